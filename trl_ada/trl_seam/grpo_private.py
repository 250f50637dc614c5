"""`GRPOTrainer`'s private API: the methods `AdaGRPOTrainer` overrides (checked at import), the private attributes it
reads and writes, the inline behaviours of `_generate_and_score_completions` it repeats, the layout of
`_get_train_sampler`'s `RepeatSampler`, `unwrap_model_for_generation`, and the fused LM head `GRPOTrainer.__init__`
puts on the model (`trl.trainer.utils`). Rows of `TOUCHPOINTS` in `tests/test_trl_touchpoints.py`."""

from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any

import trl
from trl.models import unwrap_model_for_generation
from trl.trainer.grpo_trainer import GRPOTrainer, RepeatSampler
from trl.trainer.utils import get_config_model_id

from . import SUPPORTED_TRL, refuse_unsupported

# Private GRPOTrainer methods AdaGRPOTrainer overrides or calls, with the parameters it passes. Checked at import, so a
# TRL that renamed or re-shaped one fails loudly instead of silently bypassing an override.
OVERRIDDEN_METHODS: dict[str, tuple[str, ...]] = {
    "_generate_and_score_completions": ("inputs",),
    "_generate": ("prompts",),
    "_generate_single_turn": ("prompt_ids", "images", "multimodal_fields", "num_generations"),
    "_calculate_rewards": ("inputs", "prompts", "completions", "completion_ids_list"),
    "_save_optimizer_and_scheduler": ("output_dir",),
    "_load_optimizer_and_scheduler": ("checkpoint",),
    "create_model_card": ("model_name", "dataset_name", "tags"),
    "_get_train_sampler": ("dataset",),
}

GENERATE_OUTPUT_FIELDS = (
    "prompt_ids",
    "completion_ids",
    "tool_mask",
    "completions",
    "logprobs",
    "extra_fields",
    "images",
    "tool_images",
)
"""The layout of `GRPOTrainer._generate`'s return tuple."""

GENERATION_SEAM = "_prepare_and_generate"
"""The `GRPOTrainer` method, proposed upstream in `docs/upstream/`, that sets a generation batch up and generates it:
`(inputs) -> (prompts, *_generate's tuple)`. TRL 1.14 to 1.16 do not have it."""


def has_generation_seam(trainer_class: type) -> bool:
    """Whether `trainer_class` has [`GENERATION_SEAM`]`(inputs)`, which a sampling round then calls instead of
    stopping `_generate_and_score_completions` at its `_generate` call."""
    method = getattr(trainer_class, GENERATION_SEAM, None)
    return method is not None and [p for p in inspect.signature(method).parameters if p != "self"][:1] == ["inputs"]


def check_overridable(trainer_class: type) -> None:
    """Raise `ImportError` when a method trl-ada overrides is missing from `trainer_class` or lost a parameter."""
    problems = []
    for name, parameters in OVERRIDDEN_METHODS.items():
        method = getattr(trainer_class, name, None)
        if method is None:
            problems.append(f"{name} is missing")
            continue
        have = inspect.signature(method).parameters
        missing = [p for p in parameters if p not in have]
        if missing:
            problems.append(f"{name} has no parameter(s) {missing}")
    if problems:
        raise ImportError(
            f"{trainer_class.__name__} of TRL {trl.__version__} does not have the private API trl-ada overrides: "
            f"{'; '.join(problems)}. Install TRL {SUPPORTED_TRL}."
        )


def split_generate_output(output: tuple) -> dict[str, Any]:
    """`GRPOTrainer._generate`'s return tuple as a dict keyed by [`GENERATE_OUTPUT_FIELDS`]."""
    return dict(zip(GENERATE_OUTPUT_FIELDS, output, strict=True))


