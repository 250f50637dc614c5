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
