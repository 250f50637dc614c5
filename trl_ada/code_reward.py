"""A code-execution reward for code RL: run the completion's program against the row's tests, in a sandbox.

``code_execution_reward`` (``--reward_funcs code_execution``) is the default instance of [`CodeExecutionReward`];
build your own for other limits, all-or-nothing scoring, concurrency or column names. Pure Python and the standard
library; the sandbox is [`trl_ada.sandbox.Sandbox`] (bubblewrap).

**The program** is the completion's last fenced code block tagged Python (```` ```python ````, ```` ```py ````), else
its last fenced block of any tag, else the whole completion. A last fence left open (a truncated completion) runs to
the end of the text. Completions may be strings or lists of chat messages (the last message's content is read).

**The tests**, read from the dataset columns the reward names (a row with neither gets ``None``: not applicable):

- ``verification_info`` (open-r1's verifiable-coding format): ``{"language": "python", "test_cases": [{"type":
  "stdin_stdout", "input": ..., "output": ...}, ...]}``, a dict or its JSON string. Each case is one sandboxed run of
  the program as ``__main__`` that sees only its own input; the case passes when its standard output equals the
  expected output after each line is right-stripped and leading/trailing blank lines are dropped. Another language
  or no ``stdin_stdout`` case gives ``None``.
- ``tests`` (MBPP / HumanEval style): Python test code (a string, or a list of statements such as MBPP's
  ``test_list``), with an optional ``entry_point`` column: when the test code defines ``def check(candidate)``
  (HumanEval), its body runs with ``candidate`` bound to the entry point (the column, else the name in a top-level
  ``check(name)`` call). Every top-level statement that contains an
  ``assert`` is one test; the other statements (imports, helpers) run in order as set-up. The program is loaded as a
  module named ``solution`` (so its ``if __name__ == "__main__":`` block does not run); a ``sys.exit()`` while
  loading ends the loading, not the tests.

**The reward** is the fraction of tests passed, or 1/0 with ``all_or_nothing=True``. A program that cannot run scores
0. Each completion gets one outcome: ``passed``, or the reason of its first failing test, one of ``wrong_answer``,
``runtime_error``, ``syntax_error``, ``timeout``, ``memory``, ``output_limit``, ``sandbox_error``; rows the reward
does not apply to count as ``not_applicable``. The counts of the last call are in ``reward.last_outcomes`` (each
completion's outcome, in order, in ``reward.last_row_outcomes``) and their
running totals in ``reward.outcomes`` (``collections.Counter``); under TRL's trainers each outcome's share of the
batch is also logged as the metric ``code_execution/<outcome>`` through the ``log_metric`` hook TRL passes.

**Why a program cannot mark its own tests passed.** The verdict is decided outside the sandbox, from data the
program cannot forge without solving the task:

- stdin/stdout: the expected output never enters the sandbox; each case's run sees only its own input, so printing
  another case's expected output, reading the test file or a harness is impossible (there is none inside), and the
  exit status is not part of the verdict.
- assert tests of the form ``assert <expression> == <literal>`` (or ``<literal> == <expression>``), the form of
  MBPP's and nearly all of HumanEval's tests: the literal (the expected value) is removed from what enters the
  sandbox. The harness inside evaluates only ``<expression>`` and reports its value, converted to plain Python data
  (numbers, strings, bytes, ``None``, lists, tuples, dicts, sets; numpy values through ``tolist()``), as a ``repr``
  on a pipe; the trainer reads it back with ``ast.literal_eval`` and compares it to the literal with ``==`` on plain
  data. So an early ``sys.exit(0)``/``os._exit(0)`` (no value reported: the test fails), patched ``assert``,
  ``AssertionError`` or builtins, an object whose ``__eq__`` always returns ``True``, or writing to the pipe
  (without the expected value there is nothing right to write; a test reported twice fails) gain nothing.
- any other assert (``assert math.isclose(f(x), 0.5)``, asserts inside loops, ``assert f(x) == y`` with a
  non-literal ``y``) must run inside the program's interpreter, and its pass/fail is reported from there. A program
  that manipulates that interpreter (e.g. returns an object whose ``__eq__`` is always true, or writes a "passed"
  record to the pipe itself) can pass such tests. Prefer the literal form in training data when rewards are at
  stake; ``CodeExecutionReward.count_checks`` tells how many tests of a row are of each kind.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import logging
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, get_args

from .sandbox import Isolation, Sandbox, SandboxLimits, SandboxResult

logger = logging.getLogger(__name__)

Outcome = Literal[
    "passed",
    "wrong_answer",
    "runtime_error",
    "syntax_error",
    "timeout",
    "memory",
    "output_limit",
    "sandbox_error",
    "not_applicable",
]
OUTCOMES: tuple[str, ...] = get_args(Outcome)
"""Every outcome a completion can get, in the order metrics are logged."""

_SANDBOX_STATUS_OUTCOME: dict[str, Outcome] = {
    "timeout": "timeout",
    "memory": "memory",
    "output_limit": "output_limit",
    "sandbox_error": "sandbox_error",
    "error": "runtime_error",
    "ok": "runtime_error",  # the run ended normally but a test reported nothing (e.g. os._exit in the program)
}
_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")

# ---------------------------------------------------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})


def extract_program(completion: Any) -> str:
    """The program of a completion: its last ```` ```python ```` block, else its last fenced block, else all of it."""
    from .rewards import completion_text  # imported here: trl_ada.rewards imports this module to register it

    text = completion_text(completion)
    blocks = [(match.group(1).strip().lower(), match.group(2)) for match in _FENCE.finditer(text)]
    if not blocks:
        return text
    python_blocks = [body for tag, body in blocks if (tag.split() or [""])[0] in _PYTHON_TAGS]
    return python_blocks[-1] if python_blocks else blocks[-1][1]


# ---------------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StdioCase:
    """One stdin/stdout test case."""

    input: str
    output: str


@dataclass(frozen=True)
class AssertPlan:
    """Assert-style tests split into what runs in the sandbox and what stays outside.

    ``steps`` go into the sandbox (``{"kind": "setup" | "value" | "assert", "src": ...}``); ``expected[i]`` is the
    expected value of value step ``i`` and never leaves the trainer.
    """

    steps: tuple[tuple[str, str], ...]
    expected: tuple[tuple[int, Any], ...]

    @property
    def check_indices(self) -> list[int]:
        return [i for i, (kind, _) in enumerate(self.steps) if kind != "setup"]


def normalize_output(text: str) -> list[str]:
    """Output as compared: lines right-stripped, leading and trailing blank lines dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    while lines and not lines[0]:
        lines.pop(0)
    return lines


def parse_verification_info(info: Any) -> list[StdioCase] | None:
    """The stdin/stdout cases of an open-r1 ``verification_info`` value, or ``None`` if it has none for Python.

    Raises:
        ValueError: on a value that is neither a dict nor a JSON object string.
    """
    if info is None:
        return None
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except json.JSONDecodeError as error:
            raise ValueError(f"verification_info is not valid JSON ({error}); expected a dict or its JSON.") from None
    if not isinstance(info, dict):
        raise ValueError(f"verification_info must be a dict or its JSON string, got {type(info).__name__}.")
    language = str(info.get("language") or "python").lower()
    if language not in ("python", "python3", "py"):
        return None
    cases = [
        StdioCase(str(case.get("input") or ""), str(case.get("output") or ""))
        for case in info.get("test_cases") or []
        if isinstance(case, dict) and case.get("type", "stdin_stdout") == "stdin_stdout"
    ]
    return cases or None


def _literal(node: ast.expr) -> tuple[bool, Any]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _contains_assert(node: ast.AST) -> bool:
    return any(isinstance(child, ast.Assert) for child in ast.walk(node))


def _step(statement: ast.stmt) -> tuple[tuple[str, str], Any, bool]:
    """(kind, source) of a statement, its expected value and whether it has one."""
    if not _contains_assert(statement):
        return ("setup", ast.unparse(statement)), None, False
    test = statement.test if isinstance(statement, ast.Assert) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        for expression, other in ((left, right), (right, left)):
            is_literal, value = _literal(other)
            if is_literal and not _literal(expression)[0]:
                return ("value", ast.unparse(expression)), value, True
    return ("assert", ast.unparse(statement)), None, False


@functools.lru_cache(maxsize=4096)
def build_assert_plan(tests: str, entry_point: str | None = None) -> AssertPlan | None:
    """Splits assert-style test code into sandbox steps and expected values (see [`AssertPlan`]).

    Returns ``None`` when the code has no assert. Raises ``ValueError`` when it does not parse (a data problem:
    fix or drop the row).
    """
    try:
        module = ast.parse(tests)
    except (SyntaxError, ValueError) as error:
        raise ValueError(f"The test code does not parse ({error}); fix or drop the row.") from None
    body = list(module.body)
    check = next(
        (s for s in body if isinstance(s, ast.FunctionDef) and s.name == "check" and s.args.args),
        None,
    )
    statements: list[ast.stmt]
    prelude: list[tuple[str, str]] = []

    def calls_check(statement: ast.stmt) -> bool:
        return (
            isinstance(statement, ast.Expr)
            and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Name)
            and statement.value.func.id == "check"
        )

    if check is not None and not entry_point:  # `check(name)` at the end of the tests names the entry point
        for statement in body:
            if calls_check(statement) and statement.value.args and isinstance(statement.value.args[0], ast.Name):
                entry_point = statement.value.args[0].id
    if check is not None and entry_point:
        candidate = check.args.args[0].arg

        for statement in body:
            if statement is not check and not calls_check(statement):
                prelude.append(("setup", ast.unparse(statement)))
        prelude.append(("setup", f"{candidate} = {entry_point}"))
        statements = list(check.body)
    else:
        statements = body
    steps = list(prelude)
    expected: list[tuple[int, Any]] = []
    for statement in statements:
        step, value, has_value = _step(statement)
        if has_value:
            expected.append((len(steps), value))
        steps.append(step)
    if not any(kind != "setup" for kind, _ in steps):
        return None
    return AssertPlan(tuple(steps), tuple(expected))


# The harness that runs inside the sandbox for assert tests. It holds no secret: the expected values are not in it.
HARNESS = r"""
import json, numbers, os, sys

_fd = int(os.environ["SANDBOX_CHANNEL_FD"])


def _emit(record):
    os.write(_fd, (json.dumps(record) + "\n").encode())


def _plain(value, depth=0):
    if depth > 100:
        raise TypeError("too deeply nested")
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(item, depth + 1) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item, depth + 1) for item in value)
    if isinstance(value, (set, frozenset)):
        return {_plain(item, depth + 1) for item in value}
    if isinstance(value, dict):
        return {_plain(k, depth + 1): _plain(v, depth + 1) for k, v in value.items()}
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist(), depth + 1)
    raise TypeError("not plain data: " + type(value).__name__)


def _main():
    with open("plan.json") as handle:
        plan = json.load(handle)
    with open("solution.py") as handle:
        source = handle.read()
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except SystemExit:
        pass
    except BaseException as error:
        _emit({"load": type(error).__name__})
        return
    _emit({"load": "ok"})
    for index, (kind, src) in enumerate(plan):
        try:
            if kind == "setup":
                exec(src, namespace)
            elif kind == "value":
                _emit({"i": index, "repr": repr(_plain(eval(src, namespace)))})
            else:
                exec(src, namespace)
                _emit({"i": index, "ok": True})
        except BaseException as error:
            if kind != "setup":
                _emit({"i": index, "error": type(error).__name__})


_main()
"""


# ---------------------------------------------------------------------------------------------------------------------
# The reward
# ---------------------------------------------------------------------------------------------------------------------


class CodeExecutionReward:
    """TRL reward function that runs programs against tests in a sandbox (see the module docstring).

    An async callable: TRL's trainers await it (``GRPOTrainer`` runs async reward functions on its event loop, the
    async trainer's rollout worker in its own), so the sandboxes of a batch run in parallel, at most ``concurrency``
    at a time. Outside a trainer call [`score`]. Instances pickle (TRL's async trainer spawns a worker process).

    Args:
        limits: Limits of each sandboxed run (one per stdin/stdout case; one per completion for assert tests).
        all_or_nothing: Reward 1 only when every test passes, else 0 (default: the fraction passed).
        concurrency: Sandboxes running at once (default: the number of CPUs).
        verification_info_column: Column of open-r1 ``verification_info`` values.
        tests_column: Column of assert-style test code.
        entry_point_column: Column naming the function HumanEval's ``check(candidate)`` receives.
        max_test_cases: Run at most this many stdin/stdout cases per row (the first ones); default all.
        isolation: ``"bwrap"`` or ``"none"`` (NOT a security boundary), passed to [`Sandbox`].
        python: Interpreter programs run with, passed to [`Sandbox`].
        check_sandbox: Build (and so check) the sandbox now, raising the install command if bubblewrap is missing;
            ``False`` defers that to the first call (the default instance, so importing it never fails).
        name: The name TRL logs the reward under.
    """

    def __init__(
        self,
        *,
        limits: SandboxLimits | None = None,
        all_or_nothing: bool = False,
        concurrency: int | None = None,
        verification_info_column: str = "verification_info",
        tests_column: str = "tests",
        entry_point_column: str = "entry_point",
        max_test_cases: int | None = None,
        isolation: Isolation = "bwrap",
        python: str | None = None,
        check_sandbox: bool = True,
        name: str = "code_execution_reward",
    ) -> None:
        if concurrency is None:
            concurrency = os.cpu_count() or 1
        if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {concurrency!r}.")
        if max_test_cases is not None and (not isinstance(max_test_cases, int) or max_test_cases < 1):
            raise ValueError(f"max_test_cases must be a positive integer or None, got {max_test_cases!r}.")
        for label, column in (
            ("verification_info_column", verification_info_column),
            ("tests_column", tests_column),
            ("entry_point_column", entry_point_column),
        ):
            if not isinstance(column, str) or not column:
                raise ValueError(f"{label} must be a non-empty column name, got {column!r}.")
        if isolation not in ("bwrap", "none"):
            raise ValueError(f"isolation must be 'bwrap' or 'none' (no security boundary), got {isolation!r}.")
        self.limits = limits if limits is not None else SandboxLimits()
        self.all_or_nothing = bool(all_or_nothing)
        self.concurrency = concurrency
        self.verification_info_column = verification_info_column
        self.tests_column = tests_column
        self.entry_point_column = entry_point_column
        self.max_test_cases = max_test_cases
        self.isolation: Isolation = isolation
        self.python = python
        self.__name__ = name
        self.last_outcomes: Counter[str] = Counter()
        self.last_row_outcomes: list[str] = []
        self.outcomes: Counter[str] = Counter()
        self._sandbox: Sandbox | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        if check_sandbox:
            self.sandbox  # noqa: B018 - builds and checks the sandbox

    # -- pickling: the executor and the lock are rebuilt in the new process ---------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_executor"] = None
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def sandbox(self) -> Sandbox:
        """The sandbox, built on first use (raising the install command when bubblewrap is missing)."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox(self.limits, isolation=self.isolation, python=self.python)
            return self._sandbox

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="code-sandbox")
            return self._executor

    def __repr__(self) -> str:
        return (
            f"CodeExecutionReward(all_or_nothing={self.all_or_nothing}, concurrency={self.concurrency}, "
            f"isolation={self.isolation!r}, limits={self.limits!r})"
        )

    # -- running -------------------------------------------------------------------------------------------------

    async def _run(self, **kwargs: Any) -> SandboxResult:
        sandbox = self.sandbox
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool(), functools.partial(sandbox.run, **kwargs))

    async def _score_stdio(self, program: str, cases: list[StdioCase]) -> tuple[float, Outcome]:
        if self.max_test_cases is not None:
            cases = cases[: self.max_test_cases]

        def verdict(case: StdioCase, result: SandboxResult) -> Outcome:
            if result.status == "ok":
                return "passed" if normalize_output(result.stdout) == normalize_output(case.output) else "wrong_answer"
            if result.status == "error" and _is_syntax_error(result.stderr):
                return "syntax_error"
            return _SANDBOX_STATUS_OUTCOME[result.status]

        # The first case alone: a program that does not compile is not run on every case.
        first = verdict(cases[0], await self._run(program=program, stdin=cases[0].input))
        if first == "syntax_error":
            return 0.0, "syntax_error"
        rest = await asyncio.gather(*(self._run(program=program, stdin=case.input) for case in cases[1:]))
        verdicts = [first, *(verdict(case, result) for case, result in zip(cases[1:], rest))]
        return self._reward(verdicts)

    async def _score_asserts(self, program: str, plan: AssertPlan) -> tuple[float, Outcome]:
        files = {
            "main.py": HARNESS,
            "solution.py": program,
            "plan.json": json.dumps([list(step) for step in plan.steps]),
        }
        result = await self._run(files=files, channel=True)
        records: dict[int, list[dict[str, Any]]] = {}
        load: str | None = None
        for line in result.channel.decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(record, dict):
                continue
            if "load" in record and load is None:
                load = str(record["load"])
            index = record.get("i")
            if isinstance(index, int) and not isinstance(index, bool):
                records.setdefault(index, []).append(record)
        if load is not None and load != "ok":
            return 0.0, "syntax_error" if load in _SYNTAX_ERRORS else "runtime_error"
        expected = dict(plan.expected)
        missing: Outcome = _SANDBOX_STATUS_OUTCOME[result.status]
        verdicts: list[Outcome] = []
        for index in plan.check_indices:
            found = records.get(index, [])
            if len(found) != 1:  # not reported (the run ended early), or reported twice (forged)
                verdicts.append(missing if not found else "wrong_answer")
                continue
            record = found[0]
            if "error" in record:
                error = record["error"]
                verdicts.append(
                    "wrong_answer"
                    if error == "AssertionError"
                    else "memory"
                    if error == "MemoryError"
                    else "runtime_error"
                )
            elif index in expected:
                verdicts.append("passed" if _same_value(record.get("repr"), expected[index]) else "wrong_answer")
            else:
                verdicts.append("passed" if record.get("ok") is True else "wrong_answer")
        return self._reward(verdicts)

    def _reward(self, verdicts: list[Outcome]) -> tuple[float, Outcome]:
        passed = sum(verdict == "passed" for verdict in verdicts)
        failed = next((verdict for verdict in verdicts if verdict != "passed"), "passed")
        if self.all_or_nothing:
            return (1.0 if passed == len(verdicts) else 0.0), failed
        return passed / len(verdicts), failed

    async def _score_row(self, completion: Any, row: dict[str, Any]) -> tuple[float | None, Outcome]:
        info = row.get(self.verification_info_column)
        tests = row.get(self.tests_column)
        program = extract_program(completion)
        if info is not None:
            cases = parse_verification_info(info)
            if cases is None:
                return None, "not_applicable"
            return await self._score_stdio(program, cases)
        if tests is not None:
            if not isinstance(tests, str):
                tests = "\n".join(str(test) for test in tests)
            entry_point = row.get(self.entry_point_column)
            plan = build_assert_plan(tests, str(entry_point) if entry_point else None)
            if plan is None:
                return None, "not_applicable"
            return await self._score_asserts(program, plan)
        return None, "not_applicable"

    async def __call__(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        """Rewards of a batch: one per completion, ``None`` for rows without tests (see the module docstring).

        Args:
            completions: One completion per row (string, or list of messages).
            **kwargs: Dataset columns (one value per row) and TRL's hooks; ``log_metric`` gets each outcome's share.
        """
        columns = (self.verification_info_column, self.tests_column, self.entry_point_column)
        values = {column: kwargs.get(column) for column in columns}
        for column, column_values in values.items():
            if column_values is not None and len(column_values) != len(completions):
                raise ValueError(f"Got {len(completions)} completions but {len(column_values)} values of {column!r}.")
        if values[self.verification_info_column] is None and values[self.tests_column] is None:
            logger.warning(
                "code_execution_reward got neither a %r nor a %r column; every row scores None. Name your test "
                "columns with CodeExecutionReward(verification_info_column=..., tests_column=...).",
                self.verification_info_column,
                self.tests_column,
            )
        rows = [
            {column: (None if column_values is None else column_values[i]) for column, column_values in values.items()}
            for i in range(len(completions))
        ]
        scored = await asyncio.gather(*(self._score_row(c, row) for c, row in zip(completions, rows)))
        counts: Counter[str] = Counter(outcome for _, outcome in scored)
        self.last_outcomes = counts
        self.last_row_outcomes = [outcome for _, outcome in scored]  # per completion, in order
        self.outcomes.update(counts)
        if counts["sandbox_error"]:
            logger.warning("%d programs could not be run: the sandbox failed to start.", counts["sandbox_error"])
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and completions:
            for outcome in OUTCOMES:
                log_metric(f"code_execution/{outcome}", counts[outcome] / len(completions))
        return [reward for reward, _ in scored]

    def score(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        """The rewards of a batch, from synchronous code (runs the async call in a fresh event loop)."""
        return asyncio.run(self(completions, **kwargs))

    def count_checks(self, tests: str | Sequence[str], entry_point: str | None = None) -> dict[str, int]:
        """How many tests of a row are checked outside the program's reach (``value``) or inside it (``assert``)."""
        if not isinstance(tests, str):
            tests = "\n".join(tests)
        plan = build_assert_plan(tests, entry_point)
        kinds = Counter(kind for kind, _ in plan.steps) if plan else Counter()
        return {"value": kinds["value"], "assert": kinds["assert"]}


def _is_syntax_error(stderr: str) -> bool:
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith(_SYNTAX_ERRORS)


def _same_value(reported: Any, expected: Any) -> bool:
    """Whether a value reported from the sandbox (a ``repr``) equals the expected one, compared as plain data."""
    if not isinstance(reported, str):
        return False
    try:
        value = ast.literal_eval(reported)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    try:
        return bool(value == expected)
    except Exception:  # e.g. comparing deeply nested data
        return False


code_execution_reward = CodeExecutionReward(check_sandbox=False)
"""The default instance, ``--reward_funcs code_execution``: fraction of tests passed, default [`SandboxLimits`]."""

__all__ = [
    "HARNESS",
    "OUTCOMES",
    "AssertPlan",
    "CodeExecutionReward",
    "StdioCase",
    "build_assert_plan",
    "code_execution_reward",
    "extract_program",
    "normalize_output",
    "parse_verification_info",
]
