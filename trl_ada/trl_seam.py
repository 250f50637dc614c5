"""The one place where trl-ada touches TRL's private API, which moves between releases: it refuses an unsupported
TRL at import, saying what to do (`TRL_ADA_ALLOW_UNSUPPORTED_TRL=1` tries anyway, with a warning). Each touchpoint
is a row of `TOUCHPOINTS` in `tests/test_trl_touchpoints.py` (the asynchronous trainer's:
`tests/test_trl_async_touchpoints.py`), checked against the installed TRL."""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
from collections import defaultdict
from typing import Any

import trl
from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

SUPPORTED_TRL = SpecifierSet(">=1.14,<1.17")
"""TRL releases whose private API every touchpoint below was checked against, each run by a CI stage."""

ALLOW_UNSUPPORTED_ENV = "TRL_ADA_ALLOW_UNSUPPORTED_TRL"

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


def refuse_unsupported(message: str) -> None:
    """Raise `ImportError(message)`, or only warn when `TRL_ADA_ALLOW_UNSUPPORTED_TRL=1` asks to try anyway."""
    if os.environ.get(ALLOW_UNSUPPORTED_ENV, "") == "1":
        logger.warning("%s Continuing because %s=1.", message, ALLOW_UNSUPPORTED_ENV)
        return
    raise ImportError(message)


def check_trl_version(version: str | None = None) -> None:
    """Refuse (`refuse_unsupported`) an installed TRL (or `version`) outside [`SUPPORTED_TRL`]."""
    version = version or trl.__version__
    if Version(version) in SUPPORTED_TRL:
        return
    message = (
        f"trl-ada supports TRL {SUPPORTED_TRL} (its private GRPOTrainer API, checked per release in "
        f"trl_ada/trl_seam.py); TRL {version} is installed. Install a supported TRL (pip install 'trl{SUPPORTED_TRL}'), "
        f"or set {ALLOW_UNSUPPORTED_ENV}=1 to try this one anyway."
    )
    refuse_unsupported(message)


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


def completion_logprobs(trainer: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int) -> Any:
    """Per-token log-probabilities of the last `logits_to_keep` tokens under the trainer's model, as TRL computes its
    policy's (`_get_per_token_logps_and_entropies`, at the generation temperature), without gradients."""
    import torch

    with torch.no_grad():
        output = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=trainer.args.per_device_train_batch_size,
        )
    return output[0]


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


def server_sampling_params(generation: Any) -> dict[str, Any]:
    """The sampling parameters `VLLMGeneration.generate` passes to `VLLMClient.generate` in server mode."""
    return {
        "repetition_penalty": generation.repetition_penalty,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
        "min_p": 0.0 if generation.min_p is None else generation.min_p,
        "max_tokens": generation.max_completion_length,
        "logprobs": generation.logprobs,
        "structured_outputs_regex": generation.structured_outputs_regex,
        "generation_kwargs": generation.generation_kwargs,
    }


class _Captured(Exception):
    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("captured")
        self.payload = payload


def completions_payload(client: Any, sampling_params: dict[str, Any], prompt_ids: list[int]) -> dict[str, Any]:
    """The `/v1/completions` body `VLLMClient.generate` builds for one prompt and `n=1` (nothing is sent)."""

    def capture(url: str, **kwargs: Any) -> dict:
        raise _Captured(kwargs["json"])

    client._post = capture  # an instance attribute shadows the method for this call only
    try:
        client.generate(prompts=[prompt_ids], n=1, **sampling_params)
    except _Captured as captured:
        return captured.payload
    finally:
        del client._post
    raise RuntimeError("VLLMClient.generate sent no /v1/completions request; this TRL release is not supported.")


@contextlib.contextmanager
def replayed_completions(
    client: Any,
    payload: dict[str, Any],
    prompt_ids: list[list[int]],
    choices: list[dict],
    mismatches: list[BaseException] | None = None,
):
    """Inside the block, the client's next `/v1/completions` request (TRL's server-mode generation) is answered with
    `choices` (already generated) instead of being sent. The request must ask for exactly `prompt_ids` with `n=1`
    and `payload`'s sampling parameters, or it raises; with `mismatches`, the error is appended there instead and
    `choices` are answered anyway, so the other processes' completions broadcast completes."""
    original = client._post
    expected = {key: value for key, value in payload.items() if key != "prompt"}

    def replay(url: str, **kwargs: Any) -> dict:
        if not url.endswith("/v1/completions"):
            return original(url, **kwargs)
        sent = kwargs["json"]
        differing = sorted(k for k in {*sent, *expected} - {"prompt"} if sent.get(k) != expected.get(k))
        error = None
        if sent.get("prompt") != prompt_ids:
            error = RuntimeError("TRL asked the server for other prompts than the draws being replayed.")
        elif differing:
            error = RuntimeError(f"TRL's request differs from the continuous draws' in {differing}.")
        if error is not None:
            if mismatches is None:
                raise error
            mismatches.append(error)
            # One placeholder per row asked for: what the other processes receive must have the request's shape.
            return {"choices": [choices[i % len(choices)] for i in range(len(sent.get("prompt") or ()))]}
        return {"choices": choices}

    client._post = replay
    try:
        yield
    finally:
        del client._post


