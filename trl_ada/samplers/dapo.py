"""DAPO's dynamic sampling as a pure rule: drop groups without a signal and refill the batch from further prompts."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from . import rules
from .accounting import draw_metrics
from .base import PromptResult, Selection, finish_update, group_baseline_phrase, selection_draws
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
    """
    DAPO's dynamic sampling (arXiv 2503.14476): one round of `num_generations` per prompt, like GRPO; prompts whose
    group has no signal are dropped and the batch is refilled from further prompts ([`BatchFiller`] below), up to
    `dapo_max_refills` extra generation batches.
    """

    Options = DapoOptions


@runtime_checkable
class RefillGate(Protocol):
    """A sampler whose DAPO refill passes over some prompts (`sampler="dapo_gated"`): the refill walk, synchronous or
    streaming, asks it of every candidate prompt by key."""

    def refill_passes_over(self, key: Hashable) -> bool:
        """Whether the refill should pass over this prompt."""


def refill_gate(sampler: Any) -> Callable[[Hashable], bool] | None:
    """The sampler's `refill_passes_over` where it is a [`RefillGate`], else `None` (the refill draws every prompt)."""
    return sampler.refill_passes_over if isinstance(sampler, RefillGate) else None


def group_has_signal(rewards: Sequence[float], settings: SamplerSettings) -> bool:
    """Whether a group that is its own pool (`uniform`, `dapo`) carries a signal: its rewards are not constant within
    `zero_variance_tolerance`, the rule `SamplingStep.finish` decides `PromptResult.has_signal` by."""
    return not rules.has_zero_variance(rewards, settings.zero_variance_tolerance)


def drops(settings: SamplerSettings, has_signal: bool) -> bool:
    """DAPO's filter, the one place it is decided: with refilling on (`settings.refills`), a prompt without a signal
    leaves the update and a further prompt takes its place (the synchronous [`BatchFiller`], the asynchronous worker)."""
    return settings.refills and not has_signal


class BatchExhaustedError(RuntimeError):
    """Raised when the refill cap is reached before the batch is full and `dapo_on_exhausted="raise"`."""


