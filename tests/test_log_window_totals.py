"""A run's counted totals (draws, the gated refill's passes) read from its log entries, at any `logging_steps`."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

from trl_ada.reporting.metrics import reduce_log_window
from trl_ada.samplers.accounting import BANDS, PromptDraws, draw_metrics

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.training import draw_accounting, gate_passes, train_seconds  # noqa: E402


def gated_run(tmp_path, tokenizer, dataset, logging_steps):
    """A short `dapo_gated` run whose gate passes over prompts; returns its log, the gate's verdicts and the draws."""
    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tiny import build_tiny_model

    scored = [0]

    def reward(completions, hopeless, **kwargs):
        scored[0] += len(completions)
        return [0.0 if h else r for h, r in zip(hopeless, starts_low_digit(completions), strict=True)]

    config = AdaGRPOConfig(
        **tiny_args(
            tmp_path / f"every{logging_steps}",
            max_steps=6,
            per_device_train_batch_size=16,
            logging_steps=logging_steps,
        ),
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
    return entries, sum(verdicts), scored[0]


def test_draw_totals_and_gate_passes_do_not_depend_on_the_logging_interval(tmp_path, tokenizer, arithmetic_dataset):
    # Every other prompt is hopeless, so the gate passes some over and the refills draw batches of unequal size.
    dataset = arithmetic_dataset.select(range(16)).map(lambda row, i: {"hopeless": i % 2 == 0}, with_indices=True)
    every_step, passes, drawn = gated_run(tmp_path, tokenizer, dataset, logging_steps=1)
    every_third, passes_3, drawn_3 = gated_run(tmp_path, tokenizer, dataset, logging_steps=3)
    assert (passes, drawn) == (passes_3, drawn_3) > (0, 0)  # the same run, logged twice as often
    assert [e["step"] for e in every_third] == [3, 6]
    # Every completion the reward scored is a draw; every verdict of the gate a pass.
    accounting = draw_accounting(every_step)
    assert accounting["total"] == drawn
    assert gate_passes(every_step) == passes
    # Logged every third step, each entry holds its window's sums: the same totals.
    assert gate_passes(every_third) == passes
    accounting_3 = draw_accounting(every_third)
    assert accounting_3["total"] == drawn
    assert accounting_3 == accounting  # counts: exact sums
    assert accounting["useful"] > 0 and set(accounting["bands"]) >= {"none_right"}
    # The curve's training seconds weigh each entry's mean step time by the steps it covers.
    seconds = train_seconds(every_third)
    assert seconds == pytest.approx(sum(e["step_time"] * 3 for e in every_third))


def test_a_window_sums_counters_takes_extrema_and_averages_the_rest():
    window = {
        "ada/draws/drawn_total": [16.0, 48.0, 8.0],
        "ada/dapo/passed_over_total": [0.0, math.nan, 3.0],
        "ada/samples_per_prompt/max": [4.0, 12.0, 8.0],
        "ada/samples_per_prompt/min": [4.0, 2.0, 8.0],
        "ada/samples_per_prompt/mean": [4.0, 6.0],
        "ada/round_time/total": [math.nan],
        "completions/max_length": [3.0, 6.0],  # TRL's own metric: left for TRL to average
    }
    reduce_log_window(window)
    assert window == {
        "ada/draws/drawn_total": [72.0],
        "ada/dapo/passed_over_total": [3.0],
        "ada/samples_per_prompt/max": [12.0],
        "ada/samples_per_prompt/min": [2.0],
        "ada/samples_per_prompt/mean": [4.0, 6.0],
        "ada/round_time/total": window["ada/round_time/total"],  # nothing valid: left for TRL to log None
        "completions/max_length": [3.0, 6.0],
    }
    assert math.isnan(window["ada/round_time/total"][0])
    reduce_log_window(window)  # reducing twice changes nothing (an evaluation log in between)
    assert window["ada/draws/drawn_total"] == [72.0]


def test_the_draw_counters_count_what_the_shares_divide():
    prompts = [PromptDraws(0.0, 12, False, 0), PromptDraws(0.5, 8, True, 4), PromptDraws(0.5, 4, False, 0)]
    metrics = draw_metrics(prompts)
    assert metrics["draws/drawn_total"] == metrics["draws/drawn"] == 24.0
    assert metrics["draws/useful_total"] == metrics["draws/useful_share"] * 24 == 8.0
    assert metrics["draws/trained_total"] == 4.0
    assert metrics["draws/mid/drawn_total"] == 12.0 and metrics["draws/mid/useful_total"] == 8.0
    assert metrics["draws/none_right/drawn_total"] == 12.0 and metrics["draws/none_right/useful_total"] == 0.0
    # every band's counters, drawn or not, so a window's sum always has all of them
    assert {f"draws/{band}/drawn_total" for band in BANDS} <= set(metrics)
    assert draw_metrics([])["draws/drawn_total"] == 0.0