def make_generate_output(**fields: Any) -> tuple:
    """A `GRPOTrainer._generate` return tuple from fields named as in [`GENERATE_OUTPUT_FIELDS`]; missing ones get
    TRL's values for a text-only, tool-free generation."""
    unknown = set(fields) - set(GENERATE_OUTPUT_FIELDS)
    if unknown:
        raise TypeError(f"not fields of GRPOTrainer._generate's output: {sorted(unknown)}")
    values = {**dict.fromkeys(GENERATE_OUTPUT_FIELDS), "extra_fields": {}, "tool_images": [], **fields}
    return tuple(values[name] for name in GENERATE_OUTPUT_FIELDS)


def train_metrics(trainer: Any) -> dict[str, list[float]]:
    """The training-mode metric lists TRL averages into each log (`GRPOTrainer._metrics["train"]`)."""
    return trainer._metrics["train"]


def logged_advantages(trainer: Any) -> list[float]:
    """The completions table's `advantages` column (`GRPOTrainer._logs["advantages"]`)."""
    return trainer._logs["advantages"]


def take_pending_extra_logs(trainer: Any) -> dict[str, list]:
    """Remove and return the `log_extra` columns reward functions have written since the last call."""
    pending = trainer._pending_extra_logs
    trainer._pending_extra_logs = defaultdict(list)
    return pending


def add_pending_extra_logs(trainer: Any, column: str, values: list) -> None:
    """Queue `log_extra` values for TRL's completions table, as a reward function's `log_extra` would."""
    trainer._pending_extra_logs[column].extend(values)


def environment_pool(trainer: Any) -> dict[Any, list] | None:
    """The reusable environment instances per environment name, when the trainer was given an `environment_factory`."""
    return trainer._environment_pool if getattr(trainer, "environment_factories", None) is not None else None


def set_environment_pool(trainer: Any, pool: dict[Any, list]) -> None:
    trainer._environment_pool = pool


def is_vlm(trainer: Any) -> bool:
    """Whether the trainer's processing class is a vision-language processor."""
    return bool(trainer._is_vlm)


def micro_step(trainer: Any) -> int:
    """TRL's micro-step counter, on which `_prepare_inputs` regenerates (it restarts at 0 on resume)."""
    return trainer._step


def is_truncated(trainer: Any, completion_ids: list[int]) -> bool:
    """TRL's truncation test, which `_generate_and_score_completions` writes inline: a completion that does not end
    with EOS or padding hit `max_completion_length`. The one copy in trl-ada."""
    return bool(completion_ids) and completion_ids[-1] not in (*trainer.eos_token_ids, trainer._tokenizer.pad_token_id)


def summed_rewards(trainer: Any, rewards_per_func: Any) -> Any:
    """TRL's `sum_then_normalize` aggregation, which `_generate_and_score_completions` writes inline: the weighted
    sum over reward functions (NaN skipped), NaN where every function returned None. The one copy in trl-ada."""
    import torch

    weights = trainer.reward_weights.to(rewards_per_func.device).unsqueeze(0)
    rewards = (rewards_per_func * weights).nansum(dim=1)
    rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return rewards


def tokenize_prompts(trainer: Any, prompts: list) -> list[list[int]]:
    """The token ids `_generate` would send to vLLM for these prompts (TRL's `_tokenize_prompts`: chat template,
    tools, images)."""
    return trainer._tokenize_prompts(prompts)[0]


def set_last_loaded_step(trainer: Any, step: int) -> None:
    trainer._last_loaded_step = step


def last_loaded_step(trainer: Any) -> int:
    """The global step whose weights TRL last pushed to vLLM (`GRPOTrainer._last_loaded_step`; -1 before any)."""
    return trainer._last_loaded_step


class FusedLMHeadNeedsGPUError(RuntimeError):
    """The installed TRL's `GRPOTrainer` cannot compute log-probabilities on this device (`check_fused_lm_head_runs`)."""


