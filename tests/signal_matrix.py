"""
The signal-integrity matrix's shared part (tests/test_signal_matrix.py, one process; tests/signal_matrix_run.py, two
processes): every accepted combination of the settings that change an advantage, a trainer that records what TRL
trains, and the checks each recorded update must pass. The checks follow from the definitions, not from the sampler's
code: what TRL trains equals what the sampler computed (times `train_on="pool"`'s step factor, derived here from the
rows), it is finite and bounded, within a prompt it grows with the reward, a group baseline's advantages sum to zero
with the sign of `r - mean`, SPO's normalised update has mean 0 and std 1, a remembered baseline gives an unmixed
group a non-zero advantage, and DAPO's update holds no group without a signal.
"""

from __future__ import annotations

import functools
import itertools
import math

import torch
from accelerate.utils import gather_object

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.samplers import rules
from trl_ada.trl_seam.grpo_private import summed_rewards

SAMPLERS = ("uniform", "seq_pos", "seq_balance", "est", "est_ema", "dapo", "knapsack", "dapo_gated", "spo")
AXES = {
    "sampler": SAMPLERS,
    "baseline": ("pool", "group", "tracked", "predicted"),
    "scale_rewards": ("group", "batch", "none"),
    "normalize_advantages": (False, True),
    "objective": ("linear", "log"),
    "train_on": ("downsample", "pool"),
    "dapo_refill": (None, True),
}
"""The settings that change an advantage, each with every value (the power objective shares the log's weight path;
its own test is in tests/test_samplers.py)."""

POOLING_SAMPLERS = ("seq_pos", "seq_balance", "est", "est_ema", "knapsack")
"""The samplers whose pool can outgrow the update group."""

RUN_AXES = {"steps_per_generation": (1, 2), "zero_variance_tolerance": (0.0, 1e-6), "loss_type": ("grpo", "dapo")}
"""What a trainer run varies besides: micro-batches per generation batch, the zero-variance boundary, and a loss
normalised by rows or by tokens."""


def knobs_of(combination: dict) -> dict:
    """The config knobs of one combination: small rounds and budgets so that a run takes seconds."""
    knobs = {key: value for key, value in combination.items() if value is not None}
    sampler = combination["sampler"]
    if sampler in ("seq_pos", "seq_balance"):
        knobs.update(round_size=4, max_rounds=2)
    if sampler in ("est", "est_ema"):
        knobs.update(est_max_samples=8)
    if sampler == "knapsack":
        knobs.update(sampler_kwargs={"max_draws": 8})
    if combination["baseline"] == "predicted":
        knobs["pass_rate_predictor"] = "learned"
    if combination.get("dapo_refill") or sampler in ("dapo", "dapo_gated"):
        knobs["dapo_on_exhausted"] = "keep_partial"  # four prompts can run out of mixed groups; the padding is checked
    return knobs


def base_args(output_dir: str, **overrides) -> dict:
    """The trainer tests' fast CPU settings (`conftest.tiny_args`), four steps long."""
    from conftest import tiny_args

    return tiny_args(output_dir, **{"max_steps": 4, **overrides})


@functools.cache
def accepted_combinations() -> tuple[tuple[tuple[str, object], ...], ...]:
    """Every combination of `AXES` that `AdaGRPOConfig` accepts (as sorted item tuples, hashable)."""
    accepted = []
    for values in itertools.product(*AXES.values()):
        combination = dict(zip(AXES, values, strict=True))
        try:
            AdaGRPOConfig(**base_args("outputs/signal-matrix-check"), **knobs_of(combination))
        except ValueError:
            continue
        accepted.append(tuple(combination.items()))
    return tuple(accepted)


