"""
The asynchronous trainer's TRL touchpoints, one named test each.

Every private name, signature and behaviour of TRL's asynchronous trainer (`trl.experimental.async_grpo`) that
`trl_ada.async_grpo` (directly or through `trl_ada/trl_seam/`) relies on is a row of [`ASYNC_TOUCHPOINTS`]: what it
is, what trl-ada relies on, and a check against the installed TRL, so that an upstream change fails
`test_trl_async_still_has[<touchpoint>]`. The methods trl-ada replaces or relies on line by line are pinned by source
digest (`trl_seam.async_grpo_private.ASYNC_PINNED_SOURCES`); behaviours cheap to run on CPU are run on a bare loop or
worker. The rows were checked against TRL 1.14.2, 1.15.0 and 1.16.0 (each release runs this file on CI). The
synchronous trainer's touchpoints are `tests/test_trl_touchpoints.py`, whose helpers this module shares.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import itertools
import queue
import re
import textwrap
import threading
import time
import types
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import transformers
from accelerate import PartialState
from accelerate.data_loader import DataLoaderDispatcher
from test_trl_touchpoints import SEAM_MODULES, Touchpoint, all_of, assigned, calls, contains, parameters
from trl.experimental.async_grpo import AsyncGRPOTrainer, async_grpo_trainer, async_rollout_worker
from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset
from trl.experimental.async_grpo.async_rollout_worker import (
    AsyncRolloutWorker,
    RolloutGroup,
    RolloutSample,
    _AsyncRolloutLoop,
)

import trl_ada
from trl_ada.generation.faults import VLLMServerUnresponsive
from trl_ada.trl_seam import async_grpo_private, batch_dispatch

PACKAGE = Path(trl_ada.__file__).parent

ASYNC_SEAM_MODULES = ("async_grpo_private.py", "batch_dispatch.py")
"""The modules of `trl_ada/trl_seam/` that hold the asynchronous trainer's touchpoints (the synchronous trainer's:
`SEAM_MODULES` in `tests/test_trl_touchpoints.py`)."""


def pinned(qualname: str) -> Callable[[], None]:
    """`_AsyncRolloutLoop`'s method `qualname` has a source `trl_seam.async_grpo_private.ASYNC_PINNED_SOURCES` records
    for a release."""

    def check() -> None:
        digest = async_grpo_private.source_digest(inspect.getsource(async_rollout_worker), qualname)
        recorded = async_grpo_private.ASYNC_PINNED_SOURCES[qualname]
        assert digest in set(recorded.values()), f"{qualname}'s source ({digest}) is none of {recorded}"

    return check


def ast_calls(function: object) -> list[ast.Call]:
    """Every call made in `function`'s installed source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _assert(condition: bool, message: str) -> None:
    assert condition, message


def assert_fields(cls: type, names: tuple[str, ...]) -> None:
    """`cls` is a dataclass with (at least) the fields `names`."""
    have = {f.name for f in dataclasses.fields(cls)}
    missing = [name for name in names if name not in have]
    assert not missing, f"{cls.__name__} has no field(s) {missing}"


def bare_loop(cls: type = _AsyncRolloutLoop, **attributes: object) -> _AsyncRolloutLoop:
    """A loop built without `__init__` (which needs a dataset, a tokenizer and a server), with `attributes` set."""
    loop = cls.__new__(cls)
    for name, value in attributes.items():
        setattr(loop, name, value)
    return loop


def _checkpoint_is_loaded_before_train_begin() -> None:
    # transformers' `_inner_training_loop` loads the optimizer (directly, or in `_prepare_for_training`) before the
    # `on_train_begin` callbacks, one of which starts the worker.
    loop = inspect.getsource(transformers.Trainer._inner_training_loop)
    load = "self._load_optimizer_and_scheduler(resume_from_checkpoint)"
    if load not in loop:
        contains(transformers.Trainer, "_prepare_for_training", load)()
        load = "self._prepare_for_training("
    begin = "self.callback_handler.on_train_begin("
    assert load in loop and begin in loop and loop.index(load) < loop.index(begin), (load, begin)


