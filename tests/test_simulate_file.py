"""`trl-ada simulate --pass-rates-from FILE`: planning on a file of pass rates, checked against closed forms."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

from trl_ada import cli
from trl_ada.samplers import SamplerSettings, sampler_names
from trl_ada.samplers.simulate import plan, simulated_population

PASS_RATES = [0.05, 0.2, 0.5, 0.8, 1.0]
TRIALS = 2000  # 400 simulated prompts per pass rate


def _mixed(p: float, draws: int) -> float:
    """Chance that `draws` Bernoulli(p) draws hold both outcomes."""
    return 1.0 - p**draws - (1.0 - p) ** draws


def _standard_error(chances: list[float], trials: int) -> float:
    """Standard error of a share over `trials` simulated prompts spread evenly over prompts with these chances."""
    return math.sqrt(sum(c * (1.0 - c) for c in chances) / len(chances) / trials)


def _seq_balance_draws(p: float, round_size: int, max_rounds: int) -> tuple[float, float]:
    """Mean and variance of the completions seq_balance (quotas 2 and 2) draws at pass rate p: it stops after the
    first round whose pool holds 2 positives and 2 negatives, or at the cap."""

    def unfinished(draws: int) -> float:  # P(fewer than 2 positives or fewer than 2 negatives among `draws`)
        if draws < 4:
            return 1.0
        return sum(math.comb(draws, k) * p**k * (1 - p) ** (draws - k) for k in (0, 1, draws - 1, draws))

    mean = second = 0.0
    for rounds in range(1, max_rounds + 1):
        draws = rounds * round_size
        stop_here = unfinished(draws - round_size) - (unfinished(draws) if rounds < max_rounds else 0.0)
        mean += stop_here * draws
        second += stop_here * draws**2
    return mean, second - mean**2


def _run(capsys, *argv: str) -> list[dict]:
    assert cli.main(["simulate", *argv, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _write_parquet(path: Path, columns: dict[str, list]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_a_plan_on_a_jsonl_file_matches_the_closed_forms_and_a_parquet_file_gives_the_same(tmp_path, capsys):
    rows = [{"prompt": f"q{i}", "pass_rate": p} for i, p in enumerate(PASS_RATES)]
    jsonl = write_jsonl(tmp_path / "prompts.jsonl", rows)
    argv = ["--sampler", "uniform", "seq_balance", "--num-generations", "4", "--round-size", "4", "--trials"]
    uniform, seq_balance = _run(capsys, "--pass-rates-from", str(jsonl), *argv, str(TRIALS))

    # The reference: GRPO n=16 on the same prompts.
    reference = [_mixed(p, 16) for p in PASS_RATES]
    assert uniform["reference_mixed_share"] == pytest.approx(
        sum(reference) / len(reference), abs=4 * _standard_error(reference, TRIALS)
    )
    assert uniform["prompts"] == len(PASS_RATES) and uniform["simulated_prompts"] == TRIALS

    # Uniform n=4: exactly 4 completions, mixed share mean(1 - p^4 - (1-p)^4); it matches GRPO n=16 at n=16 exactly
    # (each prompt's draws are common to every setting, so a smaller n is never mixed more often).
    chances = [_mixed(p, 4) for p in PASS_RATES]
    assert uniform["completions_per_prompt"] == 4.0
    assert uniform["mixed_share"] == pytest.approx(
        sum(chances) / len(chances), abs=4 * _standard_error(chances, TRIALS)
    )
    assert uniform["completions_per_mixed_prompt"] == pytest.approx(4.0 / uniform["mixed_share"])
    assert (uniform["budget_knob"], uniform["budget_value"], uniform["budget_completions_per_prompt"]) == (
        "num_generations",
        16,
        16.0,
    )

    # seq_balance, rounds of 4 up to 4 rounds: mixed exactly when the first 16 draws are (it stops early only once
    # mixed), so on common draws its share IS the reference's, and max_rounds=4 is the smallest that reaches it.
    assert seq_balance["mixed_share"] == uniform["reference_mixed_share"]
    assert (seq_balance["budget_knob"], seq_balance["budget_value"]) == ("max_rounds", 4)
    assert seq_balance["budget_completions_per_prompt"] == seq_balance["completions_per_prompt"]
    moments = [_seq_balance_draws(p, 4, 4) for p in PASS_RATES]
    mean = sum(m for m, _ in moments) / len(moments)
    spread = math.sqrt(sum(v for _, v in moments) / len(moments) / TRIALS)
    assert seq_balance["completions_per_prompt"] == pytest.approx(mean, abs=4 * spread)

    # The same pass rates from a parquet file, the same seed: the same numbers.
    parquet = _write_parquet(
        tmp_path / "prompts.parquet", {"prompt": [r["prompt"] for r in rows], "pass_rate": PASS_RATES}
    )
    argv = ["--sampler", "uniform", "--num-generations", "4", "--trials", str(TRIALS)]
    assert _run(capsys, "--pass-rates-from", str(parquet), *argv) == [uniform]


def test_the_table_names_every_registered_sampler_by_default(tmp_path, capsys):
    path = write_jsonl(tmp_path / "p.jsonl", [{"pass_rate": 0.3}, {"pass_rate": 0.7}])
    assert cli.main(["simulate", "--pass-rates-from", str(path), "--trials", "40"]) == 0
    table = capsys.readouterr().out
    assert "GRPO n=16" in table and "to match GRPO n=16" in table
    listed = {line.split()[0] for line in table.splitlines()[4:]}
    assert listed == set(sampler_names())


def test_a_budget_out_of_reach_is_said_and_plans_are_deterministic():
    # seq_pos stops at its first positive, so on easy prompts no cap makes its group mixed as often as GRPO n=16's.
    settings = [SamplerSettings(sampler="seq_pos", num_generations=4, round_size=4)]
    first = plan(settings, [0.9, 0.95], trials=200, seed=3)
    assert first[0].budget_value is None and "not reached" in first[0].budget_note
    assert plan(settings, [0.9, 0.95], trials=200, seed=3) == first


def test_a_large_file_is_simulated_at_evenly_spaced_quantiles():
    assert simulated_population([0.5, 0.1], 5) == [0.5, 0.5, 0.5, 0.1, 0.1, 0.1]
    assert simulated_population([i / 99 for i in range(100)][::-1], 4) == [12 / 99, 37 / 99, 62 / 99, 87 / 99]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.jsonl", None, "no such file"),
        ("prompts.csv", "pass_rate\n0.5\n", "unknown format"),
        ("empty.jsonl", "", "holds no prompts"),
        (
            "nocolumn.jsonl",
            [{"prompt": "a", "num_correct": 3}],
            "no 'pass_rate' column (columns: 'prompt', 'num_correct')",
        ),
        ("nocolumn.parquet", {"prompt": ["a"]}, "no 'pass_rate' column (columns: 'prompt')"),
        ("null.jsonl", [{"pass_rate": 0.5}, {"pass_rate": None}], "1 of 2 rows"),
        ("nan.parquet", {"pass_rate": [0.5, float("nan")]}, "row 2: nan"),
        ("range.jsonl", [{"pass_rate": 1.5}, {"pass_rate": -0.1}, {"pass_rate": 0.5}], "2 of 3 rows"),
        ("text.jsonl", [{"pass_rate": "0.5"}], "row 1: '0.5'"),
        ("partial.jsonl", [{"pass_rate": 0.5}, {"prompt": "b"}], "line 2 (a row of 2) has no 'pass_rate'"),
        ("broken.jsonl", '{"pass_rate": 0.5}\n{"pass_rate": \n', "line 2: not JSON"),
    ],
)
def test_bad_files_are_rejected_before_any_compute(tmp_path, capsys, monkeypatch, name, content, message):
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, list):
        write_jsonl(path, content)
    elif isinstance(content, dict):
        _write_parquet(path, content)
    monkeypatch.setattr(cli, "plan", lambda *args, **kwargs: pytest.fail("planned on a bad file"))
    with pytest.raises(SystemExit) as exited:
        cli.main(["simulate", "--pass-rates-from", str(path)])
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert message in error
    assert "prepare-data" in error or "Drop those rows" in error  # the fix is named


def test_knobs_go_to_the_samplers_that_read_them_and_mistakes_are_named(tmp_path, capsys):
    path = write_jsonl(tmp_path / "p.jsonl", [{"pass_rate": 0.5}])
    for argv, message in [
        (["--sampler", "uniform", "dapo", "--round-size", "4"], "--round-size is read by none of the samplers"),
        (["--pass-rates", "0.5"], "--pass-rates and --pass-rates-from both"),
        (["--sampler", "nonexistent"], "nonexistent"),
    ]:
        with pytest.raises(SystemExit):
            cli.main(["simulate", "--pass-rates-from", str(path), *argv])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--sampler", "uniform", "dapo", "--trials", "10"])
    assert "--pass-rates-from" in capsys.readouterr().err
