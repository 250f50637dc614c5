"""[`AdaAsyncGRPOTrainer`]: TRL's `AsyncGRPOTrainer` whose rollout worker draws Reinforce-Ada pools."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import math
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list
from transformers import TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

from ..checkpoints import SAMPLER_STATE_NAME, CheckpointError, read_sampler_state
from ..generation.faults import (
    VLLMServerError,
    VLLMServerUnresponsive,
    resume_advice,
    server_calls_of_one_sync,
    vllm_server_message,
)
from ..predictor_hub import resolve_pass_rate_predictor
from ..reporting.card import ASYNC_TRAINER_NAME
from ..samplers import PassRateEstimator, build_sampler
from ..samplers.predictor import PREDICTOR_DIR
from ..trainer import AdaGRPOTrainer, AdaModelCard, init_argument_binder
from ..trl_seam.async_grpo_private import (
    WEIGHT_SYNC_CALLS,
    WEIGHT_SYNC_CALLS_IN_CALLER_THREAD,
    async_rollout_worker_class,
    has_tree_packing,
    install_peak_flops_fallback,
    rows_trained_for_the_position,
)
from ..trl_seam.batch_dispatch import batches_are_dispatched, fail_the_processes_waiting_for_a_batch
from ..trl_seam.grpo_private import check_fused_lm_head_runs
from .async_grpo_config import AdaAsyncGRPOConfig, resolve_prompts_per_generation_batch
from .rollout import (
    GROUP_VERSION_KEY,
    AdaAsyncRolloutWorker,
    AsyncRolloutWorker,
    AsyncSampling,
    RobustAsyncRolloutWorker,
    SamplerStateChannel,
    WorkerState,
)

logger = logging.getLogger(__name__)

_bind_async_init_arguments = init_argument_binder(AsyncGRPOTrainer, "AdaAsyncGRPOTrainer")

RAISED_ON_EVERY_PROCESS = "raised_on_every_process"
"""Set (True) on an error that every process raises at the same point (`_sync_weight`, a failed rollout worker)."""

ROWS_COUNTED_AHEAD = "rows_counted_ahead"
"""Key of a checkpoint's sampler state: the rows (absolute ids) the state counted at or past the resume position."""

STOP_STATE_TIMEOUT_S = 30.0
"""How long stopping the worker waits for its last sampler state (for a `save_model` after training)."""


def async_sampling(args: AdaAsyncGRPOConfig, pass_rate_estimator: PassRateEstimator | None = None) -> AsyncSampling:
    """What the rollout worker needs of `args` (settings, prompts per generation batch); the sampler is built here
    once, so a bad estimator or predictor fails before any compute."""
    settings = args.sampler_settings()
    predictor_source = resolve_pass_rate_predictor(settings)
    build_sampler(settings, pass_rate_estimator, predictor_source, train_on=args.train_on)
    samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
    prompts_per_batch = resolve_prompts_per_generation_batch(
        args.prompts_per_generation_batch, settings, samples_per_step
    )
    return AsyncSampling(
        settings=settings,
        prompts_per_batch=prompts_per_batch,
        predictor_source=predictor_source,
        estimator=pass_rate_estimator,
        server_timeout=float(args.vllm_server_timeout),
        train_on=args.train_on,
    )


def pool_step_ceiling(max_steps: int, sampling: AsyncSampling) -> int:
    """TRL's safety ceiling on `max_steps` (set when `max_steps` is not), which assumes `num_generations` samples per
    prompt: with `train_on="pool"` a prompt trains on up to `max_pool_size`, so it grows by that ratio."""
    settings = sampling.settings
    if sampling.train_on != "pool":
        return max_steps
    return math.ceil(max_steps * settings.max_pool_size / settings.num_generations)


# -- faults ------------------------------------------------------------------------------------------------------------

PICKLING_MESSAGE = (
    "AsyncRolloutWorker forwards reward_funcs / tools / environment_factory to a spawned child process, so they must "
    "be picklable. Lambdas and closures are not: use a module-level function, functools.partial, or a callable class "
    "instance instead (tools are registered under their __name__, so they must be module-level functions)."
)
"""TRL's own message (`AsyncRolloutWorker.start`), raised by `AdaAsyncGRPOTrainer.__init__` before the model loads."""


