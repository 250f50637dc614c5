"""Issue 33's tournament in scripts/benchmark_learning.py: equal-completions runs, methods of one's own, the report."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.curves import curve_to_budget, heldout_at_completions  # noqa: E402
from harness.methods import add_method_config  # noqa: E402
from harness.tournament import tournament_summary, tournament_table  # noqa: E402
from harness.training import EvaluationPlan, budget_steps, gate_passes  # noqa: E402


@pytest.fixture
def bench():
    # A fresh module per test: --method_config adds to its METHODS.
    spec = importlib.util.spec_from_file_location(
        "benchmark_learning_tournament", ROOT / "scripts" / "benchmark_learning.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_budget_measures_at_each_eighth_and_stops_at_the_budget():
    plan = EvaluationPlan(steps=1000, eval_every=25, budget=800)
    completions = [0, 60, 100, 150, 420, 799, 800]
    decisions = [(plan.evaluate_now(step, done), plan.stop_now(done)) for step, done in enumerate(completions, 1)]
    # Marks at 100, 200, ...: 60 is before the first; 420 crosses three marks at once and measures once.
    assert decisions == [(False, False), (False, False), (True, False), (False, False), (True, False),
                         (True, False), (True, True)]  # fmt: skip
    steps_only = EvaluationPlan(steps=50, eval_every=25, budget=None)
    assert [steps_only.evaluate_now(step, 10**9) for step in (24, 25, 49, 50)] == [False, True, False, True]
    assert not steps_only.stop_now(10**9)
    # The step cap lets a method drawing 2 completions a prompt reach the budget.
    assert budget_steps(54_416, 200, 20) == math.ceil(54_416 / 40)
    assert budget_steps(None, 200, 20) == 200


def test_a_method_of_ones_own_is_checked_before_any_run(bench, tmp_path):
    name = add_method_config('mine={"sampler": "seq_balance", "max_rounds": 2}', bench.METHODS)
    assert bench.METHODS[name] == ("mine", {"num_generations": 4, "sampler": "seq_balance", "max_rounds": 2})
    assert bench.run_settings({"steps": 1}, "mine")["overrides"]["max_rounds"] == 2
    assert bench.run_settings({"steps": 1}, "dapo") == {"steps": 1}  # built-in runs stay reusable
    for spec, message in [
        ("mine", "NAME="),
        ("mine={sampler: dapo}", "not JSON"),
        ('mine={"max_rounds": 2}', "sampler"),
        ('mine={"sampler": "seq_balance", "max_rounds": 0}', "max_rounds"),
        ('mine={"sampler": "nonexistent"}', "nonexistent"),
    ]:
        with pytest.raises(ValueError, match=message):
            add_method_config(spec, bench.METHODS)
    with pytest.raises(SystemExit):  # argparse's error, before anything runs
        bench.main(["--out", str(tmp_path), "--methods", "not_a_method"])
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--tournament"])  # needs --completions_budget
    assert not (tmp_path / "runs").exists()


def test_recommended_is_the_readmes_recommendation(bench):
    readme = (ROOT / "README.md").read_text()
    assert bench.METHODS["recommended"][1] == bench.METHODS[bench.RECOMMENDED][1]
    assert f"`{bench.RECOMMENDED}`" in readme.split("## Which sampler should I use", 1)[1].split("\n## ", 1)[0]


def run(method, seed, finals, seconds, draws):
    """A finished run as run_finite writes it: a curve ending at `finals` after `seconds`, and its draw accounting."""
    curve = [{"step": 0, "heldout": 0.1, "samples": 0.0, "train_seconds": 0.0},
             {"step": 10, "heldout": finals, "samples": 100.0, "train_seconds": seconds}]  # fmt: skip
    total, useful, none_right = draws
    bands = {
        "none_right": {"drawn": none_right, "useful": 0.0},
        "mid": {"drawn": total - none_right, "useful": useful},
    }
    return {"method": method, "label": method.upper(), "seed": seed, "curve": curve,
            "draws": {"total": total, "useful": useful, "trained": useful / 2, "bands": bands}}  # fmt: skip


def test_the_tournament_pairs_by_seed_against_dapo_at_equal_completions_and_time():
    results = [run("dapo", seed, 0.20 + 0.01 * seed, 10.0, (100, 30, 50)) for seed in range(3)]
    results += [run("mine", seed, 0.22 + 0.01 * seed + 0.001 * seed**2, 20.0, (100, 60, 10)) for seed in range(3)]
    summary = tournament_summary(results, budget=100)
    mine = summary["methods"]["mine"]
    differences = [0.02 + 0.001 * seed**2 for seed in range(3)]
    assert mine["minus_reference"]["mean"] == pytest.approx(sum(differences) / 3)
    assert mine["minus_reference"]["ci_low"] < mine["minus_reference"]["mean"] < mine["minus_reference"]["ci_high"]
    # At DAPO's 10 s (the time both reached), "mine" is half way along its curve: 0.1 + (final - 0.1) / 2.
    at_time = [(0.1 + (0.22 + 0.01 * s + 0.001 * s**2 - 0.1) / 2) - (0.20 + 0.01 * s) for s in range(3)]
    assert mine["minus_reference_at_equal_time"]["mean"] == pytest.approx(sum(at_time) / 3)
    # DAPO's mean final is 0.21; the mean curve of "mine" is linear from 0.1 to the mean final 0.231 at 100
    # completions (its points at each eighth of the budget lie on that line), so it reaches 0.21 at 100 x 0.11 / 0.131.
    mean_final = sum(0.22 + 0.01 * s + 0.001 * s**2 for s in range(3)) / 3
    assert mine["to_reference_final"]["completions_ratio"] == pytest.approx(0.11 / (mean_final - 0.1))
    assert mine["to_reference_final"]["seeds_reached"] == 3
    assert mine["useful_share"] == pytest.approx(0.6) and summary["methods"]["dapo"]["useful_share"] == 0.3
    assert mine["bands"]["none_right"] == {"share": 0.1, "useful_share": 0.0}
    assert mine["bands"]["mid"]["useful_share"] == pytest.approx(60 / 90)
    table = tournament_table(summary)
    assert "| MINE | 3 |" in table and "0.600" in table and "none_right" in table
    # A run that stopped first (5 s) is compared with DAPO at 5 s, half way along DAPO's curve: not extrapolated.
    short = [run("short", seed, 0.3, 5.0, (100, 50, 0)) for seed in range(3)]
    at_five = [0.3 - (0.1 + (0.20 + 0.01 * s - 0.1) / 2) for s in range(3)]
    reading = tournament_summary(results + short, 100)["methods"]["short"]["minus_reference_at_equal_time"]
    assert reading["mean"] == pytest.approx(sum(at_five) / 3) and reading["seeds"] == [0, 1, 2]


def test_a_rule_that_draws_what_dapo_draws_is_named_identical_and_a_flat_dapo_sets_no_target():
    dapo = [run("dapo", seed, 0.20 + 0.01 * seed, 10.0, (100, 30, 50)) for seed in range(2)]
    # The same draws and held-out at every evaluation, another timing: dapo_gated where nothing it skips comes back.
    twin = [{**entry, "method": "twin", "label": "TWIN"} for entry in dapo]
    twin = [
        {**entry, "curve": [{**p, "train_seconds": 1.5 * p["train_seconds"]} for p in entry["curve"]]}
        for entry in twin
    ]
    # One evaluation apart: not identical.
    near = [{**entry, "method": "near", "label": "NEAR"} for entry in twin]
    near[1] = {**near[1], "curve": [*near[1]["curve"][:-1], {**near[1]["curve"][-1], "heldout": 0.5}]}
    summary = tournament_summary(dapo + twin + near, budget=100)
    assert summary["methods"]["twin"]["identical_to_reference"] is True
    assert summary["methods"]["near"]["identical_to_reference"] is False
    table = tournament_table(summary)
    assert "| TWIN (= dapo run for run: same draws and held-out, seeds 0, 1) | 2 |" in table
    assert "| NEAR | 2 |" in table
    assert "stepped past" not in table  # no run recorded the gate's count
    # The gate's count, a mean over the runs that record it (those written before it was kept lack it).
    twin[0]["gate_passed_over"], twin[1]["gate_passed_over"] = 10.0, 25.0
    near[0]["gate_passed_over"] = 7.0
    gated = tournament_table(tournament_summary(dapo + twin + near, budget=100))
    assert "- TWIN: 17.5 (mean of 2 runs that record it)" in gated and "- NEAR: 7.0 (mean of 1 run that" in gated

    # A reference that ended at its start (0.1) sets no target: the reading is left out, not printed as 0.00x.
    flat = [run("dapo", seed, 0.1, 10.0, (100, 30, 50)) for seed in range(2)]
    mine = [run("mine", seed, 0.3, 10.0, (100, 30, 50)) for seed in range(2)]
    flat_summary = tournament_summary(flat + mine, budget=100)
    assert math.isnan(flat_summary["methods"]["mine"]["to_reference_final"]["completions_ratio"])
    flat_table = tournament_table(flat_summary)
    assert "0.00x" not in flat_table and "the reference ended at or below its start" in flat_table


def test_a_run_records_the_prompts_the_gated_refill_passed_over(tmp_path, tokenizer, arithmetic_dataset):
    from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tiny import build_tiny_model

    # Every other prompt is hopeless (all wrong at every draw): after one visit the gate passes it over, and the refill
    # walks the 16 prompts often enough to meet it again.
    dataset = arithmetic_dataset.select(range(16)).map(lambda row, i: {"hopeless": i % 2 == 0}, with_indices=True)

    def reward(completions, hopeless, **kwargs):
        return [0.0 if h else r for h, r in zip(hopeless, starts_low_digit(completions), strict=True)]

    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=6, per_device_train_batch_size=16),
        sampler="dapo_gated",
        dapo_max_refills=40,
        dapo_on_exhausted="keep_partial",
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(model, [reward], args=config, train_dataset=dataset, processing_class=tokenizer)
    verdicts: list[bool] = []
    judge = trainer.ada_sampler.refill_passes_over

    def recording_judge(key):
        verdicts.append(judge(key))
        return verdicts[-1]

    trainer.ada_sampler.refill_passes_over = recording_judge
    trainer.train()
    entries = [e for e in trainer.state.log_history if "step_time" in e]
    assert sum(verdicts) > 0
    # Every verdict, also those of a walk that found nothing to draw (a per-batch count is averaged over the step's
    # batches by TRL and misses those).
    assert gate_passes(entries) == sum(verdicts)
    assert gate_passes([{"ada/pass_rate/mean": 0.5, "step_time": 1.0}]) is None  # no refill: nothing to count


def curve_run(method, seed, points, seconds=10.0):
    """A run whose evaluations are `points`, (completions, held-out) pairs, from the first at 0 completions."""
    curve = [
        {"step": i, "heldout": heldout, "samples": float(samples), "train_seconds": seconds * samples / points[-1][0]}
        for i, (samples, heldout) in enumerate(points)
    ]
    bands = {"mid": {"drawn": float(points[-1][0]), "useful": 1.0}}
    return {"method": method, "label": method.upper(), "seed": seed, "start_heldout": points[0][1], "curve": curve,
            "median_step_seconds": 1.0,
            "draws": {"total": float(points[-1][0]), "useful": 1.0, "trained": 1.0, "bands": bands}}  # fmt: skip


def test_dapo_against_itself_reads_one_and_its_own_crossing_is_the_yardstick():
    # DAPO's curves reach their level at 50 of the 100 completions and stay flat past the budget (to 110): against
    # its mean final completions (110) it would read 50/110 against itself.
    dapo = [
        curve_run("dapo", seed, [(0, 0.1), (50, 0.3 + 0.01 * seed), (110, 0.3 + 0.01 * seed)]) for seed in range(3)
    ]
    twin = [{**run, "method": "twin", "label": "TWIN"} for run in dapo]
    # "slow" climbs 0.003 per completion: it reaches DAPO's level (0.31) at 70 completions, 1.4x DAPO's own 50.
    slow = [curve_run("slow", seed, [(0, 0.1), (104, 0.1 + 0.003 * 104)]) for seed in range(3)]
    summary = tournament_summary(dapo + twin + slow, budget=100)
    readings = {method: row.get("to_reference_final") for method, row in summary["methods"].items()}
    assert readings["twin"]["completions_ratio"] == pytest.approx(1.0)
    assert readings["dapo"]["completions_ratio"] == pytest.approx(1.0)
    assert readings["dapo"]["reference_completions"] == pytest.approx(50.0)
    assert readings["slow"]["completions_ratio"] == pytest.approx(1.4)
    assert readings["dapo"]["seeds_reached"] == 2  # seed 0 ends at 0.30, below the mean 0.31
    dapo_line = next(line for line in tournament_table(summary).splitlines() if line.startswith("| DAPO |"))
    assert dapo_line.endswith("| 1.00x (2) |")


def test_the_equal_completions_reading_is_the_curve_at_the_budget_not_its_last_evaluation():
    # Evaluations at 70 and 110 around the budget of 100: the reading is 3/4 of the way from 0.30 to 0.50.
    dapo = [curve_run("dapo", seed, [(0, 0.1), (70, 0.30), (110, 0.50 + 0.01 * seed)]) for seed in range(3)]
    exact = [curve_run("exact", seed, [(0, 0.1), (50, 0.2), (100, 0.40)]) for seed in range(3)]
    summary = tournament_summary(dapo + exact, budget=100)
    dapo_at_budget = [0.30 + 0.75 * (0.20 + 0.01 * seed) for seed in range(3)]
    assert summary["methods"]["dapo"]["final"]["mean"] == pytest.approx(sum(dapo_at_budget) / 3)
    assert summary["methods"]["exact"]["final"]["mean"] == pytest.approx(0.40)
    assert summary["methods"]["exact"]["minus_reference"]["mean"] == pytest.approx(0.40 - sum(dapo_at_budget) / 3)
    # Crossings are read within the budget too: DAPO's level is 0.4575, which "exact" never reaches by 100.
    assert summary["methods"]["exact"]["to_reference_final"]["seeds_reached"] == 0
    assert curve_to_budget(dapo[0]["curve"], 100)[-1] == {"samples": 100.0, "heldout": pytest.approx(0.45)}


def test_a_run_that_ended_short_of_the_budget_is_flagged_and_not_extrapolated():
    dapo = [curve_run("dapo", seed, [(0, 0.1), (100, 0.3 + 0.01 * seed)]) for seed in range(3)]
    # Seed 1 stopped at 80 completions (its step cap): its last held-out is not a reading at 100.
    mine = [curve_run("mine", seed, [(0, 0.1), (100, 0.35)]) for seed in (0, 2)]
    mine.insert(1, curve_run("mine", 1, [(0, 0.1), (80, 0.9)]))
    summary = tournament_summary(dapo + mine, budget=100)
    row = summary["methods"]["mine"]
    assert row["short_of_budget"] == [{"seed": 1, "completions": 80.0}]
    assert summary["methods"]["dapo"]["short_of_budget"] == []
    assert row["final"]["mean"] == pytest.approx(0.35) and row["final"]["n"] == 2
    assert row["minus_reference"]["seeds"] == [0, 2]
    assert row["minus_reference"]["mean"] == pytest.approx(0.35 - (0.30 + 0.32) / 2)
    assert heldout_at_completions(mine[1], 100) is None and heldout_at_completions(mine[1], 40) == 0.5
    table = tournament_table(summary)
    assert "| MINE | 3 (1 short) |" in table and "- MINE: seed 1 at 80" in table


def test_report_only_refuses_a_tournament_with_missing_runs(bench, tmp_path, capsys):
    settings = {"steps": 300, "eval_every": 25, "learning_rate": 3e-5, "completions_budget": 100, "heldout_size": 600}
    (tmp_path / "runs").mkdir()
    run = {**curve_run("dapo", 0, [(0, 0.1), (100, 0.3)]), "settings": settings}
    (tmp_path / "runs" / "dapo-seed0.json").write_text(json.dumps(run))
    argv = ["--out", str(tmp_path), "--tournament", "--completions_budget", "100", "--report_only"]
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--methods", "dapo", "grpo_n4", "--seeds", "0", "1"])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert "dapo-seed1, grpo_n4-seed0, grpo_n4-seed1" in error and "dapo-seed0" not in error
    assert not (tmp_path / "tournament.md").exists()