def fused_lm_head_is_triton_only() -> bool:
    """Whether the installed TRL's fused LM head (`add_fused_lm_head`, which `GRPOTrainer.__init__` puts on the model)
    runs a Triton kernel only, on CUDA/XPU: TRL 1.15. TRL 1.14 has no fused head; 1.16's falls back to torch."""
    import trl.trainer.utils as trl_utils

    if not hasattr(trl_utils, "add_fused_lm_head") or not hasattr(trl_utils, "_ChunkedLogProbFunction"):
        return False  # 1.14: no fused LM head
    try:
        from trl.kernels import chunked_logprob
    except ImportError:  # 1.15 without Triton
        return True
    return not hasattr(chunked_logprob, "_use_triton")  # 1.16 has its own torch fallback


def _accelerator_type() -> str:
    """`"cuda"` or `"xpu"` when this machine has one (in that order), else `"cpu"`."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    return "xpu" if xpu is not None and xpu.is_available() else "cpu"


def check_fused_lm_head_runs(device_type: str | None = None) -> None:
    """Raise `FusedLMHeadNeedsGPUError` when the installed TRL's `GRPOTrainer` would compute log-probabilities with its
    Triton-only kernel (`fused_lm_head_is_triton_only`, TRL 1.15) on a device other than CUDA/XPU: `device_type`
    (the type of the device the model trains on, as `torch.device(...).type` names it), or by default this machine's
    accelerator (`"cpu"` when it has no CUDA/XPU device). Call it before any model is loaded."""
    if not fused_lm_head_is_triton_only():
        return
    device_type = device_type or _accelerator_type()
    if device_type in ("cuda", "xpu"):
        return
    raise FusedLMHeadNeedsGPUError(
        f"TRL {trl.__version__}'s GRPOTrainer computes log-probabilities with a Triton kernel that runs only on "
        f"CUDA/XPU, and this run's device is {device_type!r}. To train on CPU, install TRL 1.16 "
        '(pip install "trl>=1.16,<1.17") or 1.14 (pip install "trl>=1.14,<1.15"); or run on a CUDA/XPU GPU.'
    )


def unwrap_for_generation(trainer: Any, gather_deepspeed3_params: bool = True) -> Any:
    """TRL's `unwrap_model_for_generation` context for the trainer's model, with the arguments `_generate_single_turn`
    passes (1.16 added `gradient_checkpointing_kwargs`)."""
    kwargs = {}
    if "gradient_checkpointing_kwargs" in inspect.signature(unwrap_model_for_generation).parameters:
        kwargs["gradient_checkpointing_kwargs"] = trainer.args.gradient_checkpointing_kwargs
    return unwrap_model_for_generation(
        trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=gather_deepspeed3_params, **kwargs
    )


def repeat_layout(data_order: Any) -> dict[str, int]:
    """The layout of `GRPOTrainer._get_train_sampler`'s `RepeatSampler`: rows per prompt, prompts per generation batch
    and how many times a batch repeats (`mini_repeat_count`, `batch_size`, `repeat_count`)."""
    if not isinstance(data_order, RepeatSampler):
        refuse_unsupported(
            f"GRPOTrainer._get_train_sampler returned a {type(data_order).__name__}, not TRL's RepeatSampler, whose "
            "layout a prompt-choosing sampler (sampler='spo') draws in; this TRL release is not supported by trl-ada."
        )
    return {name: getattr(data_order, name) for name in ("mini_repeat_count", "batch_size", "repeat_count")}


check_overridable(GRPOTrainer)

__all__ = [
    "FusedLMHeadNeedsGPUError",
    "GENERATION_SEAM",
    "RepeatSampler",
    "add_pending_extra_logs",
    "check_fused_lm_head_runs",
    "check_overridable",
    "environment_pool",
    "get_config_model_id",
    "has_generation_seam",
    "is_vlm",
    "repeat_layout",
    "set_last_loaded_step",
    "tokenize_prompts",
    "last_loaded_step",
    "logged_advantages",
    "make_generate_output",
    "micro_step",
    "set_environment_pool",
    "split_generate_output",
    "take_pending_extra_logs",
    "train_metrics",
    "unwrap_for_generation",
]
