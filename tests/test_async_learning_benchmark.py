"""The pure parts of benchmarks/async_learning.py: the server's counters, the busy share, the curves on a common grid,
the t-intervals, the goals and the tables. No vLLM, no training: synthetic runs in the shape a run writes."""

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("async_learning_bench", ROOT / "benchmarks" / "async_learning.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["async_learning_bench"] = module
    spec.loader.exec_module(module)
    return module


METRICS_TEXT = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="/m"} 1234.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="/m"} 90.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="/m"} 10.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="/m"} 3.0
vllm:num_requests_running{engine="0",model_name="/m"} 7.0
vllm:num_requests_waiting{engine="0",model_name="/m"} 2.0
vllm:request_generation_tokens_sum{engine="0",model_name="/m"} 99.0
"""


def test_scrape_reads_vllm_counters(bench):
    assert bench.scrape(METRICS_TEXT) == {
        "generation_tokens": 1234.0,
        "finished": 100.0,  # every reason but abort
        "aborted": 3.0,
        "running": 7.0,
        "waiting": 2.0,
    }
    assert bench.scrape("")["finished"] == 0.0


def test_busy_share_is_time_weighted_and_skips_pauses(bench):
    samples = [(0.0, 0, False), (1.0, 5, False), (2.0, 5, False), (4.0, 9, False)]
    assert bench.busy_share(samples) == pytest.approx(3.0 / 4.0)  # busy 0-1 and 2-4, idle 1-2
    paused = [(0.0, 0, False), (1.0, 0, True), (5.0, 0, True), (6.0, 3, False)]
    assert math.isnan(bench.busy_share(paused))  # every interval touches a pause
    assert math.isnan(bench.busy_share([]))


def test_time_grid(bench):
    assert bench.time_grid(120, 20) == [0, 20, 40, 60, 80, 100, 120]
    assert bench.time_grid(50, 20) == [0, 20, 40, 50.0]
    assert bench.time_grid(30, 0) == [0.0, 30.0]


def run(bench, method, seed, heldouts, seconds, completions, **extra):
    label, kind, _ = bench.METHODS[method]
    curve = [
        {"step": i, "seconds": s, "completions": c, "heldout": h}
        for i, (h, s, c) in enumerate(zip(heldouts, seconds, completions, strict=True))
    ]
    values = dict(
        method=method,
        label=label,
        kind=kind,
        seed=seed,
        curve=curve,
        steps=len(curve) - 1,
        first_step_seconds=5.0,
        median_step_seconds_after_first=1.0,
        draws_per_prompt=4.0,
        staleness_mean=1.0,
        dropped_stale_total=0.0,
        aborted_training=0.0,
        aborted_total=2.0,
        engine_busy_share=0.5 if kind != "sync" else None,
        load_average_1min_at_start=2.0,
    )
    return {**values, **extra}


def synthetic(bench):
    seconds = [0.0, 20.0, 40.0, 60.0]
    results = []
    for seed, noise in ((0, 0.0), (1, 0.01), (2, -0.01)):
        results += [
            run(bench, "grpo_n4", seed, [0.3, 0.31 + noise, 0.32, 0.33], seconds, [0, 600, 1200, 1800]),
            run(bench, "seq_balance", seed, [0.3, 0.35 + noise, 0.38, 0.40], seconds, [0, 1500, 3000, 4500]),
            run(bench, "sync_seq_balance", seed, [0.3, 0.32, 0.34 + noise, 0.36], seconds, [0, 800, 1600, 2400]),
        ]
    return results


def test_summary_intervals_interpolation_and_goals(bench):
    table = bench.summarize(synthetic(bench), budget_s=60, eval_every_s=20)
    rows = table["methods"]
    assert list(rows) == ["grpo_n4", "seq_balance", "sync_seq_balance"]
    final = rows["seq_balance"]["final"]
    assert final["mean"] == pytest.approx(0.40) and final["half_width"] == pytest.approx(0)  # same final, 3 seeds
    first = rows["seq_balance"]["curve_seconds"][1]
    assert first["heldout"] == pytest.approx(0.35) and first["ci"][0] < 0.35 < first["ci"][1]  # t-interval, 3 seeds
    # completions: each method's fewest (over seeds) rounded down to a multiple of 500, and half the smallest
    assert table["completion_budgets"] == [500, 1500, 2000, 4500]
    at_500, at_1500, at_2000 = rows["grpo_n4"]["curve_completions"][:3]
    assert at_500["heldout"] == pytest.approx(0.3 + 0.01 * 500 / 600)  # 0.31 at 600 on average over seeds
    assert at_1500["heldout"] == pytest.approx(0.325)
    assert at_2000["heldout"] is None and at_2000["reached"] == 0  # never drew 2,000: not extrapolated
    assert len(rows["grpo_n4"]["curve_completions_plot"]) == 13
    # Goal 1: the sync final (0.36) lies between the async seq_balance mean curve's 0.35 (20 s) and 0.38 (40 s):
    # reached at 20 + 20 * (0.01 / 0.03) s, against the sync run's 60 s.
    goal_1 = table["goals"]["goal_1"]
    assert goal_1["async_seq_balance_reach_seconds"] == pytest.approx(20 + 20 / 3)
    assert goal_1["ratio"] == pytest.approx((20 + 20 / 3) / 60) and goal_1["met"]
    goal_2 = table["goals"]["goal_2"]
    assert goal_2["at_budget"]["mean"] == pytest.approx(0.07) and goal_2["met"] and goal_2["ahead_at_every_time"]
    text = bench.markdown(table)
    assert "Goal 1" in text and "**met**" in text and "0.44x" in text
    assert "n/a (in-process)" in text  # the sync reference has no server


def test_goal_not_met_is_reported_as_such(bench):
    results = [
        r
        if r["method"] != "seq_balance"
        else {**r, "curve": [{**p, "heldout": 0.3 + 0.001 * i} for i, p in enumerate(r["curve"])]}
        for r in synthetic(bench)
    ]
    table = bench.summarize(results, budget_s=60, eval_every_s=20)
    assert math.isinf(table["goals"]["goal_1"]["async_seq_balance_reach_seconds"])
    assert not table["goals"]["goal_1"]["met"] and not table["goals"]["goal_2"]["met"]
    text = bench.markdown(table)
    assert "never reached" in text and "**not met**" in text


def test_step_time_table_without_evaluation(bench):
    results = [
        {**run(bench, "grpo_n4", 0, [None, None], [0, 10], [0, 100]), "median_step_seconds_after_first": 0.5},
        {**run(bench, "seq_balance", 0, [None, None], [0, 10], [0, 300]), "median_step_seconds_after_first": 1.0},
    ]
    for r in results:
        for point in r["curve"]:
            point.pop("heldout")
    table = bench.summarize(results, budget_s=10, eval_every_s=0)
    assert table["goals"] == {} and table["completion_budgets"] == []
    text = bench.step_time_table(table)
    assert "| 2.00 |" in text
