"""DAPO's dynamic sampling as a pure rule: drop groups without a signal and refill the batch from further prompts."""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import Selection


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

    def add(self, selection: Selection) -> None:
        """File every prompt of one generation batch as informative or dropped."""
        batch = self.batches
        self.kept_constant.append(selection.kept_constant)
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
            raise BatchExhaustedError(
                f"DAPO refilling found only {len(self.informative)} of {self.num_prompts} prompts with a non-zero "
                f"reward variance after {self.batches - 1} extra generation batches. Raise dapo_max_refills, set "
                "dapo_on_exhausted='keep_partial' to train on the partial batch, or use sampler='seq_balance', "
                "which spends extra samples on the same prompts instead of dropping them."
            )
        # Static shapes: pad with dropped groups; without a signal their advantages are zero, so they add no gradient.
        self.taken = self.informative + self.dropped[: self.num_prompts - len(self.informative)]
        return self.taken

    def metrics(self) -> dict[str, float]:
        """
        `dapo/dropped_groups` / `dropped_share`: prompts sampled this step (first batch and refills) without a signal,
        their number and share; `dapo/extra_batches`: refill batches drawn; `dapo/filled_share`: the share of the
        update's prompts that carry a signal; `zero_variance_share/kept`: the share of the update's groups (after
        `take`) whose kept rewards are constant, what TRL's `frac_reward_zero_std` describes.
        """
        seen = len(self.informative) + len(self.dropped)
        metrics = {
            "dapo/dropped_groups": float(len(self.dropped)),
            "dapo/dropped_share": len(self.dropped) / seen,
            "dapo/extra_batches": float(self.batches - 1),
            "dapo/filled_share": min(len(self.informative), self.num_prompts) / self.num_prompts,
        }
        if self.taken:
            constant = [self.kept_constant[batch][prompt] for batch, prompt in self.taken]
            metrics["zero_variance_share/kept"] = sum(constant) / len(constant)
        return metrics
