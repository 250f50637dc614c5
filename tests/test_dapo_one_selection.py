"""
DAPO's refill makes one selection per update: the rules that read the whole update (the batch std of
`scale_rewards="batch"`, the weight normalisation of `normalize_weights`) run once over the prompts it trains, not once
per generation batch. The pools: A=[1,0,0,0] and B=[0,0,0,0] in the first generation batch, C=[1,1,0,0] and
D=[1,1,1,1] in its refill; B and D have no signal, so the update trains on A and C.
"""

import statistics

import pytest
import torch
from conftest import TINY_MODEL_KWARGS, tiny_args
from test_trainer import recording
from trl.trainer.utils import nanstd

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.samplers import SamplerSettings, build_sampler, rules
from trl_ada.samplers.dapo import RefillWalk, fill_update
from trl_ada.tiny import build_tiny_model

A, B, C, D = [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]
TRAINED = (A, C)


def refilled_update(settings, first=(A, B), refill=(C, D), keep_partial=False):
    """`fill_update` over a first batch of pools `first` and one refill batch of pools `refill`, as the trainer runs it."""
    sampler = build_sampler(settings)

    def selection_of(pools, keys):
        step = sampler.begin(len(pools), keys)
        step.observe(step.requests(), [r for pool in pools for r in pool])
        return step.finish()

    rows = [{"prompt": f"refill{i}"} for i in range(len(refill))]
    walk = RefillWalk(rows, lambda epoch: list(range(len(rows))), key=lambda row: row["prompt"])
    first_keys = [f"first{i}" for i in range(len(first))]

    def sample(batch_rows):
        return selection_of([refill[i] for i in range(len(batch_rows))], [row["prompt"] for row in batch_rows])

    return fill_update(
        selection_of(list(first), first_keys), first_keys, sample, walk, max_refills=1, keep_partial=keep_partial
    )


def centred(pool):
    mean = sum(pool) / len(pool)
    return [r - mean for r in pool]


@pytest.mark.parametrize("sampler", ["dapo", "dapo_gated"])
def test_batch_scaling_divides_by_the_std_of_the_rows_the_update_trains(sampler):
    settings = SamplerSettings(sampler=sampler, num_generations=4, scale_rewards="batch", seed=0)
    filler = refilled_update(settings)
    assert filler.taken == [(0, 0), (1, 0)]
    # TRL's "batch" scaling: the Bessel-corrected std over every reward of the training batch, here A's and C's rows.
    trained_std = statistics.stdev(A + C)
    for pool, result in zip(TRAINED, filler.update_results(settings), strict=True):
        assert result.scale == pytest.approx(trained_std)
        assert list(result.advantages) == pytest.approx([a / (trained_std + rules.STD_EPSILON) for a in centred(pool)])


@pytest.mark.parametrize("sampler", ["dapo", "dapo_gated"])
def test_log_weights_are_normalised_over_the_prompts_the_update_trains(sampler):
    settings = SamplerSettings(sampler=sampler, num_generations=4, scale_rewards="none", objective="log", seed=0)
    results = refilled_update(settings).update_results(settings)
    # The log objective weighs a prompt 1/p: A (p = 1/4) twice C (p = 1/2); normalised to mean 1 over A and C.
    assert [result.weight for result in results] == pytest.approx([4 / 3, 2 / 3])
    for pool, result in zip(TRAINED, results, strict=True):
        assert list(result.advantages) == pytest.approx([result.weight * a for a in centred(pool)])


def test_an_update_without_refill_is_its_first_batch_selection_unchanged():
    settings = SamplerSettings(sampler="dapo", num_generations=4, scale_rewards="batch", objective="log", seed=0)
    filler = refilled_update(settings, first=(A, C))
    assert filler.batches == 1 and filler.taken == [(0, 0), (0, 1)]
    assert filler.update_results(settings) == filler.selections[0].prompts


def test_padding_groups_stay_at_zero_advantage_and_out_of_the_weight_normalisation():
    settings = SamplerSettings(
        sampler="dapo", num_generations=4, scale_rewards="batch", objective="log", dapo_on_exhausted="keep_partial"
    )
    filler = refilled_update(settings, first=(A, B), refill=(D,), keep_partial=True)
    assert filler.taken == [(0, 0), (0, 1)]  # A, then B as padding
    a_result, b_result = filler.update_results(settings)
    assert b_result.advantages == (0.0, 0.0, 0.0, 0.0)
    assert a_result.weight == 1.0  # the only prompt with a signal: mean 1 over the signal is its own weight
    # The padding rows are trained rows (zero advantage), so TRL's batch std counts them.
    assert a_result.scale == pytest.approx(statistics.stdev(A + B))


def scripted_reward(patterns):
    """A reward function that scores the i-th distinct prompt it meets with `patterns[i]`, one reward per draw."""
    assigned: dict[str, list[float]] = {}
    drawn: dict[str, int] = {}

    def scripted(prompts, completions, **kwargs):
        rewards = []
        for prompt in prompts:
            key = str(prompt)
            if key not in assigned:
                assigned[key] = patterns[len(assigned)]
            rewards.append(assigned[key][drawn.get(key, 0)])
            drawn[key] = drawn.get(key, 0) + 1
        return rewards

    return scripted


@pytest.mark.parametrize(
    ("overrides", "knobs"),
    [({"scale_rewards": "batch"}, {}), ({"scale_rewards": "none"}, {"objective": "log"})],
    ids=["batch_std", "log_weights"],
)
def test_the_trainer_trains_the_update_selection(tmp_path, tokenizer, arithmetic_dataset, overrides, knobs):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=1, **overrides), sampler="dapo", dapo_max_refills=1, **knobs
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = recording(AdaGRPOTrainer)(
        model,
        [scripted_reward([A, B, C, D])],
        args=config,
        train_dataset=arithmetic_dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    (record,) = trainer.recorded
    rows = torch.tensor(A + C)
    if overrides["scale_rewards"] == "batch":
        # TRL's scale_rewards="batch" over the rows it trains: (r - group mean) / (nanstd(all rows) + 1e-4).
        expected = torch.tensor(centred(A) + centred(C)) / (nanstd(rows) + 1e-4)
    else:
        weights = [4 / 3] * 4 + [2 / 3] * 4  # 1/p, normalised to mean 1 over A and C
        expected = torch.tensor([w * a for w, a in zip(weights, centred(A) + centred(C), strict=True)])
    assert record["advantages"].tolist() == pytest.approx(expected.tolist(), rel=1e-5)