def spawns_a_child(worker_class: Any) -> bool:
    """Whether `worker_class` pickles its arguments into a spawned child: TRL's `AsyncRolloutWorker`, or a subclass
    keeping its `start()` (as [`AdaAsyncRolloutWorker`] does; a test's in-thread worker does not)."""
    return (
        isinstance(worker_class, type)
        and issubclass(worker_class, AsyncRolloutWorker)
        and worker_class.start is AsyncRolloutWorker.start
    )


def check_picklable(**arguments: Any) -> None:
    """Raise TRL's `TypeError` (`PICKLING_MESSAGE`, naming the argument) when one of `arguments` cannot be pickled."""
    for name, value in arguments.items():
        items = list(enumerate(value)) if isinstance(value, list | tuple) else [(None, value)]
        for index, item in items:
            try:
                pickle.dumps(item)
            except (pickle.PicklingError, AttributeError, TypeError) as error:
                where = name if index is None else f"{name}[{index}]"
                raise TypeError(f"{PICKLING_MESSAGE} Not picklable: {where} ({error}).") from error


class RolloutWorkerError(RuntimeError):
    """The rollout worker failed, died or hung during training (the worker's own error is chained)."""


def worker_failure(trainer: Any, error: BaseException) -> RuntimeError:
    """What the trainer raises when its rollout worker's health check fails with `error`: a `VLLMServerError` for a
    lost server (worded as the synchronous trainer's), else a [`RolloutWorkerError`] quoting the worker."""
    cause = error.__cause__  # TRL chains the child's exception as `RuntimeError("<type>: <message>\n<traceback>")`
    reported = str(cause).split("\nTraceback (most recent call last):", 1)[0] if cause else str(error)
    reported = reported.strip().rstrip(".")
    if reported.startswith(f"{VLLMServerUnresponsive.__name__}: "):
        unresponsive = VLLMServerUnresponsive(reported.split(": ", 1)[1])
        return VLLMServerError(vllm_server_message(trainer, None, unresponsive, during="generation"))
    return RolloutWorkerError(
        f"The rollout worker (generating from the vLLM server at {trainer.args.vllm_server_base_url}) stopped during "
        f"training step {trainer.state.global_step + 1}: {reported}. Training cannot continue without it. Fix the "
        f"cause (the worker's error and traceback are chained to this one), then {resume_advice(trainer.args.output_dir)}"
    )


def allow_cpu() -> None:
    """Let a script build and train TRL's own `AsyncGRPOTrainer` without CUDA, for the rest of the process: the
    plain-torch tree attention where TRL's GPU kernel is not available, and no CUDA query for the peak FLOPs
    (`AdaAsyncGRPOTrainer` needs no call)."""
    import torch

    if has_tree_packing():
        from .tree_attention import use_cpu_tree_attention_if_no_kernel

        use_cpu_tree_attention_if_no_kernel()
    if not torch.cuda.is_available():
        install_peak_flops_fallback()


def register_cpu_tree_attention_if_no_kernel() -> None:
    """Register the plain-torch tree attention as `"tree_fa3"` where TRL's GPU kernel is not available (TRL 1.16),
    after `AsyncGRPOTrainer.__init__` registered TRL's own; TRL's module is left as it is."""
    if has_tree_packing():
        from .tree_attention import kernel_available, register_cpu_tree_attention

        if not kernel_available():
            register_cpu_tree_attention()


@contextlib.contextmanager
def peak_flops_unknown_off_cuda() -> Iterator[None]:
    """While open and off CUDA, TRL's `get_peak_flops_per_device` (called in `AsyncGRPOTrainer.__init__`, TRL 1.15 and
    1.16) answers `None`, TRL's value for an unknown peak, where it would ask CUDA for the device's name and raise."""
    import torch
    from trl.experimental.async_grpo import async_grpo_trainer

    original = getattr(async_grpo_trainer, "get_peak_flops_per_device", None)
    if original is None or torch.cuda.is_available():
        yield
        return
    install_peak_flops_fallback()
    try:
        yield
    finally:
        async_grpo_trainer.get_peak_flops_per_device = original


