"""A custom `rollout_func` (TRL's hook for agent and environment rollouts) through the sampling rounds, one process.

Each round calls TRL's own `_generate` for its share, which calls the `rollout_func`; whatever it returns per row (the
`env_mask`, which TRL turns into the tool mask, and extra fields merged into the reward kwargs) must stay with its
completion through the pool, the downsampling and the hand-over to TRL's loss.
"""

import pytest
import torch
from conftest import TINY_MODEL_KWARGS, env_reward, env_rollout, rollout_env_mask, rollout_feedback, tiny_args
from trl import GRPOConfig, GRPOTrainer

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.tiny import build_tiny_model


def recording(trainer_class):
    class Recording(trainer_class):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.__dict__.setdefault("recorded", []).append(
                {key: output[key].detach().clone() for key in ("completion_ids", "completion_mask", "advantages")}
                | {"tool_mask": None if output.get("tool_mask") is None else output["tool_mask"].detach().clone()}
            )
            return output

        def _generate(self, prompts):
            kept = getattr(self, "_ada_pending", None) is not None
            output = super()._generate(prompts)
            if kept:  # the kept rows handed to TRL's loss: check each against its own completion
                prompt_ids, completion_ids, tool_mask, _, _, extra_fields, _, _ = output
                self.__dict__.setdefault("handed_over", []).append(
                    {
                        "rows": len(completion_ids),
                        "masks_line_up": tool_mask == [rollout_env_mask(ids) for ids in completion_ids],
                        "fields_line_up": extra_fields["feedback"]
                        == [rollout_feedback(ids) for ids in completion_ids],
                        "shared_field": set(extra_fields["env_name"]),
                        "rewards": self._ada_pending.rewards[:, 0].tolist(),
                        "expected_rewards": [
                            1.0 if rollout_feedback(ids) == "solved" else 0.0 for ids in completion_ids
                        ],
                    }
                )
            return output

        def _log_selection(self, selection):
            self.__dict__.setdefault("selections", []).append(selection)
            super()._log_selection(selection)

    return Recording


def train(trainer_class, config, tokenizer, dataset):
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = recording(trainer_class)(
        model, [env_reward], args=config, train_dataset=dataset, processing_class=tokenizer, rollout_func=env_rollout
    )
    trainer.train()
    return trainer


def test_uniform_with_a_rollout_func_reproduces_grpo_trainer(tmp_path, tokenizer, arithmetic_dataset):
    common = tiny_args(tmp_path, max_steps=3)
    grpo = train(GRPOTrainer, GRPOConfig(**common), tokenizer, arithmetic_dataset)
    ada = train(AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"), tokenizer, arithmetic_dataset)
    assert len(grpo.recorded) == len(ada.recorded) == 3
    for expected, actual in zip(grpo.recorded, ada.recorded):
        for key in ("completion_ids", "completion_mask", "advantages", "tool_mask"):
            assert torch.equal(expected[key], actual[key]), key
        assert (actual["tool_mask"] == 0).any()  # the env_mask reached TRL's loss mask
    assert any(record["advantages"].abs().sum() > 0 for record in ada.recorded)
    losses = [[entry["loss"] for entry in t.state.log_history if "loss" in entry] for t in (grpo, ada)]
    assert losses[0] == losses[1]
    for (name, expected), actual in zip(grpo.model.named_parameters(), ada.model.parameters()):
        assert torch.equal(actual, expected), name


def test_seq_balance_with_a_rollout_func_keeps_masks_fields_and_rewards_with_their_rows(
    tmp_path, tokenizer, arithmetic_dataset
):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=3, per_device_train_batch_size=16),
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    trainer = train(AdaGRPOTrainer, config, tokenizer, arithmetic_dataset)
    # The rounds drew more than n for some prompt (else this would test a plain GRPO batch) ...
    assert any(len(pool) > 4 for selection in trainer.selections for pool in selection.pools)
    # ... and every row handed to TRL's loss carries its own env_mask, extra fields and reward.
    assert len(trainer.handed_over) == 3
    for batch in trainer.handed_over:
        assert batch["rows"] == 16
        assert batch["masks_line_up"] and batch["fields_line_up"]
        assert batch["shared_field"] == {"digits"}
        assert batch["rewards"] == batch["expected_rewards"]
    for record in trainer.recorded:
        assert (record["tool_mask"] == 0).any()


def test_round_times_are_logged_per_generation_batch(tmp_path, tokenizer, arithmetic_dataset):
    # With agent episodes a round waits for its slowest one: each batch logs its rounds' wall times.
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=2, per_device_train_batch_size=16), sampler="seq_balance", round_size=4
    )
    trainer = train(AdaGRPOTrainer, config, tokenizer, arithmetic_dataset)
    logs = [entry for entry in trainer.state.log_history if "ada/round_time/total" in entry]
    assert len(logs) == 2
    for entry, selection in zip(logs, trainer.selections):
        rounds = len(selection.active_after_round)
        assert 0 < entry["ada/round_time/mean"] <= entry["ada/round_time/max"] <= entry["ada/round_time/total"]
        assert entry["ada/round_time/total"] == pytest.approx(rounds * entry["ada/round_time/mean"], rel=1e-6)