def recording_trainer():
    """An AdaGRPOTrainer that records, per generation batch, what the sampler computed and what TRL trains."""

    class Recording(AdaGRPOTrainer):
        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            if self._ada_pending is not None:
                self.__dict__["pending"] = self._ada_pending
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)

        def _generate_and_score_completions(self, inputs):
            self.__dict__["pending"] = None
            output = super()._generate_and_score_completions(inputs)
            pending = self.__dict__["pending"]
            if pending is not None:
                mask = output["completion_mask"]
                if "tool_mask" in output:
                    mask = mask * output["tool_mask"]
                self.__dict__.setdefault("updates", []).append(
                    {
                        "trained": self.accelerator.gather(output["advantages"].detach()).cpu().double(),
                        "sampler": pending.advantages.cpu().double(),
                        "stands_in": pending.trl_stands_in,
                        "shares": None if pending.draw_shares is None else pending.draw_shares.cpu().double(),
                        "tokens": self.accelerator.gather(mask.sum(dim=1).float()).cpu().double(),
                        "rewards": summed_rewards(self, pending.rewards).cpu().double(),
                        "group_sizes": list(pending.group_sizes),
                        # The share of the update DAPO filled with prompts it judged to have a signal.
                        "dapo_filled": self._metrics["train"].get("ada/dapo/filled_share", [None])[-1],
                        "prompts": gather_object(self.processing_class.batch_decode(output["prompt_ids"])),
                    }
                )
            return output

    return Recording


