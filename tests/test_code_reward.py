"""The code-execution reward (`trl_ada.rewards.code`): program extraction, the two test formats, outcome counts, and
programs that try to mark their own tests as passed (each must get its honest score while a correct program scores 1
in the same batch)."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import threading
import time

import pytest

from trl_ada.rewards.code import (
    CodeExecutionReward,
    build_assert_plan,
    code_execution_reward,
    extract_program,
    normalize_output,
    parse_verification_info,
)
from trl_ada.rewards.sandbox import INSTALL_HINT, SandboxLimits, SandboxResult

CI = os.environ.get("CI", "").lower() == "true"
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}")

LIMITS = SandboxLimits(wall_time_s=5, cpu_time_s=3, memory_bytes=512 << 20, max_processes=16, output_bytes=1 << 16)


# Every test: a wall-clock guard, and no bubblewrap process left behind (fixtures of conftest.py).
pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(90),
]


@pytest.fixture(scope="module")
def reward() -> CodeExecutionReward:
    if not HAVE_BWRAP:
        pytest.fail(f"CI=true but bubblewrap is not installed: {INSTALL_HINT}")
    return CodeExecutionReward(limits=LIMITS, concurrency=2)


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\nIt adds the numbers."


ADD_TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0\nassert add(10, 5) == 15\nassert 7 == add(3, 4)"
ADD = "def add(a, b):\n    return a + b"


def stdio_info(*pairs: tuple[str, str], as_json: bool = True):
    info = {
        "language": "python",
        "test_cases": [{"type": "stdin_stdout", "input": i, "output": o} for i, o in pairs],
    }
    return json.dumps(info) if as_json else info


SUM_INFO = stdio_info(("1 2\n", "3\n"), ("5 5\n", "10\n"), ("-4 1\n", "-3"))
SUM = "a, b = map(int, input().split())\nprint(a + b)"


# ---------------------------------------------------------------------------------------------------------------------
# Parsing (no sandbox)
# ---------------------------------------------------------------------------------------------------------------------


def test_extract_program():
    assert extract_program(fenced("x = 1")) == "x = 1\n"
    two = "```python\nfirst\n```\ntext\n```py\nsecond\n```\n```text\noutput\n```"
    assert extract_program(two) == "second\n"  # the last Python block, not the trailing output block
    assert extract_program("```\nplain\n```") == "plain\n"
    assert extract_program("no fences: print(1)") == "no fences: print(1)"
    assert extract_program("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # truncated
    assert extract_program([{"role": "assistant", "content": fenced("y = 2")}]) == "y = 2\n"


def test_verification_info_and_output_normalisation():
    assert parse_verification_info(SUM_INFO)[1].output == "10\n"
    assert parse_verification_info(stdio_info(("a", "b"), as_json=False))[0].input == "a"
    assert parse_verification_info({"language": "cpp", "test_cases": [{"input": "", "output": ""}]}) is None
    assert parse_verification_info({"language": "python", "test_cases": [{"type": "fn_call"}]}) is None
    with pytest.raises(ValueError, match="JSON"):
        parse_verification_info("{not json")
    assert normalize_output("\n3  \r\n4\n\n") == normalize_output("3\n4") == ["3", "4"]
    assert normalize_output("3 4") != normalize_output("34")


def test_assert_plan_keeps_expected_values_out_of_the_sandbox():
    plan = build_assert_plan(
        "import math\nassert add(1, 2) == 3\nassert 5 == add(2, 3)\nassert math.isclose(add(0.1, 0.2), 0.3)"
    )
    kinds = [kind for kind, _ in plan.steps]
    assert kinds == ["import", "setup", "value", "value", "assert"]
    assert plan.steps[0] == ("import", "add")  # the tests see the program's `add`, not its other globals
    sources = json.dumps(plan.steps)
    assert "== 3" not in sources and "5 ==" not in sources  # only the expressions enter the sandbox
    assert dict(plan.checks) == {
        2: ("compare", ("answer",), (("==", ("const", 3)),)),
        3: ("compare", ("const", 5), (("==", ("answer",)),)),
    }
    humaneval = (
        "METADATA = {}\n\ndef check(candidate):\n    assert candidate([1, 2]) == [2, 1]\n"
        "    assert abs(candidate([0])[0]) < 1\n    assert candidate([0]).count(0) == 1\n\ncheck(rev)"
    )
    plan = build_assert_plan(humaneval, "rev")
    # `abs(...[0]) < 1` is computed outside on the answer's plain value; a method of the answer runs inside.
    assert [kind for kind, _ in plan.steps] == ["import", "setup", "setup", "value", "value", "assert"]
    assert plan.steps[4] == ("value", "candidate([0])")
    assert plan.steps[2] == ("setup", "candidate = rev")
    assert build_assert_plan(humaneval) == plan  # the entry point read from `check(rev)`
    # MBPP's `set(...) == set(...)`: the expected side is built outside, from literals and the builtins.
    plan = build_assert_plan("assert set(similar_elements((3, 4), (4, 5))) == set((4,))")
    assert plan.steps[1] == ("value", "set(similar_elements((3, 4), (4, 5)))")
    assert plan.checks == ((1, ("compare", ("answer",), (("==", ("const", {4})),))),)
    assert build_assert_plan("x = 1") is None
    with pytest.raises(ValueError, match="does not parse"):
        build_assert_plan("assert (")


def test_bad_configuration_fails_at_construction():
    with pytest.raises(ValueError, match="concurrency"):
        CodeExecutionReward(concurrency=0, check_sandbox=False)
    with pytest.raises(ValueError, match="isolation"):
        CodeExecutionReward(isolation="docker", check_sandbox=False)
    with pytest.raises(ValueError, match="column"):
        CodeExecutionReward(tests_column="", check_sandbox=False)


def test_missing_bubblewrap_fails_with_the_install_command(monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        CodeExecutionReward()
    lazy = CodeExecutionReward(check_sandbox=False)  # the default instance's way: fails at its first call instead
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        lazy.score([ADD], tests=[ADD_TESTS])


def test_registered_by_name_async_and_picklable():
    from trl.trainer.utils import get_callable_name, is_async_callable

    from trl_ada.rewards import REWARD_FUNCS, get_reward_funcs

    assert get_reward_funcs(["code_execution"]) == [code_execution_reward] == [REWARD_FUNCS["code_execution"]]
    assert is_async_callable(code_execution_reward)  # TRL awaits it
    assert get_callable_name(code_execution_reward) == "code_execution_reward"
    clone = pickle.loads(pickle.dumps(CodeExecutionReward(limits=LIMITS, all_or_nothing=True, check_sandbox=False)))
    assert clone.all_or_nothing and clone.limits == LIMITS


# ---------------------------------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_correct_programs_score_one_in_both_formats(reward):
    completions = [fenced(ADD), [{"role": "assistant", "content": fenced(SUM)}], "def sq(x):\n    return x * x"]
    humaneval = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == 9\n\ncheck(sq)\n"
    rewards = reward.score(
        completions,
        tests=[ADD_TESTS, None, humaneval],
        verification_info=[None, SUM_INFO, None],
        entry_point=[None, None, "sq"],
    )
    assert rewards == [1.0, 1.0, 1.0], reward.last_outcomes
    assert reward.last_outcomes == {"passed": 3}


@needs_bwrap
def test_fraction_all_or_nothing_and_outcomes(reward):
    half = "def add(a, b):\n    return a + b if a > 0 else 0"  # passes add(1,2), add(10,5), add(3,4); fails add(-1,1)?
    wrong_sum = "a, b = map(int, input().split())\nprint(a + b if a > 0 else 0)"
    kwargs = dict(tests=[ADD_TESTS, None], verification_info=[None, SUM_INFO])
    logged = {}
    rewards = reward.score([half, wrong_sum], log_metric=lambda name, value: logged.__setitem__(name, value), **kwargs)
    assert rewards == [1.0, 2 / 3]  # add(-1, 1) == 0 happens to hold; -4 + 1 is printed as 0
    assert reward.last_outcomes == {"passed": 1, "wrong_answer": 1}
    assert logged["code_execution/wrong_answer"] == 0.5 and logged["code_execution/timeout"] == 0.0
    strict = CodeExecutionReward(limits=LIMITS, all_or_nothing=True)
    assert strict.score([half, wrong_sum], **kwargs) == [1.0, 0.0]


@needs_bwrap
def test_failures_are_scored_zero_and_counted(reward):
    slow = LIMITS.__class__(wall_time_s=1.5, cpu_time_s=1, memory_bytes=256 << 20, output_bytes=1 << 14)
    tight = CodeExecutionReward(limits=slow, concurrency=2)
    completions = [
        "def add(a, b) return a + b",  # syntax error
        "def add(a, b):\n    return a / 0",  # runtime error
        "def add(a, b):\n    while True:\n        pass",  # timeout
        "def add(a, b):\n    return bytearray(1 << 33)",  # memory
        "def add(a, b):\n    while True:\n        print('x' * 100)",  # output limit
        ADD,
    ]
    start = time.monotonic()
    rewards = tight.score(completions, tests=[ADD_TESTS] * len(completions))
    assert time.monotonic() - start < 15
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert tight.last_outcomes == {
        "syntax_error": 1,
        "runtime_error": 1,
        "timeout": 1,
        "memory": 1,
        "output_limit": 1,
        "passed": 1,
    }
    stdio = tight.score(["x = (", "while True: pass", SUM], verification_info=[SUM_INFO] * 3)
    assert stdio == [0.0, 0.0, 1.0]
    assert tight.last_outcomes == {"syntax_error": 1, "timeout": 1, "passed": 1}
    assert tight.outcomes["passed"] == 2  # running totals


@needs_bwrap
def test_rows_without_tests_are_not_applicable(reward, caplog):
    assert reward.score([ADD], verification_info=[{"language": "rust", "test_cases": []}]) == [None]
    with caplog.at_level("WARNING", logger="trl_ada.rewards.code"):
        assert reward.score([ADD]) == [None]
    assert "neither" in caplog.text
    assert reward.last_outcomes == {"not_applicable": 1}
    with pytest.raises(ValueError, match="values of 'tests'"):
        reward.score([ADD, ADD], tests=[ADD_TESTS])


# ---------------------------------------------------------------------------------------------------------------------
# Programs that try to mark their own tests as passed
# ---------------------------------------------------------------------------------------------------------------------

ASSERT_HACKS = {
    "sys.exit(0) before the asserts": "import sys\nsys.exit(0)",
    "os._exit(0) before the asserts": "import os\nos._exit(0)",
    "exit from inside the tested function": "import os\ndef add(a, b):\n    os._exit(0)",
    "an object equal to everything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def add(a, b):\n    return Anything()"
    ),
    "an int subclass equal to everything": (
        "class Anything(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Anything(12345)"
    ),
    "a bytes subclass whose repr and bytes() lie": (
        "class Liar(bytes):\n    def __repr__(self):\n        return '3'\n    def __bytes__(self):\n        return self\n"
        "def add(a, b):\n    return Liar(b'x')"
    ),
    "disabled assert and AssertionError": (
        "import builtins\nbuiltins.AssertionError = type('Never', (Exception,), {})\ndef add(a, b):\n    return None"
    ),
    "patched builtins and json": (
        "import builtins, json\nbuiltins.repr = lambda value: '3'\njson.dumps = lambda record: '{\"i\": 0, \"ok\": true}'\n"
        "def add(a, b):\n    return None"
    ),
    "forged records on the channel": (
        "import os, json\nfd = int(os.environ['SANDBOX_CHANNEL_FD'])\n"
        "for i in range(20):\n"
        "    for guess in (0, 1, 3, 15):\n"
        "        os.write(fd, (json.dumps({'i': i, 'ok': True}) + '\\n').encode())\n"
        "        os.write(fd, (json.dumps({'i': i, 'repr': repr(guess)}) + '\\n').encode())\n"
        "def add(a, b):\n    return 0"
    ),
    "reads the harness and the plan to find the expected values": (
        "import glob, json, re\ntext = ''.join(open(p).read() for p in glob.glob('/tmp/*'))\n"
        "numbers = [int(n) for n in re.findall(r'== (-?\\d+)', text)]\n"
        "answers = iter(numbers)\n"
        "def add(a, b):\n    return next(answers, -999)"
    ),
    "inspects the caller's frame for the expected value": (
        "import sys\ndef add(a, b):\n    frame = sys._getframe(1)\n"
        "    return [c for c in frame.f_code.co_consts if isinstance(c, int)][-1:] or [None]"
    ),
}


@needs_bwrap
def test_programs_cannot_mark_their_own_assert_tests_passed(reward):
    names = list(ASSERT_HACKS)
    completions = [ASSERT_HACKS[name] for name in names] + [ADD]
    start = time.monotonic()
    rewards = reward.score(completions, tests=[ADD_TESTS] * len(completions))
    assert time.monotonic() - start < 30
    scores = dict(zip(names + ["correct"], rewards))
    assert scores.pop("correct") == 1.0
    assert scores == {name: 0.0 for name in names}, scores


@needs_bwrap
def test_a_non_literal_assert_is_checked_inside_and_reported_so(reward):
    """The documented limit: an assert that is not decided outside runs in the program's interpreter, so a program
    that patches a module the test imports, reaches the tests' namespace through its caller's frame, or forges its
    pass records and sinks the harness's (`os.dup2` over the channel), passes it. `count_checks` exposes how many
    tests of a row are of that kind."""
    tests = "import math\nassert math.isclose(add(0.1, 0.2), 0.3)\nassert add(1, 2) == 3"
    assert reward.count_checks(tests) == {"value": 1, "assert": 1, "ignored": 0}
    forger = (
        "import os, json\nfd = int(os.environ['SANDBOX_CHANNEL_FD'])\n"
        "for i in range(8):\n    os.write(fd, (json.dumps({'i': i, 'ok': True}) + '\\n').encode())\n"
        "def add(a, b):\n    return 0"
    )
    patcher = "import math\nmath.isclose = lambda *a, **k: True\ndef add(a, b):\n    return 0"
    abs_tests = (  # in loops, so run inside
        "for a, b, s in [(5, 5, 10)]:\n    assert abs(add(a, b) - s) < 1e-9\n"
        "for a, b, s in [(1, 2, 3)]:\n    assert abs(add(a, b) - s) < 1e-9"
    )
    frame_walker = "import sys\ndef add(a, b):\n    sys._getframe(1).f_globals['abs'] = lambda x: 0\n    return 0"
    # The forged records and the harness's own make two records for each test: they fail. Patching `math.isclose`
    # passes that test; the `== 3` test holds in both. The frame walker's first call comes after `abs` was looked
    # up (that test fails); the second test sees its `abs`.
    rewards = reward.score([forger, patcher, ADD, frame_walker, ADD], tests=[tests] * 3 + [abs_tests] * 2)
    assert rewards == [0.0, 0.5, 1.0, 0.5, 1.0]


@needs_bwrap
def test_hostile_programs_score_zero_next_to_a_correct_one(reward, monkeypatch, tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_test_secret")
    monkeypatch.setenv("HF_TOKEN", "hf_test_secret")
    hostile = {
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "memory bomb": "x = [bytearray(1 << 24) for _ in range(1000)]",
        "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\ndef add(a, b):\n    return None",
        "token thief": (
            f"import os\nsecret = os.environ.get('HF_TOKEN') or open({str(token)!r}).read()\n"
            "def add(a, b):\n    return secret"
        ),
        "kills its parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)",
    }
    tight = CodeExecutionReward(limits=SandboxLimits(wall_time_s=2, cpu_time_s=2, max_processes=16), concurrency=2)
    start = time.monotonic()
    rewards = tight.score([*hostile.values(), ADD], tests=[ADD_TESTS] * (len(hostile) + 1))
    assert time.monotonic() - start < 20
    assert dict(zip([*hostile, "correct"], rewards)) == {**{name: 0.0 for name in hostile}, "correct": 1.0}


STDIO_INFO = stdio_info(("1 2\n", "3\n"), ("20 22\n", "42\n"), ("0 0\n", "0\n"))
STDIO_HACKS = {
    "prints the first case's expected output": "print(3)",
    "exits 0 without output": "import sys\nsys.exit(0)",
    "searches the filesystem for the expected outputs": (
        "import os\nfound = []\nfor root in ('/tmp', '/', '/proc/1'):\n"
        "    try:\n        found += os.listdir(root)\n    except OSError:\n        pass\n"
        "for name in os.listdir('/tmp'):\n    print(open('/tmp/' + name).read())\n"
        "print(open('/proc/1/cmdline').read())\nprint(found)"
    ),
    "prints every plausible answer": "print('\\n'.join(str(i) for i in range(100)))",
}


@needs_bwrap
def test_stdio_programs_see_only_their_own_input(reward):
    names = list(STDIO_HACKS)
    completions = [STDIO_HACKS[name] for name in names] + [SUM]
    rewards = reward.score(completions, verification_info=[STDIO_INFO] * len(completions))
    scores = dict(zip(names + ["correct"], rewards))
    assert scores == {
        "prints the first case's expected output": 1 / 3,  # its honest score: it is right on that case only
        "exits 0 without output": 0.0,
        "searches the filesystem for the expected outputs": 0.0,
        "prints every plausible answer": 0.0,
        "correct": 1.0,
    }


@needs_bwrap
def test_concurrency_bounds_the_sandboxes_running_at_once():
    reward = CodeExecutionReward(limits=LIMITS, concurrency=2)
    sandbox = reward.sandbox
    running, peak, lock = [0], [0], threading.Lock()
    original = sandbox.run

    def counting_run(*args, **kwargs):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    sandbox.run = counting_run
    program = "import time\ntime.sleep(0.3)\n" + SUM
    rewards = reward.score([program] * 3, verification_info=[SUM_INFO] * 3)
    assert rewards == [1.0, 1.0, 1.0]
    assert peak[0] == 2


@needs_bwrap
def test_awaited_inside_a_running_event_loop_like_trl(reward):
    async def main():
        return await asyncio.gather(reward([ADD], tests=[ADD_TESTS]), reward([SUM], verification_info=[SUM_INFO]))

    assert asyncio.run(main()) == [[1.0], [1.0]]


@needs_bwrap
def test_unpickled_reward_scores_in_a_spawned_process(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        result = pool.apply_async(_score_in_child, (pickle.dumps(CodeExecutionReward(limits=LIMITS)),))
        assert result.get(timeout=60) == [1.0, 0.0]


def _score_in_child(payload: bytes):
    reward = pickle.loads(payload)
    return reward.score([ADD, "import sys\nsys.exit(0)"], tests=[ADD_TESTS, ADD_TESTS])


@needs_bwrap
def test_trains_under_ada_grpo_trainer_as_an_async_reward(tmp_path, tokenizer, arithmetic_dataset):
    """One step of AdaGRPOTrainer on the tiny model with the reward awaited on TRL's event loop; the outcome shares
    reach the trainer's logs through `log_metric`."""
    from conftest import TINY_MODEL_KWARGS, tiny_args

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tiny import build_tiny_model

    reward = CodeExecutionReward(limits=LIMITS)
    dataset = arithmetic_dataset.select(range(8)).map(lambda row: {"tests": "assert f() == 1"})
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=1, max_rounds=2, round_size=4))
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(model, [reward], args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    logged = {key: value for entry in trainer.state.log_history for key, value in entry.items()}
    assert sum(reward.last_outcomes.values()) > 0
    shares = [logged[f"code_execution/{outcome}"] for outcome in ("passed", "syntax_error", "runtime_error")]
    assert all(0.0 <= share <= 1.0 for share in shares)
    assert "rewards/code_execution_reward/mean" in logged


def test_trainer_with_code_execution_and_no_bubblewrap_fails_before_the_model_loads(monkeypatch, tmp_path):
    """`reward_funcs="code_execution"` builds the sandbox at trainer construction: a missing bubblewrap names the
    install command before GRPOTrainer loads anything (the model id below does not exist)."""
    from conftest import tiny_args

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name, *a, **k))
    monkeypatch.setattr(code_execution_reward, "_sandbox", None)  # as in a fresh process
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        AdaGRPOTrainer(
            "no-such-org/no-such-model",
            reward_funcs="code_execution",
            args=AdaGRPOConfig(**tiny_args(tmp_path, max_steps=1)),
            train_dataset=[{"prompt": "p", "tests": "assert True"}],
        )


