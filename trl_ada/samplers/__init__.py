"""Sampling strategies for Reinforce-Ada. Pure Python: this package imports neither torch nor TRL."""

from .base import (
    SAMPLERS,
    PromptResult,
    Sampler,
    SamplingStep,
    Selection,
    SeqBalanceSampler,
    SeqPosSampler,
    SequentialSampler,
    UniformSampler,
    build_sampler,
)
from .settings import SAMPLER_NAMES, SamplerSettings
from .simulate import SimulationResult, simulate

__all__ = [
    "SAMPLERS",
    "SAMPLER_NAMES",
    "PromptResult",
    "Sampler",
    "SamplerSettings",
    "SamplingStep",
    "Selection",
    "SeqBalanceSampler",
    "SeqPosSampler",
    "SequentialSampler",
    "SimulationResult",
    "UniformSampler",
    "build_sampler",
    "simulate",
]
