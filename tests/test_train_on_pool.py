"""`train_on="pool"` in `AdaGRPOTrainer`: every draw of a prompt's pool enters TRL's loss, with the pool baseline."""

import math

import pytest
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args
from test_trainer import recording

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.samplers import PromptResult, SamplerSettings, build_sampler
from trl_ada.samplers.base import fit_trained_rows
from trl_ada.tiny import build_tiny_model


def by_hand(pool, group_size):
    """
    The advantages of a whole pool trained on: the pool's mean and std, each scaled by the share of its outcome's draws
    that the balanced group of `group_size` keeps (half positives where there are, the rest negatives, topped up).
    """
    positives = sum(r > 0.5 for r in pool)
    negatives = len(pool) - positives
    kept_positives = min(group_size // 2, positives)
    kept_negatives = min(group_size - kept_positives, negatives)
    kept_positives = min(group_size - kept_negatives, positives)
    mean = sum(pool) / len(pool)
    std = math.sqrt(sum((r - mean) ** 2 for r in pool) / (len(pool) - 1))
    if std <= 1e-6:
        return [0.0] * len(pool)
    share = {True: kept_positives / max(positives, 1), False: kept_negatives / max(negatives, 1)}
    return [share[r > 0.5] * (r - mean) / (std + 1e-4) for r in pool]


def pool_trainer(tmp_path, tokenizer, dataset, **overrides):
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, **{"max_steps": 3, **overrides}),
        sampler="seq_balance",
        train_on="pool",
        round_size=2,
        max_rounds=5,
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = recording(AdaGRPOTrainer)(
        model, [starts_low_digit], args=config, train_dataset=dataset, processing_class=tokenizer
    )
    return trainer


class Masks:
    """Adds each generation batch's completion mask to what `recording` keeps."""

    def __init__(self, trainer):
        self.trainer = trainer
        trainer.masks = []
        parent = trainer._generate_and_score_completions

        def wrapped(inputs):
            output = parent(inputs)
            trainer.masks.append({"completion_mask": output["completion_mask"].detach().clone()})
            return output

        trainer._generate_and_score_completions = wrapped


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
def test_the_loss_of_a_whole_pool_is_the_hand_computation(tmp_path, tokenizer, arithmetic_dataset, loss_type):
    trainer = pool_trainer(tmp_path, tokenizer, arithmetic_dataset, loss_type=loss_type)
    Masks(trainer)
    trainer.train()
    n = trainer.args.num_generations
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    outgrew = False
    for step, (record, selection) in enumerate(zip(trainer.recorded, trainer.selections, strict=True)):
        # Every draw kept, each advantage the pool's, scaled by group / pool (computed here from the rewards alone).
        for pool, result in zip(selection.pools, selection.prompts, strict=True):
            assert list(result.kept) == list(range(len(pool)))
            assert list(result.advantages) == pytest.approx(by_hand(pool, n), abs=1e-9)
            outgrew |= len(pool) > n
        fitted, left_out = fit_trained_rows(selection.prompts, n, n)  # one process, steps_per_generation 1
        shares = [share for result in fitted for share in result.draw_shares]
        lengths = trainer.masks[step]["completion_mask"].sum(-1).tolist()
        # The step factor: the loss divides by the rows (grpo, dr_grpo) or tokens (dapo, bnpo) trained, which the
        # pool outnumbers; the factor restores the downsampled group's expected count (sum of share x count).
        counts = lengths if loss_type in ("dapo", "bnpo") else [1] * len(shares)
        factor = sum(counts) / math.fsum(s * c for s, c in zip(shares, counts, strict=True))
        assert factor > 1.0 or not outgrew
        advantages = [factor * a for result in fitted for a in result.advantages]
        assert record["advantages"].tolist() == pytest.approx(advantages, rel=1e-5, abs=1e-6)
        assert len(advantages) == sum(len(pool) for pool in selection.pools) - left_out and len(advantages) % n == 0
        # At the first iteration the policy ratio is 1 and beta 0, so each token's loss is -A of its row.
        weighted = -math.fsum(a * length for a, length in zip(advantages, lengths, strict=True))
        expected = {
            "dapo": weighted / sum(lengths),
            "bnpo": weighted / sum(lengths),
            "grpo": -math.fsum(a for a, length in zip(advantages, lengths, strict=True) if length) / len(lengths),
            "dr_grpo": weighted / (len(lengths) * trainer.args.max_completion_length),
        }[loss_type]
        assert logged[step] == pytest.approx(expected, rel=1e-3, abs=1e-6)
    assert outgrew  # some pool outgrew its group: the rows TRL trained were not its static batch