def colocated_sleep_mode_vllm(trainer: Any) -> Any | None:
    """The trainer's `VLLMGeneration` when it runs vLLM in this process (`vllm_mode="colocate"`) with sleep mode on."""
    if not getattr(trainer, "use_vllm", False) or getattr(trainer, "vllm_mode", None) != "colocate":
        return None
    generation = trainer.vllm_generation
    return generation if generation.enable_sleep_mode else None


def vllm_engine(generation: Any) -> Any:
    """The in-process vLLM `LLM` of a colocated `VLLMGeneration` (whose `sleep`/`wake_up` TRL calls)."""
    return generation.llm


def set_vllm_sleep_mode(generation: Any, enabled: bool) -> None:
    """Switch `VLLMGeneration`'s sleep handling (waking, re-syncing and putting the engine to sleep) on or off."""
    generation.enable_sleep_mode = enabled


def set_vllm_weights_sleeping(generation: Any, sleeping: bool) -> None:
    """Record whether the engine's weights were discarded (the next `generate` re-syncs them first when True)."""
    generation._llm_weights_sleeping = sleeping


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


check_trl_version()

from trl.models import unwrap_model_for_generation  # noqa: E402


def unwrap_for_generation(trainer: Any, gather_deepspeed3_params: bool = True) -> Any:
    """TRL's `unwrap_model_for_generation` context for the trainer's model, with the arguments `_generate_single_turn`
    passes (1.16 added `gradient_checkpointing_kwargs`)."""
    kwargs = {}
    if "gradient_checkpointing_kwargs" in inspect.signature(unwrap_model_for_generation).parameters:
        kwargs["gradient_checkpointing_kwargs"] = trainer.args.gradient_checkpointing_kwargs
    return unwrap_model_for_generation(
        trainer.model_wrapped, trainer.accelerator, gather_deepspeed3_params=gather_deepspeed3_params, **kwargs
    )


from trl.trainer.grpo_trainer import GRPOTrainer, RepeatSampler  # noqa: E402
from trl.trainer.utils import get_config_model_id  # noqa: E402


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
    "ALLOW_UNSUPPORTED_ENV",
    "FusedLMHeadNeedsGPUError",
    "GENERATION_SEAM",
    "SUPPORTED_TRL",
    "RepeatSampler",
    "add_pending_extra_logs",
    "check_fused_lm_head_runs",
    "check_overridable",
    "check_trl_version",
    "colocated_sleep_mode_vllm",
    "environment_pool",
    "get_config_model_id",
    "has_generation_seam",
    "is_vlm",
    "completions_payload",
    "repeat_layout",
    "replayed_completions",
    "server_sampling_params",
    "set_last_loaded_step",
    "tokenize_prompts",
    "last_loaded_step",
    "logged_advantages",
    "make_generate_output",
    "micro_step",
    "set_environment_pool",
    "set_vllm_sleep_mode",
    "set_vllm_weights_sleeping",
    "split_generate_output",
    "take_pending_extra_logs",
    "train_metrics",
    "unwrap_for_generation",
    "vllm_engine",
]


# The asynchronous trainer's TRL touchpoints, from here on: `ASYNC_TOUCHPOINTS` in tests/test_trl_async_touchpoints.py.

WEIGHT_SYNC_CALLS = ("pause", "send_weights", "resume", "load_lora_adapter", "unload_lora_adapter")
"""What the main process calls on the server (TRL's `vllm_client` or `weight_transfer`) during `_sync_weight`."""
WEIGHT_SYNC_CALLS_IN_CALLER_THREAD = ("send_weights",)
"""Of `WEIGHT_SYNC_CALLS`, those that must run in the trainer's thread (`send_weights` consumes an iterator whose items
may be collectives and moves tensors to the thread's CUDA device)."""

DISPATCHED_BATCH_INFO_ITEMS = 2
"""How many objects accelerate's `DataLoaderDispatcher._fetch_batches` broadcasts from the main process per batch (the
batch's structure and the stop flag), which every other process waits to receive."""