# ---------------------------------------------------------------------------------------------------------------------
# What the tests run against, when a run counts, and what the reward does with what it cannot judge
# ---------------------------------------------------------------------------------------------------------------------

HUMANEVAL_TESTS = (
    "METADATA = {'author': 'jt'}\n\n\ndef check(candidate):\n"
    "    assert candidate([1, 2, 3]) == 6\n"
    "    assert True, 'This prints if this assert fails 1 (good for debugging!)'\n"
    "    assert candidate([]) == 0\n"
    "    assert True, 'This prints if this assert fails 2 (also good for debugging!)'\n"
    "    assert abs(candidate([0.5, 0.25]) - 0.75) < 1e-9\n"
)


@needs_bwrap
def test_asserts_that_do_not_exercise_the_candidate_are_not_tests(reward):
    """`assert True, "..."` in HumanEval's `check` is no test (an empty function scored 0.4 on it), and a `check`
    nothing names an entry point for cannot be run against the program: `None`, not the 1.0 `print('hello')` got."""
    assert reward.count_checks(HUMANEVAL_TESTS, "total") == {"value": 3, "assert": 0, "ignored": 2}
    assert build_assert_plan(HUMANEVAL_TESTS) is None  # no entry point: no column value, no `check(name)` call
    assert build_assert_plan("assert True\nassert 1 + 1 == 2") is None  # asserts, none of them about a program
    honest = "def total(xs):\n    return sum(xs)"
    rewards = reward.score(
        ["def total(xs):\n    pass", honest, "print('hello')", "print('hello')"],
        tests=[HUMANEVAL_TESTS] * 4,
        entry_point=["total", "total", None, ""],
    )
    assert rewards == [0.0, 1.0, None, None]
    assert reward.last_row_outcomes == ["wrong_answer", "passed", "not_applicable", "not_applicable"]


