"""A run stopped off its logging interval still logs its last steps, so totals read from the log miss none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the learning benchmarks' harness

from harness.training import draw_accounting, train_seconds  # noqa: E402


def dapo_run(tmp_path, tokenizer, dataset, max_steps, stop_at=None):
    """A DAPO run logged every third step; `stop_at` stops it there, as a completions budget does."""
    from transformers import TrainerCallback

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tiny import build_tiny_model

    scored = [0]

    def reward(completions, **kwargs):
        scored[0] += len(completions)
        return starts_low_digit(completions)

    class Budget(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop |= state.global_step == stop_at

    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=max_steps, per_device_train_batch_size=16, logging_steps=3),
        sampler="dapo",
        dapo_max_refills=4,
        dapo_on_exhausted="keep_partial",
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(
        model,
        [reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Budget()],
    )
    trainer.train()
    return [e for e in trainer.state.log_history if "step_time" in e], scored[0]


@pytest.mark.parametrize(("max_steps", "stop_at", "logged_steps"), [(4, None, [3, 4]), (5, 4, [3, 4])])
def test_the_steps_after_the_last_log_reach_the_totals(tmp_path, tokenizer, arithmetic_dataset, max_steps,
                                                        stop_at, logged_steps):  # fmt: skip
    # The Trainer logs every logging_steps only, but GRPOTrainer.log puts the metrics still pending into the run's
    # closing entry (the one with train_runtime): a step cap or a budget stop off the interval loses no step.
    entries, scored = dapo_run(tmp_path, tokenizer, arithmetic_dataset, max_steps, stop_at)
    assert [e["step"] for e in entries] == logged_steps
    assert "train_runtime" in entries[-1]
    assert draw_accounting(entries)["total"] == scored  # every completion drawn, the last window's included
    assert train_seconds(entries) > 0
