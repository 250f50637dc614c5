"""DAPO's dynamic sampling as a pure rule: drop groups without a signal and refill the batch from further prompts."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import rules
from .accounting import draw_metrics
from .base import PromptResult, Selection, finish_update, group_baseline_phrase, selection_draws
from .capabilities import GatesRefills
from .registry import register_sampler
from .settings import SamplerSettings
from .uniform import UniformOptions, UniformSampler


@dataclass(kw_only=True)
class DapoOptions(UniformOptions):
    """What `dapo` reads: the objective, and its refills (`dapo_refill` is on: `None` reads as `True`)."""

    dapo_refill: bool | None
    dapo_max_refills: int
    dapo_on_exhausted: str

    def __post_init__(self) -> None:
        if self.dapo_refill is False:
            raise ValueError(
                "sampler='dapo' is uniform sampling with batch refilling; dapo_refill=False contradicts it. "
                "Remove dapo_refill, or use sampler='uniform'."
            )
        self.dapo_refill = True

    def describe(self, settings: SamplerSettings) -> str:
        exhausted = {
            "raise": "the run stops",
            "keep_partial": "it trains on the prompts found, padded with zero-advantage groups",
        }[settings.dapo_on_exhausted]
        return (
            f"Sampler `{settings.sampler}`, DAPO's dynamic sampling: {settings.num_generations} completions per prompt "
            "in one generate call, as in GRPO; prompts whose group has no signal (every reward the same) are dropped "
            f"and the batch is refilled from further prompts, with at most {settings.dapo_max_refills} extra "
            f"generation batches per step (when they do not fill it, {exhausted}). Each kept group is trained on "
            f"whole, with {group_baseline_phrase(settings)} as baseline."
        )


@register_sampler("dapo")
class DapoSampler(UniformSampler):
    """DAPO's dynamic sampling (arXiv 2503.14476): GRPO's draws, and groups without a signal dropped and refilled."""

    Options = DapoOptions


def refill_gate(sampler: Any) -> Callable[[Hashable], bool] | None:
    """The sampler's `refill_passes_over` where it declares [`GatesRefills`], else `None` (the refill draws every
    prompt)."""
    return sampler.refill_passes_over if isinstance(sampler, GatesRefills) else None


def group_has_signal(rewards: Sequence[float], settings: SamplerSettings) -> bool:
    """Whether a group that is its own pool (`uniform`, `dapo`) carries a signal, as `PromptResult.has_signal`."""
    return not rules.has_zero_variance(rewards, settings.zero_variance_tolerance)


def drops(settings: SamplerSettings, has_signal: bool) -> bool:
    """DAPO's filter, for both trainers: with refilling on, a prompt without a signal leaves the update."""
    return settings.refills and not has_signal


class BatchExhaustedError(RuntimeError):
    """Raised when the refill cap is reached before the batch is full and `dapo_on_exhausted="raise"`."""


@dataclass
class BatchFiller:
    """Collects prompts with a signal over successive generation batches until `num_prompts` are found."""

    num_prompts: int
    informative: list[tuple[int, int]] = field(default_factory=list)
    """`(batch, prompt)` of prompts with a signal, in arrival order."""
    dropped: list[tuple[int, int]] = field(default_factory=list)
    """`(batch, prompt)` of prompts without a signal, whose advantages are all zero."""
    batches: int = 0
    taken: list[tuple[int, int]] = field(default_factory=list)
    """`(batch, prompt)` of the update's prompts, once `take` chose them."""
    selections: list[Selection] = field(default_factory=list)
    """Every batch's selection, in order."""
    passed_over: int = 0
    """Rows the refill walk stepped past this step because the sampler expects nothing from them."""
    out_of_prompts: int | None = None
    """Set when the refill stopped because every prompt of the dataset was in this step: their number."""

    def add(self, selection: Selection) -> None:
        """File every prompt of one generation batch as informative or dropped."""
        batch = self.batches
        self.selections.append(selection)
        for index, result in enumerate(selection.prompts):
            (self.informative if result.has_signal else self.dropped).append((batch, index))
        self.batches += 1

    @property
    def is_full(self) -> bool:
        return len(self.informative) >= self.num_prompts

    def take(self, keep_partial: bool) -> list[tuple[int, int]]:
        """The `num_prompts` prompts of the update, informative first; short batches are padded or rejected."""
        if self.is_full:
            self.taken = self.informative[: self.num_prompts]
            return self.taken
        if not keep_partial:
            # Raising the cap cannot help when the walk had nothing left to draw.
            cause = (
                " (dapo_max_refills). Raise dapo_max_refills"
                if self.out_of_prompts is None
                else f", when every prompt of the dataset ({self.out_of_prompts}) had been drawn in this step. Use a "
                "dataset with more prompts"
            )
            raise BatchExhaustedError(
                f"DAPO refilling found only {len(self.informative)} of {self.num_prompts} prompts with a non-zero "
                f"reward variance after {self.batches - 1} extra generation batches{cause}, set "
                "dapo_on_exhausted='keep_partial' to train on the partial batch, or use sampler='seq_balance', which "
                "spends extra samples on the same prompts instead of dropping them."
            )
        # Static shapes: pad with dropped groups; without a signal their advantages are zero, so they add no gradient.
        self.taken = self.informative + self.dropped[: self.num_prompts - len(self.informative)]
        return self.taken

    def update_results(self, settings: SamplerSettings) -> tuple[PromptResult, ...]:
        """The `taken` prompts' results, with the rules that read the whole update run once ([`finish_update`])."""
        prompts = [self.selections[batch].prompts[index] for batch, index in self.taken]
        kept_rewards = [
            prompt.kept_rewards(self.selections[batch].pools[index])
            for (batch, index), prompt in zip(self.taken, prompts, strict=True)
        ]
        return finish_update(prompts, kept_rewards, settings)

    def metrics(self) -> dict[str, float]:
        """`dapo/*` for this step (first batch and refills); once `take` chose the update, `zero_variance_share/kept`
        over its groups and `draws/*` ([`draw_metrics`]) over every batch (a dropped or untaken prompt's draws were not
        useful)."""
        seen = len(self.informative) + len(self.dropped)
        metrics = {
            "dapo/dropped_groups": float(len(self.dropped)),
            "dapo/dropped_share": len(self.dropped) / seen,
            "dapo/extra_batches": float(self.batches - 1),
            "dapo/filled_share": min(len(self.informative), self.num_prompts) / self.num_prompts,
            "dapo/passed_over_total": float(self.passed_over),
        }
        if self.taken:
            constant = [self.selections[batch].kept_constant[prompt] for batch, prompt in self.taken]
            metrics["zero_variance_share/kept"] = sum(constant) / len(constant)
            taken = set(self.taken)
            metrics.update(
                draw_metrics(
                    prompt
                    for batch, selection in enumerate(self.selections)
                    for prompt in selection_draws(
                        selection.prompts,
                        selection.pools,
                        [(batch, index) in taken for index in range(len(selection.prompts))],
                    )
                )
            )
        return metrics


