"""est and dapo inside AdaGRPOTrainer, and sampler state across checkpoints (tiny model, CPU, one process)."""

import json
import logging
import math

import pytest
import torch
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args
from test_trainer import recording

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.samplers.dapo import BatchExhaustedError
from trl_ada.samplers.predictor import PREDICTOR_DIR, PREDICTOR_FILE
from trl_ada.tiny import build_tiny_model


def always_right(completions, **kwargs):
    return [1.0] * len(completions)


def make_trainer(config, tokenizer, dataset, rewards=(starts_low_digit,)):
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    return recording(AdaGRPOTrainer)(
        model, list(rewards), args=config, train_dataset=dataset, processing_class=tokenizer
    )


def test_est_trains_on_variable_groups_with_a_fixed_total(tmp_path, tokenizer, arithmetic_dataset):
    # 8 prompts of 32 per step for 6 steps: prompts come back in the second epoch, so the tracker gets used
    dataset = arithmetic_dataset.select(range(32))
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=6, per_device_train_batch_size=32, num_generations=4),
        sampler="est",
        est_max_samples=12,
    )
    trainer = make_trainer(config, tokenizer, dataset)
    trainer.train()
    for record, selection in zip(trainer.recorded, trainer.selections, strict=True):
        assert record["completion_ids"].shape[0] == 32  # static: B x n rows, whatever the group sizes
        sizes = [len(result.kept) for result in selection.prompts]
        assert sum(sizes) == 32 and min(sizes) >= 2 and max(sizes) <= 12
        expected = [a for result in selection.prompts for a in result.advantages]
        assert record["advantages"].tolist() == pytest.approx(expected, abs=1e-6)
    tracker = trainer.ada_sampler.estimator
    # every distinct prompt of the dataset has been seen once, keyed by content (the dataset has a few duplicates)
    assert len(tracker.counts) == len(set(dataset["prompt"]))
    # once prompts repeat, budgets differ between prompts
    assert any(len({len(r.kept) for r in s.prompts}) > 1 for s in trainer.selections[4:])
    logged = [e for e in trainer.state.log_history if "ada/est/tracked_pass_rate/mean" in e]
    assert len(logged) == 6


def test_dapo_refills_the_batch_with_informative_groups(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=3), sampler="dapo", dapo_max_refills=20)
    trainer = make_trainer(config, tokenizer, arithmetic_dataset)
    trainer.train()
    extra = [e["ada/dapo/extra_batches"] for e in trainer.state.log_history if "loss" in e]
    assert sum(extra) > 0  # the tiny model's pass rate is low: most groups are all-wrong and get replaced
    for record in trainer.recorded:
        rewards = record["advantages"].view(-1, 4)
        assert record["completion_ids"].shape[0] == 8
        assert bool((rewards.abs().sum(dim=1) > 0).all())  # every kept group carries a signal
    assert all(e["ada/dapo/filled_share"] == 1.0 for e in trainer.state.log_history if "loss" in e)


def test_dapo_stacks_with_seq_balance(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=2), sampler="seq_balance", round_size=4, max_rounds=2, dapo_refill=True
    )
    trainer = make_trainer(config, tokenizer, arithmetic_dataset)
    trainer.train()
    assert all(e["ada/dapo/filled_share"] == 1.0 for e in trainer.state.log_history if "loss" in e)


def test_dapo_at_the_cap_raises_by_default_and_can_keep_the_partial_batch(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=1), sampler="dapo", dapo_max_refills=1)
    with pytest.raises(BatchExhaustedError, match="dapo_max_refills"):
        make_trainer(config, tokenizer, arithmetic_dataset, rewards=[always_right]).train()

    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=1), sampler="dapo", dapo_max_refills=1, dapo_on_exhausted="keep_partial"
    )
    trainer = make_trainer(config, tokenizer, arithmetic_dataset, rewards=[always_right])
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ada/dapo/filled_share"] == 0.0 and entry["ada/dapo/extra_batches"] == 1.0
    assert bool((trainer.recorded[0]["advantages"] == 0).all())  # padding groups add no gradient


@pytest.mark.parametrize(
    "sampler_kwargs",
    [
        {"sampler": "est", "est_max_samples": 12},
        {"sampler": "seq_balance", "round_size": 4, "max_rounds": 2, "dapo_refill": True, "dapo_max_refills": 20},
        {"sampler": "dapo", "baseline": "tracked", "scale_rewards": "none", "dapo_max_refills": 20},
        {
            "sampler": "dapo",
            "baseline": "predicted",
            "pass_rate_predictor": "learned",
            "scale_rewards": "none",
            "normalize_advantages": True,
        },
    ],
    ids=["est", "seq_balance+dapo", "dapo+tracked_baseline", "dapo+predicted_baseline"],
)
def test_resume_makes_the_same_decisions_as_an_uninterrupted_run(
    tmp_path, tokenizer, arithmetic_dataset, sampler_kwargs
):
    common = dict(max_steps=4, per_device_train_batch_size=32, save_strategy="steps", save_steps=2)

    def decisions(trainer):
        return [[(len(pool), result.kept) for pool, result in zip(s.pools, s.prompts)] for s in trainer.selections]

    def losses(trainer):
        return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}

    full = make_trainer(
        AdaGRPOConfig(**tiny_args(tmp_path / "full", **common), **sampler_kwargs), tokenizer, arithmetic_dataset
    )
    full.train()
    state = json.loads((tmp_path / "full" / "checkpoint-2" / "ada_sampler_state.json").read_text())
    assert state["sampler"]["rng"]

    resumed = make_trainer(
        AdaGRPOConfig(**tiny_args(tmp_path / "full", **common), **sampler_kwargs), tokenizer, arithmetic_dataset
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert decisions(resumed) == decisions(full)[-len(decisions(resumed)) :]
    assert len(decisions(resumed)) >= 2
    resumed_losses = losses(resumed)
    assert resumed_losses and all(resumed_losses[step] == losses(full)[step] for step in resumed_losses)
    if sampler_kwargs["sampler"] == "est":
        resumed_counts, full_counts = resumed.ada_sampler.estimator.counts, full.ada_sampler.estimator.counts
        assert resumed_counts.keys() == full_counts.keys()  # (pytest >= 9.2's approx takes no nested containers)
        assert all(resumed_counts[key] == pytest.approx(full_counts[key]) for key in full_counts)
    if sampler_kwargs.get("baseline") == "tracked":
        assert state["sampler"]["baseline_history"]["counts"]
        resumed_counts, full_counts = (
            resumed.ada_sampler.baseline_history.counts,
            full.ada_sampler.baseline_history.counts,
        )
        assert resumed_counts.keys() == full_counts.keys()
        assert all(resumed_counts[key] == pytest.approx(full_counts[key]) for key in full_counts)
    if sampler_kwargs.get("baseline") == "predicted":
        assert state["sampler"]["baseline_history"]["model"]["updates"] >= 2
        assert resumed.ada_sampler.baseline_history.state_dict() == full.ada_sampler.baseline_history.state_dict()
        # The baseline's predictor is saved with the model, to warm-start another run.
        full.save_model(str(tmp_path / "model"))
        assert (tmp_path / "model" / PREDICTOR_DIR / PREDICTOR_FILE).is_file()
    for a, b in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)


