"""A code-execution reward for code RL: run the completion's program against the row's tests, in a sandbox.

``code_execution_reward`` (``--reward_funcs code_execution``) is the default instance of [`CodeExecutionReward`];
build your own for other limits, all-or-nothing scoring, concurrency or column names. Pure Python and the standard
library; the sandbox is [`trl_ada.rewards.sandbox.Sandbox`] (bubblewrap). docs/code-rl.md says which program runs
(the completion's last ```` ```python ```` block), how the tests are read (open-r1's ``verification_info``: one run
per stdin/stdout case; MBPP/HumanEval assert ``tests``: one harness run per completion), what a row may cost, the
outcomes, and why a program cannot mark its own tests passed: the verdict is decided outside the sandbox, and for
asserts that compare the program's answer with literals (``f(x) == 3``, ``(f(x) > 9) == True``, ``abs(f(x) - y) < e``)
only ``f(x)`` runs inside, its value brought out as plain data and the whole comparison made outside.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import dataclasses
import functools
import json
import logging
import math
import operator
import os
import re
import threading
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal, get_args

from .sandbox import Filesystem, Isolation, Sandbox, SandboxLimits, SandboxResult
from .text import completion_text

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
}
_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")

_FENCE = re.compile(r"```([^\n`]*)\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3", "py3"})


def extract_program(completion: Any) -> str:
    """The program of a completion: its last ```` ```python ```` block, else its last fenced block, else all of it."""
    text = completion_text(completion)
    blocks = [(match.group(1).strip().lower(), match.group(2)) for match in _FENCE.finditer(text)]
    if not blocks:
        return text
    python_blocks = [body for tag, body in blocks if (tag.split() or [""])[0] in _PYTHON_TAGS]
    return python_blocks[-1] if python_blocks else blocks[-1][1]


@dataclass(frozen=True)
class StdioCase:
    """One stdin/stdout test case."""

    input: str
    output: str


@dataclass(frozen=True)
class AssertPlan:
    """Assert-style tests split into what runs in the sandbox and what stays outside: ``steps`` go into the sandbox,
    in order, as ``(kind, src)``: ``import`` (bind the program's name ``src`` in the tests' namespace), ``setup`` (run;
    its failure is no test's), ``value`` (a test: evaluate ``src``, the program's answer, report it as plain data) or
    ``assert`` (a test: run ``src``, report whether it raised). ``checks`` pairs each value step's index with the
    test's condition over that plain value (a tree of tuples, see [`build_assert_plan`]), which never leaves the
    trainer; ``ignored`` counts the asserts that do not exercise the program (run as set-up)."""

    steps: tuple[tuple[str, str], ...]
    checks: tuple[tuple[int, tuple], ...]
    ignored: int = 0

    @property
    def check_indices(self) -> list[int]:
        """The indices of the steps that are tests."""
        return [i for i, (kind, _) in enumerate(self.steps) if kind in ("value", "assert")]

    @functools.cached_property
    def longest_reports(self) -> dict[int, int]:
        """Per value step, the longest ``repr`` it may report: a few times the test's literals' own (``1`` may come
        back as ``1.0`` or ``True``), and at least ``PREDICATE_REPORT_CHARS`` when the test is not a plain equality
        (``5 in f(x)`` says little about the answer's size); a longer report is a wrong answer, rejected before it
        is parsed."""
        return {index: _longest_report(check) for index, check in self.checks}


PREDICATE_REPORT_CHARS = 4096
"""The longest report a value step may send for a test other than ``f(x) == <literal>``, unless its literals allow
more: it bounds what the trainer parses for one test."""


def normalize_output(text: str) -> list[str]:
    """Output as compared: lines right-stripped, leading and trailing blank lines dropped (linear in the text)."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    start, end = 0, len(lines)
    while end > start and not lines[end - 1]:
        end -= 1
    while start < end and not lines[start]:
        start += 1
    return lines[start:end]


CASE_OUTPUT_FACTOR = 4
"""Each stream of a stdin/stdout case may carry this many times the expected output's bytes (room for trailing spaces
and ``\\r\\n``), plus ``CASE_OUTPUT_SLACK_BYTES`` (at most ``SandboxLimits.output_bytes``); a program writing more
fails the case (``output_limit``), so judging a case costs the trainer little whatever the program prints."""
CASE_OUTPUT_SLACK_BYTES = 64 << 10
"""The fixed part of a stdin/stdout case's output cap (see ``CASE_OUTPUT_FACTOR``)."""
ROW_WALL_FACTOR = 3
"""A stdin/stdout row's cases share ``ROW_WALL_FACTOR * SandboxLimits.wall_time_s`` sandbox seconds by default."""


def case_output_bytes(expected: str, output_bytes: int) -> int:
    """The output cap of a stdin/stdout case whose expected output is ``expected``, under a sandbox cap of
    ``output_bytes``: ``min(output_bytes, CASE_OUTPUT_FACTOR * len(expected in UTF-8) + CASE_OUTPUT_SLACK_BYTES)``."""
    return min(output_bytes, CASE_OUTPUT_FACTOR * len(expected.encode("utf-8", "replace")) + CASE_OUTPUT_SLACK_BYTES)


def parse_verification_info(info: Any) -> list[StdioCase] | None:
    """The stdin/stdout cases of an open-r1 ``verification_info`` value, or ``None`` if it has none for Python.

    Raises:
        ValueError: on a value that is neither a dict nor a JSON object string.
    """
    if info is None:
        return None
    try:
        info = json.loads(info) if isinstance(info, str) else info
    except json.JSONDecodeError as error:
        raise ValueError(f"verification_info is not valid JSON ({error}); expected a dict or its JSON.") from None
    if not isinstance(info, dict):
        raise ValueError(f"verification_info must be a dict or its JSON string, got {type(info).__name__}.")
    language = str(info.get("language") or "python").lower()
    if language not in ("python", "python3", "py"):
        return None
    cases = [
        StdioCase(_case_text(case.get("input")), _case_text(case.get("output")))
        for case in info.get("test_cases") or []
        if isinstance(case, dict) and case.get("type", "stdin_stdout") == "stdin_stdout"
    ]
    return cases or None


def _case_text(value: Any) -> str:
    """A case's input or output as text: ``None`` is empty, anything else its ``str`` (so ``0`` is ``"0"``)."""
    return "" if value is None else str(value)


# Builtins an expected value may be built with outside the sandbox (``set((4, 5))``, MBPP's habit): one argument
# that is itself such a value (or none), nothing else, so evaluating it in the trainer runs no test code.
_EXPECTED_CONSTRUCTORS: dict[str, Any] = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "sorted": sorted,
    "dict": dict,
}
_BUILTIN_NAMES = frozenset(dir(builtins))


def _expected_value(node: ast.expr, rebound: frozenset[str]) -> tuple[bool, Any]:
    """Whether ``node`` is a value the trainer can compute without running test code, and that value: a literal, or
    one of ``_EXPECTED_CONSTRUCTORS`` (not rebound by the tests) applied to at most one such value."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _EXPECTED_CONSTRUCTORS
        and node.func.id not in rebound
        and not node.keywords
        and len(node.args) <= 1
        and not any(isinstance(arg, ast.Starred) for arg in node.args)
    ):
        if not node.args:
            return True, _EXPECTED_CONSTRUCTORS[node.func.id]()
        ok, argument = _expected_value(node.args[0], rebound)
        if not ok:
            return False, None
        try:
            return True, _EXPECTED_CONSTRUCTORS[node.func.id](argument)
        except (TypeError, ValueError):  # e.g. sorted() of mixed types, dict() of non-pairs
            return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _contains_assert(node: ast.AST) -> bool:
    return any(isinstance(child, ast.Assert) for child in ast.walk(node))


def _loaded_names(node: ast.AST) -> set[str]:
    return {child.id for child in ast.walk(node) if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load)}


def _bound_names(node: ast.AST) -> set[str]:
    """Every name ``node`` binds, at any depth (assignments, loop targets, parameters, imports, definitions, ...)."""
    names: set[str] = set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load):
            names.add(child.id)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, ast.arg):
            names.add(child.arg)
        elif isinstance(child, ast.alias) and child.name != "*":
            names.add((child.asname or child.name).split(".")[0])
        elif isinstance(child, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and child.name:
            names.add(child.name)
        elif isinstance(child, ast.MatchMapping) and child.rest:
            names.add(child.rest)
        elif isinstance(child, (ast.Global, ast.Nonlocal)):
            names.update(child.names)
    return names


# Builtins a test may apply to the program's answer inside the sandbox: each calls the program's code with nothing
# but the answer's own values (no operand of the test), so what it returns is still the program's answer.
_ANSWER_BUILTINS = frozenset(
    "set frozenset tuple list sorted dict len sum min max abs round str int float bool".split()
)


def _is_answer(node: ast.expr, answers: frozenset[str], test_data: Any, rebound: frozenset[str]) -> bool:
    """Whether ``node`` is the program's answer, which may be computed inside the sandbox and brought out as plain
    data: a name imported from the program, a call of an answer (a program function) whose arguments are answers or
    test data (``test_data(argument)``: nothing bound from the program), or one of ``_ANSWER_BUILTINS`` applied to
    one answer. Anything else the test does to an answer (an operator, a subscript, an attribute, a method) hands the
    program's code the test's operand and lets it answer for the test, so it is not an answer."""
    if isinstance(node, ast.Name):
        return node.id in answers
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name) and func.id in _ANSWER_BUILTINS and func.id not in rebound | answers:
        return (
            len(node.args) == 1
            and not node.keywords
            and not isinstance(node.args[0], ast.Starred)
            and _is_answer(node.args[0], answers, test_data, rebound)
        )
    arguments = [arg.value if isinstance(arg, ast.Starred) else arg for arg in node.args]
    arguments += [keyword.value for keyword in node.keywords]
    return _is_answer(func, answers, test_data, rebound) and all(
        test_data(arg) or _is_answer(arg, answers, test_data, rebound) for arg in arguments
    )


# The comparisons the trainer makes on a plain value; `is` is left inside (an honest answer to `is None` is often an
# object that is not plain data, and identity is no dunder a program can override).
_COMPARISONS: dict[type, tuple[str, Any]] = {
    ast.Eq: ("==", operator.eq),
    ast.NotEq: ("!=", operator.ne),
    ast.Lt: ("<", operator.lt),
    ast.LtE: ("<=", operator.le),
    ast.Gt: (">", operator.gt),
    ast.GtE: (">=", operator.ge),
    ast.In: ("in", lambda a, b: a in b),
    ast.NotIn: ("not in", lambda a, b: a not in b),
}
_COMPARE_BY_NAME = dict(_COMPARISONS.values())
_ARITHMETIC = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub)}
_ARITHMETIC_BY_NAME = dict(_ARITHMETIC.values())


def _outside_check(node: ast.expr, is_answer: Any, rebound: frozenset[str]) -> tuple[tuple, list[ast.expr]] | None:
    """The part of an assert's condition the trainer computes on the answer's plain value, as a tree of tuples, and
    the answers it holds; ``None`` when part of it is neither an answer, a literal (see ``_expected_value``) nor one
    of the cheap operations on plain data below (comparisons, ``not``, ``+``/``-``, a literal subscript, ``abs``,
    ``round``), so that the test must run inside."""
    if is_answer(node):
        return ("answer",), [node]
    is_expected, value = _expected_value(node, rebound)
    if is_expected:
        return ("const", value), []
    parts: list[tuple[tuple, list[ast.expr]] | None]
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARISONS for op in node.ops):
        parts = [_outside_check(operand, is_answer, rebound) for operand in (node.left, *node.comparators)]
        if any(part is None for part in parts):
            return None
        names = [_COMPARISONS[type(op)][0] for op in node.ops]
        pairs = tuple((name, part[0]) for name, part in zip(names, parts[1:]))
        return ("compare", parts[0][0], pairs), [answer for part in parts for answer in part[1]]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        part = _outside_check(node.operand, is_answer, rebound)
        kind = {ast.Not: "not", ast.USub: "neg", ast.UAdd: "pos"}[type(node.op)]
        return None if part is None else ((kind, part[0]), part[1])
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _outside_check(node.left, is_answer, rebound), _outside_check(node.right, is_answer, rebound)
        if left is None or right is None:
            return None
        return ("arithmetic", _ARITHMETIC[type(node.op)][0], left[0], right[0]), left[1] + right[1]
    if isinstance(node, ast.Subscript):
        part = _outside_check(node.value, is_answer, rebound)
        key = _literal_key(node.slice, rebound)
        return None if part is None or key is None else (("item", part[0], key), part[1])
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("abs", "round")
        and node.func.id not in rebound
        and not node.keywords
        and 1 <= len(node.args) <= (2 if node.func.id == "round" else 1)
        and not any(isinstance(arg, ast.Starred) for arg in node.args)
    ):
        part = _outside_check(node.args[0], is_answer, rebound)
        digits = _expected_value(node.args[1], rebound) if len(node.args) == 2 else (True, None)
        if part is None or not digits[0] or not (digits[1] is None or type(digits[1]) is int):
            return None
        return (node.func.id, part[0], digits[1]), part[1]
    return None


def _literal_key(node: ast.expr, rebound: frozenset[str]) -> Any:
    """A subscript's key when it is a literal (or a slice of literals), wrapped in a one-tuple; else ``None``."""
    if isinstance(node, ast.Slice):
        bounds = [
            (True, None) if bound is None else _expected_value(bound, rebound)
            for bound in (node.lower, node.upper, node.step)
        ]
        return (slice(*(value for _, value in bounds)),) if all(ok for ok, _ in bounds) else None
    is_expected, value = _expected_value(node, rebound)
    return (value,) if is_expected else None


def _decide(check: tuple, answer: Any) -> Any:
    """A check's value for the answer's plain value (the trainer's side: plain data only, so no program code runs)."""
    kind = check[0]
    if kind == "answer":
        return answer
    if kind == "const":
        return check[1]
    if kind == "compare":
        left = _decide(check[1], answer)
        for name, part in check[2]:
            right = _decide(part, answer)
            if not _COMPARE_BY_NAME[name](left, right):
                return False
            left = right
        return True
    if kind == "not":
        return not _decide(check[1], answer)
    if kind == "neg":
        return -_decide(check[1], answer)
    if kind == "pos":
        return +_decide(check[1], answer)
    if kind == "arithmetic":
        return _ARITHMETIC_BY_NAME[check[1]](_decide(check[2], answer), _decide(check[3], answer))
    if kind == "item":
        return _decide(check[1], answer)[check[2][0]]
    if kind == "abs":
        return abs(_decide(check[1], answer))
    if kind == "round":
        value = _decide(check[1], answer)
        return round(value) if check[2] is None else round(value, check[2])
    raise ValueError(f"unknown check {kind!r}")


def _constants(check: tuple) -> list[Any]:
    """The literals of a check."""
    kind = check[0]
    if kind == "const":
        return [check[1]]
    if kind == "compare":
        return _constants(check[1]) + [value for _, part in check[2] for value in _constants(part)]
    if kind == "arithmetic":
        return _constants(check[2]) + _constants(check[3])
    if kind == "item":
        return _constants(check[1]) + [check[2][0]]
    if kind in ("not", "neg", "pos", "abs", "round"):
        return _constants(check[1])
    return []


def _longest_report(check: tuple) -> int:
    """The longest report a value step with this check may send (see ``AssertPlan.longest_reports``)."""
    longest = 8 * sum(len(repr(value)) for value in _constants(check)) + 64
    equality = check[0] == "compare" and len(check[2]) == 1 and check[2][0][0] == "=="
    if equality and {check[1][0], check[2][0][1][0]} == {"answer", "const"}:
        return longest
    return max(longest, PREDICATE_REPORT_CHARS)


@functools.lru_cache(maxsize=4096)
def build_assert_plan(tests: str, entry_point: str | None = None) -> AssertPlan | None:
    """Splits assert-style test code into sandbox steps and the checks made outside it (see [`AssertPlan`]).

    The names the tests use but neither define nor find among Python's builtins (and ``entry_point``) are imported
    from the program. A test is a top-level statement (or one of ``check``'s) that contains an ``assert`` and uses one
    of those names, directly or through a name bound from them; other statements run as set-up. A test is a ``value``
    step when its condition holds exactly one of the program's answers (``f(x)``, see ``_is_answer``) and is
    otherwise made of literals and of what the trainer can compute on plain data: comparisons (``==``, ``!=``,
    ``<``, ``<=``, ``>``, ``>=``, ``in``, ``not in``, chained), ``not``, ``+``, ``-``, a literal subscript, ``abs``
    and ``round``, with a comparison on top. Only the answer enters the sandbox; the rest is the check, kept here
    as a tree of tuples (``("answer",)``, ``("const", value)``, ``("compare", left, ((op, right), ...))``, ...) and
    applied to the answer's plain value. Any other test is an ``assert`` step, run whole inside. Returns ``None``
    when no test is left, or when the code defines ``check(candidate)`` but names no entry point. Raises
    ``ValueError`` when the code does not parse (a data problem: fix or drop the row).
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
    if check is not None and not entry_point:
        return None  # nothing says which of the program's functions `check` tests
    rebound = frozenset(_bound_names(module))
    if any(isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names) for node in ast.walk(module)):
        rebound |= _BUILTIN_NAMES  # a star import may rebind any builtin, so none is known to be Python's own
    # The program's names: used by the tests, defined by neither the tests nor Python.
    imported = (_loaded_names(module) - rebound - _BUILTIN_NAMES) | ({entry_point} if entry_point else set())
    steps: list[tuple[str, str]] = [("import", name) for name in sorted(imported)]
    statements: list[ast.stmt]
    if check is not None:
        candidate = check.args.args[0].arg
        steps += [("setup", ast.unparse(s)) for s in body if s is not check and not calls_check(s)]
        steps.append(("setup", f"{candidate} = {entry_point}"))
        imported.add(candidate)
        statements = list(check.body)
    else:
        statements = body
    from_program = set(imported)  # names bound from the program, directly or through other such names
    answers = frozenset(imported)  # the program's own objects; names a statement binds from them are the tests'

    def is_answer(node: ast.expr) -> bool:
        return _is_answer(node, answers, lambda arg: not _loaded_names(arg) & from_program, rebound)

    checks: list[tuple[int, tuple]] = []
    ignored = 0
    for statement in statements:
        used = _loaded_names(statement.test if isinstance(statement, ast.Assert) else statement)
        exercises = bool(used & from_program)
        definition = isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if definition or not _contains_assert(statement) or not exercises:
            if exercises:
                from_program |= _bound_names(statement)
            ignored += _contains_assert(statement) and not definition and not exercises
            steps.append(("setup", ast.unparse(statement)))
            continue
        step: tuple[str, str] = ("assert", ast.unparse(statement))
        test = statement.test if isinstance(statement, ast.Assert) else None
        # A value step only when the assert's condition is a comparison the trainer can make on the answer's plain
        # value; else the program's own objects would decide it (`__gt__`, `__contains__`, `__sub__` answering
        # whatever passes).
        try:
            outside = (
                _outside_check(test, is_answer, rebound) if isinstance(test, (ast.Compare, ast.UnaryOp)) else None
            )
        except RecursionError:  # a condition nested too deeply to walk is left to run inside
            outside = None
        if outside is not None and len(outside[1]) == 1 and _is_comparison(outside[0]):
            checks.append((len(steps), outside[0]))
            step = ("value", ast.unparse(outside[1][0]))
        steps.append(step)
    if not any(kind in ("value", "assert") for kind, _ in steps):
        return None
    return AssertPlan(tuple(steps), tuple(checks), ignored)


def _is_comparison(check: tuple) -> bool:
    """Whether a check's verdict is a comparison (possibly negated), not the truth of a bare value: the truth of an
    answer that is not plain data (an object, a generator) is still the test's to ask, inside."""
    return check[0] == "compare" or (check[0] == "not" and _is_comparison(check[1]))


# The harness that runs inside the sandbox for assert tests. It holds no secret: the expected values are not in it.
# The program is loaded as the module `solution`; the tests run in a namespace of their own that holds only the names
# imported from the program (plan steps of kind "import") and a copy of the builtins taken before the program ran.
HARNESS = r"""
import builtins, json, numbers, os

# Taken before the program runs, so what it does to `builtins`, `json` or `os` later reaches neither the tests'
# builtins nor the harness's own functions (defined below, they look their builtins up in this copy).
_BUILTINS = dict(builtins.__dict__)
__builtins__ = _BUILTINS
_fd = int(os.environ["SANDBOX_CHANNEL_FD"])
_write, _dumps = os.write, json.dumps


def _emit(record):
    _write(_fd, (_dumps(record) + "\n").encode())


_EXACT = ((int, int.__int__), (float, float.__float__), (complex, complex.__complex__), (str, str.__str__),
          (bytes, bytes.__bytes__))


def _plain(value, depth=0):
    # Exact built-in types only, so the `repr` sent out is Python's own (a subclass's `__repr__` never runs).
    if depth > 100:
        raise TypeError("too deeply nested")
    kind = type(value)
    if value is None or kind in (bool, int, float, complex, str, bytes):
        return value
    for base, exact in _EXACT:
        if isinstance(value, base):
            return exact(value)
    if isinstance(value, numbers.Integral):
        return _plain(int(value), depth + 1)
    if isinstance(value, numbers.Real):
        return _plain(float(value), depth + 1)
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
    raise TypeError("not plain data: " + kind.__name__)


def _main():
    with open("plan.json") as handle:
        plan = json.load(handle)
    with open("solution.py") as handle:
        source = handle.read()
    program = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(source, "solution.py", "exec"), program)
    except SystemExit:
        pass
    except BaseException as error:
        _emit({"load": type(error).__name__})
        return
    _emit({"load": "ok"})
    tests = {"__name__": "tests", "__builtins__": _BUILTINS}
    for index, (kind, src) in enumerate(plan):
        try:
            if kind == "import":
                if src in program:
                    tests[src] = program[src]
            elif kind == "setup":
                exec(src, tests)
            elif kind == "value":
                _emit({"i": index, "repr": repr(_plain(eval(src, tests)))})
            else:
                exec(src, tests)
                _emit({"i": index, "ok": True})
        except BaseException as error:
            if kind in ("value", "assert"):
                _emit({"i": index, "error": type(error).__name__})


_main()
"""


# Read by `available_cpus` (module constants so that tests can point them at files of their own).
_PROC_SELF_CGROUP = "/proc/self/cgroup"
_CGROUP_ROOT = "/sys/fs/cgroup"


def available_cpus() -> int:
    """The CPUs this process may actually use (unlike ``os.cpu_count()``): its affinity mask (``taskset``, ``docker
    --cpuset-cpus``), capped by the cgroup v2 CPU quota (``cpu.max``, ``docker --cpus``) of its cgroup and each
    parent, rounded up; at least 1. cgroup v1 quotas are not read."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def _cgroup_cpu_quota() -> float | None:
    """The smallest ``quota / period`` of the ``cpu.max`` files from this process's cgroup (v2) up to the root, or
    ``None`` when none sets one (``max``) or the files cannot be read."""
    try:
        with open(_PROC_SELF_CGROUP) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    path = next((line[len("0::") :] for line in lines if line.startswith("0::")), None)  # the v2 hierarchy
    if path is None:
        return None
    root = os.path.normpath(_CGROUP_ROOT)
    directory = os.path.normpath(os.path.join(root, path.strip().lstrip("/")))
    if os.path.commonpath([root, directory]) != root:
        return None
    quota: float | None = None
    while True:
        try:
            with open(os.path.join(directory, "cpu.max")) as handle:
                fields = handle.read().split()
            if len(fields) == 2 and fields[0] != "max" and int(fields[1]) > 0:
                share = int(fields[0]) / int(fields[1])
                quota = share if quota is None else min(quota, share)
        except (OSError, ValueError):  # no cpu.max here (the root, or the cpu controller is off)
            pass
        if directory == root:
            return quota
        directory = os.path.dirname(directory)


class CodeExecutionReward:
    """TRL reward function that runs programs against tests in a sandbox (the rules: docs/code-rl.md).

    An async callable: TRL's trainers await it, so the sandboxes of a batch run in parallel, at most ``concurrency``
    at a time; outside a trainer call [`score`]. Instances pickle (TRL's async trainer spawns a worker process).

    Args:
        limits: Limits of each sandboxed run (one per stdin/stdout case; one per completion for assert tests). A
            stdin/stdout case may get a shorter wall and a smaller output cap (see ``row_wall_time_s`` and
            [`case_output_bytes`]).
        all_or_nothing: Reward 1 only when every test passes, else 0 (default: the fraction passed).
        concurrency: Sandboxes running at once (default: [`available_cpus`], the CPUs this process may use).
        verification_info_column: Column of open-r1 ``verification_info`` values.
        tests_column: Column of assert-style test code.
        entry_point_column: Column naming the function HumanEval's ``check(candidate)`` receives.
        max_test_cases: Run at most this many stdin/stdout cases per row (the first ones); default all.
        row_wall_time_s: Sandbox seconds a stdin/stdout row's cases share (a case that finds nothing left fails as
            ``timeout``); default ``ROW_WALL_FACTOR`` (3) times ``limits.wall_time_s``. Raise it for rows with many
            cases of slow but honest programs.
        isolation: Passed to [`Sandbox`]: ``"bwrap"``, or ``"none"`` (NOT a security boundary).
        python: Passed to [`Sandbox`]: the interpreter programs run with.
        filesystem: Passed to [`Sandbox`]: ``"private"`` (a copy in memory of the interpreter's files) or ``"host"``.
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
        row_wall_time_s: float | None = None,
        isolation: Isolation = "bwrap",
        python: str | None = None,
        filesystem: Filesystem = "private",
        check_sandbox: bool = True,
        name: str = "code_execution_reward",
    ) -> None:
        if concurrency is None:
            concurrency = available_cpus()
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
        if filesystem not in ("private", "host"):
            raise ValueError(f"filesystem must be 'private' or 'host', got {filesystem!r}.")
        self.limits = limits if limits is not None else SandboxLimits()
        if row_wall_time_s is None:
            row_wall_time_s = ROW_WALL_FACTOR * self.limits.wall_time_s
        if (
            not isinstance(row_wall_time_s, (int, float))
            or isinstance(row_wall_time_s, bool)
            or not math.isfinite(row_wall_time_s)
            or row_wall_time_s <= 0
        ):
            raise ValueError(
                f"row_wall_time_s must be a positive number of seconds or None (default {ROW_WALL_FACTOR} walls), got "
                f"{row_wall_time_s!r}."
            )
        self.row_wall_time_s = float(row_wall_time_s)
        self.all_or_nothing = bool(all_or_nothing)
        self.concurrency = concurrency
        self.verification_info_column = verification_info_column
        self.tests_column = tests_column
        self.entry_point_column = entry_point_column
        self.max_test_cases = max_test_cases
        self.isolation: Isolation = isolation
        self.python = python
        self.filesystem: Filesystem = filesystem
        self.__name__ = name
        self.last_outcomes: Counter[str] = Counter()
        self.last_row_outcomes: list[str] = []
        self.outcomes: Counter[str] = Counter()
        self._sandbox: Sandbox | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        if check_sandbox:
            self.sandbox  # noqa: B018 - builds and checks the sandbox

    def __getstate__(self) -> dict[str, Any]:
        # The executor and the lock are rebuilt in the unpickling process.
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
                self._sandbox = Sandbox(
                    self.limits, isolation=self.isolation, python=self.python, filesystem=self.filesystem
                )
            return self._sandbox

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="code-sandbox")
            return self._executor

    def __repr__(self) -> str:
        return (
            f"CodeExecutionReward(all_or_nothing={self.all_or_nothing}, concurrency={self.concurrency}, "
            f"isolation={self.isolation!r}, row_wall_time_s={self.row_wall_time_s}, limits={self.limits!r})"
        )

    async def _score_stdio(self, program: str, cases: list[StdioCase]) -> tuple[float | None, Outcome]:
        if self.max_test_cases is not None:
            cases = cases[: self.max_test_cases]
        sandbox, pool = self.sandbox, self._pool()
        loop = asyncio.get_running_loop()
        budget = _WallBudget(self.row_wall_time_s, self.limits.wall_time_s)

        async def judge(case: StdioCase) -> Outcome:
            wall_s = await budget.take()
            if wall_s <= 0:  # the row's cases have spent its budget: this one is not run
                return "timeout"
            used_s = wall_s
            try:
                # One executor job runs and judges the case: the output is compared off the event loop.
                outcome, used_s = await loop.run_in_executor(pool, _judge_stdio_case, sandbox, program, case, wall_s)
            finally:
                await budget.settle(wall_s, used_s)
            return outcome

        # The first case alone: a program that does not compile is not run on every case.
        first = await judge(cases[0])
        if first in ("syntax_error", "sandbox_error"):
            return self._reward([first])
        rest = await asyncio.gather(*(judge(case) for case in cases[1:]))
        return self._reward([first, *rest])

    async def _score_asserts(self, program: str, plan: AssertPlan) -> tuple[float | None, Outcome]:
        files = {
            "main.py": HARNESS,
            "solution.py": program,
            "plan.json": json.dumps([list(step) for step in plan.steps]),
        }
        sandbox = self.sandbox
        loop = asyncio.get_running_loop()
        # Run and judge in one executor job: the program's report (up to `output_bytes`) is parsed off the event loop.
        verdicts = await loop.run_in_executor(
            self._pool(), lambda: _assert_verdicts(sandbox.run(files=files, channel=True), plan)
        )
        return self._reward(verdicts)

    def _reward(self, verdicts: list[Outcome]) -> tuple[float | None, Outcome]:
        if "sandbox_error" in verdicts:  # the program did not run (or not on every case): no verdict, not a zero
            return None, "sandbox_error"
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
        """Rewards of a batch: one per completion, ``None`` for rows without tests or whose sandbox did not start.

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
            logger.warning(
                "%d programs could not be run: the sandbox failed to start. They score None (unscorable), not 0; "
                "fix the sandbox (see trl_ada.rewards.sandbox) if this repeats.",
                counts["sandbox_error"],
            )
        log_metric = kwargs.get("log_metric")
        if callable(log_metric) and completions:
            for outcome in OUTCOMES:
                log_metric(f"code_execution/{outcome}", counts[outcome] / len(completions))
        return [reward for reward, _ in scored]

    def score(self, completions: list[Any], **kwargs: Any) -> list[float | None]:
        """The rewards of a batch, from synchronous code (runs the async call in a fresh event loop)."""
        return asyncio.run(self(completions, **kwargs))

    def count_checks(self, tests: str | Sequence[str], entry_point: str | None = None) -> dict[str, int]:
        """How a row's asserts are checked: ``value``, decided outside the sandbox; ``assert``, decided inside the
        program's interpreter (subvertible: docs/code-rl.md); ``ignored``, asserts that do not exercise the program
        (``assert True``), counted as no test."""
        if not isinstance(tests, str):
            tests = "\n".join(tests)
        plan = build_assert_plan(tests, entry_point)
        kinds = Counter(kind for kind, _ in plan.steps) if plan else Counter()
        return {"value": kinds["value"], "assert": kinds["assert"], "ignored": plan.ignored if plan else 0}


class _WallBudget:
    """The sandbox seconds a stdin/stdout row's cases share. A case holds ``min(case wall, what is left)`` while it
    runs (waiting, on the event loop, while that would be less than a full wall and other cases of the row hold some)
    and is charged what it used when it ends; so the row's sandbox time stays within its budget (plus the time to
    kill the last runs) and at most ``total / case wall`` of its cases run at once."""

    def __init__(self, total_s: float, case_wall_s: float) -> None:
        self.left_s = total_s
        self.case_wall_s = case_wall_s
        self.held_s = 0.0
        self.running = 0
        self._changed = asyncio.Condition()

    async def take(self) -> float:
        """Seconds of wall for the next case (0 or less: none left, do not run it)."""
        async with self._changed:
            await self._changed.wait_for(lambda: not self.running or self.left_s - self.held_s >= self.case_wall_s)
            share = min(self.case_wall_s, self.left_s - self.held_s)
            if share > 0:
                self.held_s += share
                self.running += 1
            return share

    async def settle(self, share_s: float, used_s: float) -> None:
        """Ends a case that held ``share_s`` and ran ``used_s`` seconds."""
        async with self._changed:
            self.held_s -= share_s
            self.running -= 1
            self.left_s -= used_s
            self._changed.notify_all()


def _judge_stdio_case(sandbox: Sandbox, program: str, case: StdioCase, wall_s: float) -> tuple[Outcome, float]:
    """One stdin/stdout case's verdict and the sandbox seconds it took (blocking: run it off the event loop). The run
    gets ``wall_s`` of wall time and the case's output cap ([`case_output_bytes`]); only the verdict outlives it."""
    limits = dataclasses.replace(
        sandbox.limits,
        wall_time_s=wall_s,
        output_bytes=case_output_bytes(case.output, sandbox.limits.output_bytes),
    )
    result = sandbox.with_limits(limits).run(program=program, stdin=case.input)
    if result.status == "ok":
        outcome: Outcome = (
            "passed" if normalize_output(result.stdout) == normalize_output(case.output) else "wrong_answer"
        )
    elif result.status == "error" and _is_syntax_error(result.stderr):
        outcome = "syntax_error"
    else:
        outcome = _SANDBOX_STATUS_OUTCOME[result.status]
    return outcome, result.wall_time_s


def _assert_verdicts(result: SandboxResult, plan: AssertPlan) -> list[Outcome]:
    """Each test's verdict from one harness run (blocking: run it off the event loop)."""
    if result.status == "sandbox_error":
        return ["sandbox_error"]
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
        return ["syntax_error" if load in _SYNTAX_ERRORS else "runtime_error"]
    if result.status != "ok":
        # A run that did not end by itself in time and within its limits fails every test, whatever it reported
        # first (as a stdin/stdout case does): passing, then spinning in an `atexit` handler, is a timeout.
        return [_SANDBOX_STATUS_OUTCOME[result.status]]
    checks = dict(plan.checks)
    longest = plan.longest_reports
    verdicts: list[Outcome] = []
    for index in plan.check_indices:
        found = records.get(index, [])
        if len(found) != 1:  # not reported (the run ended early, e.g. os._exit), or reported twice (forged)
            verdicts.append("runtime_error" if not found else "wrong_answer")
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
        elif index in checks:
            verdicts.append("passed" if _passes(record.get("repr"), checks[index], longest[index]) else "wrong_answer")
        else:
            verdicts.append("passed" if record.get("ok") is True else "wrong_answer")
    return verdicts


def _is_syntax_error(stderr: str) -> bool:
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    return tail.startswith(_SYNTAX_ERRORS)


def _passes(reported: Any, check: tuple, longest: int) -> bool:
    """Whether a value reported from the sandbox (a ``repr``) passes its test's check, made on it as plain data. A
    report longer than ``longest`` characters is not parsed (parsing attacker-sized text costs seconds)."""
    if not isinstance(reported, str) or len(reported) > longest:
        return False
    try:
        value = ast.literal_eval(reported)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    try:
        return bool(_decide(check, value))
    except Exception:  # e.g. ordering a list against a number, comparing deeply nested data
        return False


code_execution_reward = CodeExecutionReward(check_sandbox=False)
"""The default instance, ``--reward_funcs code_execution``: fraction of tests passed, default [`SandboxLimits`]."""

__all__ = [
    "HARNESS",
    "OUTCOMES",
    "CASE_OUTPUT_FACTOR",
    "CASE_OUTPUT_SLACK_BYTES",
    "PREDICATE_REPORT_CHARS",
    "ROW_WALL_FACTOR",
    "AssertPlan",
    "CodeExecutionReward",
    "StdioCase",
    "available_cpus",
    "build_assert_plan",
    "case_output_bytes",
    "code_execution_reward",
    "extract_program",
    "normalize_output",
    "parse_verification_info",
]
