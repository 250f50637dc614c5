"""Reduced runs of benchmarks/overhead.py and scripts/benchmark_learning.py: they run and report sane numbers.

Correctness only: no timing is asserted (timings belong in BENCHMARKS.md, measured against a baseline in one run).
"""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_overhead_benchmark_reports_both_ratios(tmp_path):
    overhead = load(ROOT / "benchmarks" / "overhead.py", "overhead_bench")
    out = tmp_path / "overhead.json"
    assert overhead.main(["--steps", "3", "--repeats", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["steps_measured_each"] == 2  # the first step of each run is warm-up
    assert math.isfinite(result["step_time_ratio"]) and result["step_time_ratio"] > 0
    assert result["sampler_control_ms_per_step_1024_prompts_cap_128"] > 0


def test_learning_benchmark_summary_and_ratios(tmp_path):
    bench = load(ROOT / "scripts" / "benchmark_learning.py", "benchmark_learning")
    code = bench.main(
        [
            "--out",
            str(tmp_path),
            "--steps",
            "2",
            "--eval_every",
            "1",
            "--heldout_size",
            "16",
            "--seeds",
            "0",
            "--methods",
            "grpo_n4",
            "seq_balance",
            "--jobs",
            "2",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["methods"]) == {"grpo_n4", "seq_balance"}
    for method in summary["methods"].values():
        steps = [point["step"] for point in method["curve"]]
        assert steps == [0, 1, 2]
        samples = [point["samples"] for point in method["curve"]]
        assert samples == sorted(samples) and samples[-1] > 0
    # seq_balance draws more completions per step than GRPO n=4 (16 prompts x 4)
    assert (
        summary["methods"]["seq_balance"]["samples_total_mean"] >= summary["methods"]["grpo_n4"]["samples_total_mean"]
    )
    assert "steps_seq_balance_to_grpo_n4_final" in summary["ratios"]
    assert (tmp_path / "learning_curves.png").stat().st_size > 1000


def test_first_reach_interpolates():
    bench = load(ROOT / "scripts" / "benchmark_learning.py", "benchmark_learning")
    curve = [{"step": 0, "heldout": 0.3}, {"step": 10, "heldout": 0.5}, {"step": 20, "heldout": 0.6}]
    assert bench.first_reach(curve, "step", 0.4) == pytest.approx(5)
    assert bench.first_reach(curve, "step", 0.55) == pytest.approx(15)
    assert bench.first_reach(curve, "step", 0.7) == math.inf
