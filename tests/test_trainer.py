"""AdaGRPOTrainer on a tiny model built in code, one process, CPU."""

import asyncio
import math

import pytest
import torch
from conftest import TINY_MODEL_KWARGS, length_or_none, starts_low_digit, starts_with_one, tiny_args
from trl import GRPOConfig, GRPOTrainer

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.tiny import build_tiny_model
from trl_ada.trainer import _RoundCall


def recording(trainer_class):
    """A subclass that keeps what each generation batch handed to TRL's loss (and the sampler's selection)."""

    class Recording(trainer_class):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.__dict__.setdefault("recorded", []).append(
                {key: output[key].detach().clone() for key in ("prompt_ids", "completion_ids", "advantages")}
            )
            return output

        def _log_selection(self, selection):
            self.__dict__.setdefault("selections", []).append(selection)
            super()._log_selection(selection)

    return Recording


def train(trainer_class, config, tokenizer, dataset, reward_funcs):
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = recording(trainer_class)(
        model, reward_funcs, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    return trainer


def losses(trainer):
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "steps_per_generation": 2,
            "num_iterations": 2,
            "loss_type": "grpo",
            "scale_rewards": "batch",
            "max_steps": 4,
        },
    ],
    ids=["default", "spg2-iter2-grpo-batch"],
)
def test_uniform_reproduces_grpo_trainer(tmp_path, tokenizer, arithmetic_dataset, overrides):
    rewards = [starts_low_digit, length_or_none]  # two functions, weights, a dataset column, None rewards
    common = tiny_args(tmp_path, reward_weights=[1.0, 0.5], **overrides)
    grpo = train(GRPOTrainer, GRPOConfig(**common), tokenizer, arithmetic_dataset, rewards)
    ada = train(AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"), tokenizer, arithmetic_dataset, rewards)

    assert len(grpo.recorded) == len(ada.recorded) > 0
    for expected, actual in zip(grpo.recorded, ada.recorded):
        assert torch.equal(expected["prompt_ids"], actual["prompt_ids"])
        assert torch.equal(expected["completion_ids"], actual["completion_ids"])
        assert torch.equal(expected["advantages"], actual["advantages"])
    assert any(record["advantages"].abs().sum() > 0 for record in ada.recorded)  # the comparison had signal
    # The sampler's own float64 advantages agree with the float32 ones TRL computed and the loss received.
    assert len(ada.selections) == len(ada.recorded)
    for selection, record in zip(ada.selections, ada.recorded):
        ours = torch.tensor([a for result in selection.prompts for a in result.advantages])
        torch.testing.assert_close(ours, record["advantages"], rtol=1e-5, atol=1e-6)
    assert losses(ada) == losses(grpo)
    for (name, expected), actual in zip(grpo.model.named_parameters(), ada.model.parameters()):
        assert torch.equal(actual, expected), name


class CountingReward:
    """Counts the completions it scores, to prove no completion is scored twice."""

    def __init__(self, func):
        self.func = func
        self.scored = 0
        self.__name__ = func.__name__

    def __call__(self, completions, **kwargs):
        self.scored += len(completions)
        return self.func(completions, **kwargs)


async def async_starts_with_one(completions, **kwargs):
    await asyncio.sleep(0)
    return starts_with_one(completions)


def test_seq_balance_recovers_signal_with_static_shapes(tmp_path, tokenizer, arithmetic_dataset):
    counting = CountingReward(starts_low_digit)
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=4, reward_weights=[1.0, 0.0]),
        sampler="seq_balance",
        round_size=8,
        max_rounds=4,
    )
    trainer = train(AdaGRPOTrainer, config, tokenizer, arithmetic_dataset, [counting, async_starts_with_one])

    rows = config.per_device_train_batch_size * config.steps_per_generation
    total_drawn = 0
    for record, selection in zip(trainer.recorded, trainer.selections, strict=True):
        # static shape: exactly B x n rows reach TRL's loss
        assert record["completion_ids"].shape[0] == rows and record["advantages"].shape == (rows,)
        assert len(selection.prompts) == rows // config.num_generations
        for pool, result in zip(selection.pools, selection.prompts):
            total_drawn += len(pool)
            kept = [pool[i] for i in result.kept]
            positives = [r > 0.5 for r in pool]
            assert (0 < sum(r > 0.5 for r in kept) < len(kept)) == (0 < sum(positives) < len(pool))
            # full-pool baseline and std (scale_rewards="group" is TRL's default), recomputed independently
            mean = sum(pool) / len(pool)
            std = math.sqrt(sum((r - mean) ** 2 for r in pool) / (len(pool) - 1))
            assert list(result.advantages) == pytest.approx([(r - mean) / (std + 1e-4) for r in kept])
        trained = record["advantages"].tolist()
        expected = [a for result in selection.prompts for a in result.advantages]
        assert trained == pytest.approx(expected, abs=1e-6)
    assert counting.scored == total_drawn  # every completion scored exactly once, kept ones never again

    first_n = [e["ada/zero_variance_share/first_n"] for e in trainer.state.log_history if "loss" in e]
    kept = [e["ada/zero_variance_share/kept"] for e in trainer.state.log_history if "loss" in e]
    assert all(k <= f for k, f in zip(kept, first_n))
    assert sum(kept) < sum(first_n)  # fewer zero-variance groups than plain GRPO's first n draws
    assert all(e["ada/samples_per_prompt/max"] <= 32 for e in trainer.state.log_history if "loss" in e)


