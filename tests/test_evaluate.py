"""trl_ada.reporting.metrics (pass@k, Ave@k, bands) and scripts/evaluate.py."""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from conftest import TINY_MODEL_KWARGS, write_jsonl

from trl_ada.reporting.metrics import (
    PassRateBand,
    average_at_k,
    count_correct,
    mean_pass_at_k,
    pass_at_k,
    pass_rate_histogram,
    weighted_average,
)
from trl_ada.tasks.arithmetic import held_out_problems
from trl_ada.tiny import TINY_ARITH_ASSETS, build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "evaluate.py"
TINY = TINY_MODEL_KWARGS
ENV = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def load_script():
    spec = importlib.util.spec_from_file_location("evaluate_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def evaluate_script():
    # The code of `trl-ada evaluate`; scripts/evaluate.py is a thin entry over it (tested below).
    return importlib.import_module("trl_ada.cli.evaluate")


# ---------------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------------


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Share of the k-subsets of n samples (c correct) that contain at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in subset) for subset in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(float(brute_force_pass_at_k(n, c, k)), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_form_and_edges():
    assert pass_at_k(16, 3, 4) == pytest.approx(1 - math.comb(13, 4) / math.comb(16, 4))
    assert pass_at_k(256, 1, 1) == pytest.approx(1 / 256)
    assert pass_at_k(10, 0, 10) == 0.0 and pass_at_k(10, 1, 10) == 1.0
    for bad in [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_pass_at_1_equals_ave():
    counts = [0, 3, 7, 8, 1]
    assert mean_pass_at_k(counts, 8, 1) == pytest.approx(average_at_k(counts, 8))
    assert average_at_k(counts, 8) == pytest.approx(19 / 40)
    assert average_at_k([1, 2], [2, 4]) == pytest.approx(0.5)  # per-problem sample counts
    assert math.isnan(average_at_k([], 4)) and math.isnan(mean_pass_at_k([], 4, 1))
    # pass@k grows with k.
    values = [mean_pass_at_k(counts, 8, k) for k in range(1, 9)]
    assert values == sorted(values)


def test_count_correct_histogram_and_weighted_average():
    assert count_correct([1.0, 0.0, 0.7, None]) == 2
    assert count_correct([None, None]) is None
    assert count_correct([0.6, 0.4], threshold=0.7) == 0
    assert pass_rate_histogram([0, 2, 2, 4], 4) == {0: 1, 1: 0, 2: 2, 3: 0, 4: 1}
    with pytest.raises(ValueError):
        pass_rate_histogram([5], 4)
    assert weighted_average([0.5, 1.0], [500, 230]) == pytest.approx((250 + 230) / 730)
    assert math.isnan(weighted_average([1.0], [0]))


def test_pass_rate_band():
    paper = PassRateBand.from_ends(0, 0.375)  # (0, 0.375]: 1..6 of 16, exactly (no float slop at 6/16)
    assert [c for c in range(17) if paper.contains(c, 16)] == [1, 2, 3, 4, 5, 6]
    assert str(paper) == "(0, 0.375]"
    assert paper.side(0, 16) == "below" and paper.side(7, 16) == "above" and paper.side(3, 16) == "inside"
    hard = PassRateBand.from_correct_range(1, 2, 16)
    assert [c for c in range(17) if hard.contains(c, 16)] == [1, 2]
    authors_easy = PassRateBand.from_ends(0, 0.313)  # the authors' script: <= 0.313 and > 0
    assert [c for c in range(17) if authors_easy.contains(c, 16)] == [1, 2, 3, 4, 5]
    closed = PassRateBand.from_ends(0.25, 0.5, "[]")
    assert closed.contains(2, 8) and closed.contains(4, 8) and not closed.contains(1, 8)
    assert not PassRateBand.from_ends(0.25, 0.5, "()").contains(2, 8)
    for bad in [lambda: PassRateBand.from_ends(0.5, 0.2), lambda: PassRateBand.from_ends(0, 1.5),
                lambda: PassRateBand.from_ends(0.5, 0.5, "(]"), lambda: PassRateBand.from_ends(0, 1, "<>"),
                lambda: PassRateBand.from_correct_range(3, 2, 16), lambda: PassRateBand.from_correct_range(1, 17, 16)]:  # fmt: skip
        with pytest.raises(ValueError):
            bad()


# ---------------------------------------------------------------------------------------------------------------------
# scripts/evaluate.py with a deterministic generator
# ---------------------------------------------------------------------------------------------------------------------

MATH_ROWS = [
    {"problem": "a", "answer": "1"},  # 2 of 4 right
    {"problem": "b", "answer": "\\frac{1}{2}"},  # 4 of 4
    {"problem": "c", "answer": "3"},  # 0 of 4
    {"problem": "d", "answer": ""},  # unparsable reference: skipped
]
RIGHT = {"a": 2, "b": 4, "c": 0, "d": 4}


class FakeGenerator:
    def __call__(self, prompts, num_samples):
        out = []
        for prompt in prompts:
            problem = prompt.split()[0]
            answer = {row["problem"]: row["answer"] for row in MATH_ROWS}[problem] or "1"
            out.append([f"\\boxed{{{answer}}}"] * RIGHT[problem] + ["\\boxed{99}"] * (num_samples - RIGHT[problem]))
        return out


def run_evaluate(script, tmp_path, *extra, generator=None, datasets=None):
    datasets = datasets or [str(write_jsonl(tmp_path / "math.jsonl", MATH_ROWS))]
    argv = [
        "--model_name_or_path", "unused", "--dataset_name", *datasets, "--num_samples", "4",
        "--output", str(tmp_path / "results.json"), "--prompt_format", "text", "--system_prompt", "", *extra,
    ]  # fmt: skip
    args = script.build_parser().parse_args(argv)
    return script.evaluate(args, generator=generator or FakeGenerator(), tokenizer=build_char_tokenizer())


def test_evaluate_numbers_with_known_counts(evaluate_script, tmp_path):
    results = run_evaluate(evaluate_script, tmp_path)
    entry = results["datasets"][str(tmp_path / "math.jsonl")]
    assert [p["num_correct"] for p in entry["problems"]] == [2, 4, 0, None]
    assert (entry["num_problems"], entry["num_scored"], entry["num_skipped"]) == (4, 3, 1)
    metrics = entry["metrics"]
    assert list(metrics) == ["ave@4", "pass@1", "pass@2", "pass@4"]
    assert metrics["ave@4"] == pytest.approx((0.5 + 1 + 0) / 3)
    assert metrics["pass@1"] == pytest.approx(metrics["ave@4"])
    assert metrics["pass@2"] == pytest.approx((pass_at_k(4, 2, 2) + 1 + 0) / 3)
    assert metrics["pass@4"] == pytest.approx(2 / 3)
    assert json.loads((tmp_path / "results.json").read_text())["datasets"] == results["datasets"]
    table = evaluate_script.markdown_table(results)
    assert "| dataset | problems | ave@4 | pass@1 | pass@2 | pass@4 |" in table
    assert "| 3 | 50.0 | 50.0 | 61.1 | 66.7 |" in table


def test_evaluate_several_datasets_weighted_average(evaluate_script, tmp_path):
    first = write_jsonl(tmp_path / "one.jsonl", MATH_ROWS[:2])  # ave 0.75 over 2 problems
    second = write_jsonl(tmp_path / "two.jsonl", MATH_ROWS[2:3])  # ave 0 over 1 problem
    results = run_evaluate(evaluate_script, tmp_path, "--pass_at_k", "1", datasets=[str(first), str(second)])
    average = results["weighted_average"]
    assert average["num_scored"] == 3
    assert average["metrics"]["ave@4"] == pytest.approx(0.5)
    assert "| weighted average | 3 | 50.0 | 50.0 |" in evaluate_script.markdown_table(results)


def test_evaluate_saves_completions_and_passes_reference_under_reward_name(evaluate_script, tmp_path):
    # The dataset has 'answer'; math_verify reads 'solution': evaluate passes the answer column under that name.
    results = run_evaluate(evaluate_script, tmp_path, "--save_completions", "--limit", "1", "--pass_at_k", "1", "4")
    problem = results["datasets"][str(tmp_path / "math.jsonl")]["problems"][0]
    assert problem["completions"] == ["\\boxed{1}", "\\boxed{1}", "\\boxed{99}", "\\boxed{99}"]
    assert problem["rewards"] == [1.0, 1.0, 0.0, 0.0] and problem["prompt"].startswith("a")


def test_evaluate_argument_errors(evaluate_script, tmp_path):
    with pytest.raises(ValueError, match=r"--pass_at_k values must be in \[1, --num_samples=4\]"):
        run_evaluate(evaluate_script, tmp_path, "--pass_at_k", "8")
    with pytest.raises(ValueError, match="Unknown reward function"):
        run_evaluate(evaluate_script, tmp_path, "--reward", "nope")
    no_reference = write_jsonl(tmp_path / "noref.jsonl", [{"problem": "a", "notes": "x"}])
    with pytest.raises(ValueError, match="--reference_column"):
        run_evaluate(evaluate_script, tmp_path, datasets=[str(no_reference)])


# ---------------------------------------------------------------------------------------------------------------------
# End to end on tiny local models
# ---------------------------------------------------------------------------------------------------------------------


def check_consistent(results: dict, num_samples: int) -> None:
    for entry in results["datasets"].values():
        counts = [p["num_correct"] for p in entry["problems"]]
        assert all(0 <= c <= num_samples for c in counts)
        metrics = entry["metrics"]
        assert metrics[f"ave@{num_samples}"] == pytest.approx(sum(counts) / (num_samples * len(counts)))
        assert metrics["pass@1"] == pytest.approx(metrics[f"ave@{num_samples}"])
        for k in results["pass_at_k"]:
            assert metrics[f"pass@{k}"] == pytest.approx(mean_pass_at_k(counts, num_samples, k))
        values = [metrics[f"pass@{k}"] for k in results["pass_at_k"]]
        assert values == sorted(values)


def test_evaluate_cli_end_to_end_on_tiny_model(tmp_path, tiny_model_dir):
    """The real script as a subprocess: a random tiny model on arithmetic problems, scored by exact match."""
    data = write_jsonl(tmp_path / "arith.jsonl", held_out_problems(5, seed=0))
    output = tmp_path / "eval.json"
    command = [
        sys.executable, str(SCRIPT), "--model_name_or_path", str(tiny_model_dir), "--dataset_name", str(data),
        "--reward", "exact_match", "--num_samples", "4", "--max_new_tokens", "6", "--output", str(output),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=ENV, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| dataset | problems | ave@4 | pass@1 | pass@2 | pass@4 |" in result.stdout
    results = json.loads(output.read_text())
    assert results["num_samples"] == 4 and results["pass_at_k"] == [1, 2, 4] and results["reward"] == "exact_match"
    entry = results["datasets"][str(data)]
    assert entry["num_problems"] == entry["num_scored"] == 5
    check_consistent(results, 4)


@pytest.mark.skipif(not (TINY_ARITH_ASSETS / "model.safetensors").is_file(), reason="no shipped tiny-arith model")
def test_evaluate_shipped_arithmetic_model(evaluate_script, tmp_path):
    """A model that is sometimes right gives non-trivial, self-consistent numbers (in process, transformers)."""
    data = write_jsonl(tmp_path / "arith.jsonl", held_out_problems(12, seed=1))
    argv = [
        "--model_name_or_path", str(TINY_ARITH_ASSETS), "--dataset_name", str(data), "--reward", "exact_match",
        "--num_samples", "8", "--max_new_tokens", "6", "--output", str(tmp_path / "eval.json"),
    ]  # fmt: skip
    assert evaluate_script.main(argv) == 0
    results = json.loads((tmp_path / "eval.json").read_text())
    check_consistent(results, 8)
    metrics = next(iter(results["datasets"].values()))["metrics"]
    assert metrics["pass@8"] >= metrics["pass@1"]


def test_trl_ada_evaluate_is_the_script_with_the_same_flags(tmp_path, tiny_model_dir, capsys):
    from trl_ada.cli import main as trl_ada_main
    from trl_ada.cli.evaluate import build_parser

    def option_strings(parser):
        return [action.option_strings for action in parser._actions]

    assert option_strings(load_script().build_parser()) == option_strings(build_parser())
    data = write_jsonl(tmp_path / "arith.jsonl", held_out_problems(3, seed=0))
    output = tmp_path / "eval.json"
    argv = [
        "--model_name_or_path", str(tiny_model_dir), "--dataset_name", str(data), "--reward", "exact_match",
        "--num_samples", "2", "--max_new_tokens", "4", "--output", str(output),
    ]  # fmt: skip
    assert trl_ada_main(["evaluate", *argv]) == 0
    assert "| dataset | problems | ave@2 | pass@1 | pass@2 |" in capsys.readouterr().out
    results = json.loads(output.read_text())
    assert results["datasets"][str(data)]["num_problems"] == 3
    check_consistent(results, 2)