def _repeat_iterator_yields_each_row_num_generations_times_cycling() -> None:
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    loop = bare_loop(dataset=rows, _dataset_iter=iter(rows), num_generations=2)
    drawn = list(itertools.islice(_AsyncRolloutLoop._repeat_iterator(loop), 6))
    assert drawn == [(0, rows[0]), (0, rows[0]), (1, rows[1]), (1, rows[1]), (2, rows[0]), (2, rows[0])], drawn


def _push_metrics_sends_the_values() -> None:
    loop = bare_loop(_counters=defaultdict(int), _rates={}, _metrics_queue=queue.Queue())
    loop._push_metrics({"ada/x": 1.0})
    assert loop._metrics_queue.get_nowait() == {"ada/x": 1.0}


def _run_in_a_thread(loop: _AsyncRolloutLoop) -> BaseException | None:
    """`loop.run()` in a thread of its own (it sets that thread's current event loop); what it raised, if anything."""
    raised: list[BaseException] = []

    def target() -> None:
        try:
            loop.run()
        except BaseException as error:  # the failing run re-raises after reporting
            raised.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "run() did not return"
    return raised[0] if raised else None


def _run_runs_and_closes_its_loop() -> None:
    class Recording(_AsyncRolloutLoop):
        async def _run_loops(self, stop_event: object) -> None:
            self.ran_on = asyncio.get_running_loop()

    loop = bare_loop(Recording, _loop=asyncio.new_event_loop(), _stop_event=None, _tool_pool=ThreadPoolExecutor(1))
    assert _run_in_a_thread(loop) is None
    assert loop.ran_on is loop._loop and loop._loop.is_closed()


def _a_failed_run_reports_its_error_before_setting_the_event() -> None:
    class Failing(_AsyncRolloutLoop):
        async def _run_loops(self, stop_event: object) -> None:
            raise ValueError("boom")

    failed = threading.Event()
    reports = []

    class Reports:
        def put_nowait(self, info: tuple) -> None:
            reports.append((info, failed.is_set()))

    loop = bare_loop(
        Failing,
        _loop=asyncio.new_event_loop(),
        _stop_event=None,
        _tool_pool=ThreadPoolExecutor(1),
        _exception_info_queue=Reports(),
        _failed_event=failed,
    )
    PartialState()  # as TRL's child does before running: its failure is logged through accelerate's logger
    assert isinstance(_run_in_a_thread(loop), ValueError)
    [((type_name, message, _), event_was_set)] = reports
    assert (type_name, message, event_was_set) == ("ValueError", "boom", False) and failed.is_set()
    assert loop._loop.is_closed()


def _check_health_chains_the_childs_error_or_finds_a_stale_heartbeat() -> None:
    worker = AsyncRolloutWorker.__new__(AsyncRolloutWorker)
    worker._failed_event = threading.Event()
    worker._exception_info_queue = queue.Queue(maxsize=1)
    worker._heartbeat_value = types.SimpleNamespace(value=time.time())
    worker.check_health(60.0)  # healthy
    worker._exception_info_queue.put(("ValueError", "boom", "Traceback (most recent call last): ..."))
    worker._failed_event.set()
    with pytest.raises(RuntimeError) as failure:
        worker.check_health(60.0)
    assert str(failure.value.__cause__).startswith("ValueError: boom\nTraceback (most recent call last):")
    with pytest.raises(RuntimeError) as again:  # the report was taken off the queue: a later check chains nothing
        worker.check_health(60.0)
    assert again.value.__cause__ is None
    worker._failed_event.clear()
    worker._heartbeat_value.value = time.time() - 120
    with pytest.raises(RuntimeError, match="stale"):
        worker.check_health(60.0)


