"""The CPU code task (`trl_ada.tasks.code_synthesis`): the problem generator, the sandboxed reward it is scored by
(correct expressions 1; wrong, lookup and hostile ones 0), the warm-start builder, and a few steps of `seq_balance`
training on it."""

from __future__ import annotations

import os
import random
import re
import shutil
import sys
from pathlib import Path

import pytest

from trl_ada.rewards.sandbox import INSTALL_HINT, SandboxLimits
from trl_ada.tasks.code_synthesis import (
    LEVELS,
    NUM_HIDDEN,
    NUM_SHOWN,
    PROMPT_WIDTH,
    CodeSynthesisReward,
    build_warm_started_code_model,
    corrupt_expression,
    evaluate_expression,
    expression_program,
    extract_expression,
    held_out_problems,
    is_held_out,
    make_dataset,
    make_problems,
    pass_rate_by_level,
)

CI = os.environ.get("CI", "").lower() == "true"
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}")

LIMITS = SandboxLimits(wall_time_s=3, cpu_time_s=2, memory_bytes=256 << 20, max_processes=8, output_bytes=1 << 16)

# Every test: a wall-clock guard, and no bubblewrap process left behind (fixtures of conftest.py).
pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(60),
]


@pytest.fixture(scope="module")
def reward() -> CodeSynthesisReward:
    if not HAVE_BWRAP:
        pytest.fail(f"CI=true but bubblewrap is not installed: {INSTALL_HINT}")
    return CodeSynthesisReward(limits=LIMITS, concurrency=2)


def _pairs(tests: str) -> list[tuple[int, int]]:
    pairs = []
    for line in tests.splitlines():
        assert line.startswith("assert f(") and " == " in line
        call, expected = line.removeprefix("assert f(").split(") == ")
        pairs.append((int(call), int(expected)))
    return pairs


# ---------------------------------------------------------------------------------------------------------------------
# The generator (no sandbox)
# ---------------------------------------------------------------------------------------------------------------------


def test_generator_is_deterministic_balanced_and_split():
    first, again, other = make_problems(120, seed=3), make_problems(120, seed=3), make_problems(120, seed=4)
    assert first == again and first != other
    assert [sum(p["level"] == level for p in first) for level in range(len(LEVELS))] == [20] * len(LEVELS)
    assert make_problems(7, seed=0, levels=[2, 5])[0]["level"] in (2, 5)
    heldout = held_out_problems(120, seed=3)
    assert heldout == held_out_problems(120, seed=3)
    assert all(is_held_out(p["prompt"]) for p in heldout)
    assert not any(is_held_out(p["prompt"]) for p in make_problems(600, seed=5))
    assert {p["prompt"] for p in first}.isdisjoint(p["prompt"] for p in heldout)
    with pytest.raises(ValueError, match="level"):
        make_problems(3, seed=0, levels=[len(LEVELS)])


def test_problems_are_consistent_and_test_unshown_inputs():
    for problem in make_problems(300, seed=1) + held_out_problems(60, seed=1):
        prompt, solution = problem["prompt"], problem["solution"]
        assert len(prompt) == PROMPT_WIDTH and prompt.endswith("=")
        pairs = _pairs(problem["tests"])
        assert len(pairs) == NUM_SHOWN + NUM_HIDDEN
        shown = [(int(x), int(y)) for x, y in (item.split(":") for item in prompt[:-1].split(","))]
        assert pairs[:NUM_SHOWN] == shown  # the prompt shows the first four cases
        hidden = [x for x, _ in pairs[NUM_SHOWN:]]
        assert hidden == problem["hidden_inputs"] and not set(hidden) & {x for x, _ in shown}
        assert all(evaluate_expression(solution, x) == y for x, y in pairs)
        assert problem["entry_point"] == "f"
        if "abs(x-" in solution:  # the kink lies between the shown inputs
            c = int(solution.split("abs(x-")[1].split(")")[0])
            assert shown[0][0] < c < shown[-1][0]


