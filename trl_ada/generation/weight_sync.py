"""
One weight sync per training step across all of the step's sampling rounds.

The weights do not change between the rounds of a step, so vLLM needs them once per step. What TRL (1.14-1.16) does
per `VLLMGeneration.generate` call, i.e. per round:

- **server mode**: `GRPOTrainer._generate_single_turn` syncs when `state.global_step != _last_loaded_step` and then
  records the step, so only a step's first round syncs. Nothing to do here.
- **colocate mode without sleep mode**: the same check; nothing to do.
- **colocate mode with sleep mode** (`vllm_enable_sleep_mode=True`): every `generate` call ends with
  `llm.sleep(level=2)`, which discards the weights and the KV cache, and marks the weights sleeping; the next call
  therefore re-syncs the weights (`sync_weights`: `llm.wake_up(tags=["weights"])` and a full `load_weights`) and wakes
  the KV cache before generating. A step of R rounds pushed the weights R times.

[`one_weight_sync_per_step`] keeps the colocated engine awake from the end of the step's first round to the end of the
step: round 1 runs TRL's code unchanged (weights synced and woken, KV cache woken, generate) except that its final
`llm.sleep(...)` is held back; from then on TRL's sleep handling is switched off, so rounds 2+ neither wake, nor
re-sync, nor sleep; when the step's rounds end (normally or by an exception) the held-back sleep runs once, with the
arguments TRL gave it, and TRL's state is back to "weights sleeping". The next step's first round then syncs once, as
TRL would.

Rounds 2+ call no `wake_up` at all: vLLM treats a wake-up of an already-awake engine as a logged no-op in its executor
(`Executor.wake_up`: "Executor is not sleeping." / "Tag ... is not in sleeping tags"), but the allocator underneath
(`CuMemAllocator.wake_up`) re-maps every allocation of the tag without checking, so relying on the guard is avoided.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from ..trl_seam import (
    colocated_sleep_mode_vllm,
    last_loaded_step,
    set_last_loaded_step,
    set_vllm_sleep_mode,
    set_vllm_weights_sleeping,
    unwrap_for_generation,
    vllm_engine,
)

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def one_weight_sync_per_step(trainer: Any) -> Iterator[None]:
    """
    Wrap every generate call of one training step's sampling rounds so that vLLM's weights are synced once per step.

    A no-op unless the trainer runs vLLM colocated with sleep mode on (server mode and sleep-less colocate mode already
    sync once per step; transformers generation has nothing to sync). Otherwise, for the duration of the block only:
    the engine's `sleep` is replaced on that `LLM` instance by one that records the call and switches TRL's sleep
    handling off (`VLLMGeneration.enable_sleep_mode = False`); on exit, whatever happened inside, the instance's own
    `sleep` is restored, sleep handling is switched back on, and, if a sleep was held back, the engine is put to sleep
    once and TRL told its weights are sleeping.
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


def gathers_zero3_parameters_per_round(trainer: Any) -> bool:
    """
    Whether TRL would gather the full ZeRO-3 parameters for every generate call, i.e. every round: DeepSpeed ZeRO-3,
    transformers generation (no vLLM) and `ds3_gather_for_generation=True` (TRL's default).
    """
    if getattr(trainer, "use_vllm", False) or not getattr(trainer.args, "ds3_gather_for_generation", False):
        return False
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return bool(getattr(trainer, "is_deepspeed_enabled", False) and plugin is not None and plugin.zero_stage == 3)


@contextlib.contextmanager
def one_parameter_gather_per_step(trainer: Any) -> Iterator[None]:
    """
    With ZeRO-3 and transformers generation, gather the full parameters once for all of a step's rounds.

    TRL's `_generate_single_turn` enters `unwrap_model_for_generation(..., gather_deepspeed3_params=
    args.ds3_gather_for_generation)` for every generate call, so a step of R rounds all-gathers every parameter R
    times although the weights do not change between rounds. Here TRL's own context is entered once around the rounds
    (it gathers the parameters and removes ZeRO-3's fetch hooks), and `args.ds3_gather_for_generation` is off inside,
    so each round's unwrap uses the parameters already gathered; both are undone on exit, whatever happened. The full
    parameters then stay in memory while the rounds' rewards are computed too (the same peak as each round's gather,
    held longer). A no-op in every other setting.
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
    """
    Push the weights to the vLLM server if this step has not yet (what `_generate_single_turn` does before its first
    generate call of a step). The continuous schedule submits draws before any such call, so it syncs here first; TRL's
    own check then finds the step synced. Collective (ZeRO-3 gathers, the push from the main process): every process
    calls it.
    """
    step = trainer.state.global_step
    if last_loaded_step(trainer) != step:
        trainer.vllm_generation.sync_weights()
        set_last_loaded_step(trainer, step)
