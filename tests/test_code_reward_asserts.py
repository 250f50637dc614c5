"""How assert tests are split between the sandbox and the trainer: only the program's answer (``f(x)``) is computed
inside and brought out as plain data; every comparison, ``not``, ``+``/``-``, subscript, ``abs`` or ``round`` the test
applies to it is made outside on that plain value, or the whole test runs inside and is counted so. Hostile answers
(objects, subclasses of built-in types, ``nan``, huge ints) are scored through the public reward beside an honest
program and the plain value they stand for."""

from __future__ import annotations

import json
import shutil

import pytest

from trl_ada.rewards.code import CodeExecutionReward, build_assert_plan
from trl_ada.rewards.sandbox import INSTALL_HINT, SandboxLimits

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason=f"bubblewrap is not installed: {INSTALL_HINT}")

pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(90),
]


@pytest.fixture(scope="module")
def reward() -> CodeExecutionReward:
    limits = SandboxLimits(wall_time_s=5, cpu_time_s=3, memory_bytes=512 << 20, max_processes=16, output_bytes=1 << 16)
    return CodeExecutionReward(limits=limits, concurrency=2)


def kinds(tests: str) -> list[str]:
    plan = build_assert_plan(tests)
    return [kind for kind, _ in plan.steps if kind in ("value", "assert")]


def test_only_the_answer_enters_the_sandbox_and_the_test_is_decided_outside():
    decided_outside = {
        "assert f(3) == 9": "f(3)",
        "assert (f(3) > 8) == True": "f(3)",
        "assert 0 < f(2) < 5": "f(2)",
        "assert (4 in f(4)) == True": "f(4)",
        "assert f(5) not in (24, 26)": "f(5)",
        "assert not (f(2) != 4)": "f(2)",
        "assert abs(f(0.5) - 0.25) < 1e-9": "f(0.5)",
        "assert round(f(1.1), 2) == 1.21": "f(1.1)",
        "assert f(6) - 36 == 0": "f(6)",
        "assert f(3)[-1] == 3": "f(3)",
        "assert f(3)[1:] == [1, 2, 3]": "f(3)",
        # Builtins that hand the answer's code nothing of the test's run inside, on the answer: still its answer.
        "assert set(f((1, 1))) == {1}": "set(f((1, 1)))",
        "assert len(f(3)) > 2": "len(f(3))",
        "assert f(g(3)) == 1": "f(g(3))",
    }
    for test, answer in decided_outside.items():
        plan = build_assert_plan(test)
        assert plan.steps[-1] == ("value", answer), test
        assert len(plan.checks) == 1, test
    # The operands of the comparisons stay outside: a program reading the plan learns only which calls are made.
    sources = json.dumps(build_assert_plan("\n".join(decided_outside)).steps)
    for operand in ("> 8", "== True", "< 5", "in (24", "!= 4", "0.25", "1.21", "- 36", "[-1]", "[1:]", "> 2"):
        assert operand not in sources, operand
    # Whatever hands the answer's own code an operand of the test (an operator or method it could override, a key
    # function, a name bound from it by the tests) would let that code decide the test: run inside, counted so.
    decided_inside = [
        "assert f(3).startswith('a') == True",
        "assert f(3) * 2 == 6",
        "assert f(g(3) + 1) == 2",
        "assert sorted(f(3), key=len) == [1]",
        "assert f(1) < f(2)",
        "x = f(3) > 8\nassert x == True",
        "assert f(3) is None",
        "assert f(3)",
        "import math\nassert math.isclose(f(1), 2)",
    ]
    for test in decided_inside:
        assert kinds(test) == ["assert"], test


