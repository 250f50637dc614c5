"""The private API of TRL's experimental `AsyncGRPOTrainer` and its rollout worker (`trl.experimental.async_grpo`): the
worker's methods trl-ada replaces or relies on (pinned by source digest), its score queue and `RolloutGroup`s, the
worker class `__init__` builds, the trained rows `_save_checkpoint` reads, the server calls of `_sync_weight`, the peak
FLOPs query and the tree packing. Rows of `ASYNC_TOUCHPOINTS` in `tests/test_trl_async_touchpoints.py`."""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Any

import trl

from . import ALLOW_UNSUPPORTED_ENV, refuse_unsupported

WEIGHT_SYNC_CALLS = ("pause", "send_weights", "resume", "load_lora_adapter", "unload_lora_adapter")
"""What the main process calls on the server (TRL's `vllm_client` or `weight_transfer`) during `_sync_weight`."""
WEIGHT_SYNC_CALLS_IN_CALLER_THREAD = ("send_weights",)
"""Of `WEIGHT_SYNC_CALLS`, those that must run in the trainer's thread (`send_weights` consumes an iterator whose items
may be collectives and moves tensors to the thread's CUDA device)."""

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