class RefillWalk:
    """
    Where DAPO's refill prompts come from: the dataset in the permutation `order(epoch)` (a pure function of the epoch,
    the same on every process), skipping prompts already in the step by `key(row)`. Training state: `state_dict()`.
    """

    def __init__(self, dataset: Any, order: Callable[[int], Sequence[int]], key: Callable[[Any], Hashable]) -> None:
        self.dataset = dataset
        self.order = order
        self.key = key
        self.epoch = 0
        self.position = 0
        self._indices: list[int] | None = None

    def next_prompts(
        self, count: int, exclude: set, passes_over: Callable[[Hashable], bool] | None = None
    ) -> list[Any]:
        """Up to `count` rows of prompts not in `exclude` (fewer when the dataset has no more), their keys added to it.
        A row whose key `passes_over` accepts is stepped past, as if it were in `exclude`."""
        dataset_size = len(self.dataset)
        rows: list[Any] = []
        scanned = 0  # a whole pass over the dataset without a new prompt means there is none left
        while len(rows) < count and scanned < dataset_size:
            if self._indices is None:
                # Built lazily (also after `load_state_dict`): the position may sit at the end of an epoch.
                self._indices = list(self.order(self.epoch))
            if self.position >= len(self._indices):
                self.epoch, self.position = self.epoch + 1, 0
                self._indices = None
                continue
            row = self.dataset[self._indices[self.position]]
            self.position += 1
            scanned += 1
            key = self.key(row)
            if key not in exclude and not (passes_over is not None and passes_over(key)):
                exclude.add(key)
                rows.append(row)
        return rows

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._indices = None


def fill_update(
    first: Selection,
    first_keys: Iterable[Hashable],
    sample: Callable[[list[Any]], Selection],
    walk: RefillWalk,
    max_refills: int,
    keep_partial: bool,
    passes_over: Callable[[Hashable], bool] | None = None,
) -> BatchFiller:
    """DAPO's dynamic sampling for one update: file the first generation batch, then, while it is short and at most
    `max_refills` refill batches were drawn, `sample(rows)` a refill batch from `walk`. Returns the filler after `take`
    (batch 0 is `first`). `passes_over` (the sampler's [`refill_gate`]) lets the walk step past prompts; a refill batch
    a whole walk leaves short is filled ungated, so the gate never starves the update."""
    filler = BatchFiller(len(first.prompts))
    filler.add(first)
    in_step = set(first_keys)

    def judged(key: Hashable) -> bool:
        # Counted once per update: TRL's log would average a per-batch count over the step's batches.
        passes = passes_over is not None and passes_over(key)
        filler.passed_over += passes
        return passes

    while not filler.is_full and filler.batches <= max_refills:
        passed_before = filler.passed_over
        rows = walk.next_prompts(filler.num_prompts, exclude=in_step, passes_over=judged)
        if len(rows) < filler.num_prompts and filler.passed_over > passed_before:
            # A whole walk of the dataset without enough prompts the gate lets through: the rest ungated.
            rows += walk.next_prompts(filler.num_prompts - len(rows), exclude=in_step)
        if not rows:
            filler.out_of_prompts = len(in_step)  # every prompt of the dataset is already in this step
            break
        filler.add(sample(rows))
    filler.take(keep_partial=keep_partial)
    return filler
