"""Sampling strategies for Reinforce-Ada, each a plug-in that `@register_sampler("name")` registers as its module is
imported. Pure Python: this package imports neither torch nor TRL."""

# isort: off
# Registration order is `sampler_names()`'s order (the paper's samplers first): uniform, seq_pos, seq_balance, then the rest.
from .uniform import UniformSampler  # registers "uniform"
from .sequential import SeqBalanceSampler, SeqPosSampler, SequentialSampler  # registers "seq_pos", "seq_balance"

# isort: on
from .base import PromptResult, Sampler, SamplingStep, Selection, build_sampler
from .dapo import BatchExhaustedError, BatchFiller, DapoSampler  # registers "dapo"
from .est import EstEmaSampler, EstSampler  # registers "est", "est_ema"
from .gated import GatedRefillOptions, GatedRefillSampler  # registers "dapo_gated"
from .knapsack import KnapsackOptions, KnapsackSampler  # registers "knapsack"
from .predictor import LearnedPassRatePredictor, PromptKey
from .registry import SAMPLERS, register_sampler, sampler_class, sampler_names
from .settings import SamplerFields, SamplerOptions, SamplerSettings, read_when
from .simulate import SimulationResult, simulate
from .spo import PromptPriority, SpoOptions, SpoSampler, StreamPriority  # registers "spo"
from .streaming import ContinuousStep, ScheduleStats
from .tracker import DecayedBetaTracker, PassRateEstimator

__all__ = [
    "SAMPLERS",
    "BatchExhaustedError",
    "BatchFiller",
    "ContinuousStep",
    "DapoSampler",
    "DecayedBetaTracker",
    "EstEmaSampler",
    "EstSampler",
    "GatedRefillOptions",
    "GatedRefillSampler",
    "KnapsackOptions",
    "KnapsackSampler",
    "LearnedPassRatePredictor",
    "PassRateEstimator",
    "PromptKey",
    "PromptPriority",
    "PromptResult",
    "Sampler",
    "SamplerFields",
    "SamplerOptions",
    "SamplerSettings",
    "SamplingStep",
    "ScheduleStats",
    "Selection",
    "SeqBalanceSampler",
    "SeqPosSampler",
    "SequentialSampler",
    "SimulationResult",
    "SpoOptions",
    "SpoSampler",
    "StreamPriority",
    "UniformSampler",
    "build_sampler",
    "read_when",
    "register_sampler",
    "sampler_class",
    "sampler_names",
    "simulate",
]