class StaleGroups:
    """The rollout queue as the trainer reads it (TRL's `RolloutQueueDataset.queue`), with staleness decided per
    prompt rather than per sample: a prompt's first sample decides for all of them by their oldest version
    (`GROUP_VERSION_KEY`). More than `max_staleness` behind, every one is dropped (TRL's
    `sample/dropped_stale_total`) and `on_stale_row(group_id)` records the row as done; otherwise every one is
    passed on, its version raised to at most `max_staleness` behind, so that TRL's own check keeps the group whole."""

    def __init__(self, dataset: Any, on_stale_row: Any) -> None:
        self._dataset = dataset
        self._queue = dataset.queue
        self._on_stale_row = on_stale_row
        self._group: int | None = None
        self._keep = True

    def qsize(self) -> int:
        return self._queue.qsize()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        max_staleness = self._dataset.max_staleness
        while True:
            sample = self._queue.get(*args, **kwargs)
            oldest = int(sample.metrics.pop(GROUP_VERSION_KEY, sample.model_version))
            if sample.group_id != self._group:
                self._group = sample.group_id
                self._keep = self._dataset.model_version_fn() - oldest <= max_staleness
                if not self._keep:
                    self._on_stale_row(sample.group_id)
            if self._keep:
                sample.model_version = max(sample.model_version, self._dataset.model_version_fn() - max_staleness)
                return sample
            self._dataset.metrics["sample/dropped_stale_total"].append(1.0)