def test_seq_balance_has_fewer_zero_variance_groups_than_uniform(tmp_path, tokenizer, arithmetic_dataset):
    common = tiny_args(tmp_path, max_steps=3)
    uniform = train(
        AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"), tokenizer, arithmetic_dataset, [starts_low_digit]
    )
    balance = train(
        AdaGRPOTrainer,
        AdaGRPOConfig(**common, sampler="seq_balance", round_size=8, max_rounds=4),
        tokenizer,
        arithmetic_dataset,
        [starts_low_digit],
    )

    def zero_variance_groups(trainer):
        return sum(
            1
            for selection in trainer.selections
            for pool, result in zip(selection.pools, selection.prompts)
            if len({pool[i] for i in result.kept}) == 1
        )

    assert zero_variance_groups(balance) < zero_variance_groups(uniform)


def test_log_objective_weights_reach_the_advantages(tmp_path, tokenizer, arithmetic_dataset):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=2, scale_rewards="none", loss_type="dr_grpo"),
        sampler="seq_pos",
        round_size=4,
        max_rounds=4,
        objective="log",
        normalize_weights=False,
        max_weight=8.0,
    )
    trainer = train(AdaGRPOTrainer, config, tokenizer, arithmetic_dataset, [starts_low_digit])
    for selection in trainer.selections:
        for pool, result in zip(selection.pools, selection.prompts):
            p_hat = sum(r > 0.5 for r in pool) / len(pool)
            weight = min(1 / p_hat, 8.0) if p_hat > 0 else 8.0
            kept = [pool[i] for i in result.kept]
            assert list(result.advantages) == pytest.approx([weight * (r - sum(pool) / len(pool)) for r in kept])


def test_plain_grpo_config_is_upgraded_without_losing_values(tmp_path, tokenizer, tiny_model, arithmetic_dataset):
    args = GRPOConfig(**tiny_args(tmp_path, learning_rate=3e-4, num_generations=2, per_device_train_batch_size=4))
    trainer = AdaGRPOTrainer(
        tiny_model, [starts_low_digit], args=args, train_dataset=arithmetic_dataset, processing_class=tokenizer
    )
    assert isinstance(trainer.args, AdaGRPOConfig)
    assert trainer.args.learning_rate == 3e-4 and trainer.args.num_generations == 2
    assert trainer.args.sampler == "seq_balance" and trainer.args.positive_quota == 1
    assert trainer.ada_sampler.settings.negative_quota == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sampler": "seq_magic"}, "sampler='seq_magic' is not supported"),
        (
            {"num_generations": 6, "per_device_train_batch_size": 6, "round_size": 2, "max_rounds": 2},
            "Raise round_size or max_rounds",
        ),
        ({"positive_quota": 30, "negative_quota": 30}, "can never be reached"),
        ({"multi_objective_aggregation": "normalize_then_sum"}, "sum_then_normalize"),
        ({"sampler": "seq_pos", "negative_quota": 2}, "Remove negative_quota"),
    ],
)
def test_invalid_config_raises_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        AdaGRPOConfig(**tiny_args(tmp_path, **overrides))


def test_a_rounds_block_applies_to_its_first_generate_call_only(tmp_path, tokenizer, arithmetic_dataset, monkeypatch):
    # In a round, `_generate` calls `_generate_single_turn` with num_generations (vLLM server mode dedupes by it: the
    # round's block); TRL's tool loop then calls again with 1 per row, which must not become the block.
    seen = []
    monkeypatch.setattr(
        GRPOTrainer,
        "_generate_single_turn",
        lambda self, ids, images, fields, num_generations, **kw: seen.append(num_generations),
    )
    trainer = AdaGRPOTrainer(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        [starts_low_digit],
        args=AdaGRPOConfig(**tiny_args(tmp_path)),
        train_dataset=arithmetic_dataset,
        processing_class=tokenizer,
    )
    trainer._ada_round = _RoundCall(block=8)
    trainer._generate_single_turn([[1]], None, {}, 4)  # the round's generate call
    trainer._generate_single_turn([[1, 2]], None, {}, 1)  # a tool-loop continuation
    assert seen == [8, 1]


def test_prompt_keys_tell_images_apart_and_survive_a_gather():
    import pickle

    from PIL import Image

    from trl_ada.schedules import prompt_key as _prompt_key

    prompt = [{"role": "user", "content": "What colour is the image?"}]
    red, blue = Image.new("RGB", (4, 4), (255, 0, 0)), Image.new("RGB", (4, 4), (0, 0, 255))
    rows = [{"prompt": prompt, "image": red}, {"prompt": prompt, "image": blue}]
    # Same text, different images: two prompts (est's tracker and DAPO's exclusion key on this).
    assert _prompt_key(rows[0]) != _prompt_key(rows[1])
    # A row gathered from another process (pickled) keeps its key: the layout check compares keys across processes.
    assert [_prompt_key(pickle.loads(pickle.dumps(row))) for row in rows] == [_prompt_key(row) for row in rows]
    # An environment may supply the prompt: a row without one is keyed by all its columns.
    assert _prompt_key({"seed": 1, "environment": "low"}) != _prompt_key({"seed": 2, "environment": "low"})
