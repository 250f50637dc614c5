"""The finite, hard-skewed comparison of issue 13: building the sets and the runner's finite mode.

Correctness only, no timing: `scripts/prepare_data.py --band_mix` selects by band counts; the interval and paired
difference maths of the benchmarks' harness and `scripts/benchmark_learning.py` against hand-computed values; and a smoke run (2 methods x 2 seeds,
2 epochs of a 16-prompt set) checks per-band evaluation, completion counts, epochs over the finite set and that the
summary's intervals are those of its runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.arithmetic import epoch_visits, steps_per_epoch  # noqa: E402
from harness.stats import mean_ci, t_quantile  # noqa: E402


def load(path: Path, name: str) -> ModuleType:
    """Imports a script as a module (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load(ROOT / "scripts" / "benchmark_learning.py", "benchmark_learning_finite")


@pytest.fixture(scope="module")
def prepare_data() -> ModuleType:
    return load(ROOT / "scripts" / "prepare_data.py", "prepare_data_finite")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# ---------------------------------------------------------------------------------------------------------------------
# prepare_data.py --band_mix
# ---------------------------------------------------------------------------------------------------------------------


def test_mix_counts_scales_the_papers_mix_by_largest_remainder(prepare_data):
    mix = prepare_data.parse_band_mix(["[0,0]:984", "(0,0.2]:3082", "(0.2,0.5]:870", "(0.5,1]:63"])
    assert [str(band) for band, _ in mix] == ["[0, 0]", "(0, 0.2]", "(0.2, 0.5]", "(0.5, 1]"]
    # 1000 * (984, 3082, 870, 63) / 4999 = 196.84, 616.52, 174.03, 12.60: floors sum to 998, the two largest
    # remainders (0.84, 0.60) get one more.
    assert prepare_data.mix_counts(mix, 1000, 16) == [197, 616, 174, 13]
    assert prepare_data.mix_counts(mix, None, 16) == [984, 3082, 870, 63]
    # The bands as counts of 16: 0 | 1..3 | 4..8 | 9..16.
    assert [c for c in range(17) if mix[1][0].contains(c, 16)] == [1, 2, 3]
    assert [c for c in range(17) if mix[2][0].contains(c, 16)] == [4, 5, 6, 7, 8]


def test_mix_errors(prepare_data):
    with pytest.raises(ValueError, match="overlap at 0 of 16"):
        prepare_data.mix_counts(prepare_data.parse_band_mix(["[0,0]:1", "[0,0.2]:1"]), None, 16)
    with pytest.raises(ValueError, match="whole numbers"):
        prepare_data.mix_counts(prepare_data.parse_band_mix(["[0,0]:1.5"]), None, 16)
    with pytest.raises(ValueError, match="BAND:COUNT"):
        prepare_data.parse_band_mix(["0-0.2:5"])
    with pytest.raises(SystemExit):  # one difficulty rule at a time
        prepare_data.build_parser().parse_args(
            ["--dataset_name", "x", "--output", "o.jsonl", "--band_mix", "[0,0]:1", "--correct_range", "1", "2"]
        )


class CountingGenerator:
    """The first ``correct[prompt]`` of the samples state the answer; the rest a wrong one."""

    def __init__(self, answers: dict[str, str], correct: dict[str, int]) -> None:
        self.answers, self.correct = answers, correct

    def __call__(self, prompts: list[str], num_samples: int) -> list[list[str]]:
        return [[self.answers[p]] * self.correct[p] + ["-1"] * (num_samples - self.correct[p]) for p in prompts]


def band_mix_args(prepare_data, source: Path, output: Path, *mix: str) -> Any:
    argv = [
        "--dataset_name", str(source), "--output", str(output), "--model_name_or_path", "unused",
        "--reward", "exact_match", "--prompt_format", "text", "--system_prompt", "", "--instruction", "",
        "--keep_columns", "level", "--num_samples", "16", "--band_mix", *mix,
    ]  # fmt: skip
    return prepare_data.build_parser().parse_args(argv)


def test_band_mix_selects_counts_per_band_with_pass_rates(prepare_data, tmp_path):
    from trl_ada.tiny import build_char_tokenizer

    # 40 prompts: correct counts cycle over 0, 1, 2, 5, 12 (of 16), 8 prompts each.
    cycle = [0, 1, 2, 5, 12]
    rows = [{"problem": f"{i:>3d}+  1=", "answer": str(i + 1), "level": i % 6} for i in range(40)]
    correct = {row["problem"]: cycle[i % 5] for i, row in enumerate(rows)}
    generator = CountingGenerator({row["problem"]: row["answer"] for row in rows}, correct)
    source = write_jsonl(tmp_path / "pool.jsonl", rows)
    output = tmp_path / "mix.jsonl"
    args = band_mix_args(prepare_data, source, output, "[0,0]:3", "(0,0.2]:6", "(0.2,0.5]:2", "(0.5,1]:1")
    report = prepare_data.prepare(args, generator=generator, tokenizer=build_char_tokenizer())
    out = [json.loads(line) for line in output.read_text().splitlines()]
    bands = [row["band"] for row in out]
    assert {band: bands.count(band) for band in set(bands)} == {
        "[0, 0]": 3,
        "(0, 0.2]": 6,
        "(0.2, 0.5]": 2,
        "(0.5, 1]": 1,
    }
    for row in out:
        assert row["pass_rate"] == row["num_correct"] / 16 == correct[row["prompt"]] / 16
        assert row["prompt"] == row["problem"]  # the task's fixed-width prompt, untouched
        assert row["answer"] == row["solution"] and "level" in row
    assert report["band_mix"]["(0, 0.2]"] == {"requested": 6, "available": 16}
    assert report["counts"]["after_band_mix"] == 12
    # Deterministic for a seed.
    again = prepare_data.prepare(
        band_mix_args(
            prepare_data, source, tmp_path / "again.jsonl", "[0,0]:3", "(0,0.2]:6", "(0.2,0.5]:2", "(0.5,1]:1"
        ),
        generator=generator,
        tokenizer=build_char_tokenizer(),
    )
    assert again["band_mix"] == report["band_mix"]
    assert (tmp_path / "again.jsonl").read_text() == output.read_text()
    # Too few prompts in a band fails, naming it.
    short = band_mix_args(prepare_data, source, tmp_path / "short.jsonl", "(0.5,1]:9")
    with pytest.raises(ValueError, match=r"\(0.5, 1\]"):
        prepare_data.prepare(short, generator=generator, tokenizer=build_char_tokenizer())


# ---------------------------------------------------------------------------------------------------------------------
# benchmark_learning.py: intervals and paired differences on fixed inputs
# ---------------------------------------------------------------------------------------------------------------------


def test_t_quantile_matches_tables():
    for df, value in {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 9: 2.2621572, 30: 2.0422725}.items():
        assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-6)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)
    assert t_quantile(0.025, 4) == pytest.approx(-2.7764451, abs=1e-6)