REBINDING_TESTS = (  # in loops, so that `abs` and `sorted` are computed inside
    "for x, y in [(-4, -2)]:\n    assert abs(half(x) - y) < 1e-9\n"
    "for x, y in [(3, 1.5)]:\n    assert abs(half(x) - y) < 1e-9\n"
    "for xs in [[4, 1, 2]]:\n    assert sorted(evens(xs)) in ([2, 4],)"
)
MBPP_TASK_2_TESTS = [  # verbatim
    "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
    "assert set(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == set((3, 4))",
    "assert set(similar_elements((11, 12, 14, 13),(17, 15, 14, 13))) == set((13, 14))",
]
REBINDING_HACKS = {
    "its own `set`, equal to everything (MBPP task 2)": (
        "class set:\n    def __init__(self, *args):\n        pass\n    def __eq__(self, other):\n        return True\n"
        "def similar_elements(a, b):\n    return ()"
    ),
    "rebinds `abs` and `sorted` in its globals": (
        "abs = lambda x: 0\nsorted = lambda xs: [2, 4]\ndef half(x):\n    return 0\ndef evens(xs):\n    return []"
    ),
    "rebinds `abs` and `sorted` module-wide": (
        "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.sorted = lambda xs: [2, 4]\n"
        "def half(x):\n    return 0\ndef evens(xs):\n    return []"
    ),
}