def test_levels_are_graded_by_form():
    problems = make_problems(600, seed=2)
    forms = {level: {p["solution"] for p in problems if p["level"] == level} for level in range(len(LEVELS))}
    patterns = [
        r"\d|x[+-]\d",  # offset
        r"\d\*x",  # scale
        r"\d\*x[+-]\d",  # affine
        r"abs\(x-\d\)|x//\d",  # abs_floordiv
        r"x\*x([+-]\d)?|\d\*x\*x",  # quadratic
        r"\d\*abs\(x-\d\)|x\*x\+(\d\*)?x",  # composite
    ]
    for level, pattern in enumerate(patterns):
        assert forms[level] and all(re.fullmatch(pattern, s) for s in forms[level]), (LEVELS[level], forms[level])
    # More distinct hidden functions (and longer expressions) at the harder levels.
    lengths = [sum(len(s) for s in forms[level]) / len(forms[level]) for level in range(len(LEVELS))]
    assert lengths[0] < lengths[2] < lengths[5]


def test_corrupted_expressions_are_wrong_and_short():
    rng = random.Random(0)
    for problem in make_problems(120, seed=0):
        wrong = corrupt_expression(problem, rng)
        pairs = _pairs(problem["tests"])
        assert len(wrong) <= 12
        assert any(evaluate_expression(wrong, x) != y for x, y in pairs)


def test_dataset_has_the_columns_the_reward_reads():
    dataset = make_dataset(12, seed=0)
    assert {"prompt", "tests", "entry_point", "solution", "level"} <= set(dataset.column_names)
    assert len(make_dataset(6, seed=0, held_out=True)) == 6


def test_expression_program():
    assert extract_expression("2*x+1<eos>junk") == "2*x+1"
    assert extract_expression(" x-3 \nimport os") == "x-3"  # one line only
    assert extract_expression([{"role": "assistant", "content": "x*x"}]) == "x*x"
    assert expression_program("2*x+1") == "def f(x):\n    return (2*x+1)\n"


# ---------------------------------------------------------------------------------------------------------------------
# The sandboxed reward
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_reward_scores_right_wrong_lookup_and_hostile_expressions(reward):
    problem = next(p for p in make_problems(60, seed=0) if p["level"] == 2)  # affine, e.g. 3*x+1
    pairs = _pairs(problem["tests"])
    lookup = "".join(f"{y} if x=={x} else " for x, y in pairs[:NUM_SHOWN]) + "0"  # only the shown pairs
    everything_equal = "type('E',(),{'__eq__':lambda s,o:True,'__hash__':lambda s:0})()"
    completions = {
        "canonical": problem["solution"],
        "equivalent": f"({problem['solution']})+0",
        "with eos": problem["solution"] + "<eos>garbage",
        "wrong": corrupt_expression(problem, random.Random(1)),
        "lookup of the shown pairs": lookup,
        "syntax error": "2*x+",
        "runtime error": "1//0",
        "exit before the tests": "__import__('os')._exit(0)",
        "sys.exit": "__import__('sys').exit(0)",
        "equal to everything": everything_equal,
        "endless loop": "[i for i in iter(int, 1)]",
        "read the token": "len(open('/root/.cache/huggingface/token').read())",
        "fork": "__import__('os').fork() or x",
    }
    names = list(completions)
    scores = reward.score(list(completions.values()), tests=[problem["tests"]] * len(names))
    got = dict(zip(names, scores, strict=True))
    assert got["canonical"] == got["equivalent"] == got["with eos"] == 1.0
    assert all(got[name] == 0.0 for name in names[3:]), got
    outcomes = reward.reward.last_row_outcomes
    assert outcomes[names.index("syntax error")] == "syntax_error"
    assert outcomes[names.index("endless loop")] in ("timeout", "memory")
    assert reward.calls >= 1 and reward.completions >= len(names) and reward.seconds > 0


