"""The sampler contract and the core samplers of Reinforce-Ada (arXiv 2510.04996): `uniform` (GRPO), `seq_pos`,
`seq_balance`, `est`, `est_ema` and `dapo`, each registered by `@register_sampler("name")` as its module is imported.
Every other sampler is a plug-in on the same contract (`trl_ada.experimental`, or a package of your own: see
docs/custom-sampler.md). Pure Python: this package imports neither torch nor TRL."""

# isort: off
# Registration order is `sampler_names()`'s order (the paper's samplers first): uniform, seq_pos, seq_balance, then the rest.
from . import uniform  # noqa: F401 - registers "uniform"
from . import sequential  # noqa: F401 - registers "seq_pos", "seq_balance"

# isort: on
from . import dapo, est  # noqa: F401 - registers "dapo", then "est" and "est_ema"
from .base import PromptResult, Sampler, SamplingStep, Selection, build_sampler
from .capabilities import ChoosesPrompts, GatesRefills
from .predictor import PromptKey
from .registry import register_sampler, sampler_names
from .settings import SamplerOptions, SamplerSettings, read_when
from .simulate import simulate
from .tracker import PassRateEstimator

__all__ = [
    # The contract a sampler plug-in is written against (docs/custom-sampler.md).
    "PassRateEstimator",
    "PromptKey",
    "PromptResult",
    "Sampler",
    "SamplerOptions",
    "SamplerSettings",
    "SamplingStep",
    "Selection",
    "read_when",
    "register_sampler",
    # The capabilities a sampler may declare beyond it.
    "ChoosesPrompts",
    "GatesRefills",
    # Building and trying samplers.
    "build_sampler",
    "sampler_names",
    "simulate",
]
