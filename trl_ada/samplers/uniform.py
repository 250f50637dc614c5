"""The `uniform` sampler: plain GRPO, one round of `num_generations` draws per prompt. Pure Python."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Sampler, SamplingStep, _reject_dapo_refill_without_rounds
from .registry import register_sampler

if TYPE_CHECKING:
    from .settings import SamplerSettings


@register_sampler("uniform")
class UniformSampler(Sampler):
    """Plain GRPO: one round of `num_generations` completions per prompt, all kept."""

    @classmethod
    def one_request_per_prompt(cls, settings: SamplerSettings) -> bool:
        return True  # GRPOTrainer's own request

    @classmethod
    def check_contradictions(cls, settings: SamplerSettings) -> None:
        _reject_dapo_refill_without_rounds(settings)

    @classmethod
    def describe(cls, settings: SamplerSettings) -> str:
        return (
            f"Sampler `{settings.sampler}`, plain GRPO: {settings.num_generations} completions per prompt in one "
            "generate call, all trained on, with the group's mean reward as baseline."
        )

    @property
    def max_rounds(self) -> int:
        return 1

    def request_size(self, step: SamplingStep, index: int) -> int:
        return self.settings.num_generations if step.rounds == 0 else 0