def batches_are_dispatched(dataloader: Any) -> bool:
    """Whether `dataloader` (prepared by accelerate) hands every process its slice of batches the main process
    fetches (`DataLoaderDispatcher`), as TRL's asynchronous trainer needs: its other processes have no data."""
    from accelerate.data_loader import DataLoaderDispatcher

    return isinstance(dataloader, DataLoaderDispatcher)


def _raise_received(error_type: type[BaseException], args: tuple, attributes: dict[str, Any]) -> None:
    error = error_type(*args)
    error.__dict__.update(attributes)
    raise error


class _RaisedWhenReceived:
    """An error sent in a broadcast: unpickling it (in each receiving process) raises a copy of it there."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple:
        return _raise_received, (type(self.error), self.error.args, dict(vars(self.error)))


def _raise_where_waiting(error: BaseException, items: int, filler: Any) -> None:
    """Send, in a broadcast of `items` objects from the main process, the one whose unpickling raises `error`."""
    from accelerate.utils import broadcast_object_list

    broadcast_object_list([_RaisedWhenReceived(error)] + [filler] * (items - 1), from_process=0)


def fail_the_processes_waiting_for_a_batch(error: BaseException) -> None:
    """On the main process, while it fetches a batch from TRL's rollout queue: make every other process raise
    `error` (its type, arguments and attributes) where it waits for that batch, in the dispatcher's broadcast of the
    batch's structure. The main process raises `error` itself after this."""
    _raise_where_waiting(error, DISPATCHED_BATCH_INFO_ITEMS, True)


SERVER_COMPLETIONS_BROADCAST_ITEMS = 1
"""How many objects TRL's `VLLMGeneration.generate` (server mode) broadcasts from the main process with the completions
(one payload tuple), which every other process waits to receive while the main process's request is in flight."""


def fail_the_processes_waiting_for_completions(error: BaseException) -> None:
    """On the main process, when a request of TRL's server-mode `VLLMGeneration.generate` failed: make every other
    process raise `error` where it waits for that request's completions."""
    _raise_where_waiting(error, SERVER_COMPLETIONS_BROADCAST_ITEMS, None)


ASYNC_PINNED_SOURCES: dict[str, dict[str, str]] = {
    "_AsyncRolloutLoop._repeat_iterator": {
        "1.14.2": "0b03f69b3d4ad7a8",
        "1.15.0": "0b03f69b3d4ad7a8",
        "1.16.0": "0b03f69b3d4ad7a8",
    },
    "_AsyncRolloutLoop._generate_loop": {
        "1.14.2": "24f4baa7ecae18c5",
        "1.15.0": "baaa94b3391648d9",
        "1.16.0": "8bdfdf0709a65fc6",
    },
}
"""sha256 (first 16 hex digits) of each pinned method's source per checked TRL release (`source_digest`)."""