def _retry_ends_at_an_error_it_does_not_list() -> None:
    assert not issubclass(VLLMServerUnresponsive, async_rollout_worker._RETRYABLE_HTTP_ERRORS)
    attempts = []

    async def request() -> None:
        attempts.append(1)
        raise VLLMServerUnresponsive("no answer")

    loop = bare_loop(_counters=defaultdict(int))
    with pytest.raises(VLLMServerUnresponsive):
        asyncio.run(loop._retry(request, label="POST /v1/completions", max_attempts=30))
    assert len(attempts) == 1


def _sync_weight_calls_only_the_watched_server_calls() -> None:
    called = set()
    for name in ("_sync_weight_merged", "_sync_weight_lora"):
        for node in ast_calls(getattr(AsyncGRPOTrainer, name)):
            receiver = getattr(node.func, "value", None)
            if receiver is not None and ast.unparse(receiver) in ("self.vllm_client", "self.weight_transfer"):
                called.add(node.func.attr)
    assert called == set(async_grpo_private.WEIGHT_SYNC_CALLS), called


def _iterable_datasets_are_dispatched() -> None:
    # The data loader TRL prepares iterates an IterableDataset (the rollout queue, or an empty one): accelerate then
    # dispatches its batches from the main process unless told otherwise.
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader

    prepared = prepare_data_loader(
        DataLoader(async_grpo_trainer._EmptyIterableDataset(), batch_size=1), put_on_device=True
    )
    assert isinstance(prepared, DataLoaderDispatcher) and batch_dispatch.batches_are_dispatched(prepared)


def _peak_flops_is_asked_in_init_where_trl_has_it() -> None:
    function = getattr(async_grpo_trainer, "get_peak_flops_per_device", None)
    if function is None:  # TRL 1.14
        assert "get_peak_flops_per_device" not in inspect.getsource(AsyncGRPOTrainer.__init__)
        return
    parameters(function, "", ("accelerator", "dtype"))()
    contains(AsyncGRPOTrainer, "__init__", "get_peak_flops_per_device(self.accelerator, dtype)")()
    contains(function, "", "torch.cuda.get_device_name")()


def _tree_attention_is_registered_by_name_where_trl_packs() -> None:
    if not async_grpo_private.has_tree_packing():  # TRL 1.14, 1.15
        assert "register_tree_attention" not in inspect.getsource(AsyncGRPOTrainer.__init__)
        return
    from trl.experimental.async_grpo import packing

    calls(AsyncGRPOTrainer, "__init__", "register_tree_attention()", times=1)()
    # The module global, looked up at the call: a function put in its place by name is what gets registered.
    calls(packing, "register_tree_attention", "AttentionInterface.register(TREE_ATTENTION, tree_attention)")()
    assert packing.TREE_ATTENTION == "tree_fa3" and callable(packing.tree_attention)