SQUARE_TESTS = [
    "assert (square(3) > 8) == True",
    "assert (square(3) < 10) == True",
    "assert (square(1) < 2) == True",
    "assert (square(4) >= 16) == True",
    "assert 0 < square(2) < 5",
    "assert square(5) in (25, 26)",
    "assert not (square(2) != 4)",
    "assert abs(square(0.5) - 0.25) < 1e-9",
    "assert round(square(1.1), 2) == 1.21",
    "assert square(6) - 36 == 0",
    "assert (4 in upto(4)) == True",
    "assert (9 in upto(4)) == False",
    "assert upto(3)[-1] == 3",
]
HONEST = "def square(x):\n    return x * x\ndef upto(n):\n    return list(range(n + 1))"
YES = (  # every operator answers what would pass; subtraction and abs give 0
    "    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n        return False\n"
    "    __lt__ = __le__ = __gt__ = __ge__ = __contains__ = __eq__\n"
    "    def __sub__(self, other):\n        return 0\n    __rsub__ = __sub__\n"
    "    def __abs__(self):\n        return 0\n    def __round__(self, digits=None):\n        return 1.21\n"
    "    def __getitem__(self, key):\n        return 3\n    def __hash__(self):\n        return 0\n"
    "    def __bool__(self):\n        return True\n    def __len__(self):\n        return 5\n"
)
HOSTILE = {
    "an object that answers yes to every operator": (
        f"class Yes:\n{YES}    def __iter__(self):\n        return iter(())\n"
        "def square(x):\n    return Yes()\ndef upto(n):\n    return Yes()"
    ),
    "int and list subclasses that answer yes": (
        f"class YesInt(int):\n{YES}class YesList(list):\n{YES}"
        "def square(x):\n    return YesInt(0)\ndef upto(n):\n    return YesList()"
    ),
    "a str subclass that answers yes": (
        f"class YesStr(str):\n{YES}def square(x):\n    return YesStr('')\ndef upto(n):\n    return YesStr('')"
    ),
    "nan": "def square(x):\n    return float('nan')\ndef upto(n):\n    return list(range(n + 1))",
    "an int too large to report": "def square(x):\n    return 10 ** 5000\ndef upto(n):\n    return list(range(n + 1))",
}
# The plain value each hostile program stands for, scored the same way: a subclass counts as its plain value.
PLAIN = {
    "int and list subclasses that answer yes": "def square(x):\n    return 0\ndef upto(n):\n    return []",
    "a str subclass that answers yes": "def square(x):\n    return ''\ndef upto(n):\n    return ''",
}


@needs_bwrap
def test_an_answer_cannot_decide_the_comparisons_made_on_it(reward):
    """An object whose `__gt__`, `__lt__`, `__contains__`, `__sub__`, ... answer whatever passes scored 1.0 on
    `(f(x) > 9) == True`-style tests when the comparison ran inside on it (a constant scored 0.33): the object is not
    plain data, so it fails; subclasses of `int`, `str` and `list` score what their plain value scores; `nan` and an
    int too long to report pass nothing about `square`."""
    names = list(HOSTILE)
    programs = [HOSTILE[name] for name in names] + [PLAIN[name] for name in PLAIN] + [HONEST]
    rewards = reward.score(programs, tests=[SQUARE_TESTS] * len(programs))
    scores = dict(zip(names + [f"plain: {name}" for name in PLAIN] + ["honest"], rewards))
    upto_only = 3 / len(SQUARE_TESTS)  # the three `upto` tests, which these programs answer honestly
    assert scores == {
        "an object that answers yes to every operator": 0.0,
        "int and list subclasses that answer yes": 3 / len(SQUARE_TESTS),  # `< 10`, `< 2`, `9 not in []`
        "a str subclass that answers yes": 0.0,
        "nan": upto_only,
        "an int too large to report": upto_only,
        **{f"plain: {name}": scores[name] for name in PLAIN},
        "honest": 1.0,
    }, scores
    assert reward.count_checks(SQUARE_TESTS) == {"value": len(SQUARE_TESTS), "assert": 0, "ignored": 0}


MBPP_SET_TESTS = [
    "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))",
    "assert len(similar_elements((1, 2, 3, 4),(5, 4, 3, 7))) == 2",
]


@needs_bwrap
def test_builtins_run_inside_on_the_answer_still_give_its_answer(reward):
    """`set(f(x))` and `len(f(x))` run inside but hand the answer's code nothing of the test's, so what they give is
    still the answer: elements equal to everything, with one hash, make a set of one element (the `set` test fails;
    the list's length is its honest 2)."""
    collapsing = (
        "class Same(int):\n    def __eq__(self, other):\n        return True\n"
        "    def __hash__(self):\n        return 0\n"
        "def similar_elements(a, b):\n    return [Same(4), Same(5)]"
    )
    honest = "def similar_elements(a, b):\n    return tuple(set(a) & set(b))"
    assert reward.score([collapsing, honest], tests=[MBPP_SET_TESTS] * 2) == [0.5, 1.0]