def source_digest(module_source: str, qualname: str) -> str | None:
    """The digest `ASYNC_PINNED_SOURCES` records for method `Class.method` of a module's source; `None` if absent."""
    import ast
    import hashlib

    class_name, method_name = qualname.split(".")
    for node in ast.parse(module_source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name == method_name:
                    segment = ast.get_source_segment(module_source, item) or ""
                    return hashlib.sha256(segment.encode()).hexdigest()[:16]
    return None


def check_async_pins(module_source: str | None = None, version: str | None = None) -> None:
    """Refuse (`refuse_unsupported`) a TRL whose pinned rollout-worker methods differ from every release checked;
    `module_source` and `version` default to the installed `async_rollout_worker.py` and TRL."""
    if module_source is None:
        from trl.experimental.async_grpo import async_rollout_worker

        module_source = inspect.getsource(async_rollout_worker)
    version = version or trl.__version__
    changed = [
        qualname
        for qualname, digests in ASYNC_PINNED_SOURCES.items()
        if source_digest(module_source, qualname) not in set(digests.values())
    ]
    if not changed:
        return
    message = (
        f"trl_ada.AdaAsyncGRPOTrainer replaces or relies on {', '.join(changed)} of TRL's asynchronous rollout worker, "
        f"and TRL {version}'s source of it differs from the releases it was checked against "
        f"({', '.join(ASYNC_PINNED_SOURCES[changed[0]])}). Install one of those TRL releases, or set "
        f"{ALLOW_UNSUPPORTED_ENV}=1 to try this one anyway."
    )
    refuse_unsupported(message)


def async_rollout_classes() -> tuple[type, type]:
    """TRL's `(_AsyncRolloutLoop, AsyncRolloutWorker)`, after checking the pinned sources (`check_async_pins`)."""
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

    check_async_pins()
    return _AsyncRolloutLoop, AsyncRolloutWorker


def take_waiting_groups(loop: Any) -> list[Any]:
    """Every closed group already waiting on the loop's score queue, taken off it (so one reward call scores them all).
    The end-of-loop sentinel (`None`) stays on the queue for TRL's score loop."""
    groups, queue = [], loop._groups_to_score
    while not queue.empty():
        group = queue.get_nowait()
        if group is None:
            queue.put_nowait(None)
            break
        groups.append(group)
    return groups


def merge_rollout_groups(groups: list[Any]) -> Any:
    """One `RolloutGroup` holding the conversations of `groups` in order (per-conversation lists concatenated,
    `reward_kwargs` column by column; the scalar fields of the first group), for one batched `_score_group` call."""
    import dataclasses

    if len(groups) == 1:
        return groups[0]
    values = {}
    for f in dataclasses.fields(groups[0]):
        first = getattr(groups[0], f.name)
        if isinstance(first, list):
            values[f.name] = [item for group in groups for item in getattr(group, f.name)]
        elif isinstance(first, dict):
            values[f.name] = {key: [v for group in groups for v in getattr(group, f.name)[key]] for key in first}
        else:
            values[f.name] = first
    return type(groups[0])(**values)


def samples_per_conversation(groups: list[Any], samples: list[Any]) -> list[tuple[float, list[Any]]]:
    """Split `_score_group`'s samples (of `groups` merged, in order) by conversation: `(reward, its samples)` each. A
    conversation yields one sample per training sequence; one without any sequence has no reward to read (NaN)."""
    sizes = [len(sequences) for group in groups for sequences in group.completions_sequences]
    if sum(sizes) != len(samples):
        raise RuntimeError(f"TRL's _score_group returned {len(samples)} samples for {sum(sizes)} training sequences")
    out, offset = [], 0
    for size in sizes:
        own = samples[offset : offset + size]
        offset += size
        out.append((float(own[0].metrics["reward"]) if own else math.nan, own))
    return out


@contextlib.contextmanager
def async_rollout_worker_class(worker_factory: Any):
    """While open, `AsyncGRPOTrainer.__init__` builds its rollout worker (on rank 0, when none is injected) with
    `worker_factory(**TRL's worker arguments)` instead of TRL's `AsyncRolloutWorker`."""
    from trl.experimental.async_grpo import async_grpo_trainer

    original = async_grpo_trainer.AsyncRolloutWorker
    async_grpo_trainer.AsyncRolloutWorker = worker_factory
    try:
        yield
    finally:
        async_grpo_trainer.AsyncRolloutWorker = original


@contextlib.contextmanager
def rows_trained_for_the_position(trainer: Any, rows: set[int]):
    """While open, `AsyncGRPOTrainer._save_checkpoint` reads the resume position as if `rows` (TRL's row ids) had been
    trained too: `trainer._trained_groups` is their union, and the very set (the collator's) is back afterwards."""
    trained = trainer._trained_groups
    if rows - trained:
        trainer._trained_groups = trained | rows
    try:
        yield
    finally:
        trainer._trained_groups = trained


def install_peak_flops_fallback() -> bool:
    """Let `AsyncGRPOTrainer.__init__` run off CUDA: TRL 1.15 and 1.16 call `get_peak_flops_per_device`, which asks
    CUDA for the device's name; off CUDA the wrapper returns `None`, TRL's value for an unknown peak. Idempotent;
    returns whether the trainer module has the function (TRL 1.14 does not)."""
    from trl.experimental.async_grpo import async_grpo_trainer

    original = getattr(async_grpo_trainer, "get_peak_flops_per_device", None)
    if original is None:
        return False
    if getattr(original, "_trl_ada_fallback", False):
        return True

    def peak_flops_per_device(accelerator: Any, dtype: str) -> float | None:
        if getattr(accelerator.device, "type", str(accelerator.device)) != "cuda":
            return None
        return original(accelerator, dtype)

    peak_flops_per_device._trl_ada_fallback = True
    async_grpo_trainer.get_peak_flops_per_device = peak_flops_per_device
    return True


def has_tree_packing() -> bool:
    """Whether TRL's asynchronous trainer packs samples into trees (`packing.py`, TRL 1.16) rather than loading the
    Hub's `kernels-community/flash-attn3` attention by name (1.14, 1.15: a GPU only path, no CPU equivalent here)."""
    import importlib.util

    return importlib.util.find_spec("trl.experimental.async_grpo.packing") is not None