@dataclass
class BatchFiller:
    """
    Collects prompts with a signal ([`PromptResult.has_signal`], decided once in `SamplingStep.finish`) over
    successive generation batches until `num_prompts` are found. Works with any sampler's [`Selection`], so DAPO's
    filling stacks with `seq_*`.
    """

    num_prompts: int
    informative: list[tuple[int, int]] = field(default_factory=list)
    """`(batch, prompt)` of prompts with a signal, in arrival order."""
    dropped: list[tuple[int, int]] = field(default_factory=list)
    """`(batch, prompt)` of prompts without a signal, whose advantages are all zero."""
    batches: int = 0
    kept_constant: list[tuple[bool, ...]] = field(default_factory=list)
    """Per batch, per prompt: whether the kept group's rewards are constant ([`Selection.kept_constant`])."""
    taken: list[tuple[int, int]] = field(default_factory=list)
    """`(batch, prompt)` of the update's prompts, once `take` chose them."""
    selections: list[Selection] = field(default_factory=list)
    """Every batch's selection, in order: the draw accounting (`draws/*`) covers the refills' draws too."""
    passed_over: int = 0
    """Rows the refill walk stepped past because the sampler expects nothing from them ([`fill_update`]'s
    `passes_over`), this step."""
    out_of_prompts: int | None = None
    """Set when the refill stopped because every prompt of the dataset was already in this step: their number."""

    def add(self, selection: Selection) -> None:
        """File every prompt of one generation batch as informative or dropped."""
        batch = self.batches
        self.kept_constant.append(selection.kept_constant)
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
            found = (
                f"DAPO refilling found only {len(self.informative)} of {self.num_prompts} prompts with a non-zero "
                f"reward variance after {self.batches - 1} extra generation batches"
            )
            if self.out_of_prompts is not None:
                # Raising the cap cannot help here: the walk had nothing left to draw.
                raise BatchExhaustedError(
                    f"{found}, when every prompt of the dataset ({self.out_of_prompts}) had been drawn in this step. "
                    "Use a dataset with more prompts, set dapo_on_exhausted='keep_partial' to train on the partial "
                    "batch, or use sampler='seq_balance', which spends extra samples on the same prompts instead of "
                    "dropping them."
                )
            raise BatchExhaustedError(
                f"{found} (dapo_max_refills). Raise dapo_max_refills, set dapo_on_exhausted='keep_partial' to train "
                "on the partial batch, or use sampler='seq_balance', which spends extra samples on the same prompts "
                "instead of dropping them."
            )
        # Static shapes: pad with dropped groups; without a signal their advantages are zero, so they add no gradient.
        self.taken = self.informative + self.dropped[: self.num_prompts - len(self.informative)]
        return self.taken

    def update_results(self, settings: SamplerSettings) -> tuple[PromptResult, ...]:
        """
        The `taken` prompts' results, in order, as the update trains them: each batch's selection chose a prompt's
        kept completions, baseline and signal, and the rules that read the whole update (the batch std, the weight
        normalisation) run here once over the taken prompts ([`finish_update`]), not over each generation batch.
        """
        prompts = [self.selections[batch].prompts[index] for batch, index in self.taken]
        kept_rewards = [
            prompt.kept_rewards(self.selections[batch].pools[index])
            for (batch, index), prompt in zip(self.taken, prompts, strict=True)
        ]
        return finish_update(prompts, kept_rewards, settings)

    def metrics(self) -> dict[str, float]:
        """
        `dapo/dropped_groups` / `dropped_share`: prompts sampled this step (first batch and refills) without a signal,
        their number and share; `dapo/extra_batches`: refill batches drawn; `dapo/filled_share`: the share of the
        update's prompts that carry a signal; `dapo/passed_over_total`: rows the refill walk stepped past this step
        because the sampler predicts them unmixed (`sampler="dapo_gated"`; a row met twice in the step counts twice);
        `zero_variance_share/kept`: the share of the update's groups (after
        `take`) whose kept rewards are constant, what TRL's `frac_reward_zero_std` describes.
        Once `take` chose the update, `draws/*` ([`draw_metrics`]) over every batch: a dropped or untaken prompt's draws
        were not useful.
        """
        seen = len(self.informative) + len(self.dropped)
        metrics = {
            "dapo/dropped_groups": float(len(self.dropped)),
            "dapo/dropped_share": len(self.dropped) / seen,
            "dapo/extra_batches": float(self.batches - 1),
            "dapo/filled_share": min(len(self.informative), self.num_prompts) / self.num_prompts,
            "dapo/passed_over_total": float(self.passed_over),
        }
        if self.taken:
            constant = [self.kept_constant[batch][prompt] for batch, prompt in self.taken]
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
    Where DAPO's refill prompts come from: the dataset in an order of its own, one seeded permutation per epoch, the
    same on every process (the trainer builds the permutation from TRL's `RepeatSampler` with `seed + 1 + epoch`; the
    main loader, which the Trainer owns, uses `seed`, and its epoch is not consumed). Prompts already in the step are
    skipped, so one update never holds two groups of the same prompt.

    The walk is training state: `state_dict()` is `{"epoch", "position"}`, the format saved in every checkpoint
    (`ada_sampler_state.json`'s `refill`).

    Args:
        dataset: The rows, indexable (`len(dataset)`, `dataset[i]`).
        order: `order(epoch)`, the permutation of `range(len(dataset))` that epoch walks; asked again after
            `load_state_dict`, so it must be a pure function of the epoch.
        key: A row's stable prompt id (what `exclude` holds).
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
        """
        Up to `count` rows (one per prompt) none of whose prompts is in `exclude`; the keys of the rows returned are
        added to `exclude`. Fewer than `count` (or none) come back when the dataset has no more prompts outside it.
        A row whose key `passes_over` accepts is stepped past, as if it were in `exclude` (the walk moves on).
        """
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
    """
    DAPO's dynamic sampling for one update: file the first generation batch's prompts (`first`, keyed `first_keys`),
    then, while fewer than its number of prompts carry a signal and at most `max_refills` refill batches were drawn,
    sample a refill batch of as many prompts from `walk` (`sample(rows)` runs the generation schedule on them and
    returns their selection) and file it too. Returns the filler after `take`: `taken` holds the update's
    `(batch, prompt)` pairs (batch 0 is `first`, batch `i` the `i`-th `sample` call), `metrics()` the `dapo/*` values.
    Raises `BatchExhaustedError` when the batch is short and not `keep_partial`. `passes_over` (the sampler's
    [`refill_gate`]) lets the walk step past prompts the sampler expects nothing from; when a whole walk
    of the dataset leaves a refill batch short because of it, the rest of that batch is drawn without it, as plain DAPO
    draws (the asynchronous stream's gate, likewise, opens a new epoch after a whole walk passed over), so the gate
    never starves the update of prompts DAPO would have drawn.

    The loop lives here, next to the filter and the walk, rather than in `trl_ada.schedules`: it is DAPO's rule (which
    batches to draw, when to stop, what the update keeps), pure and the same for any schedule, which it drives only
    through `sample`; the schedules know nothing of DAPO.
    """
    filler = BatchFiller(len(first.prompts))
    filler.add(first)
    in_step = set(first_keys)

    def judged(key: Hashable) -> bool:
        # Counted here, once per update: TRL's log averages a per-batch count over the step's batches, and a walk
        # that found no row to draw belongs to no batch.
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