@needs_bwrap
def test_pass_rate_by_level_with_an_untrained_model(reward, tokenizer, tiny_model):
    problems = held_out_problems(12, seed=0)
    result = pass_rate_by_level(tiny_model, tokenizer, problems, reward=reward, temperature=1.0, num_samples=2, seed=0)
    assert result["num_completions"] == 24 and 1 <= result["distinct_runs"] <= 24
    assert 0.0 <= result["overall"] <= 1.0 and set(result["per_level"]) == set(range(len(LEVELS)))
    again = pass_rate_by_level(tiny_model, tokenizer, problems, reward=reward, temperature=1.0, num_samples=2, seed=0)
    assert again["overall"] == result["overall"]  # sampling is seeded


# ---------------------------------------------------------------------------------------------------------------------
# The warm start (tiny settings) and training
# ---------------------------------------------------------------------------------------------------------------------


def test_warm_start_builder_is_deterministic():
    from conftest import TINY_MODEL_KWARGS

    def build():
        model, tokenizer, report = build_warm_started_code_model(
            clean_steps=4, noisy_steps=2, batch_size=8, eval_problems=0, model_kwargs=TINY_MODEL_KWARGS
        )
        return model, report

    (first, report), (second, _) = build(), build()
    assert set(report["phases"]) == {"clean", "noisy"} and report["threads"] == 1
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        assert (a == b).all()


@needs_bwrap
@pytest.mark.wall_clock_limit(90)
def test_seq_balance_trains_on_the_task_with_the_sandboxed_reward(tmp_path, tokenizer, tiny_model, reward):
    from conftest import tiny_args

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer

    config = AdaGRPOConfig(
        **tiny_args(tmp_path, sampler="seq_balance", round_size=4, max_rounds=2, max_completion_length=12)
    )
    dataset = make_dataset(16, seed=0)
    before = reward.completions
    trainer = AdaGRPOTrainer(tiny_model, [reward], args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "ada/samples_per_prompt/mean" in entry]
    assert len(logged) == 3  # one entry per step
    for entry in logged:
        assert 4 <= entry["ada/samples_per_prompt/mean"] <= 8  # rounds of 4, at most 2
        assert 0.0 <= entry["ada/zero_variance_share/first_n"] <= 1.0
        assert "code_execution/syntax_error" in entry and "rewards/code_synthesis_reward/mean" in entry
    drawn = sum(entry["ada/samples_per_prompt/mean"] * 2 for entry in logged)  # 2 prompts per step
    assert reward.completions - before == drawn  # every completion drawn was run in the sandbox, once


def test_benchmark_report_from_synthetic_runs(tmp_path):
    """The benchmark's report code (summary, paired differences against DAPO, table) on made-up runs, no training."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import code_learning

    def run(method, seed, final):
        curve = [
            {"step": 0, "heldout": 0.4, "levels": {"0": 0.5}, "samples": 0.0, "train_seconds": 0.0},
            {"step": 10, "heldout": final, "levels": {"0": final}, "samples": 400.0, "train_seconds": 20.0},
        ]
        steps = [{"reward_seconds": 1.0, "completions": 40.0, "step_time": 2.0, "share": 0.5}] * 10
        return {
            "method": method,
            "label": method,
            "seed": seed,
            "curve": curve,
            "per_step": steps,
            "median_step_seconds": 2.0,
            "median_reward_share": 0.5,
            "reward_concurrency": 2,
        }

    runs = [run(m, s, 0.5 + 0.01 * s + (0.02 if m == "dapo" else 0)) for m in code_learning.METHODS for s in (0, 1)]
    summary = code_learning.summarize(runs, [{**runs[0], "source": "short runs"}])
    assert summary["paired_vs_dapo"]["grpo_n4"]["mean"] == pytest.approx(-0.02)
    assert summary["methods"]["dapo"]["final_heldout"]["n"] == 2
    text = code_learning.table(
        summary,
        {"steps": 10, "prompts_per_step": 8, "learning_rate": 2e-4, "heldout_size": 30, "eval_samples": 1},
    )
    assert "| GRPO n=4 - DAPO |" not in text and "grpo_n4 - DAPO" in text and "share" in text