ASYNC_TOUCHPOINTS = [
    Touchpoint(
        "_AsyncRolloutLoop._repeat_iterator",
        "override (pinned)",
        "`_repeat_iterator()` yields `(group_id, row)`, each row `num_generations` times under one id, cycling the "
        "dataset; the same source in the three releases",
        all_of(
            pinned("_AsyncRolloutLoop._repeat_iterator"),
            _repeat_iterator_yields_each_row_num_generations_times_cycling,
        ),
    ),
    Touchpoint(
        "_AsyncRolloutLoop._generate_loop",
        "relied on (pinned)",
        "takes one `next(work_iter)` per free slot, creates a `RolloutGroup` per new group id with the current "
        "`model_version` and `reward_kwargs` of `num_generations` copies of the row's columns, and queues the group on "
        "`_groups_to_score` once `pending_completed[group_id] == self.num_generations` (read at every completion)",
        all_of(
            pinned("_AsyncRolloutLoop._generate_loop"),
            contains(
                _AsyncRolloutLoop,
                "_generate_loop",
                "next(work_iter)",
                "RolloutGroup(",
                "reward_kwargs=reward_kwargs",
                "if pending_completed[group_id] == self.num_generations:",
                "self._groups_to_score.put_nowait(group)",
            ),
        ),
    ),
    Touchpoint(
        "_AsyncRolloutLoop._score_group",
        "call",
        "`_score_group(group)` returns one `RolloutSample` per training sequence, conversation by conversation "
        "(`completions_sequences`), each with `metrics['reward']` (TRL's reward aggregation; NaN when unscorable); "
        "`advantage` and `group_id` are attributes we overwrite",
        all_of(
            parameters(_AsyncRolloutLoop, "_score_group", ("group",)),
            contains(_AsyncRolloutLoop, "_score_group", "completions_sequences", "RolloutSample(", '"reward"'),
            lambda: assert_fields(RolloutSample, ("advantage", "group_id", "model_version", "metrics")),
        ),
    ),
    Touchpoint(
        "_AsyncRolloutLoop._groups_to_score._push_metrics",
        "attribute, call",
        "`_groups_to_score` is the asyncio queue of closed groups (`None` ends the score loop); `_push_metrics(dict)` "
        "sends metrics to the trainer's log",
        all_of(
            assigned(_AsyncRolloutLoop, ("_groups_to_score",)),
            contains(_AsyncRolloutLoop, "_score_loop", "self._groups_to_score.get()", "if group is None"),
            contains(_AsyncRolloutLoop, "_generate_loop", "self._groups_to_score.put_nowait(None)"),
            parameters(_AsyncRolloutLoop, "_push_metrics", ("values",)),
            _push_metrics_sends_the_values,
        ),
    ),
    Touchpoint(
        "RolloutGroup",
        "dataclass",
        "per-conversation lists, `reward_kwargs` (dict of per-conversation lists), `model_version`, `group_id`, "
        "`queued_at` (what `trl_seam.async_grpo_private.merge_rollout_groups` concatenates or keeps)",
        lambda: assert_fields(
            RolloutGroup,
            (
                "prompts",
                "reward_kwargs",
                "completions",
                "completions_sequences",
                "model_version",
                "group_id",
                "queued_at",
            ),
        ),
    ),
    Touchpoint(
        "_AsyncRolloutLoop._loop.run",
        "attribute, override (wraps)",
        "`run()` runs the loop's asyncio event loop `_loop` (created in `__init__` by `asyncio.new_event_loop()`) "
        "until the stop event and closes it; `AdaRolloutLoop.run` starts a watcher thread before calling it, which "
        "hands the trainer's sampler-state requests to that loop with `_loop.call_soon_threadsafe` until "
        "`_loop.is_closed()` (the same code in the three releases)",
        all_of(
            contains(_AsyncRolloutLoop, "__init__", "self._loop = asyncio.new_event_loop()"),
            parameters(_AsyncRolloutLoop, "run", ()),
            _run_runs_and_closes_its_loop,
        ),
    ),
    Touchpoint(
        "AsyncRolloutWorker._loop_cls",
        "class",
        "`AsyncRolloutWorker` forwards its keyword arguments to `_loop_cls(**kwargs)` in the spawned child",
        all_of(
            lambda: _assert(AsyncRolloutWorker._loop_cls is _AsyncRolloutLoop, "_loop_cls is not _AsyncRolloutLoop"),
            contains(AsyncRolloutWorker, "start", "self._loop_cls,", "self._loop_kwargs,"),
            contains(async_rollout_worker, "_child_main", "loop_cls(**loop_kwargs,"),
        ),
    ),
    Touchpoint(
        "AsyncRolloutWorker.start.stop.check_health._process._failed_event._exception_info_queue._stop_event_mp",
        "call, attribute",
        "`start` pickles the loop arguments and spawns the child (`_process`); `stop` sets `_stop_event_mp` (an mp "
        "Event, whose `set()` waits for the child's watcher: `AdaAsyncRolloutWorker.stop` reaps a dead child instead); "
        "`check_health` raises once `_failed_event` is set (the child's exception chained: the child puts it on "
        "`_exception_info_queue`, an mp Queue of one item, before setting the event, and the check reads it with "
        "`get_nowait`; `RobustAsyncRolloutWorker.check_health` waits for it to arrive) or the heartbeat is stale",
        all_of(
            assigned(AsyncRolloutWorker, ("_process", "_failed_event", "_exception_info_queue", "_stop_event_mp")),
            contains(AsyncRolloutWorker, "__init__", "self._exception_info_queue = ctx.Queue(maxsize=1)"),
            contains(AsyncRolloutWorker, "start", "pickle.dumps(self._loop_kwargs)", "self._process.start()"),
            contains(AsyncRolloutWorker, "stop", "self._stop_event_mp.set()"),
            parameters(AsyncRolloutWorker, "check_health", ("stale_after_s",)),
            _check_health_chains_the_childs_error_or_finds_a_stale_heartbeat,
            _a_failed_run_reports_its_error_before_setting_the_event,
        ),
    ),
    Touchpoint(
        "AsyncRolloutWorker._loop_kwargs",
        "attribute",
        "the keyword arguments the child's loop is built from, pickled at `start`; a resume puts the checkpoint's "
        "sampler state into `ada_sampling` there before the worker starts (TRL's own resume sets `dataset_start_index` "
        "the same way, in `_inner_training_loop` before transformers' loop calls `_load_optimizer_and_scheduler`)",
        all_of(
            contains(
                AsyncRolloutWorker,
                "__init__",
                'loop_kwargs.setdefault("dataset_start_index", 0)',
                "self._loop_kwargs = loop_kwargs",
            ),
            contains(
                AsyncGRPOTrainer,
                "_inner_training_loop",
                'self.rollout_worker._loop_kwargs["dataset_start_index"] = rollout_state["prompt_index"]',
                "super()._inner_training_loop(",
            ),
            _checkpoint_is_loaded_before_train_begin,
        ),
    ),
    Touchpoint(
        "AsyncGRPOTrainer._save_checkpoint",
        "override (wraps)",
        "`_save_checkpoint(model, trial)`: ours writes the model card, then TRL's saves the checkpoint and the "
        "rollout position (`rollout_state.json`)",
        all_of(
            parameters(AsyncGRPOTrainer, "_save_checkpoint", ("model", "trial")),
            contains(
                AsyncGRPOTrainer, "_save_checkpoint", "rollout_state.json", "super()._save_checkpoint(model, trial)"
            ),
        ),
    ),
    Touchpoint(
        "AsyncGRPOTrainer._trained_groups",
        "attribute",
        "the set of row ids (samples' `group_id`) the collator trained; TRL's `_save_checkpoint` resumes at "
        "`dataset_start_index` + the smallest id not in it, and its epoch stop and `batch/groups_per_step` read its "
        "size; `rows_trained_for_the_position` swaps in its union with the rows the worker dropped for the save only, "
        "then restores the same set object (the collator holds it)",
        all_of(
            assigned(AsyncGRPOTrainer, ("_trained_groups",)),
            contains(
                AsyncGRPOTrainer,
                "_save_checkpoint",
                "trained = self._trained_groups",
                "next(g for g in itertools.count() if g not in trained)",
                'self.rollout_worker._loop_kwargs["dataset_start_index"] + first_untrained',
            ),
            contains(AsyncGRPOTrainer, "get_train_dataloader", "groups_trained=self._trained_groups"),
            contains(async_grpo_trainer._EpochStopCallback, "on_step_end", "len(self._trainer._trained_groups)"),
            contains(async_grpo_trainer, "", '"batch/groups_per_step"', "len(self._trained_groups)"),
        ),
    ),
    Touchpoint(
        "_AsyncRolloutLoop._retry",
        "override (wraps)",
        "`_retry(coro_factory, *, label, max_attempts)`: every vLLM request goes through it (`_post`, "
        "`_generate_one_turn`); a failure TRL does not list as retryable ends the loop",
        all_of(
            parameters(_AsyncRolloutLoop, "_retry", ("coro_factory", "label", "max_attempts")),
            contains(_AsyncRolloutLoop, "_post", "self._retry("),
            contains(_AsyncRolloutLoop, "_generate_one_turn", "self._retry("),
            _retry_ends_at_an_error_it_does_not_list,
        ),
    ),
    Touchpoint(
        "_AsyncRolloutLoop.reward_funcs.reward_func_names.vllm_server_url.request_timeout",
        "attribute",
        "what the loop scores with and where it sends requests",
        assigned(_AsyncRolloutLoop, ("reward_funcs", "reward_func_names", "vllm_server_url", "request_timeout")),
    ),
    Touchpoint(
        "AsyncGRPOTrainer._sync_weight.vllm_client.weight_transfer",
        "override (wraps), attribute",
        "`_sync_weight()` is called at train begin and every `weight_sync_steps` on every process; only the main "
        "process calls the server, through `vllm_client` (LoRA: `pause`, `load_lora_adapter`, `resume`, "
        "`unload_lora_adapter`) or `weight_transfer` (`pause`, `send_weights(iterator)`, `resume`), between "
        "`accelerator.wait_for_everyone()` barriers; ours watches those calls "
        "(`trl_seam.async_grpo_private.WEIGHT_SYNC_CALLS`) and raises a lost server on every process after TRL's sync",
        all_of(
            parameters(AsyncGRPOTrainer, "_sync_weight", ()),
            assigned(AsyncGRPOTrainer, ("vllm_client", "weight_transfer")),
            contains(async_grpo_trainer._TrainBeginCallback, "on_train_begin", "self._trainer._sync_weight()"),
            contains(AsyncGRPOTrainer, "__init__", "StepIntervalCallback(self._sync_weight,"),
            contains(AsyncGRPOTrainer, "_sync_weight_merged", "self.accelerator.wait_for_everyone()"),
            contains(AsyncGRPOTrainer, "_sync_weight_lora", "self.accelerator.wait_for_everyone()"),
            _sync_weight_calls_only_the_watched_server_calls,
        ),
    ),
    Touchpoint(
        "AsyncGRPOTrainer.get_train_dataloader.DataLoaderDispatcher",
        "override (wraps), behaviour",
        "TRL's dataset is the main process's rollout queue (the others get an empty one) and accelerate dispatches "
        "each batch from it (`DataLoaderDispatcher`, checked by `trl_seam.batch_dispatch.batches_are_dispatched`); "
        "the dispatcher fetches a batch ahead, so while the main process waits for samples (where TRL calls "
        "`rollout_worker.check_health` every 5 s without one) every other process waits in the "
        "`broadcast_object_list` of `_fetch_batches`' `DISPATCHED_BATCH_INFO_ITEMS` objects (`[structure, stop]`, "
        "accelerate 1.x; the count: `tests/test_trl_seam.py`), which `fail_the_processes_waiting_for_a_batch` answers",
        all_of(
            parameters(AsyncGRPOTrainer, "get_train_dataloader", ()),
            contains(
                AsyncGRPOTrainer,
                "get_train_dataloader",
                "RolloutQueueDataset(",
                "check_health_fn=self.rollout_worker.check_health",
                "_EmptyIterableDataset()",
                "self.accelerator.prepare(",
            ),
            parameters(RolloutQueueDataset, "__init__", ("rollout_queue", "model_version_fn", "check_health_fn")),
            lambda: _assert(
                inspect.signature(RolloutQueueDataset).parameters["poll_interval_s"].default == 5.0,
                "the rollout queue's poll interval is no longer 5 s",
            ),
            contains(DataLoaderDispatcher, "_fetch_batches", "broadcast_object_list(batch_info)"),
            _iterable_datasets_are_dispatched,
        ),
    ),
    Touchpoint(
        "AsyncGRPOTrainer._rollout_dataset.RolloutQueueDataset",
        "attribute, behaviour",
        "on the main process `_rollout_dataset` is the `RolloutQueueDataset` that `get_train_dataloader` built (None "
        "elsewhere); ours sets its `check_health_fn` and wraps its `queue` (`StaleGroups`: `get`, `qsize`), reading "
        "`max_staleness`, `model_version_fn()` and `metrics['sample/dropped_stale_total']`; TRL's `__iter__` reads "
        "the queue, calls `check_health_fn(stale_after_s)` after each empty wait, and drops a sample more than "
        "`max_staleness` versions old",
        all_of(
            assigned(AsyncGRPOTrainer, ("_rollout_dataset",)),
            contains(AsyncGRPOTrainer, "get_train_dataloader", "self._rollout_dataset = dataset"),
            assigned(
                RolloutQueueDataset, ("queue", "check_health_fn", "max_staleness", "model_version_fn", "metrics")
            ),
            contains(
                RolloutQueueDataset,
                "__iter__",
                "self.queue.get(timeout=self.poll_interval_s)",
                "self.check_health_fn(self.stale_after_s)",
                "self.model_version_fn()",
                "> self.max_staleness",
                'self.metrics["sample/dropped_stale_total"].append(1.0)',
            ),
        ),
    ),
    Touchpoint(
        "AsyncGRPOTrainer._epoch_stop_groups",
        "attribute",
        "set (not None) when TRL derived `max_steps` from `num_train_epochs`: `max_steps` is then a safety ceiling "
        "and `_EpochStopCallback` stops at that many prompt-groups trained; `pool_step_ceiling` raises the ceiling "
        "for `train_on='pool'`",
        all_of(
            assigned(AsyncGRPOTrainer, ("_epoch_stop_groups",)),
            contains(
                AsyncGRPOTrainer,
                "__init__",
                "self._epoch_stop_groups = math.ceil(self.args.num_train_epochs * len(train_dataset))",
                "self.args.max_steps = math.ceil(",
                "self.add_callback(_EpochStopCallback(self, self._epoch_stop_groups))",
            ),
        ),
    ),
    Touchpoint(
        "AsyncGRPOTrainer.train_begin_and_end",
        "behaviour",
        "TRL's `_TrainBeginCallback` (added in `__init__`, so before a callback a subclass adds after it) syncs the "
        "weights and then starts the worker on the main process at `on_train_begin`; `_inner_training_loop`'s "
        "`finally` stops the worker",
        all_of(
            contains(AsyncGRPOTrainer, "__init__", "_TrainBeginCallback(self)"),
            contains(async_grpo_trainer._TrainBeginCallback, "on_train_begin", "self._trainer.rollout_worker.start()"),
            contains(AsyncGRPOTrainer, "_inner_training_loop", "finally:", "self.rollout_worker.stop()"),
        ),
    ),
    Touchpoint(
        "async_grpo_trainer.AsyncRolloutWorker",
        "module name",
        "what `AsyncGRPOTrainer.__init__` instantiates (rank 0), with keyword arguments only, when no "
        "`rollout_worker` is given (`trl_seam.async_grpo_private.async_rollout_worker_class` names another class "
        "there for `__init__`)",
        all_of(
            lambda: _assert(async_grpo_trainer.AsyncRolloutWorker is AsyncRolloutWorker, "another AsyncRolloutWorker"),
            parameters(AsyncGRPOTrainer, "__init__", ("model", "reward_funcs", "args")),
            lambda: _assert(
                "rollout_worker" in inspect.signature(AsyncGRPOTrainer.__init__).parameters, "no rollout_worker="
            ),
            contains(AsyncGRPOTrainer, "__init__", "self.rollout_worker = rollout_worker", "= AsyncRolloutWorker("),
            lambda: _assert(
                all(
                    not node.args
                    for node in ast_calls(AsyncGRPOTrainer.__init__)
                    if ast.unparse(node.func) == "AsyncRolloutWorker"
                ),
                "AsyncRolloutWorker is given positional arguments",
            ),
        ),
    ),
    Touchpoint(
        "async_grpo_trainer.get_peak_flops_per_device",
        "module function, 1.15 and 1.16",
        "`get_peak_flops_per_device(accelerator, dtype)` is called in `__init__`; it calls `torch.cuda.get_device_name` "
        "even off CUDA, so `trl_ada.async_grpo.async_grpo_trainer.peak_flops_unknown_off_cuda` swaps it for the duration of "
        "`__init__` (`None` off CUDA, as TRL returns for an unknown peak) and restores it; "
        "`trl_seam.async_grpo_private.install_peak_flops_fallback` wraps it for good, for scripts that build TRL's "
        "own trainer on CPU",
        _peak_flops_is_asked_in_init_where_trl_has_it,
    ),
    Touchpoint(
        "packing.tree_attention.register_tree_attention",
        "module variable, 1.16 only",
        "`register_tree_attention()` (called by `AsyncGRPOTrainer.__init__`) registers whatever "
        "`packing.tree_attention` names under `'tree_fa3'`; without the GPU kernel, "
        "`trl_ada/async_grpo/tree_attention.py` registers a plain-torch version under that name after `__init__` "
        "(TRL's module is left as it is)",
        _tree_attention_is_registered_by_name_where_trl_packs,
    ),
]