@needs_bwrap
def test_a_program_cannot_rebind_what_the_tests_compute_with(reward):
    """The tests run in a namespace of their own (only the program's tested names imported, builtins copied before
    the program ran), so a program's own `set`, `abs` or `sorted`, in its globals or in `builtins`, gains nothing."""
    assert reward.count_checks(REBINDING_TESTS) == {"value": 0, "assert": 3, "ignored": 0}  # all decided inside
    honest_half = "def half(x):\n    return x / 2\ndef evens(xs):\n    return [x for x in xs if x % 2 == 0]"
    honest_similar = "def similar_elements(a, b):\n    return tuple(set(a) & set(b))"
    names = list(REBINDING_HACKS)
    rewards = reward.score(
        [*REBINDING_HACKS.values(), honest_half, honest_similar],
        tests=[MBPP_TASK_2_TESTS, REBINDING_TESTS, REBINDING_TESTS, REBINDING_TESTS, MBPP_TASK_2_TESTS],
    )
    assert dict(zip([*names, "honest half", "honest similar"], rewards)) == {
        **{name: 0.0 for name in names},
        "honest half": 1.0,
        "honest similar": 1.0,
    }


@needs_bwrap
def test_passing_then_spinning_until_the_wall_limit_is_a_timeout():
    """Every test reports a pass, then an `atexit` handler (and a forked child) spin: the run does not end in time,
    so it fails, as a stdin/stdout case that does not end does."""
    short = CodeExecutionReward(limits=SandboxLimits(wall_time_s=1.5, cpu_time_s=5), concurrency=2)
    spinner = (
        ADD + "\nimport atexit, os\ndef spin():\n    os.fork()\n    while True:\n        pass\natexit.register(spin)"
    )
    start = time.monotonic()
    assert short.score([spinner, ADD], tests=[ADD_TESTS] * 2) == [0.0, 1.0]
    assert short.last_row_outcomes == ["timeout", "passed"]
    assert time.monotonic() - start < 10