def test_mean_ci_hand_computed():
    stat = mean_ci([0.1, 0.2, 0.3, 0.4, 0.5])
    # sd = sqrt(0.025) = 0.1581139; half width = t(0.975, 4) * sd / sqrt(5) = 2.7764451 * 0.0707107 = 0.1963249.
    assert stat["mean"] == pytest.approx(0.3)
    assert stat["sd"] == pytest.approx(0.1581139, abs=1e-7)
    assert stat["half_width"] == pytest.approx(0.1963249, abs=1e-6)
    assert (stat["ci_low"], stat["ci_high"]) == pytest.approx((0.1036751, 0.4963249), abs=1e-6)
    assert mean_ci([0.4])["ci_low"] is None and mean_ci([0.4])["mean"] == 0.4


def fake_run(method: str, seed: int, points: list[tuple[float, float, dict[str, float]]]) -> dict:
    """A run result as `run_finite` writes it: (samples, held-out, per-band) at steps 0, 10, 20, ..."""
    curve = [
        {"step": 10 * i, "epoch": i / 2, "heldout": h, "bands": b, "samples": s, "train_seconds": float(i)}
        for i, (s, h, b) in enumerate(points)
    ]
    visits = [{"distinct": 4, "max_steps_per_row": 1}]
    return {
        "method": method,
        "label": method,
        "seed": seed,
        "start_heldout": curve[0]["heldout"],
        "curve": curve,
        "median_step_seconds": 0.1,
        "epoch_visits": visits,
    }


