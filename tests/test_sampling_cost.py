"""Smoke test of `benchmarks/sampling_cost.py --quick`: files are written and the simulated costs are right."""

import csv
import importlib.util
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sampling_cost.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("sampling_cost_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()


def _read(path):
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key, value in row.items():
            try:
                row[key] = float(value)
            except ValueError:
                pass
    return rows


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("sampling_cost")
    assert bench.main(["--quick", "--out", str(out)]) == 0
    return out


def test_outputs_exist(out):
    for name in (bench.FIG10_FILE, bench.FIG2_FILE, bench.ROUNDS_FILE):
        for suffix in (".png", ".csv"):
            path = out / f"{name}{suffix}"
            assert path.is_file() and path.stat().st_size > 0, path
        assert (out / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(_read(out / f"{name}.csv")) > 1


def _curves(rows):
    curves = {}
    for row in rows:
        curves.setdefault((row["sampler"], row["cap"], row["quota"]), []).append(row)
    return {key: sorted(points, key=lambda r: r["pass_rate"]) for key, points in curves.items()}


def _at(points, p):
    return next(r for r in points if math.isclose(r["pass_rate"], p))


def _se(row):
    return row["exact_sd_samples"] / math.sqrt(row["trials"])


def test_fig10_costs(out):
    rows = _read(out / f"{bench.FIG10_FILE}.csv")
    curves = _curves(rows)
    assert {key[0] for key in curves} == {"seq_pos", "seq_balance"} and {key[1] for key in curves} == {32, 64, 128}
    for (sampler, cap, quota), points in curves.items():
        for row in points:
            # Never above the cap, and a fixed policy always draws whole rounds.
            assert row["max_samples"] <= cap and row["mean_samples"] <= cap
            assert row["mean_samples"] == pytest.approx(row["mean_rounds"] * row["round_size"])
            # The simulation agrees with the exact expectation (5 SE, plus one round of one prompt for rare events).
            tolerance = 5 * _se(row) + row["round_size"] / row["trials"]
            assert abs(row["mean_samples"] - row["exact_mean_samples"]) <= tolerance, (sampler, cap, quota, row)
        samples = [r["mean_samples"] for r in points]
        if sampler == "seq_pos":
            # Fewer completions as p grows (up to noise), and strictly fewer from p=0.05 to p=0.95.
            for a, b in zip(points, points[1:]):
                assert b["mean_samples"] <= a["mean_samples"] + 4 * math.hypot(_se(a), _se(b)) + 1e-9
            assert samples[0] > samples[-1]
        else:
            # U-shaped: hard and easy prompts both need more completions than p=0.5.
            middle = _at(points, 0.5)["mean_samples"]
            assert _at(points, 0.05)["mean_samples"] > middle < _at(points, 0.95)["mean_samples"]
            # Symmetric quotas: p and 1-p cost the same exactly.
            assert _at(points, 0.05)["exact_mean_samples"] == pytest.approx(_at(points, 0.95)["exact_mean_samples"])


def test_fig2_matches_closed_form(out):
    rows = _read(out / f"{bench.FIG2_FILE}.csv")
    assert [r["group_size"] for r in rows] == sorted(r["group_size"] for r in rows)
    for row in rows:
        for side in ("all_correct", "all_wrong"):
            tolerance = 4 * row[f"{side}_se"] + 1 / row["prompts"]
            assert abs(row[f"{side}_mc"] - row[f"{side}_exact"]) <= tolerance, (side, row)
    for a, b in zip(rows, rows[1:]):  # both shares fall with the group size
        assert b["all_correct_exact"] < a["all_correct_exact"] and b["all_wrong_exact"] < a["all_wrong_exact"]
    # All-wrong tends to the share of prompts with p = 0.
    assert bench.closed_form_unmixed(10_000)[1] == pytest.approx(bench.population_weights()[0], abs=1e-3)


def test_closed_form_is_the_population_mean():
    population = bench.sample_population(50_000, seed=1)
    for k in (1, 4, 16):
        correct, wrong = bench.closed_form_unmixed(k)
        assert sum(p**k for p in population) / len(population) == pytest.approx(correct, abs=0.01)
        assert sum((1 - p) ** k for p in population) / len(population) == pytest.approx(wrong, abs=0.01)


def test_round_policies(out):
    rows = _read(out / f"{bench.ROUNDS_FILE}.csv")
    fixed = rows[0]
    assert fixed["policy"] == "fixed"
    assert fixed["samples_ratio_vs_fixed"] == 1 and fixed["rounds_ratio_vs_fixed"] == 1
    assert {r["policy"] for r in rows} == {"fixed", "predictive", "tracked", "oracle"}
    cap = bench.ROUNDS_SETTINGS.round_size * bench.ROUNDS_SETTINGS.max_rounds
    for row in rows:
        assert row["max_samples"] <= cap
        assert 1 <= row["mean_rounds"] <= bench.ROUNDS_SETTINGS.max_rounds
        # Every policy draws until the quotas hold or the cap is reached, so a kept group is mixed exactly when
        # the first 32 draws hold both outcomes: the mixed share cannot depend on the policy.
        assert abs(row["mixed_share"] - fixed["mixed_share"]) <= 4 * row["mixed_diff_se"] + 1e-12, row
        active = [row[f"active_round_{r}"] for r in range(1, bench.ROUNDS_SETTINGS.max_rounds + 1)]
        assert active[0] == 1 and all(b <= a for a, b in zip(active, active[1:]))
        assert row["mean_rounds"] == pytest.approx(sum(active), abs=1e-4)  # E[T] = sum_r P(T >= r)
    # A higher confidence asks for more completions per round: fewer rounds, more samples (the frontier).
    for policy in ("predictive", "tracked", "oracle"):
        points = sorted((r for r in rows if r["policy"] == policy), key=lambda r: r["confidence"])
        assert points[-1]["mean_samples"] > points[0]["mean_samples"]
        assert points[-1]["mean_rounds"] < points[0]["mean_rounds"]


def test_run_population_reproduces_simulate():
    from trl_ada.samplers import SamplerSettings, build_sampler, simulate

    settings = SamplerSettings(
        num_generations=4,
        scale_rewards="none",
        seed=0,
        sampler="seq_balance",
        round_policy="predictive",
        round_confidence=0.8,
    )
    rates, trials = [0.1, 0.5, 0.9], 30
    expected = simulate(settings, rates, trials=trials, seed=3, steps=2)
    selection = bench.run_population(build_sampler(settings), [p for p in rates for _ in range(trials)], 3, steps=2)
    mixed = bench.mixed_flags(selection, settings.positive_threshold)
    for i, result in enumerate(expected):
        block = range(i * trials, (i + 1) * trials)
        assert sum(len(selection.pools[j]) for j in block) / trials == result.mean_samples
        assert sum(selection.rounds_per_prompt[j] for j in block) / trials == result.mean_rounds
        assert sum(mixed[j] for j in block) / trials == result.mixed_share


def test_exact_cost_and_batch_rounds():
    # seq_pos K=1, one round of 4 then stop unless all four failed: E = 4 * (1 + q^4 + q^8 + ...) truncated.
    q = 0.7
    mean, sd, rounds = bench.exact_sequential_cost(0.3, 1, 0, 4, 3)
    assert rounds == pytest.approx(1 + q**4 + q**8)
    assert mean == pytest.approx(4 * rounds)
    assert sd > 0
    # Batch rounds: the max of B draws; one prompt in ten needs 3 rounds, the rest 1.
    rounds_per_prompt = [3] + [1] * 9
    assert bench.expected_batch_rounds(rounds_per_prompt, 1, 3) == pytest.approx(1.2)
    assert bench.expected_batch_rounds(rounds_per_prompt, 512, 3) == pytest.approx(3.0)


def test_oracle_first_request_follows_true_pass_rate():
    settings = bench.ROUNDS_SETTINGS
    sampler = bench.oracle_sampler(settings, [0.5, 0.1])
    step = sampler.begin(2, [0, 1])
    sizes = dict(step.requests())
    assert sizes[0] < sizes[1]  # a hard prompt gets a larger first request