def test_an_expected_output_of_zero_is_not_the_empty_string():
    cases = parse_verification_info(
        {"test_cases": [{"input": 0, "output": 0}, {"input": None, "output": 0.0}, {"output": False}]}
    )
    assert [(case.input, case.output) for case in cases] == [("0", "0"), ("", "0.0"), ("", "False")]


@needs_bwrap
def test_a_program_that_prints_nothing_fails_an_expected_zero(reward):
    info = {"language": "python", "test_cases": [{"type": "stdin_stdout", "input": "5\n", "output": 0}]}
    assert reward.score(["pass", "print(int(input()) % 5)"], verification_info=[info] * 2) == [0.0, 1.0]


class _SandboxThatDoesNotStart:
    limits = SandboxLimits()

    def with_limits(self, limits: SandboxLimits) -> _SandboxThatDoesNotStart:
        return self

    def run(self, *args, **kwargs) -> SandboxResult:
        return SandboxResult("sandbox_error", None, detail="bwrap: setting up uid map: Permission denied")


def test_a_sandbox_that_fails_to_start_scores_none_counted_and_warned(caplog):
    """No program ran, so there is no verdict: `None` (unscorable, which the samplers count as neither positive nor
    negative), not 0.0; counted as `sandbox_error` and warned."""
    broken = CodeExecutionReward(check_sandbox=False)
    broken._sandbox = _SandboxThatDoesNotStart()
    logged = {}
    with caplog.at_level("WARNING", logger="trl_ada.rewards.code"):
        rewards = broken.score(
            [ADD, SUM],
            tests=[ADD_TESTS, None],
            verification_info=[None, SUM_INFO],
            log_metric=lambda name, value: logged.__setitem__(name, value),
        )
    assert rewards == [None, None]
    assert broken.last_outcomes == {"sandbox_error": 2} and broken.last_row_outcomes == ["sandbox_error"] * 2
    assert logged["code_execution/sandbox_error"] == 1.0
    assert "could not be run" in caplog.text and "None" in caplog.text


