"""AdaGRPOTrainer's side of the schedules: the driver that generates and scores for them ([`TrainerDriver`]), and
one training step's sampling around them ([`sample_step`]: TRL's batch layout, the schedule, DAPO's refills, and the
[`PendingBatch`] of kept rows handed to the TRL overrides)."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import gather_object

from ..samplers import PromptKey, Sampler, Selection, rules
from ..samplers.base import fit_trained_rows
from ..samplers.dapo import RefillWalk, fill_update, refill_gate
from ..samplers.signal import trl_advantages_stand_in
from ..samplers.streaming import ScheduleStats
from ..trl_seam.grpo_private import RepeatSampler, train_metrics
from . import get_schedule, rounds
from .pools import LocalRow, PoolEntry, moved_fraction, route_kept_rows
from .schedule import RoundResult, prompt_key, prompt_keys

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainerDriver:
    """An AdaGRPOTrainer as a schedule's [`~trl_ada.schedules.ScheduleDriver`] (the continuous one reads `trainer`)."""

    trainer: Any

    @property
    def sampler(self) -> Sampler:
        return self.trainer.ada_sampler

    @property
    def mask_truncated(self) -> bool:
        return self.trainer.mask_truncated_completions

    def run_round(
        self, requests: Sequence[tuple[int, int]], group_inputs: list[dict[str, Any]], round_index: int
    ) -> RoundResult:
        return rounds.run_round(self.trainer, requests, group_inputs, round_index)


@dataclasses.dataclass(frozen=True)
class PendingBatch:
    """One step's sampling, the trainer's `_ada_pending` (set by [`sample_step`]) while TRL builds the batch: read by
    its `_generate` and `_calculate_rewards` overrides."""

    rows: list[LocalRow]
    """This process's kept rows, in the order TRL trains them."""
    rewards: torch.Tensor
    """Every process's kept rows' rewards per reward function (process-major), as `_calculate_rewards` returns them."""
    group_sizes: list[int]
    """Kept rows per trained prompt, in order (TRL's `num_generations` unless the sampler keeps another number)."""
    advantages: torch.Tensor
    """Every process's kept rows' advantages, as the sampler computed them."""
    trl_stands_in: bool
    """Whether TRL's own advantages stand in for `advantages` (they are GRPO's on these rows, and TRL's float32
    computation reproduces GRPOTrainer bit for bit: `trl_ada.samplers.signal.trl_advantages_stand_in`)."""
    draw_shares: torch.Tensor | None = None
    """With `train_on="pool"`, every process's kept rows' outcome shares (`PromptResult.draw_shares`), from which the
    trainer restores the downsampled rule's step size; None otherwise."""


@dataclasses.dataclass
class SampledBatch:
    """One generation batch as the step sees it: its rows and keys, and what the schedule made of them."""

    group_inputs: list[dict[str, Any]]
    keys: list[PromptKey]
    pools: list[list[PoolEntry]]
    """Every prompt's pool in draw order; the completions themselves stay on the process that generated them."""
    selection: Selection
    stats: ScheduleStats


