"""SPO, Single-stream Policy Optimization (arXiv 2509.13232), as a sampler. Pure Python."""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from trl_ada.samplers import ChoosesPrompts, Sampler, SamplerOptions, SamplerSettings, SamplingStep, register_sampler
from trl_ada.samplers.base import group_baseline_phrase
from trl_ada.samplers.settings import REMEMBERED_BASELINES
from trl_ada.samplers.tracker import checked_estimates


def spo_priority(pass_rate: float, floor: float) -> float:
    """SPO's prompt weight `sqrt(p̂ (1 - p̂)) + floor`: largest where a draw's outcome is least predictable."""
    return math.sqrt(pass_rate * (1.0 - pass_rate)) + floor


@dataclass(kw_only=True)
class SpoOptions(SamplerOptions):
    """What `spo` reads: the remembered baseline it centres on, and its own `priority_floor`."""

    baseline: str
    priority_floor: float = 0.05
    """Added to every prompt's weight, so that a prompt whose pass rate reads 0 or 1 is still drawn now and then."""
    recipe: ClassVar[Mapping[str, Any]] = {
        "baseline": "tracked",
        "scale_rewards": "none",
        "normalize_advantages": True,
    }

    def __post_init__(self) -> None:
        if self.baseline not in REMEMBERED_BASELINES:
            raise ValueError(
                f"sampler='spo' centres each reward on the prompt's remembered pass rate and draws prompts by it; "
                f"baseline={self.baseline!r} remembers nothing. Set baseline='tracked' or 'predicted' (SPO's recipe: "
                + ", ".join(f"{knob}={value!r}" for knob, value in self.recipe.items())
                + ")."
            )
        if not (0.0 <= self.priority_floor < math.inf):
            raise ValueError(
                f"priority_floor must be a finite, non-negative number (SPO uses 0.05), got {self.priority_floor}."
            )

    def describe(self, settings: SamplerSettings) -> str:
        return (
            f"Sampler `{settings.sampler}`, SPO's single stream: {settings.num_generations} completions per prompt in "
            f"one generate call, all trained on, with {group_baseline_phrase(settings)} as baseline; each generation "
            "batch's prompts were drawn with probability proportional to sqrt(p̂(1-p̂)) + "
            f"{self.priority_floor} from the same memory of pass rates."
        )


@register_sampler("spo")
class SpoSampler(ChoosesPrompts, Sampler):
    """SPO (arXiv 2509.13232): the smallest group per prompt, centred on the prompt's remembered pass rate, and
    prompts drawn by priority `sqrt(p̂(1-p̂)) + priority_floor` from that memory."""

    Options = SpoOptions

    def request_size(self, step: SamplingStep, index: int) -> int:
        return self.settings.num_generations if step.rounds == 0 else 0

    def prompt_priorities(self, keys: Sequence[Hashable]) -> list[float]:
        # A prompt never drawn reads the prior's mean (0.5 under Beta(1, 1)), the largest weight: it goes first.
        estimates = checked_estimates(self.baseline_history, keys)
        return [spo_priority(p, self.options.priority_floor) for p in estimates]

    def max_priority(self) -> float:
        # sqrt(p(1 - p)) is largest, 1/2, at p = 1/2.
        return spo_priority(0.5, self.options.priority_floor)