class _WorkerStateAtTrainEnd(TrainerCallback):
    """Notes when TRL has started the rollout worker, and keeps its last sampler state when training ends."""

    def __init__(self, trainer: AdaAsyncGRPOTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._worker_running = self.trainer.rollout_worker is not None

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer._keep_the_last_worker_state()


class AdaAsyncGRPOTrainer(AdaModelCard, AsyncGRPOTrainer):
    """Reinforce-Ada ([arXiv 2510.04996](https://huggingface.co/papers/2510.04996)) in TRL's asynchronous GRPO trainer.

    Takes every `AsyncGRPOTrainer` argument in the same positions (plus a keyword-only `pass_rate_estimator`); `args`
    may be an [`AdaAsyncGRPOConfig`] or TRL's `AsyncGRPOConfig` (then the Reinforce-Ada defaults apply). The trainer
    is TRL's; the rollout worker's loop ([`~trl_ada.async_grpo.rollout.AdaRolloutLoop`]) draws the pools and queues
    the kept samples with the synchronous trainer's advantages, and `sampler="uniform"` runs TRL's own loop. An
    injected `rollout_worker` is used as given; to pool with one, build its loop as
    `AdaRolloutLoop(ada_sampling=async_sampling(args), **TRL's loop arguments)`.
    """

    _tag_names = ["trl", "async-grpo", "reinforce-ada"]
    _name = "Reinforce-Ada (asynchronous)"
    _paper = AdaGRPOTrainer._paper

    rollout_worker_class: type = AdaAsyncRolloutWorker
    """The worker built (with TRL's arguments plus `ada_sampling`) when the sampler pools and none is injected: TRL
    computes its worker's arguments inside `__init__`, so its module builds this class during that call only
    (`trl_seam.async_grpo_private.async_rollout_worker_class`) rather than the trainer copying TRL's call."""
    uniform_worker_class: type = RobustAsyncRolloutWorker
    """The worker built (with TRL's arguments: TRL's loop) for `sampler="uniform"` when none is injected."""

    def __init__(
        self,
        model: str,
        reward_funcs: Any = None,
        args: AdaAsyncGRPOConfig | AsyncGRPOConfig | None = None,
        *positional: Any,
        pass_rate_estimator: PassRateEstimator | None = None,
        **kwargs: Any,
    ) -> None:
        """Overridden to build the sampler and choose the rollout worker before TRL builds and starts one."""
        named = _bind_async_init_arguments(self, model, reward_funcs, args, *positional, **kwargs)
        check_fused_lm_head_runs("cpu" if getattr(args, "use_cpu", False) else None)
        if args is None:
            args = AdaAsyncGRPOConfig(f"{model.split('/')[-1]}-AdaAsync")
        elif not isinstance(args, AdaAsyncGRPOConfig):
            args = AdaAsyncGRPOConfig.from_async_config(args)
        self.ada_sampling = async_sampling(args, pass_rate_estimator)
        self._dropped_row_ids: set[int] = set()  # rows done without a trained sample (see "the resume position")
        self._state_channel: SamplerStateChannel | None = None  # `_give_state_channel`
        self._worker_running = False
        self._last_worker_state: WorkerState | None = None  # the latest answer (at a save, or when the worker stopped)
        self._state_of_this_save: dict[str, Any] | None = None  # within `_save_checkpoint`
        self._weight_syncs = 0  # in this run (`_sync_weight`)
        self._batches_dispatched = False  # set by `get_train_dataloader`
        self._worker_error: BaseException | None = None  # `_check_worker_health`
        # TRL's own loop only where its advantages are the sampler's (a weighting objective needs the Ada loop).
        uniform = args.sampler == "uniform" and self.ada_sampling.trl_advantages
        worker_class = self.uniform_worker_class if uniform else self.rollout_worker_class
        if named.get("rollout_worker") is None and spawns_a_child(worker_class):
            # What TRL's worker pickles only at train start (after the model loaded), checked before anything loads.
            to_pickle = {key: named.get(key) for key in ("reward_funcs", "tools", "environment_factory")}
            check_picklable(**to_pickle, **({} if uniform else {"ada_sampling": self.ada_sampling}))
        with contextlib.ExitStack() as scope:
            scope.enter_context(peak_flops_unknown_off_cuda())
            if named.get("rollout_worker") is None:
                worker = worker_class if uniform else functools.partial(worker_class, ada_sampling=self.ada_sampling)
                scope.enter_context(async_rollout_worker_class(worker))
            super().__init__(model, reward_funcs, args, *positional, **kwargs)
        register_cpu_tree_attention_if_no_kernel()
        if self.rollout_worker is not None:
            self._give_state_channel(self.rollout_worker)
        self.add_callback(_WorkerStateAtTrainEnd(self))
        if getattr(self, "_epoch_stop_groups", None) is not None:  # TRL set max_steps as a ceiling, not a length
            self.args.max_steps = pool_step_ceiling(self.args.max_steps, self.ada_sampling)

    def _check_worker_health(self, stale_after_s: float) -> None:
        """The rollout worker's `check_health`, except that an error it reported once is raised again at every later
        check (TRL's hands the child's error over once, so a later check would raise a bare "child has failed")."""
        if self._worker_error is not None:
            raise self._worker_error
        try:
            self.rollout_worker.check_health(stale_after_s)
        except Exception as error:
            self._worker_error = error
            raise

    def _check_worker_health_while_training(self, stale_after_s: float) -> None:
        """The health check TRL's rollout queue makes each time it has waited for a sample (`check_health_fn`): a
        failure is raised as `worker_failure` words it, on every process (the others wait for the batch being
        fetched, and `fail_the_processes_waiting_for_a_batch` raises it there)."""
        try:
            self._check_worker_health(stale_after_s)
        except Exception as error:
            failure = worker_failure(self, error)
            if self.accelerator.num_processes > 1 and self._batches_dispatched:
                setattr(failure, RAISED_ON_EVERY_PROCESS, True)
                try:
                    fail_the_processes_waiting_for_a_batch(failure)
                except Exception as unsent:  # another process is gone already: no barrier to wait at then
                    setattr(failure, RAISED_ON_EVERY_PROCESS, False)
                    logger.error("The other processes could not be told (%s: %s).", type(unsent).__name__, unsent)
            raise failure from error

    def get_train_dataloader(self) -> Any:
        """Overridden to watch TRL's rollout queue: the worker's health at every wait, and rows gone stale."""
        dataloader = super().get_train_dataloader()
        # Only a dispatched batch has the other processes waiting in the broadcast that a worker failure answers.
        self._batches_dispatched = batches_are_dispatched(dataloader)
        dataset = getattr(self, "_rollout_dataset", None)  # TRL's `RolloutQueueDataset` (main process only)
        if dataset is not None:
            dataset.check_health_fn = self._check_worker_health_while_training
            if self._state_channel is not None and not isinstance(dataset.queue, StaleGroups):
                dataset.queue = StaleGroups(dataset, self._dropped_row_ids.add)
        return dataloader

    # -- the sampler's state: asked of the worker at a save ------------------------------------------------------------
    # The sampler lives in the rollout worker, which answers at each save with a `WorkerState`; the rows it counted at
    # or past the checkpoint's resume position are saved with it (`ROWS_COUNTED_AHEAD`), so a resume does not count
    # them twice (docs/async.md, "Sampler state and resume").

    def _give_state_channel(self, worker: Any) -> None:
        """Give a worker running the Ada loop the channel it answers on (a keyword argument of its loop)."""
        if "ada_sampling" not in getattr(worker, "_loop_kwargs", {}):
            return  # TRL's own loop (`sampler="uniform"`): no sampler state
        self._state_channel = SamplerStateChannel()
        worker._loop_kwargs["ada_state_channel"] = self._state_channel

    def _keep_the_last_worker_state(self) -> None:
        """When training ends, before TRL stops the worker: its state, for a `save_model` after training."""
        if self._state_channel is None or not self._worker_running:
            return
        try:  # a worker that failed or died raises at once in its health check
            self._last_worker_state = self._state_channel.ask(
                STOP_STATE_TIMEOUT_S, lambda: self._check_worker_health(float("inf"))
            )
        except Exception as error:  # the run ends here either way; only a later save_model lacks it
            logger.warning(
                "The rollout worker's last sampler state could not be fetched (%s: %s); a save_model after "
                "training writes the state of the last checkpoint, if any.",
                type(error).__name__,
                error,
            )
        self._worker_running = False

    def _ask_worker_state(self) -> WorkerState:
        """The running worker's [`WorkerState`] (main process); a worker that failed or does not answer raises
        `worker_failure`'s error."""
        stale_after_s = float(self.args.heartbeat_stale_after_s)

        def check() -> None:
            try:
                self._check_worker_health(stale_after_s)
            except Exception as error:
                raise worker_failure(self, error) from error

        try:
            answer = self._state_channel.ask(stale_after_s, check)
        except TimeoutError as error:
            raise worker_failure(self, error) from error
        self._last_worker_state = answer
        return answer

    def _sampler_state_to_save(self) -> dict[str, Any] | None:
        """The sampler state a save writes: this checkpoint's answer, a fresh one while the worker runs, else the last
        one (`None`: no Ada loop, or no answer yet)."""
        if self._state_of_this_save is not None:
            return self._state_of_this_save["sampler"]
        if self._state_channel is not None and self._worker_running and self.accelerator.is_main_process:
            return self._ask_worker_state().sampler
        return None if self._last_worker_state is None else self._last_worker_state.sampler

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """TRL's `save_model`, plus the learned pass-rate predictor as [`AdaGRPOTrainer.save_model`] writes it, from
        the worker's sampler state asked at the save (or its last state, once training has ended)."""
        state = self._sampler_state_to_save() if self.args.should_save else None
        if state is not None:
            sampler = self.ada_sampling.new_sampler()
            sampler.load_state_dict(state)
            save = getattr(sampler.estimator, "save_pretrained", None)
            if save is not None:
                save(os.path.join(output_dir if output_dir is not None else self.args.output_dir, PREDICTOR_DIR))
        super().save_model(output_dir, _internal_call)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Overridden to write the worker's sampler state into the checkpoint TRL is saving."""
        super()._save_optimizer_and_scheduler(output_dir)
        state = self._state_of_this_save
        if state is None or not self.accelerator.is_main_process:
            return
        with open(os.path.join(output_dir, SAMPLER_STATE_NAME), "w") as f:
            json.dump({**state, "trainer": type(self).__name__}, f)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Overridden to hand the checkpoint's sampler state to the worker's loop before TRL starts the worker."""
        super()._load_optimizer_and_scheduler(checkpoint)
        # Called before `on_train_begin` starts the worker, and after TRL set `dataset_start_index` to the checkpoint's
        # resume position: the worker's loop is built from `_loop_kwargs` with this state.
        worker = self.rollout_worker
        if checkpoint is None or worker is None or "ada_sampling" not in getattr(worker, "_loop_kwargs", {}):
            return
        try:
            state = read_sampler_state(checkpoint, require_refill=False)
        except CheckpointError as error:
            raise CheckpointError(f"Cannot resume the sampler from {checkpoint}: {error}.") from None
        if state is None:
            logger.warning("%s has no %s; the sampler starts fresh.", checkpoint, SAMPLER_STATE_NAME)
            return
        self.ada_sampling = dataclasses.replace(self.ada_sampling, initial_state=state["sampler"])
        worker._loop_kwargs["ada_sampling"] = self.ada_sampling
        start = worker._loop_kwargs.get("dataset_start_index", 0)
        ahead = [row - start for row in state.get(ROWS_COUNTED_AHEAD, []) if row >= start]
        worker._loop_kwargs["ada_rows_already_counted"] = ahead

    # -- the resume position -----------------------------------------------------------------------------------------
    # TRL's `_save_checkpoint` resumes at the smallest row id not in `_trained_groups`, where a row finished without a
    # sample (a DAPO drop, a prompt gone stale) would hold it for the rest of the run. The worker hands those rows
    # over at each save and `StaleGroups` adds the stale ones; TRL's save sees them as done for the position only, so
    # `_trained_groups` and TRL's epoch count are TRL's.

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """Overridden so that a failure raised on every process leaves no process before the others."""
        # Row ids restart at 0 from each run's `dataset_start_index`: rows dropped by a previous run name other rows.
        self._dropped_row_ids = set()
        self._weight_syncs = 0  # in this run (`_sync_weight`)
        try:
            return super().train(*args, **kwargs)
        except Exception as error:
            if not getattr(error, RAISED_ON_EVERY_PROCESS, False):
                raise
            # Every process raises it, the main process after stopping its worker: none leaves before the others, as
            # torchrun kills the rest once one exits, cutting the main process's error off before it is printed.
            if self.accelerator.num_processes > 1:
                self.accelerator.wait_for_everyone()
            raise
        finally:
            self._worker_running = False  # TRL has stopped it: a `save_model` now writes the last state it answered

    # -- a server lost during a weight sync ----------------------------------------------------------------------
    # Each server call of TRL's sync gives up once `/health` has failed for `vllm_server_timeout`; the main process
    # goes on through the sync's barriers, and then every process raises the same `VLLMServerError` (broadcast).

    def _sync_weight(self) -> None:
        """Overridden so that a server lost during the sync fails every process with the same message."""
        servers = (getattr(self, "vllm_client", None), getattr(self, "weight_transfer", None))
        health_url = f"{self.args.vllm_server_base_url.rstrip('/')}/health"
        timeout = float(self.args.vllm_server_timeout)
        targets = [server for server in servers if server is not None] if self.accelerator.is_main_process else []
        with server_calls_of_one_sync(
            targets, WEIGHT_SYNC_CALLS, health_url, timeout, WEIGHT_SYNC_CALLS_IN_CALLER_THREAD
        ) as failures:
            super()._sync_weight()
        first_sync = self._weight_syncs == 0  # TRL's cold sync at train begin, before step `global_step + 1`
        self._weight_syncs += 1
        message = None
        if failures:
            during = "the first weight sync" if first_sync else "the weight sync at the end"
            step = None if first_sync else self.state.global_step
            message = vllm_server_message(self, None, failures[0], during=during, step=step)
        if self.accelerator.num_processes > 1:
            (message,) = broadcast_object_list([message], from_process=0)
        if message is not None:
            error = VLLMServerError(message)
            setattr(error, RAISED_ON_EVERY_PROCESS, True)
            raise error from (failures[0] if failures else None)

    # -- the model card (and the resume position) --------------------------------------------------------------------

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """Overridden to save the card and the worker's state, and to resume past the rows the worker dropped."""
        # As GRPOTrainer does: the card (with its plots and metrics) is saved along with every checkpoint.
        self.create_model_card(model_name=Path(self.args.output_dir).name)
        answer = None
        if self._state_channel is not None and self._worker_running and self.accelerator.is_main_process:
            try:
                answer = self._ask_worker_state()
            except (RolloutWorkerError, VLLMServerError) as error:
                # Still worth writing (the next wait for samples raises the failure), with the worker's last state.
                logger.warning("Saving without the worker's current sampler state: %s", error)
                answer = self._last_worker_state
        if answer is not None:
            self._dropped_row_ids.update(answer.dropped)
            # TRL's resume position, as its save reads it below: the first row neither trained nor done.
            done = self._trained_groups | self._dropped_row_ids
            position = next(row for row in itertools.count() if row not in done)
            start = self.rollout_worker._loop_kwargs["dataset_start_index"]
            ahead = [start + row for row in answer.counted_from(position)]
            self._state_of_this_save = {"sampler": answer.sampler, ROWS_COUNTED_AHEAD: ahead}
        try:
            # TRL's save resumes past the rows the worker dropped, as if trained (see "the resume position" above).
            with rows_trained_for_the_position(self, self._dropped_row_ids):
                super()._save_checkpoint(model, trial)
        finally:
            self._state_of_this_save = None

    def _card_contents(self) -> dict[str, Any]:
        return {"settings": self.ada_sampling.settings, "trainer_name": ASYNC_TRAINER_NAME}
