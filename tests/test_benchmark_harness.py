"""The learning benchmarks' shared harness (benchmarks/harness/): the pieces no benchmark's own test reaches, on fixed
inputs: the formatter's forms, curve readings past a curve's end, and a child run that fails."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.curves import curve_on_grid, heldout_at, mean_curve  # noqa: E402
from harness.report import fmt, markdown_table  # noqa: E402
from harness.runs import Child, matching_runs, run_processes  # noqa: E402
from harness.stats import mean_ci  # noqa: E402


def test_fmt_forms():
    stat = mean_ci([1000.0, 1200.0, 1400.0])
    assert fmt(stat, digits=0, half_width=True) == "1,200 ± 497"
    assert fmt(mean_ci([0.4, 0.5])) == "0.450 [-0.185, 1.085]"
    assert fmt(mean_ci([0.012]), signed=True) == "+0.012"  # one seed: no interval
    assert fmt(mean_ci([])) == "n/a" and fmt({"mean": float("inf")}) == "n/a"


def test_markdown_table_aligns_the_first_columns_left():
    assert markdown_table("method | source | share", [["a", "b", "0.5"]], left=2) == [
        "| method | source | share |",
        "|---|---|---:|",
        "| a | b | 0.5 |",
    ]


def test_curve_readings_are_not_extrapolated():
    curve = [{"samples": 0.0, "heldout": 0.1}, {"samples": 100.0, "heldout": 0.3}, {"samples": 100.0, "heldout": 0.4}]
    assert heldout_at(curve, "samples", 25) == pytest.approx(0.15)
    assert heldout_at(curve, "samples", 0) == 0.1
    assert heldout_at(curve, "samples", 101) is None
    short = {"curve": curve[:2]}
    longer = {"curve": [{"samples": 0.0, "heldout": 0.2}, {"samples": 200.0, "heldout": 0.6}]}
    first, last = curve_on_grid([short, longer], "samples", [50, 150])
    assert first["heldout"] == pytest.approx((0.2 + 0.3) / 2) and first["reached"] == 2
    assert last["heldout"] is None and last["ci"] == [None, None] and last["reached"] == 1


def test_mean_curve_over_the_points_every_run_reached():
    runs = [
        {"curve": [{"step": 0, "heldout": 0.1, "bands": {"a": 0.0}}, {"step": 5, "heldout": 0.3, "bands": {}}]},
        {"curve": [{"step": 0, "heldout": 0.3, "bands": {"a": 0.2}}]},
    ]
    (point,) = mean_curve(runs, ("step",), bands=["a"])
    assert point["heldout"] == pytest.approx(0.2) and point["bands"]["a"] == pytest.approx(0.1)
    assert point["heldout_ci"][0] < 0.2 < point["heldout_ci"][1]
    assert "heldout_ci" not in mean_curve(runs, ("step",), intervals=False)[0]


def test_a_failed_child_is_named_and_its_output_kept(tmp_path, caplog):
    children = [
        Child("ok", 0, [sys.executable, "-c", "print('fine')"], tmp_path / "ok.log"),
        Child("broken", 1, [sys.executable, "-c", "import sys; sys.exit('no luck')"], tmp_path / "broken.log"),
    ]
    started = []
    with caplog.at_level(logging.INFO):
        failed = run_processes(children, jobs=2, before=lambda child: started.append(child.method))
    assert failed == ["broken-seed1"] and started == ["ok", "broken"]
    assert (tmp_path / "ok.log").read_text() == "fine\n" and "no luck" in (tmp_path / "broken.log").read_text()
    assert "broken seed 1: FAILED (1)" in caplog.text


def test_only_runs_with_these_settings_are_reported(tmp_path):
    for seed, lr in ((0, 1e-4), (1, 2e-4)):
        (tmp_path / f"dapo-seed{seed}.json").write_text(json.dumps({"seed": seed, "settings": {"lr": lr}}))
    runs = matching_runs(tmp_path, ["dapo", "grpo_n4"], [0, 1, 2], lambda method: {"lr": 1e-4})
    assert [run["seed"] for run in runs] == [0]


def test_projected_step_seconds_against_a_hand_computation():
    from harness.gpu_time import PaperStepCost

    # Generation: 10 s for a call of up to 1,000 completions, then 1 s per extra 1,000 (read linearly, and past the
    # last size along the last segment).
    cost = PaperStepCost(((0.0, 10.0), (1000.0, 10.0), (2000.0, 11.0)), 2.0, 0.001, 0.01, batch_prompts=40)
    assert cost.generation_seconds(1500.0) == pytest.approx(10.5)
    assert cost.generation_seconds(4000.0) == pytest.approx(13.0)
    # 3 calls of 60 completions at 20 prompts a step -> scale 2: 360 completions in 3 calls of 120; 80 rows -> 160.
    assert cost.step_seconds(3, 180, 80, 20) == pytest.approx(3 * (10.0 + 2.0) + 360 * 0.001 + 160 * 0.01)


def test_projected_grpo_step_is_the_cost_models_own():
    """The price of one GRPO n=4 step at the paper's 512 prompts equals the cost model's simulated step (same engines,
    workload and per-row costs), so a change in one shows in the other."""
    import generation_cost as model
    from harness.gpu_time import paper_step_cost

    setup = model.Setup()
    grpo = next(schedule for schedule in model.schedules() if schedule.name == "grpo_n4")
    prompts = model.sample_population(setup.batch_prompts, setup.workload, 0)
    steps = model.run_schedule(grpo, prompts, setup, seed=0, steps=4)
    simulated = model.average(steps)["step_s"]
    projected = paper_step_cost().step_seconds(1, 2048, 2048, setup.batch_prompts)
    # The simulated steps draw their own lengths: the slowest of 8 engines varies by a few percent between draws.
    assert projected == pytest.approx(simulated, rel=0.05)


def test_step_shapes_read_back_from_a_runs_log(tmp_path):
    from harness.gpu_time import shapes_from_log

    entries = [
        {"loss": "0.1", "ada/rounds": "1", "ada/dapo/extra_batches": "2", "ada/draws/drawn_total": "240"},
        {"loss": "0.2", "ada/rounds": "3", "ada/draws/drawn_total": "200", "completions/clipped_ratio": "n/a"},
    ]
    log = tmp_path / "dapo-seed0.log"
    log.write_text("Loading weights\n" + "".join(f"{entry}\n" for entry in entries) + "{'train_runtime': '3.0'}\n")
    assert shapes_from_log(log, group_rows=80) == {
        "generate_calls": [3.0, 3.0],
        "completions": [240.0, 200.0],
        "update_rows": [80.0, 80.0],
    }
    assert shapes_from_log(log, group_rows=None)["update_rows"] == [240.0, 200.0]  # a whole-pool update
    assert shapes_from_log(tmp_path / "missing.log", group_rows=80) is None


def test_tournament_reads_methods_at_equal_projected_gpu_time(tmp_path):
    from harness.gpu_time import PaperStepCost, add_projected_seconds
    from harness.tournament import tournament_summary, tournament_table

    # Flat prices: 1 s per call, nothing else, at the run's own scale; so a run's projected seconds are its calls.
    cost = PaperStepCost(((0.0, 1.0), (1e9, 1.0)), 0.0, 0.0, 0.0, batch_prompts=10)

    def run(method: str, seed: int, calls: float, heldouts: list[float]) -> dict:
        steps = len(heldouts) - 1
        return {
            "method": method, "label": method, "seed": seed, "prompts_per_step": 10,
            "curve": [{"step": i, "samples": 100.0 * i, "train_seconds": float(i), "heldout": h}
                      for i, h in enumerate(heldouts)],
            "draws": {"total": 100.0 * steps, "useful": 0.0, "trained": 0.0, "bands": {}},
            "step_shapes": {"generate_calls": [calls] * steps, "completions": [100.0] * steps,
                            "update_rows": [40.0] * steps},
        }  # fmt: skip

    # DAPO calls the engine 3 times a step, the rule once: at DAPO's 6 s the rule has run all 4 steps (0.4), DAPO 2.
    runs = [run("dapo", seed, 3.0, [0.0, 0.1, 0.2, 0.3, 0.4]) for seed in (0, 1)]
    runs += [run("rule", seed, 1.0, [0.0, 0.1, 0.2, 0.3, 0.4 + 0.1 * seed]) for seed in (0, 1)]
    add_projected_seconds(runs, tmp_path, lambda method, prompts: 40, cost)
    assert [point["gpu_seconds"] for point in runs[0]["curve"]] == [0.0, 3.0, 6.0, 9.0, 12.0]
    summary = tournament_summary(runs, budget=400)
    rule = summary["methods"]["rule"]
    # Equal projected time: the rule's 4 s (its total) against DAPO at 4 s (0.1 + 1/3 of the way to 0.2).
    expected = [0.4 - (0.1 + 0.1 / 3), 0.5 - (0.1 + 0.1 / 3)]
    assert rule["minus_reference_at_equal_gpu_time"]["mean"] == pytest.approx(sum(expected) / 2)
    assert rule["gpu_seconds"] == pytest.approx(4.0) and summary["methods"]["dapo"]["gpu_seconds"] == 12.0
    table = tournament_table(summary)
    assert "- dapo at equal projected GPU time | projected GPU h" in table
    # Runs without step shapes or a log keep the table as it was.
    for entry in runs:
        del entry["step_shapes"]
        for point in entry["curve"]:
            point.pop("gpu_seconds")
    add_projected_seconds(runs, tmp_path, lambda method, prompts: 40, cost)
    assert "projected GPU" not in tournament_table(tournament_summary(runs, budget=400))


def test_runs_that_do_not_record_their_prompts_per_step_are_projected_at_the_testbeds(tmp_path):
    from harness.gpu_time import PaperStepCost, add_projected_seconds

    # The stream's runs record their step shapes but not their prompts per step (the invocation's settings hold it).
    cost = PaperStepCost(((0.0, 1.0), (1e9, 1.0)), 0.0, 0.0, 0.0, batch_prompts=10)
    run = {
        "method": "dapo", "seed": 0,
        "curve": [{"step": i, "samples": 100.0 * i, "heldout": 0.1 * i} for i in range(3)],
        "step_shapes": {"generate_calls": [3.0, 2.0], "completions": [100.0, 100.0], "update_rows": [40.0, 40.0]},
    }  # fmt: skip
    add_projected_seconds([run], tmp_path, lambda method, prompts: 40, cost)
    assert "gpu_seconds" not in run["curve"][-1]  # no prompts per step known: nothing to scale by
    add_projected_seconds([run], tmp_path, lambda method, prompts: 40, cost, prompts_per_step=10)
    assert [point["gpu_seconds"] for point in run["curve"]] == [0.0, 3.0, 5.0]
    # Rows are priced at the paper's scale: 40 rows at 5 prompts a step stand for 80 at its 10, twice those at 10.
    per_row = PaperStepCost(((0.0, 0.0), (1e9, 0.0)), 0.0, 0.0, 0.01, batch_prompts=10)
    add_projected_seconds([run], tmp_path, lambda method, prompts: 40, per_row, prompts_per_step=5)
    assert run["curve"][-1]["gpu_seconds"] == pytest.approx(2 * 2 * 40 * 0.01)


def test_a_paired_difference_leaves_out_a_seed_with_no_reading():
    from harness.stats import paired_difference

    def run(seed: int, value: float | None) -> dict:
        return {"seed": seed, "value": value}

    # Seed 2's run ended before the reading: the difference is over seeds 0 and 1, not NaN.
    runs = [run(0, 0.5), run(1, 0.7), run(2, None)]
    reference = [run(0, 0.4), run(1, 0.4), run(2, 0.4), run(3, 0.1)]
    result = paired_difference(runs, reference, lambda r: r["value"])
    assert result["seeds"] == [0, 1] and result["mean"] == pytest.approx(0.2) and result["n"] == 2