def test_predictive_round_policy_trains_with_uneven_requests(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=2),
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
        round_policy="predictive",
    )
    trainer = make_trainer(config, tokenizer, arithmetic_dataset)
    trainer.train()
    for record, selection in zip(trainer.recorded, trainer.selections, strict=True):
        assert record["completion_ids"].shape[0] == 8
        assert all(len(r.kept) == 4 for r in selection.prompts)
    # after the first round of 4, unmixed prompts ask for more than the fixed 4 at once
    assert any(
        len(pool) > 4 * rounds for s in trainer.selections for pool, rounds in zip(s.pools, s.rounds_per_prompt)
    )


def never_scores(completions, **kwargs):
    return [None] * len(completions)


def test_dapo_kept_share_agrees_with_trl_frac_reward_zero_std(tmp_path, tokenizer, arithmetic_dataset):
    # Both describe the groups the update trains on (after DAPO dropped and refilled), with 0/1 rewards.
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=3), sampler="dapo", dapo_max_refills=20)
    trainer = make_trainer(config, tokenizer, arithmetic_dataset)
    trainer.train()
    logged = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logged) == 3 and sum(e["ada/dapo/dropped_groups"] for e in logged) > 0  # DAPO did drop groups
    for entry in logged:
        assert entry["ada/zero_variance_share/kept"] == entry["frac_reward_zero_std"] == 0.0
        # dropped_share describes every group sampled (first batch and refills), first_n the same groups' n draws
        assert entry["ada/dapo/dropped_share"] == pytest.approx(entry["ada/zero_variance_share/first_n"])


def test_dapo_padding_counts_in_the_kept_share(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=1), sampler="dapo", dapo_max_refills=1, dapo_on_exhausted="keep_partial"
    )
    trainer = make_trainer(config, tokenizer, arithmetic_dataset, rewards=[always_right])
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "loss" in e]
    assert entry["ada/zero_variance_share/kept"] == entry["frac_reward_zero_std"] == 1.0


def test_seq_balance_kept_share_agrees_with_trl_frac_reward_zero_std(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=2), sampler="seq_balance", round_size=4, max_rounds=2)
    trainer = make_trainer(config, tokenizer, arithmetic_dataset)
    trainer.train()
    for entry in [e for e in trainer.state.log_history if "loss" in e]:
        assert entry["ada/zero_variance_share/kept"] == pytest.approx(entry["frac_reward_zero_std"])


def test_a_step_nothing_can_score_stops_with_an_error_naming_the_rewards(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=2), sampler="seq_balance", round_size=8, max_rounds=4)
    trainer = make_trainer(config, tokenizer, arithmetic_dataset, rewards=[never_scores])
    with pytest.raises(
        RuntimeError, match=r"Every reward function \(never_scores\) returned None for every completion"
    ):
        trainer.train()
    assert trainer.state.global_step == 0  # before any update


def test_unscorable_prompts_exit_at_once_and_are_warned_about_once(caplog):
    """A prompt no reward function scores, beside one that is scored: warned about once, not an error."""
    from types import SimpleNamespace

    from trl_ada.samplers import SamplerSettings, build_sampler
    from trl_ada.schedules.driver import _check_unscorable

    sampler = build_sampler(SamplerSettings(sampler="seq_balance", num_generations=4, round_size=8, seed=0))
    step = sampler.begin(2)
    requests = step.requests()
    step.observe(requests, [math.nan] * 8 + [1.0, 0.0] * 4)
    assert step.requests() == []  # the unscorable prompt exits after its first round, like the mixed one
    selection = step.finish()
    warned = set()
    trainer = SimpleNamespace(
        reward_func_names=["never_scores"], num_generations=4, state=SimpleNamespace(global_step=0),
        _warn_once=lambda key, message, *args: warned.add(key) or logging.getLogger("t").warning(message, *args),
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        _check_unscorable(trainer, selection)
        _check_unscorable(trainer, selection)
    assert warned == {"unscorable"}
    assert all(a == 0.0 for a in selection.prompts[0].advantages)
    assert [r.getMessage() for r in caplog.records if "returned None for all draws" in r.getMessage()] != []