def run_combination(combination: dict, run: dict, output_dir: str, tokenizer, dataset, reward):
    """Train a few steps under one combination and run settings; return the trainer (its `updates` recorded)."""
    from conftest import TINY_MODEL_KWARGS

    from trl_ada.tiny import build_tiny_model

    config = AdaGRPOConfig(**base_args(output_dir, **run), **knobs_of(combination))
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = recording_trainer()(model, [reward], args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    return trainer


def groups(values: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    return list(torch.split(values, sizes))


def check_updates(trainer) -> None:
    """Every check of the module docstring on each update `trainer` recorded, and over the run."""
    config = trainer.args
    updates = trainer.__dict__.get("updates", [])
    assert updates, "the run recorded no update"
    seen: set[str] = set()
    for update in updates:
        check_update(update, config)
        prompts = group_prompts(update)
        if config.baseline in ("tracked", "predicted") and not config.normalize_advantages:
            # 8. A remembered baseline gives an unmixed group a signal: on any visit for a learned prediction, on a
            #    prompt with history for the tracked mean (a first visit falls back to the pool's mean). SPO's
            #    normalisation can then centre an update whose rows all agree to zero, so it is checked without.
            for prompt, group_rewards, group_advantages in zip(
                prompts, groups(update["rewards"], update["group_sizes"]), groups(update["trained"],
                update["group_sizes"]), strict=True
            ):  # fmt: skip
                r = group_rewards[~torch.isnan(group_rewards)]
                with_history = config.baseline == "predicted" or prompt in seen
                if with_history and len(r) > 1 and bool(r.max() == r.min()):
                    assert bool((group_advantages != 0).any()), f"unmixed group of {prompt!r} trained nothing"
        seen.update(prompts)


def group_prompts(update: dict) -> list[str]:
    """The prompt of each trained group (its first row's)."""
    starts = itertools.accumulate([0, *update["group_sizes"][:-1]])
    return [update["prompts"][start] for start in starts]


def expected_step_factor(update: dict, loss_type: str) -> float:
    """`train_on="pool"`'s step factor derived from the rows: the rows (or loss tokens) trained over the expected rows
    (or tokens) of the downsampled group, whose draws the shares weigh."""
    shares = update["shares"]
    sizes = torch.ones_like(shares) if rules.loss_normaliser(loss_type) == "rows" else update["tokens"]
    return float(sizes.sum() / (shares * sizes).sum())


def check_update(update: dict, config) -> int:
    """The checks on one update; returns how many unmixed groups carried a non-zero advantage."""
    trained, sampler, rewards = update["trained"], update["sampler"], update["rewards"]
    sizes = update["group_sizes"]
    assert len(trained) == len(sampler) == len(rewards) == sum(sizes)
    # 1. What TRL trains is what the sampler computed (scaled by train_on="pool"'s step factor).
    factor = 1.0 if update["shares"] is None else expected_step_factor(update, config.loss_type)
    torch.testing.assert_close(trained, sampler * factor, rtol=1e-5, atol=1e-5)
    # 2. Finite and bounded by what the rules allow: weights at most max_weight (times the prompt count when the
    #    weights are normalised to mean 1), a centred 0/1 reward at most 1, or a z-score over N values at most
    #    (N - 1) / sqrt(N) when divided by a std, and the pool's step factor.
    assert torch.isfinite(trained).all()
    weight_bound = 1.0 if config.objective == "linear" and config.sampler != "est" else config.max_weight
    if config.normalize_weights and weight_bound > 1.0:
        weight_bound *= len(sizes)
    largest_set = max(max(sizes), config.num_generations * 16)  # no pool or update outgrows this in the matrix
    spread_bound = 1.0 if config.scale_rewards == "none" else math.sqrt(len(trained) + largest_set)
    if config.normalize_advantages:
        weight_bound, spread_bound = 1.0, math.sqrt(len(trained))
    bound = weight_bound * spread_bound * max(factor, 1.0) + 1e-4
    assert trained.abs().max() <= bound, f"|A| {trained.abs().max():.4g} above its bound {bound:.4g}"
    shares = update["shares"] if update["shares"] is not None else torch.ones_like(trained)
    unmixed_with_signal = 0
    for group_rewards, group_advantages, group_shares in zip(
        groups(rewards, sizes), groups(trained, sizes), groups(shares, sizes), strict=True
    ):
        scorable = ~torch.isnan(group_rewards)
        r, a = group_rewards[scorable], (group_advantages / group_shares)[scorable]
        has_signal = bool((group_advantages != 0).any())
        constant = len(r) == 0 or bool(r.max() - r.min() <= 0)
        unmixed_with_signal += constant and has_signal
        if not has_signal:
            continue
        # 3. Within a prompt the advantage grows with the reward (rows misaligned with their advantages break it).
        for i in range(len(r)):
            for j in range(len(r)):
                if r[i] > r[j]:
                    assert a[i] >= a[j] - 1e-5, f"advantages {a.tolist()} do not grow with rewards {r.tolist()}"
        remembered = config.baseline in ("tracked", "predicted")
        if config.baseline == "group" and not config.normalize_advantages:
            # 4. A group baseline's advantages sum to zero, each with the sign of r - mean.
            assert abs(float(a.sum())) <= 1e-4 * max(1.0, float(a.abs().max()))
            centred = r - r.mean()
            signs = torch.sign(centred[centred.abs() > 1e-6]) == torch.sign(a[centred.abs() > 1e-6])
            assert signs.all(), f"advantages {a.tolist()} against rewards {r.tolist()}"
        if constant and not remembered:
            # 5. Without a memory, a constant group carries a signal only against a pool that outgrew it.
            assert config.baseline == "pool" and config.sampler in POOLING_SAMPLERS, (
                f"a constant group {r.tolist()} trained with advantages {a.tolist()}"
            )
    if config.dapo_refill and config.baseline not in ("tracked", "predicted"):
        if config.sampler in ("dapo", "dapo_gated") or config.baseline == "group":
            # 6. DAPO trains no group without a signal, however small the tolerance: a constant group is only
            #    keep_partial's padding, which trains nothing, and there is no more of it than DAPO failed to fill.
            constant = [
                bool((group_advantages == 0).all())
                for group_rewards, group_advantages in zip(groups(rewards, sizes), groups(trained, sizes), strict=True)
                for r in (group_rewards[~torch.isnan(group_rewards)],)
                if len(r) < 2 or bool(r.max() - r.min() <= config.zero_variance_tolerance)
            ]
            assert all(constant), "DAPO trained a group without a signal"
            padding = round((1.0 - update["dapo_filled"]) * len(sizes))
            assert len(constant) <= padding, f"{len(constant)} constant groups, {padding} of them padding"
    if config.normalize_advantages:
        # 7. SPO's batch normalisation: over the rows of prompts with a signal, mean 0 and std at most 1.
        signal_rows = torch.cat(
            [
                a[~torch.isnan(r)]
                for r, a in zip(groups(rewards, sizes), groups(trained / shares, sizes), strict=True)
                if bool((a != 0).any())
            ]
            or [torch.zeros(0, dtype=trained.dtype)]
        )
        if update["shares"] is None and len(signal_rows) > 1:
            assert abs(float(signal_rows.mean())) <= 1e-4
            # std / (std + 1e-4) of the raw advantages' std: 1 where they spread, below it where they nearly agree.
            assert float(signal_rows.std()) <= 1.0 + 1e-6, f"normalised std {float(signal_rows.std())}"
    return unmixed_with_signal
