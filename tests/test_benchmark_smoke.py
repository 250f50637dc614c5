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
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.curves import first_reach  # noqa: E402


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
        # every point counts the step it is taken at (16 prompts x 4 per GRPO step)
        assert all(point["train_seconds"] > 0 for point in method["curve"][1:])
    assert [point["samples"] for point in summary["methods"]["grpo_n4"]["curve"]] == [0, 64, 128]
    # seq_balance draws more completions per step than GRPO n=4 (16 prompts x 4)
    assert (
        summary["methods"]["seq_balance"]["samples_total_mean"] >= summary["methods"]["grpo_n4"]["samples_total_mean"]
    )
    assert "steps_seq_balance_to_grpo_n4_final" in summary["ratios"]
    assert (tmp_path / "learning_curves.png").stat().st_size > 1000


def test_first_reach_interpolates():
    curve = [{"step": 0, "heldout": 0.3}, {"step": 10, "heldout": 0.5}, {"step": 20, "heldout": 0.6}]
    assert first_reach(curve, "step", 0.4) == pytest.approx(5)
    assert first_reach(curve, "step", 0.55) == pytest.approx(15)
    assert first_reach(curve, "step", 0.7) == math.inf


@pytest.mark.wall_clock_limit(300)
def test_pool_memory_benchmark_counts_what_each_design_moves(tmp_path, monkeypatch, wall_clock_guard):
    from trl_ada.schedules.rounds import RoundLayout

    # The benchmark's main() in this process, which has imported trl_ada already (one process start fewer than the
    # script's command line); its spawned workers import it by name from benchmarks/, as they import the script.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    bench = importlib.import_module("pool_memory")
    out = tmp_path / "pool.json"
    argv = ["--prompts", "16", "--completion-tokens", "48", "--prompt-tokens", "16", "--extrapolate", "8"]
    # The three designs in the same two processes (one launch instead of three): bytes and rows are counted per design
    # as in fresh processes (the exact control bytes below, counted after another design, check it); only peak memory,
    # which this test does not read, needs fresh ones.
    bench.main([*argv, "--json", str(out), "--one-launch"])
    result = json.loads(out.read_text())
    measured = result["measured"]
    # Rank-local control traffic is exactly the rewards (float32) and truncation flags (uint8) of every generated row
    # (padding included) of the other process, round by round.
    setting = bench.Setting(prompts=16, completion_tokens=48, prompt_tokens=16)
    plan = bench.plan_step(setting)
    expected = sum(RoundLayout.plan(requests, 2).share_size * (4 + 1) for requests in plan.rounds)
    assert measured["rank_local_pools"]["bytes_control"] == expected
    # The old design moved every completion to every process; the new one only the kept rows that change process.
    assert measured["all_gather_pools"]["bytes_per_process"] > 5 * measured["rank_local_pools"]["bytes_per_process"]
    assert measured["all_gather_pools"]["rows_held_max"] == result["extrapolated"][0]["rows_requested"]
    assert measured["rank_local_pools"]["rows_held_max"] < result["extrapolated"][0]["rows_requested"]
    assert [row["processes"] for row in result["extrapolated"]] == [2, 8]


def test_episode_time_benchmark_runs_grpo_and_seq_balance_through_the_tool_loop(tmp_path, monkeypatch):
    bench = load(ROOT / "benchmarks" / "episode_time.py", "episode_time_bench")
    out = tmp_path / "episodes.json"
    monkeypatch.setattr(sys, "argv", ["episode_time.py", "--quick", "--json", str(out)])
    bench.main()
    results = json.loads(out.read_text())["results"]
    assert [r["name"] for r in results] == [
        "GRPO n=4",
        "seq_balance, fixed rounds",
        "seq_balance, predictive rounds",
    ]
    grpo, *adaptive = results
    assert grpo["completions_per_batch"] == 32 and grpo["rounds_per_batch"] == 1
    for result in results:
        assert (
            result["tool_calls"] > 0 and result["generate_calls"] > result["rounds_per_batch"]
        )  # the tool loop generated again
        assert result["sampling_seconds"] > 0 and result["tool_seconds"] >= 0
    assert all(r["completions_per_batch"] > 32 and r["round_time_max"] > 0 for r in adaptive)


def test_predictor_learning_table_reads_budgets_pairs_and_goals(tmp_path):
    table_module = load(ROOT / "benchmarks" / "predictor_learning.py", "predictor_learning")

    def run(method: str, seed: int, points: list[tuple[float, float, float]]) -> dict:
        curve = [{"step": i, "heldout": h, "samples": c, "train_seconds": s} for i, (h, c, s) in enumerate(points)]
        return {"method": method, "label": method, "seed": seed, "curve": curve}

    runs = [
        run("grpo_n16", 0, [(0.3, 0, 0), (0.4, 400, 40), (0.5, 800, 80)]),
        run("grpo_n16", 1, [(0.3, 0, 0), (0.4, 400, 40), (0.5, 800, 80)]),
        run("dapo", 0, [(0.3, 0, 0), (0.45, 300, 20), (0.55, 600, 40)]),
        run("dapo", 1, [(0.3, 0, 0), (0.45, 300, 20), (0.51, 600, 40)]),
        # Reaches GRPO-n16's final 0.5 at 200 of its own completions: 0.25x GRPO-n16's 800; ends above DAPO with less.
        run("est_learned", 0, [(0.3, 0, 0), (0.5, 200, 10), (0.6, 400, 20)]),
        run("est_learned", 1, [(0.3, 0, 0), (0.5, 200, 10), (0.6, 400, 20)]),
    ]
    (tmp_path / "runs").mkdir()
    for r in runs:
        (tmp_path / "runs" / f"{r['method']}-seed{r['seed']}.json").write_text(json.dumps(r))
    table = table_module.analyse(tmp_path)
    assert table["completion_budgets"] == [400, 600, 800]
    at_400 = table["methods"]["dapo"]["at_completions"]["400"]
    assert at_400["mean"] == pytest.approx((0.45 + 0.1 / 3 + 0.45 + 0.06 / 3) / 2)  # interpolated per seed
    assert table["methods"]["est_learned"]["at_completions"]["600"]["mean"] is None  # never drew 600
    assert table["methods"]["est_learned"]["vs_dapo"]["final"]["mean"] == pytest.approx(0.6 - 0.53)
    goals = table["goals"]
    assert goals["ratio_to_grpo_n16"] == pytest.approx(0.25) and goals["goal_1_met"] and goals["goal_2_met"]
    assert "Goal 1" in table_module.markdown(table)
