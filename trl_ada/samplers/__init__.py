"""Sampling strategies for Reinforce-Ada. Pure Python: this package imports neither torch nor TRL."""

from .base import (
    SAMPLERS,
    DapoSampler,
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
from .continuous import ContinuousStats, ContinuousStep
from .dapo import BatchExhaustedError, BatchFiller
from .est import EstSampler
from .predictor import LearnedPassRatePredictor, PromptKey
from .settings import SAMPLER_NAMES, SamplerSettings
from .simulate import SimulationResult, simulate
from .tracker import DecayedBetaTracker, PassRateEstimator

__all__ = [
    "SAMPLERS",
    "BatchExhaustedError",
    "BatchFiller",
    "ContinuousStats",
    "ContinuousStep",
    "DapoSampler",
    "DecayedBetaTracker",
    "EstSampler",
    "LearnedPassRatePredictor",
    "PassRateEstimator",
    "SAMPLER_NAMES",
    "PromptKey",
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