def test_a_prompts_share_of_the_update_is_its_groups_outcome_by_outcome(tmp_path, tokenizer, arithmetic_dataset):
    # The weights of a prompt's draws, summed over each outcome, are what its balanced group of 4 gives that outcome,
    # whatever the pool's size: the rare positive keeps the push the group gave it (a plain `4 / pool` share would
    # divide it by pool / 4), and the prompt weighs num_generations in all.
    settings = SamplerSettings(sampler="seq_pos", num_generations=4, round_size=2, max_rounds=6, seed=3).validated()
    sampler = build_sampler(settings, train_on="pool")
    step = sampler.begin(3)
    pools = {0: [0.0] * 7 + [1.0], 1: [1.0, 0.0, 0.0, 0.0], 2: [0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]}
    kept_positives = {0: 1, 1: 1, 2: 2}
    for index, pool in pools.items():
        step.add(index, pool)
    selection = step.finish()
    for index, result in enumerate(selection.prompts):
        pool = pools[index]
        assert list(result.kept) == list(range(len(pool)))
        mean = sum(pool) / len(pool)
        std = math.sqrt(sum((r - mean) ** 2 for r in pool) / (len(pool) - 1))
        weights = [a / ((r - mean) / (std + 1e-4)) for a, r in zip(result.advantages, pool, strict=True)]
        positive = math.fsum(w for w, r in zip(weights, pool, strict=True) if r == 1.0)
        negative = math.fsum(w for w, r in zip(weights, pool, strict=True) if r == 0.0)
        assert positive == pytest.approx(kept_positives[index]) and negative == pytest.approx(
            4 - kept_positives[index]
        )


def test_outcome_shares_follow_the_group_and_leave_excluded_draws_apart():
    from trl_ada.samplers import rules

    pool = [1.0, 0.0, 0.0, float("nan"), 1.0, 0.0]
    # The group took one positive of two, both negatives (index 2 is excluded: it sides with the NaN) and one of the
    # two draws on neither side.
    shares = rules.outcome_shares(pool, [0, 1, 2, 5], 0.5, excluded={2})
    assert shares == [0.5, 1.0, 0.5, 0.5, 0.5, 1.0]
    assert math.fsum(shares) == 4


def test_fitting_leaves_out_the_fewest_draws_from_the_largest_groups_the_least_read_first():
    def result(advantages):
        kept = tuple(range(len(advantages)))
        return PromptResult(kept, 0.0, None, 1.0, 0.5, tuple(advantages), True, 1.0, (0.5,) * len(advantages))

    results = [result([0.5, -0.5, 0.5, -0.5]), result([0.9, -0.1, -0.1, 0.2, -0.1, -0.1]), result([1, -1, 1, -1, 0.3])]
    fitted, left_out = fit_trained_rows(results, 4, 4)
    assert left_out == 3  # 15 rows -> 12
    # The 6-draw group loses two of its three -0.1 draws (ties: the later one first), the 5-draw group its 0.3.
    assert fitted[0] == results[0]
    assert fitted[1].kept == (0, 1, 2, 3) and fitted[1].advantages == (0.9, -0.1, -0.1, 0.2)
    assert fitted[2].kept == (0, 1, 2, 3) and fitted[2].draw_shares == (0.5,) * 4  # the shares follow their draws
    assert fit_trained_rows(results[:1], 4, 4) == (tuple(results[:1]), 0)
    with pytest.raises(ValueError, match="without taking a group below 4"):
        fit_trained_rows([result([1, -1, 1, -1, 1])], 8, 4)


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"sampler": "dapo"}, "draws num_generations = 4 per prompt: its pool is its update group"),
        ({"sampler": "seq_balance", "baseline": "group"}, "whose baseline is the pool's mean"),
        ({"sampler": "seq_balance", "downsample": "random"}, "trains on all of them. Remove downsample"),
        (
            {"sampler": "seq_balance", "round_size": 2, "max_rounds": 2},
            "is num_generations, so the pool is the update",
        ),
        ({"sampler": "est", "est_train_on": "downsample"}, "est_train_on='downsample' cuts each pool"),
    ],
)
def test_a_pool_that_cannot_be_trained_whole_is_refused_at_construction(tmp_path, knobs, message):
    with pytest.raises(ValueError, match=message):
        AdaGRPOConfig(**tiny_args(tmp_path), train_on="pool", **knobs)


def test_gradient_accumulation_and_micro_batches_split_the_pool_evenly(tmp_path, tokenizer, arithmetic_dataset):
    trainer = pool_trainer(
        tmp_path,
        tokenizer,
        arithmetic_dataset,
        per_device_train_batch_size=4,
        steps_per_generation=2,
        gradient_accumulation_steps=2,
        max_steps=2,
    )
    trainer.train()
    for record, selection in zip(trainer.recorded, trainer.selections, strict=True):
        rows = record["advantages"].shape[0]
        # lcm(num_generations 4, steps_per_generation 2) = 4
        assert rows % 4 == 0 and rows == sum(len(pool) for pool in selection.pools) - rows_left_out(selection, 4)
    assert all(math.isfinite(entry["loss"]) for entry in trainer.state.log_history if "loss" in entry)
    left_out = [entry["ada/pool_draws_left_out"] for entry in trainer.state.log_history if "loss" in entry]
    assert left_out and all(0 <= value < 4 for value in left_out)


def rows_left_out(selection, multiple):
    return sum(len(pool) for pool in selection.pools) % multiple