@needs_bwrap
def test_a_huge_reported_value_is_a_wrong_answer_judged_off_the_event_loop():
    """A program returning a ~200 kB value for an expected `3`: it is rejected by its length, before any parsing,
    in the executor, and the trainer's event loop keeps running (a heartbeat's longest gap stays short; parsing it on
    the loop stalled it about a second per completion)."""
    roomy = CodeExecutionReward(
        limits=SandboxLimits(wall_time_s=10, cpu_time_s=5, output_bytes=1 << 20), concurrency=2
    )
    program = "def add(a, b):\n    return [[0]] * 40000"
    extract_program(program)  # any one-time cost of a first call is paid before the gaps below are timed

    async def main():
        gaps, done = [], asyncio.Event()

        async def heartbeat():
            last = time.monotonic()
            while not done.is_set():
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        beat = asyncio.create_task(heartbeat())
        try:
            rewards = await roomy([program] * 2, tests=["assert add(1, 2) == 3"] * 2)
        finally:
            done.set()
            await beat
        return rewards, max(gaps)

    rewards, longest_gap = asyncio.run(main())
    assert rewards == [0.0, 0.0] and roomy.last_outcomes == {"wrong_answer": 2}
    assert longest_gap < 1.0, longest_gap  # 0.12 s measured on a busy 2-core machine; 4-5 s without the fix


