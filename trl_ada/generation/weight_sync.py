"""
One weight sync (and one ZeRO-3 parameter gather) per training step across the step's sampling rounds (docs/vllm.md):
the weights do not change between rounds. Colocated vLLM in sleep mode sleeps after every `generate` call, so the next
round would re-sync; rounds 2+ must not call `wake_up` either, as vLLM's allocator re-maps an awake engine's memory.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from ..trl_seam.grpo_private import last_loaded_step, set_last_loaded_step, unwrap_for_generation
from ..trl_seam.vllm_generation import (
    colocated_sleep_mode_vllm,
    set_vllm_sleep_mode,
    set_vllm_weights_sleeping,
    vllm_engine,
)

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def one_weight_sync_per_step(trainer: Any) -> Iterator[None]:
    """
    Wrap every generate call of one training step's sampling rounds so that vLLM's weights are synced once per step (a
    no-op unless vLLM runs colocated in sleep mode): the first round's sleep is held back and TRL's sleep handling
    switched off until the block ends, whatever happens inside; then the engine sleeps once, as TRL asked.
    """
    generation = colocated_sleep_mode_vllm(trainer)
    if generation is None:
        yield
        return
    llm = vllm_engine(generation)
    real_sleep = llm.sleep
    own_sleep = vars(llm).get("sleep")  # an instance attribute someone else installed, put back as found
    held_back: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def sleep_after_step(*args: Any, **kwargs: Any) -> None:
        """TRL's end-of-generate sleep, held back to the end of the step; the engine stays awake for later rounds."""
        held_back.append((args, kwargs))
        set_vllm_sleep_mode(generation, False)

    llm.sleep = sleep_after_step
    try:
        yield
    finally:
        if own_sleep is None:
            del llm.sleep
        else:
            llm.sleep = own_sleep
        set_vllm_sleep_mode(generation, True)
        if held_back:
            args, kwargs = held_back[-1]
            real_sleep(*args, **kwargs)
            set_vllm_weights_sleeping(generation, True)
            logger.debug("vLLM engine kept awake through this step's sampling rounds; now asleep.")


def uses_zero3(trainer: Any) -> bool:
    """Whether the trainer runs DeepSpeed ZeRO-3 (its parameters sharded over the processes)."""
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return bool(getattr(trainer, "is_deepspeed_enabled", False) and plugin is not None and plugin.zero_stage == 3)


def gathers_zero3_parameters_per_round(trainer: Any) -> bool:
    """Whether TRL would gather the full ZeRO-3 parameters for every generate call, i.e. every round: ZeRO-3,
    transformers generation (no vLLM) and `ds3_gather_for_generation=True` (TRL's default)."""
    if getattr(trainer, "use_vllm", False) or not getattr(trainer.args, "ds3_gather_for_generation", False):
        return False
    return uses_zero3(trainer)


@contextlib.contextmanager
def one_parameter_gather_per_step(trainer: Any) -> Iterator[None]:
    """
    With ZeRO-3 and transformers generation, gather the full parameters once for all of a step's rounds (TRL gathers
    them for every generate call). TRL's own unwrap context is entered once around the rounds, with
    `args.ds3_gather_for_generation` off inside so each round reuses the gathered parameters; both are undone on exit.
    The full parameters then stay in memory while the rounds' rewards are computed too. A no-op in every other setting.
    """
    if not gathers_zero3_parameters_per_round(trainer):
        yield
        return
    with unwrap_for_generation(trainer, gather_deepspeed3_params=True):
        trainer.args.ds3_gather_for_generation = False
        try:
            yield
        finally:
            trainer.args.ds3_gather_for_generation = True


def sync_server_weights_for_step(trainer: Any) -> None:
    """Push the weights to the vLLM server if this step has not yet, as TRL does before a step's first generate call
    (the continuous schedule submits draws before any such call). Collective: every process calls it."""
    step = trainer.state.global_step
    if last_loaded_step(trainer) != step:
        trainer.vllm_generation.sync_weights()
        set_last_loaded_step(trainer, step)