def test_paired_differences_and_completions_ratio_hand_computed(bench):
    band = {"[0, 0]": 0.0, "(0, 0.2]": 0.1}
    results = []
    # Finals: dapo 0.40 0.60 0.50 0.90 (seed 3 unpaired); seq_balance 0.50 0.60 0.70 -> diffs 0.1, 0.0, 0.2.
    for seed, final in enumerate([0.4, 0.6, 0.5, 0.9]):
        results.append(fake_run("dapo", seed, [(0, 0.3, band), (100, 0.35, band), (200, final, band)]))
    for seed, final in enumerate([0.5, 0.6, 0.7]):
        bands = {"[0, 0]": 0.1 * seed, "(0, 0.2]": 0.2}
        results.append(fake_run("seq_balance", seed, [(0, 0.3, bands), (150, 0.4, bands), (300, final, bands)]))
    # grpo_n16 ends at 0.5 on every seed, reached at 400 completions; seq_balance's mean curve is 0.3, 0.4, 0.6 at
    # 0, 150, 300 completions: it reaches 0.5 half way between its last two points, at 225.
    for seed in range(3):
        results.append(fake_run("grpo_n16", seed, [(0, 0.3, band), (200, 0.4, band), (400, 0.5, band)]))
    summary = bench.summarize_finite(results)
    assert summary["bands"] == ["[0, 0]", "(0, 0.2]"]  # ordered by pass rate, not by text

    diff = summary["paired"]["dapo"]["seq_balance"]["overall"]
    assert diff["seeds"] == [0, 1, 2]
    # mean 0.1, sd 0.1, half width t(0.975, 2) * 0.1 / sqrt(3) = 4.3026527 * 0.0577350 = 0.2484138.
    assert diff["mean"] == pytest.approx(0.1)
    assert diff["half_width"] == pytest.approx(0.2484138, abs=1e-6)
    assert diff["ci_low"] == pytest.approx(0.1 - 0.2484138, abs=1e-6)
    # Per band: seq_balance's "[0, 0]" is 0.0, 0.1, 0.2 against dapo's 0.0 -> mean 0.1, the same interval.
    assert summary["paired"]["dapo"]["seq_balance"]["bands"]["[0, 0]"]["half_width"] == pytest.approx(
        0.2484138, abs=1e-6
    )
    assert summary["paired"]["dapo"]["seq_balance"]["bands"]["(0, 0.2]"]["mean"] == pytest.approx(0.1)
    assert "grpo_n4" not in summary["paired"]  # no GRPO-n4 runs, no comparison against it

    final = summary["methods"]["dapo"]["final_heldout"]
    assert final["mean"] == pytest.approx(0.6) and final["n"] == 4
    assert summary["methods"]["seq_balance"]["curve"][2]["heldout"] == pytest.approx(0.6)

    ratio = summary["completions_to_grpo_n16_final"]
    assert ratio["best_adaptive"] == "seq_balance"
    assert ratio["target_heldout"] == pytest.approx(0.5)
    assert ratio["samples_best"] == pytest.approx(225)
    assert ratio["samples_grpo_n16"] == pytest.approx(400)
    assert ratio["ratio"] == pytest.approx(225 / 400)
    # Per seed (target 0.5 each): seed 0 reaches it at 300 (0.4 -> 0.5 over 150..300), seeds 1, 2 at 225, 200.
    assert ratio["per_seed"] == pytest.approx({0: 300 / 400, 1: 225 / 400, 2: 200 / 400})

    table = bench.finite_table(summary)
    assert "| seq_balance | 3 | 1.00 | 0.600 [" in table
    assert "+0.100 [-0.148, +0.348]" in table