def sample_step(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sample one generation batch (and DAPO refills) on every process; set the [`PendingBatch`] on the trainer
    (`_ada_pending`); return this process's kept dataset rows, which TRL then builds the training batch from."""
    rank = trainer.accelerator.process_index
    settings = trainer.ada_sampler.settings
    batches = [sample_batch(trainer, group_rows(trainer, inputs))]
    chosen = [(0, g) for g in range(len(batches[0].group_inputs))]
    results = batches[0].selection.prompts
    if settings.refills:

        def sample_refill(rows: list[dict[str, Any]]) -> Selection:
            # Every process draws the same global refill batch, so no gather is needed.
            batches.append(sample_batch(trainer, rows))
            return batches[-1].selection

        filler = fill_update(
            batches[0].selection,
            batches[0].keys,
            sample_refill,
            trainer.ada_refills,
            settings.dapo_max_refills,
            keep_partial=settings.dapo_on_exhausted == "keep_partial",
            passes_over=refill_gate(trainer.ada_sampler),
        )
        chosen = filler.taken
        # One update across the batches: its batch std and weight normalisation cover the prompts it trains.
        results = filler.update_results(settings)
        for name, value in filler.metrics().items():
            train_metrics(trainer)[f"ada/{name}"].append(value)

    num_processes = trainer.accelerator.num_processes
    if trainer.ada_sampler.train_on == "pool":
        # TRL reshapes the rows by num_generations, splits them evenly over the processes and each process's rows into
        # steps_per_generation micro-batches; a pool's size is its own, so the total is cut to fit.
        multiple = math.lcm(trainer.num_generations, num_processes * trainer.args.steps_per_generation)
        results, left_out = fit_trained_rows(results, multiple, trainer.num_generations)
        train_metrics(trainer)["ada/pool_draws_left_out"].append(float(left_out))
    kept: list[PoolEntry] = []
    kept_inputs: list[dict[str, Any]] = []
    advantages: list[float] = []
    for (b, g), result in zip(chosen, results, strict=True):
        batch = batches[b]
        pool = batch.pools[g]
        kept.extend(pool[i] for i in result.kept)
        # One copy per row: TRL merges a rollout's per-row extra fields into these dicts in place.
        kept_inputs.extend(dict(batch.group_inputs[g]) for _ in result.kept)
        advantages.extend(result.advantages)
    # Where the sampler's advantages are GRPO's on these very rows, TRL's own float32 computation stands in, so that
    # `uniform` (and a one-round seq_* batch) reproduces GRPOTrainer bit for bit; everywhere else TRL trains the
    # sampler's (trl_ada.samplers.signal).
    kept_rewards = [result.kept_rewards(batches[b].selection.pools[g]) for (b, g), result in zip(chosen, results)]
    stand_in = trl_advantages_stand_in(
        settings,
        trainer.ada_sampler.train_on,
        kept_rewards,
        [result.advantages for result in results],
        aggregation=trainer.args.multi_objective_aggregation,
    )
    local = len(kept) // num_processes
    # Each kept row moves once, from the process that generated it to the one that trains on it.
    rows = route_kept_rows(kept, rank, num_processes, trainer.accelerator.device)
    if num_processes > 1:
        train_metrics(trainer)["ada/kept_rows_moved"].append(moved_fraction(kept, num_processes))
    trainer._ada_pending = PendingBatch(
        rows=rows,
        rewards=torch.stack([entry.rewards_per_func for entry in kept]),
        group_sizes=[len(result.kept) for result in results],
        advantages=torch.tensor(advantages, dtype=torch.float32, device=trainer.accelerator.device),
        trl_stands_in=stand_in,
        draw_shares=None
        if trainer.ada_sampler.train_on != "pool"
        else torch.tensor(
            [share for result in results for share in result.draw_shares], device=trainer.accelerator.device
        ),
    )
    # An environment's observation is part of the prompt each kept completion was generated from.
    return [
        row if kept_row.prompt is None else {**row, "prompt": kept_row.prompt}
        for row, kept_row in zip(kept_inputs[rank * local : (rank + 1) * local], rows, strict=True)
    ]


def group_rows(trainer: Any, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dataset row per prompt of the whole generation batch, on every process. TRL's RepeatSampler lays the batch
    out group-major across processes (global rows [g * n, (g + 1) * n) hold prompt g), so only each group's first
    row is gathered; every process checks its own rows against it, and all fail together if one layout is wrong."""
    n = trainer.num_generations
    start = trainer.accelerator.process_index * len(inputs)
    groups = gather_object([row for i, row in enumerate(inputs) if (start + i) % n == 0])
    # Each group's key once (it hashes the prompt and any images), not once per row.
    group_keys = {g: prompt_key(groups[g]) for g in {(start + i) // n for i in range(len(inputs))}}
    misplaced = sum(prompt_key(row) != group_keys[(start + i) // n] for i, row in enumerate(inputs))
    if trainer.accelerator.gather(torch.tensor([misplaced], device=trainer.accelerator.device)).sum().item():
        raise RuntimeError(
            "AdaGRPOTrainer expects each prompt's num_generations rows to be contiguous (TRL's RepeatSampler "
            "layout). Do not override the train sampler or shuffle the generation batch before generation."
        )
    return groups


def sample_batch(trainer: Any, group_inputs: list[dict[str, Any]]) -> SampledBatch:
    """One generation batch under the trainer's `generation_schedule`, logged (`ada/*`) once sampled."""
    # The keys also carry the prompt's text, for a learned pass-rate predictor (trl_ada.samplers.PromptKey).
    keys = prompt_keys(group_inputs)
    scheduled = get_schedule(trainer.args.generation_schedule).sample(TrainerDriver(trainer), group_inputs, keys)
    trainer._log_selection(scheduled.selection)
    metrics = train_metrics(trainer)
    for name, value in scheduled.stats.metrics().items():
        metrics[f"ada/{name}"].append(value)
    return SampledBatch(group_inputs, keys, scheduled.pools, scheduled.selection, scheduled.stats)


def refill_walk(trainer: Any) -> RefillWalk:
    """The trainer's DAPO refill walk over `train_dataset`: epoch `e` walks TRL's `RepeatSampler` permutation seeded
    `seed + 1 + e` (the main loader's is seeded `seed`), the same on every process."""
    dataset, seed = trainer.train_dataset, trainer.args.seed

    def order(epoch: int) -> list[int]:
        sampler = RepeatSampler(
            data_source=dataset, mini_repeat_count=1, batch_size=1, repeat_count=1, shuffle=True, seed=seed + 1 + epoch
        )
        return list(sampler)

    return RefillWalk(dataset, order, prompt_key)


def log_selection(trainer: Any, selection: Selection) -> None:
    """A batch's selection metrics (`ada/*`), and the once-only warnings about what its rewards show."""
    metrics = train_metrics(trainer)
    for name, value in selection.metrics.items():
        metrics[f"ada/{name}"].append(value)
    _check_threshold(trainer, selection)
    _check_unscorable(trainer, selection)
    _check_difficulty(trainer, selection)


DIFFICULTY_BATCHES = 3
"""Generation batches over which `_check_difficulty` judges whether the data suits the model."""

UNSUITED_SHARE = 0.8
"""The share of prompts all-wrong (or all-right) after their draws above which the data is too hard (or too easy)."""


def _check_difficulty(trainer: Any, selection: Selection) -> None:
    """Warn once when, over the first generation batches, most prompts come back all-wrong (or all-right) even after
    the sampler's draws: such prompts train nothing, and adaptive sampling cannot help data the model cannot (or
    always does) solve."""
    threshold = trainer.ada_sampler.settings.positive_threshold
    seen = trainer.__dict__.setdefault("_ada_difficulty", [0, 0, 0, 0])  # batches, prompts, all wrong, all right
    if seen[0] >= DIFFICULTY_BATCHES:
        return
    outcomes = [rules.count_outcomes(pool, threshold) for pool in selection.pools]
    seen[0] += 1
    seen[1] += len(outcomes)
    seen[2] += sum(positives == 0 and negatives > 0 for positives, negatives in outcomes)
    seen[3] += sum(negatives == 0 and positives > 0 for positives, negatives in outcomes)
    if seen[0] < DIFFICULTY_BATCHES:
        return
    for share, side, band in ((seen[2] / seen[1], "all wrong", "hard"), (seen[3] / seen[1], "all right", "easy")):
        if share > UNSUITED_SHARE:
            trainer._warn_once(
                f"too_{band}",
                "%.0f%% of the prompts of the first %d generation batches came back %s after every draw the sampler "
                "made: they train nothing, so the data is too %s for this model. Keep the prompts it solves "
                "sometimes, e.g. `trl-ada prepare-data --pass_rate_band 0 0.375 ...` (the paper's band), or start "
                "from a stronger (or weaker) model.",
                100 * share,
                DIFFICULTY_BATCHES,
                side,
                band,
            )


def _check_unscorable(trainer: Any, selection: Selection) -> None:
    """Warn once when no reward function scored any draw of a prompt (all returned None): the sampler stops such a
    prompt at `num_generations` draws, and it trains with zero advantages."""
    pools = [pool for pool in selection.pools if pool and not any(rules.is_scorable(r) for r in pool)]
    if pools and len(pools) == len(selection.pools):
        # Nothing of the whole generation batch could be scored: the step would train on nothing and look fine.
        raise RuntimeError(
            f"Every reward function ({', '.join(trainer.reward_func_names)}) returned None for every completion of "
            f"training step {trainer.state.global_step + 1} ({sum(len(pool) for pool in pools)} completions of "
            f"{len(pools)} prompts), so there is nothing to train on. Make a reward function score these prompts "
            "(None means 'does not apply'), or check the dataset columns the reward functions read."
        )
    if pools:
        trainer._warn_once(
            "unscorable",
            "Every reward function (%s) returned None for all draws of %d of %d prompts (%d completions), so they "
            "carry no signal: trl-ada stops drawing for such a prompt once its update group of num_generations=%d "
            "is filled, and it trains with zero advantages (ada/unscorable_share logs their share). Make a reward "
            "function score these prompts, or remove them from the dataset.",
            ", ".join(trainer.reward_func_names),
            len(pools),
            len(selection.pools),
            sum(len(pool) for pool in pools),
            trainer.num_generations,
        )


def _check_threshold(trainer: Any, selection: Selection) -> None:
    """Warn once when a batch's rewards vary yet all fall on one side of `positive_threshold`: the rewards carry a
    signal the threshold cannot see (e.g. 5.0 with 0/1 rewards), so every exit rule waits for the whole cap."""
    settings = trainer.ada_sampler.settings
    threshold = settings.positive_threshold
    rewards = [r for pool in selection.pools for r in pool if not math.isnan(r)]
    if not rewards or max(rewards) - min(rewards) <= settings.zero_variance_tolerance:
        return
    positives, negatives = rules.count_outcomes(rewards, threshold)
    side = "positive" if positives == 0 else "negative" if negatives == 0 else None
    if side is not None:
        trainer._warn_once(
            f"no_{side}",
            "No completion of a whole generation batch (%d prompts, %d completions, rewards %.4g to %.4g) was %s "
            "at positive_threshold=%s, so the exit rule, the balanced downsampling and p̂ cannot tell outcomes "
            "apart and adaptive samplers spend the whole cap. Set positive_threshold between your rewards' failure "
            "and success values.",
            len(selection.pools),
            len(rewards),
            min(rewards),
            max(rewards),
            side,
            threshold,
        )


def check_memory_can_act(trainer: Any) -> None:
    """Warn once, at the start of training, when a mechanism that acts on what it remembers of a prompt's earlier
    visits (est's and knapsack's budgets, a gated refill, SPO's priorities, a tracked baseline)
    will see no prompt twice: the run draws fewer prompts than the dataset holds, so the mechanism does nothing."""
    sampler, args = trainer.ada_sampler, trainer.args
    dataset = trainer.train_dataset
    if args.max_steps <= 0 or not hasattr(dataset, "__len__"):
        return
    learned = sampler.settings.pass_rate_predictor != "tracker"  # predicts first visits from the text: it acts
    remembers = [
        name
        for name, acts in (
            (f"sampler={sampler.name!r}", sampler.estimator is not None and not learned),
            (f"baseline={sampler.settings.baseline!r}", sampler.settings.baseline == "tracked"),
        )
        if acts
    ]
    rows = args.max_steps * args.per_device_train_batch_size * args.gradient_accumulation_steps
    prompts = rows * trainer.accelerator.num_processes // trainer.num_generations
    if remembers and prompts <= len(dataset):
        logger.warning(
            "%s act(s) on what is remembered of a prompt's earlier visits, and this run draws about %d prompts from a "
            "dataset of %d, so no prompt comes back and they do nothing (the run draws as its first visits do). "
            "Train for more than one pass over the data (max_steps or num_train_epochs) or on fewer prompts.",
            " and ".join(remembers),
            prompts,
            len(dataset),
        )
