"""TRL's `frac_reward_zero_std` when the update's groups have unequal sizes (knapsack's budgets, `est_train_on="all"`)."""

import math

import pytest
import torch
from conftest import tiny_args
from test_trainer_est_dapo import make_trainer

from trl_ada import AdaGRPOConfig
from trl_ada.trainer import zero_std_row_share


def true_share(selection):
    """By hand: the share of the update's rows whose own group's rewards are all equal (every reward scored)."""
    sizes = [len(result.kept) for result in selection.prompts]
    constant = [
        len({pool[i] for i in result.kept}) == 1
        for result, pool in zip(selection.prompts, selection.pools, strict=True)
    ]
    return sum(size for size, flat in zip(sizes, constant, strict=True) if flat) / sum(sizes)


def chunked_share(selection, n):
    """What TRL computes: the rows cut into chunks of `n`, whatever prompt each row belongs to."""
    rewards = [pool[i] for result, pool in zip(selection.prompts, selection.pools, strict=True) for i in result.kept]
    chunks = [rewards[start : start + n] for start in range(0, len(rewards), n)]
    return sum(n for chunk in chunks if len(set(chunk)) == 1) / len(rewards)


def coin_or_hopeless(completions, hopeless, **kwargs):
    """0 on a hopeless prompt (its groups are constant), else the parity of the first character (a coin flip)."""
    return [0.0 if h or not c else float(ord(c[0]) % 2) for c, h in zip(completions, hopeless, strict=True)]


@pytest.mark.parametrize(
    "knobs",
    [{"sampler": "knapsack", "sampler_kwargs": {"max_draws": 12}}, {"sampler": "est", "est_train_on": "all"}],
    ids=["knapsack", "est_all"],
)
def test_unequal_groups_log_the_zero_std_share_of_their_true_groups(tmp_path, tokenizer, arithmetic_dataset, knobs):
    # 8 prompts, 4 per step: from the third step on every prompt is revisited and the budgets differ between the
    # hopeless prompts (constant groups) and the others (mostly mixed).
    dataset = arithmetic_dataset.select(range(8)).map(lambda row, i: {"hopeless": i % 2 == 0}, with_indices=True)
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=4, per_device_train_batch_size=16, num_generations=4), **knobs
    )
    trainer = make_trainer(config, tokenizer, dataset, rewards=[coin_or_hopeless])
    trainer.train()
    logged = [entry["frac_reward_zero_std"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == len(trainer.selections) == 4
    unequal = [s for s in trainer.selections if len({len(r.kept) for r in s.prompts}) > 1]
    assert unequal  # the case this test is about happened
    # TRL's chunks of n rows would have given another number in at least one of those steps
    assert any(true_share(s) != pytest.approx(chunked_share(s, 4)) for s in unequal)
    assert logged == pytest.approx([true_share(s) for s in trainer.selections])


def test_the_share_counts_rows_of_groups_with_a_zero_std_as_trl_does():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5, math.nan, 0.0, math.nan, 0.0])
    # groups: [1,1,1] zero; [0,1] not; [.5]*5 zero; [nan, 0] one scored: no std; [nan, 0] the same
    sizes = [3, 2, 5, 2, 2]
    assert zero_std_row_share(rewards, sizes) == pytest.approx(8 / 14)
    # equal groups of n: TRL's own value
    equal = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.2, 0.2])
    assert zero_std_row_share(equal, [2, 2, 2, 2]) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="cannot be split"):
        zero_std_row_share(equal, [4, 3])