@pytest.mark.parametrize("touchpoint", ASYNC_TOUCHPOINTS, ids=lambda touchpoint: touchpoint.name)
def test_trl_async_still_has(touchpoint):
    touchpoint.check()


def test_every_pinned_source_is_a_touchpoint():
    names = {touchpoint.name for touchpoint in ASYNC_TOUCHPOINTS}
    assert sorted(set(async_grpo_private.ASYNC_PINNED_SOURCES) - names) == []


TRL_ASYNC_PRIVATE = re.compile(r"(?:\bdef |self\.)(_[a-z][a-z0-9_]*)")
ASYNC_ACCESS = re.compile(
    r"\b(?:self|super\(\)|worker|loop|trainer|rollout_worker|dataset)\.(_[a-z][a-z0-9_]*)"
    r"|getattr\(\w+, \"(_[a-z][a-z0-9_]*)\""
)


def test_every_private_name_of_trls_async_trainer_we_touch_is_a_touchpoint():
    # trl_ada.async_grpo rides on TRL's worker and trainer through private names (`_score_group`, `_process`, ...),
    # directly or through trl_seam's asynchronous modules: each one must be a row above, checked on every TRL release.
    trl_private = set()
    for path in Path(async_rollout_worker.__file__).parent.glob("*.py"):
        trl_private |= set(TRL_ASYNC_PRIVATE.findall(path.read_text()))
    sources = {f"trl_seam/{name}": (PACKAGE / "trl_seam" / name).read_text() for name in ASYNC_SEAM_MODULES}
    sources |= {path.name: path.read_text() for path in sorted((PACKAGE / "async_grpo").glob("*.py"))}
    covered = " ".join(touchpoint.name for touchpoint in ASYNC_TOUCHPOINTS)
    untabled = []
    for file_name, source in sources.items():
        ours = set(re.findall(r"\bdef (_[a-z][a-z0-9_]*)", source)) - set(re.findall(r"super\(\)\.(_\w+)", source))
        for name in sorted({a or b for a, b in ASYNC_ACCESS.findall(source)}):
            if name in trl_private and name not in ours and not re.search(rf"\b{name}\b", covered):
                untabled.append(f"{file_name}: {name}")
    assert not untabled, f"TRL private names used by trl_ada.async_grpo but not in ASYNC_TOUCHPOINTS: {untabled}"


def test_every_seam_module_is_read_by_one_of_the_touchpoint_tests():
    # A module of trl_ada/trl_seam/ that neither test reads would escape both checks of the private names it uses.
    modules = sorted(path.name for path in (PACKAGE / "trl_seam").glob("*.py"))
    assert sorted({*SEAM_MODULES, *ASYNC_SEAM_MODULES}) == modules


def test_a_changed_pinned_source_fails_its_check(monkeypatch):
    # The pins can fail: a source no release recorded.
    monkeypatch.setitem(
        async_grpo_private.ASYNC_PINNED_SOURCES, "_AsyncRolloutLoop._repeat_iterator", {"0.0.0": "0" * 16}
    )
    with pytest.raises(AssertionError, match="is none of"):
        pinned("_AsyncRolloutLoop._repeat_iterator")()