def test_epoch_visits():
    # Two epochs of two steps over rows 0..3; in the second epoch row 1 comes back in a second step (a refill).
    stats = epoch_visits([[0, 1], [2, 3], [1, 3], [0, 1, 2]], per_epoch=2)
    assert stats == [{"distinct": 4, "max_steps_per_row": 1}, {"distinct": 4, "max_steps_per_row": 2}]
    assert steps_per_epoch(1000, 16) == 62  # TRL drops an epoch's incomplete last batch


# ---------------------------------------------------------------------------------------------------------------------
# Smoke run: 2 methods x 2 seeds, 2 epochs of a 16-prompt set
# ---------------------------------------------------------------------------------------------------------------------


SMOKE_PROMPTS, SMOKE_PER_STEP, SMOKE_HELDOUT = 16, 4, 6
"""The smoke run's training set, prompts per step (4 steps an epoch, 8 in all) and held-out set (3 per band)."""


def test_finite_smoke_run(bench, tmp_path, monkeypatch):
    from trl_ada.tasks.arithmetic import held_out_problems, make_problems

    bands = ["[0, 0]", "(0, 0.5]"]
    n, per_step = SMOKE_PROMPTS, SMOKE_PER_STEP
    train = [
        {**p, "band": bands[i % 2], "num_correct": 0, "pass_rate": 0.0}
        for i, p in enumerate(make_problems(n, seed=5, levels=[2, 3]))
    ]
    assert len({row["prompt"] for row in train}) == n
    heldout = [
        {**p, "band": bands[i % 2]} for i, p in enumerate(held_out_problems(SMOKE_HELDOUT, seed=5, levels=[2, 3]))
    ]
    train_path = write_jsonl(tmp_path / "train.jsonl", train)
    heldout_path = write_jsonl(tmp_path / "heldout.jsonl", heldout)
    out = tmp_path / "finite"
    argv = [
        "--out", str(out), "--train_data", str(train_path), "--heldout_data", str(heldout_path),
        "--epochs", "2", "--prompts_per_step", str(per_step), "--eval_every", "2", "--eval_samples", "2",
        "--methods", "grpo_n4", "seq_balance", "--seeds", "0", "1", "--jobs", "2", "--learning_rate", "1e-4",
    ]  # fmt: skip
    assert bench.main(argv) == 0

    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["steps"] == 8  # 2 epochs x 16 / 4
    assert summary["bands"] == bands
    runs = {(run["method"], run["seed"]): run for run in map(json.loads, map(Path.read_text, out.glob("runs/*.json")))}
    assert set(runs) == {(m, s) for m in ("grpo_n4", "seq_balance") for s in (0, 1)}
    for (method, _), run in runs.items():
        assert [p["step"] for p in run["curve"]] == [0, 2, 4, 6, 8]
        assert [p["epoch"] for p in run["curve"]] == [0, 0.5, 1, 1.5, 2]
        for point in run["curve"]:  # per-band evaluation: every band, each a pass rate
            assert set(point["bands"]) == set(bands) and all(0 <= v <= 1 for v in point["bands"].values())
            # The overall rate averages the two equal-sized bands.
            assert point["heldout"] == pytest.approx(sum(point["bands"].values()) / 2)
        # Every prompt once per epoch: 4 steps of 4 distinct prompts cover all 16, none in two steps.
        assert run["epoch_visits"] == [{"distinct": n, "max_steps_per_row": 1}] * 2
        for epoch in range(2):
            rows = [row for step in run["visits"][4 * epoch : 4 * epoch + 4] for row in step]
            assert sorted(rows) == list(range(n))
        samples = [p["samples"] for p in run["curve"]]
        assert samples == sorted(samples) and samples[-1] == sum(run["completions_per_step"])
        # Wall time at a point counts every step up to it, the point's own step included.
        assert len(run["step_seconds"]) == 8
        assert run["curve"][-1]["train_seconds"] == pytest.approx(sum(run["step_seconds"]))
        assert run["curve"][1]["train_seconds"] == pytest.approx(sum(run["step_seconds"][:2]))
        if method == "grpo_n4":
            assert run["completions_per_step"] == [per_step * 4] * 8
        else:  # at least one round of 8 per prompt, at most 4
            assert all(per_step * 8 <= c <= per_step * 32 for c in run["completions_per_step"])

    # The summary's numbers are those of its runs.
    finals = {key: run["curve"][-1]["heldout"] for key, run in runs.items()}
    stat = summary["methods"]["seq_balance"]["final_heldout"]
    expected = mean_ci([finals[("seq_balance", 0)], finals[("seq_balance", 1)]])
    assert stat["mean"] == pytest.approx(expected["mean"])
    if expected["half_width"] is not None:
        assert stat["half_width"] == pytest.approx(expected["half_width"])
    diff = summary["paired"]["grpo_n4"]["seq_balance"]["overall"]
    diffs = [finals[("seq_balance", s)] - finals[("grpo_n4", s)] for s in (0, 1)]
    assert diff["seeds"] == [0, 1] and diff["mean"] == pytest.approx(sum(diffs) / 2)
    assert diff["half_width"] == pytest.approx(12.7062047 * abs(diffs[0] - diffs[1]) / 2, abs=1e-6)
    assert set(summary["paired"]["grpo_n4"]["seq_balance"]["bands"]) == set(bands)
    assert summary["completions_to_grpo_n16_final"] is None  # no GRPO-n16 in the smoke run
    table = (out / "table.md").read_text()
    assert "| Seq-balance | 2 | 2.00 |" in table and "(0, 0.5]" in table
    for name in ("learning_curves.png", "band_curves.png"):
        assert (out / name).stat().st_size > 1000
    assert not math.isnan(summary["methods"]["grpo_n4"]["samples_total"]["mean"])

    # --reuse_runs keeps the finished runs whose settings match (adding a seed starts only that seed's runs) ...
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(command, **kwargs):
        started.append(command[command.index("--run") + 1 :])
        return real_popen(command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    seeds_at = argv.index("--seeds")
    assert (
        bench.main(
            [*argv[: seeds_at + 1], "0", "1", "2", *argv[seeds_at + 3 :], "--reuse_runs", "--methods", "grpo_n4"]
        )
        == 0
    )
    assert started == [["grpo_n4", "2"]]
    assert json.loads((out / "runs" / "grpo_n4-seed0.json").read_text()) == runs[("grpo_n4", 0)]
    assert json.loads((out / "summary.json").read_text())["methods"]["grpo_n4"]["seeds"] == [0, 1, 2]
    # ... and reruns any whose settings differ (here the learning rate).
    started.clear()
    lr_at = argv.index("--learning_rate")
    changed = [*argv[:lr_at], "--learning_rate", "2e-4", "--reuse_runs", "--methods", "grpo_n4", "--seeds", "0"]
    assert bench.main(changed) == 0
    assert started == [["grpo_n4", "0"]]

    # --report_only starts no run and builds the tables from the runs made with these settings only: grpo_n4's seed 0
    # now holds the 2e-4 run, so it is left out, as is the seed 3 nobody ran.
    started.clear()
    report = [*argv[: seeds_at + 1], "0", "1", "2", "3", *argv[seeds_at + 3 :], "--report_only"]
    assert bench.main(report) == 0
    assert started == []
    reported = json.loads((out / "summary.json").read_text())["methods"]
    assert reported["grpo_n4"]["seeds"] == [1, 2] and reported["seq_balance"]["seeds"] == [0, 1]
