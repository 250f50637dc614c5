"""The `uniform` sampler: plain GRPO, one round of `num_generations` draws per prompt. Pure Python."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Sampler, SamplingStep, group_baseline_phrase
from .registry import register_sampler
from .settings import SamplerOptions, SamplerSettings


@dataclass(kw_only=True)
class UniformOptions(SamplerOptions):
    """What `uniform` reads beyond the universal knobs: the objective's weight."""

    objective: str

    def describe(self, settings: SamplerSettings) -> str:
        return (
            f"Sampler `{settings.sampler}`, plain GRPO: {settings.num_generations} completions per prompt in one "
            f"generate call, all trained on, with {group_baseline_phrase(settings)} as baseline."
        )


@register_sampler("uniform")
class UniformSampler(Sampler):
    """Plain GRPO: one round of `num_generations` completions per prompt, all kept."""

    Options = UniformOptions

    def request_size(self, step: SamplingStep, index: int) -> int:
        return self.settings.num_generations if step.rounds == 0 else 0