def test_available_cpus_reads_the_affinity_and_the_cgroup_quota(monkeypatch, tmp_path):
    from trl_ada.rewards import code as code_reward

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    proc = tmp_path / "cgroup"
    root = tmp_path / "fs"
    (root / "outer" / "job").mkdir(parents=True)
    monkeypatch.setattr(code_reward, "_PROC_SELF_CGROUP", str(proc))
    monkeypatch.setattr(code_reward, "_CGROUP_ROOT", str(root))
    assert code_reward.available_cpus() == 6  # no /proc/self/cgroup: the affinity mask
    proc.write_text("0::/outer/job\n")
    (root / "outer" / "job" / "cpu.max").write_text("max 100000\n")
    assert code_reward.available_cpus() == 6  # no quota
    (root / "outer" / "cpu.max").write_text("250000 100000\n")
    assert code_reward.available_cpus() == 3  # a parent's 2.5 CPUs, rounded up
    (root / "outer" / "job" / "cpu.max").write_text("50000 100000\n")
    assert code_reward.available_cpus() == 1  # the smallest quota on the way up; never below one
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    (root / "outer" / "job" / "cpu.max").write_text("max 100000\n")
    assert code_reward.available_cpus() == 1  # the affinity mask, under the quota
    proc.write_text("12:cpu,cpuacct:/docker/abc\n")  # cgroup v1 only: its quota is not read
    assert code_reward.available_cpus() == 1
    assert CodeExecutionReward(check_sandbox=False).concurrency == 1  # the default concurrency


@needs_bwrap
def test_the_readme_direct_call_example_runs():
    """The README's example of calling the reward outside a trainer (an async callable: `score` is the sync form)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "code-rl.md").read_text()
    section = readme.split("# Code: a sandboxed code-execution reward", 1)[1].split("\n## ", 1)[0]
    example = re.findall(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)[0]
    assert "reward.score(" in example
    exec(compile(example, "docs/code-rl.md", "exec"), {})


def test_code_task_evaluation_refuses_to_report_a_rate_from_unscorable_programs(monkeypatch):
    """The CPU code task's `pass_rate_by_level` read every reward as a float: with the sandbox down (`None`) it
    names the cause instead of failing on `float(None)` (or, before, reporting a 0.0 pass rate)."""
    from trl_ada.tasks import code_synthesis

    broken = CodeExecutionReward(check_sandbox=False)
    broken._sandbox = _SandboxThatDoesNotStart()
    problems = code_synthesis.make_problems(2, seed=0)
    monkeypatch.setattr(
        code_synthesis, "sample_completions", lambda model, tokenizer, prompts, **kw: ["x"] * len(prompts)
    )
    with pytest.raises(RuntimeError, match="sandbox failed to start"):
        code_synthesis.pass_rate_by_level(
            None, None, problems, reward=code_synthesis.CodeSynthesisReward(broken), temperature=0.0
        )
