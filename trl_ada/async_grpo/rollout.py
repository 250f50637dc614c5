"""Reinforce-Ada inside TRL's asynchronous rollout worker (`trl.experimental.async_grpo`); docs/async.md says what
happens per sampler, to policy versions and to the resume position.

[`AdaRolloutLoop`] rides on TRL's `_AsyncRolloutLoop` through two seams, its work iterator (`_repeat_iterator`) and
`_score_group`, and copies no TRL body. Where the sampler pools (`AsyncSampling.pooled`) the loop is built with
`num_generations=1`, so every draw is a TRL group of its own; each generation batch is a streaming step of the sampler
(`trl_ada.samplers.streaming.begin_streaming`) whose draws are completed by draw index, so a pool is its draws in
submission order, and the batch's `Selection` (the synchronous trainer's code) gives the kept draws and their
advantages. Otherwise the loop trains on TRL's own groups and advantages, and DAPO drops a group without a signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import multiprocessing
import pickle
import queue
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..generation.faults import VLLMServerUnresponsive
from ..reporting.metrics import advantage_metrics
from ..rewards.reward_registry import failing_reward_name
from ..samplers import ChoosesPrompts, SamplerSettings, build_sampler, dapo, rules
from ..samplers.accounting import PromptDraws, draw_rates
from ..samplers.base import PromptResult, Sampler, draw_memories, finish_update, selection_draws
from ..samplers.signal import grpo_rule_holds
from ..samplers.streaming import begin_streaming
from ..schedules import prompt_key, prompt_keys
from ..trl_seam.async_grpo_private import (
    async_rollout_classes,
    merge_rollout_groups,
    samples_per_conversation,
    take_waiting_groups,
)
from .async_grpo_config import check_prompts_per_generation_batch, check_train_on, gates_refills

logger = logging.getLogger(__name__)

GROUP_VERSION_KEY = "ada/async/group_version_oldest"
"""Key set in the `metrics` of each queued sample (TRL's samples have slots): the oldest policy version among its
prompt's samples, by which `trl_ada.async_grpo.async_grpo_trainer.StaleGroups` keeps or drops them whole."""

HEALTH_POLL_S = 1.0
"""While a request waits, how often the loop checks whether the server still answers (`_check_server_answers`)."""
HEALTH_PROBE_TIMEOUT_S = 5.0
"""How long one `/health` probe may take (at most `vllm_server_timeout`)."""

FAILURE_REPORT_ARRIVAL_S = 5.0
"""Seconds a health check waits, once the worker child has signalled its failure, for the error it sent with it."""

MAX_EMPTY_BATCHES = 1000
"""Consecutive generation batches without a single draw (all prompts skipped) after which the worker gives up."""

_AsyncRolloutLoop, AsyncRolloutWorker = async_rollout_classes()


@dataclass(frozen=True)
class AsyncSampling:
    """What the rollout loop needs of the trainer's configuration (pickled into the worker process)."""

    settings: SamplerSettings
    """The validated sampler settings (`AdaAsyncGRPOConfig.sampler_settings()`)."""
    prompts_per_batch: int
    """Prompts per generation batch (`resolve_prompts_per_generation_batch`)."""
    predictor_source: str | None = None
    """A local directory holding a saved pass-rate predictor to warm-start from."""
    estimator: Any = None
    """A pass-rate estimator object (`pass_rate_estimator=`)."""
    initial_state: dict[str, Any] | None = None
    """A sampler state to start from (from a checkpoint when resuming)."""
    server_timeout: float | None = None
    """Seconds the server's requests may keep failing before the worker raises `VLLMServerUnresponsive`
    (`vllm_server_timeout`); `None`: TRL's own retries only."""
    train_on: str = "downsample"
    """What a prompt trains on (`AdaAsyncGRPOConfig.train_on`)."""

    def __post_init__(self) -> None:
        check_train_on(self.train_on, self.settings)
        check_prompts_per_generation_batch(self.prompts_per_batch, self.settings)

    def new_sampler(self) -> Sampler:
        """A fresh sampler of these settings, estimator and predictor (`initial_state` not loaded)."""
        return build_sampler(self.settings, self.estimator, self.predictor_source, train_on=self.train_on)

    @property
    def trl_advantages(self) -> bool:
        """Whether TRL's own groups and advantages are what the sampler would train on: the settings hold GRPO's rule
        (`trl_ada.samplers.signal.grpo_rule_holds`, the synchronous trainer's decision), the pool cannot outgrow its
        update group, TRL's worker scales as it does (by the group's std) and every rule is per prompt."""
        settings = self.settings
        return (
            grpo_rule_holds(settings, self.train_on)
            and settings.max_pool_size <= settings.num_generations
            and settings.scale_rewards == "group"
            and settings.rules_are_per_prompt
        )

    @property
    def pooled(self) -> bool:
        """Whether every draw is scored on its own and `Selection` gives the advantages: where they are not TRL's
        (`trl_advantages`), or the sampler gates DAPO's refill (its gate learns from every finished batch)."""
        return not self.trl_advantages or gates_refills(self.settings)

    @property
    def normalises_over_the_update(self) -> bool:
        """Whether DAPO's kept prompts wait for an update's worth (`prompts_per_batch`) and have the rules that read
        the update applied together (`finish_update`): where it drops groups and such a rule can change an advantage
        (normalised weights that can differ, the batch's reward std, SPO's batch normalisation)."""
        settings = self.settings
        weights_differ = settings.objective != "linear" or settings.sampler_class.weight is not Sampler.weight
        update_rules = (settings.normalize_weights and weights_differ) or not settings.rules_are_per_prompt
        return settings.refills and update_rules


class StreamGate:
    """`dapo_gated`'s refill gate on the worker's one prompt stream (the dataset walk, in TRL's order). An epoch is
    `dataset_size` prompts kept with a signal (`count_kept`, TRL's count of an epoch); a prompt's first row in an
    epoch is the loader's visit and is always drawn, and a later row of it in the same epoch (a refill visit) is
    passed over when the sampler's `refill_passes_over` says so. A whole walk of the dataset passed over opens a new
    epoch rather than walk for ever. The epoch is not saved: after a resume every prompt's next row is drawn."""

    def __init__(self, sampler: Sampler, dataset_size: int) -> None:
        if dataset_size < 1:
            raise ValueError("a gated prompt stream needs a non-empty dataset")
        self.sampler = sampler
        self.dataset_size = dataset_size
        self.epoch = 0
        self.kept = 0  # prompts kept with a signal in the current epoch
        self.visited: set[str] = set()  # keys of the prompts drawn in the current epoch
        self.passed_in_a_row = 0  # rows passed over since the last one drawn
        self.passed_over_total = 0  # since the worker started
        self._passed_over_reported = 0

    def passes_over(self, key: Hashable, row_id: int) -> bool:
        """Whether the stream passes over row `row_id`, of prompt `key` (it is then not drawn); else it is drawn."""
        name = str(key)
        if name not in self.visited:  # the loader's visit of this epoch
            self.visited.add(name)
            self.passed_in_a_row = 0
            return False
        if not self.sampler.refill_passes_over(key):
            self.passed_in_a_row = 0
            return False
        self.passed_over_total += 1
        self.passed_in_a_row += 1
        if self.passed_in_a_row >= self.dataset_size:
            self._next_epoch()
        return True

    def take_passed_over(self) -> int:
        """The rows passed over since the last call (the first: since the worker started)."""
        count = self.passed_over_total - self._passed_over_reported
        self._passed_over_reported = self.passed_over_total
        return count

    def count_kept(self, prompts: int) -> None:
        """`prompts` more prompts were kept with a signal (a finished batch's)."""
        self.kept += prompts
        while self.kept >= self.dataset_size:
            self.kept -= self.dataset_size
            self._next_epoch()

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.visited = set()
        self.passed_in_a_row = 0


class PriorityWalk:
    """A prompt-choosing sampler's draw ([`ChoosesPrompts`], `sampler="spo"`) on the worker's one prompt stream (the
    dataset walk, in TRL's order, by row id): each row is drawn with probability its prompt's priority over the
    sampler's largest, else passed over and settled like a gate's (dropped and counted). Over the walk a prompt is then
    drawn in proportion to its priority, as the synchronous trainer's weighted draw does, and TRL's resume position
    keeps counting rows. A row's coin comes from (`seed`, row id), so it does not depend on when the row is met."""

    def __init__(self, sampler: ChoosesPrompts, dataset_size: int, seed: int) -> None:
        if dataset_size < 1:
            raise ValueError("a prompt stream needs a non-empty dataset")
        self.sampler = sampler
        self.dataset_size = dataset_size
        self.seed = seed
        self.passed_in_a_row = 0
        self.passed_over_total = 0
        self._passed_over_reported = 0

    def passes_over(self, key: Hashable, row_id: int) -> bool:
        """Whether the stream passes over row `row_id`, of prompt `key` (it is then not drawn); else it is drawn."""
        # A whole walk of the dataset passed over (priorities near 0 everywhere) draws the next row: never stuck.
        if self.passed_in_a_row >= self.dataset_size:
            self.passed_in_a_row = 0
            return False
        priority = self.sampler.prompt_priorities([key])[0]
        coin = random.Random(f"{self.seed}:{row_id}").random()
        if coin * self.sampler.max_priority() < priority:
            self.passed_in_a_row = 0
            return False
        self.passed_in_a_row += 1
        self.passed_over_total += 1
        return True

    def take_passed_over(self) -> int:
        """The rows passed over since the last call (the first: since the worker started)."""
        count = self.passed_over_total - self._passed_over_reported
        self._passed_over_reported = self.passed_over_total
        return count


@dataclass
class WorkerState:
    """What the rollout worker answers when the trainer asks (at a save): one moment of its event loop."""

    sampler: dict[str, Any]
    """`Sampler.state_dict()`."""
    counted_below: int
    """Every row id (TRL's, from the run's `dataset_start_index`) below it has been counted by the sampler."""
    counted_above: list[int] = field(default_factory=list)
    """The rows counted at or above `counted_below` (rows finish out of order while others are open)."""
    dropped: list[int] = field(default_factory=list)
    """The rows finished without a sample since the previous answer (the trainer keeps them for the resume position)."""
    passed_over: list[int] = field(default_factory=list)
    """The rows a refill gate passed over ([`StreamGate`]): settled, though the sampler counted no draw of them."""

    def counted_from(self, first: int) -> list[int]:
        """The rows counted whose id is `first` or more: what a resume at `first` would draw and count again."""
        settled = [*range(first, self.counted_below), *(row for row in self.counted_above if row >= first)]
        passed_over = set(self.passed_over)
        return [row for row in settled if row not in passed_over]


class SamplerStateChannel:
    """How the trainer asks the rollout worker for a [`WorkerState`]: two queues of a `multiprocessing` context,
    passed as its loop's `ada_state_channel`. The worker's event loop answers each request with the state pickled
    there, so the answer is one consistent moment of the loop and costs it nothing between saves."""

    def __init__(self, context: Any = None) -> None:
        context = context or multiprocessing.get_context("spawn")
        self.requests = context.Queue()
        self.answers = context.Queue()
        self._asked = 0

    def __getstate__(self) -> dict[str, Any]:
        # The queues travel only while a process is spawned; TRL's `start()` first pickles the loop's arguments as a
        # check, where a queue would raise: that copy, never used, goes without them.
        if multiprocessing.context.get_spawning_popen() is None:
            return {**self.__dict__, "requests": None, "answers": None}
        return self.__dict__

    def ask(self, timeout: float, check: Callable[[], None] | None = None) -> WorkerState:
        """The worker's answer to a new request (answers to abandoned ones are skipped), calling `check` (its health
        check) every half second while waiting; after `timeout` seconds without an answer, `TimeoutError`."""
        self._asked += 1
        self.requests.put(self._asked)
        deadline = time.monotonic() + timeout
        while True:
            try:
                number, payload = self.answers.get(timeout=0.5)
            except queue.Empty:
                if check is not None:
                    check()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the rollout worker did not send its sampler state within {timeout:g} s"
                    ) from None
                continue
            if number == self._asked:
                return pickle.loads(payload)


@contextlib.contextmanager
def _updates_skipping(estimator: Any, skip: set[int]) -> Iterator[None]:
    """While open, `estimator.update(keys, totals, positives)` leaves out the prompts at the indices in `skip`."""
    if estimator is None or not skip:
        yield
        return
    update = estimator.update

    def update_the_others(keys: Sequence[Any], totals: Sequence[int], positives: Sequence[int]) -> None:
        keep = [i for i in range(len(keys)) if i not in skip]
        update([keys[i] for i in keep], [totals[i] for i in keep], [positives[i] for i in keep])

    estimator.update = update_the_others
    try:
        yield
    finally:
        estimator.update = update


@dataclass
class _Draw:
    batch: int
    prompt: int
    draw: int


@dataclass
class _Batch:
    step: Any  # ContinuousStep | SingleRequestStep
    rows: list[dict[str, Any]]
    row_ids: list[int]  # TRL's group id of each row (its position in the row stream): the id its samples carry
    opened_at: float
    # (prompt, draw) -> its RolloutSamples (a conversation may fork)
    samples: dict[tuple[int, int], list[Any]] = field(default_factory=dict)
    versions: dict[int, list[int]] = field(default_factory=dict)  # prompt -> the policy version of each of its draws


@dataclass
class _KeptPrompt:
    """A prompt of a finished generation batch whose samples the stream hands to the trainer."""

    result: PromptResult
    pool: tuple[float, ...]
    row_id: int
    samples: dict[int, list[Any]]  # draw -> its RolloutSamples


class AdaRolloutLoop(_AsyncRolloutLoop):
    """TRL's `_AsyncRolloutLoop` drawing Reinforce-Ada pools (see the module docstring), in the worker process."""

    def __init__(
        self,
        *,
        ada_sampling: AsyncSampling,
        ada_state_channel: SamplerStateChannel | None = None,
        ada_rows_already_counted: Sequence[int] = (),
        **kwargs: Any,
    ) -> None:
        """TRL's keyword arguments plus `ada_sampling`; `ada_state_channel` answers the trainer's requests for the
        sampler's state; `ada_rows_already_counted` (a resume's): rows whose next draws the estimator does not count."""
        self.ada_sampling = ada_sampling
        self._state_channel = ada_state_channel
        self._rows_already_counted = set(ada_rows_already_counted)
        if ada_sampling.pooled:
            kwargs["num_generations"] = 1  # every draw is a TRL group of its own (see the module docstring)
        super().__init__(**kwargs)
        self.sampler = ada_sampling.new_sampler()
        if ada_sampling.initial_state is not None:
            self.sampler.load_state_dict(ada_sampling.initial_state)
        self._batches: dict[int, _Batch] = {}
        self._draws: dict[int, _Draw] = {}  # TRL group id -> the draw it is
        # Draws to submit: the next blocks of prompts already open go before the first draws of a new batch.
        self._continuing: deque[tuple[int, dict[str, Any]]] = deque()
        self._fresh: deque[tuple[int, dict[str, Any]]] = deque()
        self._next_group_id = 0
        self._next_batch = 0
        self._rows: Iterator[tuple[int, dict[str, Any]]] | None = None
        self._dropped: set[int] = set()  # rows finished without a sample since the trainer last asked
        # Rows whose draws the sampler counted (`WorkerState.counted_below`, `counted_above`).
        self._counted_below = 0
        self._counted_above: set[int] = set()
        self._server_failing_since: float | None = None  # monotonic time of the first failure since a success
        self._last_answer_at = time.monotonic()  # of the last request answered (any request: they run concurrently)
        self._health_checked_at = -math.inf
        # DAPO's bound (`_count_dapo_prompt`): prompts judged since the last batch's worth of prompts with a signal.
        self._dapo_prompts_judged = 0
        self._dapo_prompts_with_signal = 0
        # What passes over rows of the stream (`_next_row`): `dapo_gated`'s refill gate or a prompt-choosing sampler's
        # priority walk; and the rows it passed over.
        self._gate: StreamGate | PriorityWalk | None = None
        if gates_refills(ada_sampling.settings):
            self._gate = StreamGate(self.sampler, len(self.dataset))
        elif isinstance(self.sampler, ChoosesPrompts):
            self._gate = PriorityWalk(self.sampler, len(self.dataset), ada_sampling.settings.seed)
        self._passed_over_rows: set[int] = set()
        self._kept_for_the_update: list[_KeptPrompt] = []  # `AsyncSampling.normalises_over_the_update`

    # -- the work iterator ------------------------------------------------------------------------------------------

    def _repeat_iterator(self) -> Iterator[tuple[int, dict[str, Any]]]:
        if not self.ada_sampling.pooled:
            yield from super()._repeat_iterator()
            return
        # TRL's iterator with num_generations=1 yields each row once, cycling the dataset: the row stream.
        self._rows = super()._repeat_iterator()
        empty_batches = 0
        while True:
            if self._continuing:
                yield self._continuing.popleft()
            elif self._fresh:
                yield self._fresh.popleft()
            elif self._open_batch():
                empty_batches = 0
            else:
                empty_batches += 1
                if empty_batches >= MAX_EMPTY_BATCHES:
                    raise RuntimeError(
                        f"{MAX_EMPTY_BATCHES} generation batches in a row asked for no draws: every prompt was "
                        f"skipped as predicted unmixed (skip_unmixed_above={self.ada_sampling.settings.skip_unmixed_above}"
                        "). Raise skip_unmixed_above, or remove it."
                    )

    def _open_batch(self) -> bool:
        """Begin the next generation batch and queue its first draws; `False` when it asks for none."""
        items = [self._next_row() for _ in range(self.ada_sampling.prompts_per_batch)]
        rows = [row for _, row in items]
        batch_id, self._next_batch = self._next_batch, self._next_batch + 1
        step = begin_streaming(self.sampler, len(rows), prompt_keys(rows))
        row_ids = [row_id for row_id, _ in items]
        self._batches[batch_id] = _Batch(step=step, rows=rows, row_ids=row_ids, opened_at=time.monotonic())
        if self._queue_draws(batch_id, self._fresh):
            return True
        self._finish_batches({batch_id})  # every prompt skipped: its statistics still count
        return False

    def _next_row(self) -> tuple[int, dict[str, Any]]:
        """The next row of the stream to draw: past those a refill gate passes over ([`StreamGate`]), each finished
        without a draw (dropped, for TRL's resume position, and counted: its sampler has nothing to count of it)."""
        while True:
            row_id, row = next(self._rows)
            if self._gate is None or not self._gate.passes_over(prompt_key(row), row_id):
                return row_id, row
            self._drop_row(row_id)
            self._count_rows([row_id])
            if row_id not in self._rows_already_counted:  # else the loaded state did count its earlier draws
                self._passed_over_rows.add(row_id)

    def _queue_draws(self, batch_id: int, queue: deque[tuple[int, dict[str, Any]]]) -> int:
        batch = self._batches[batch_id]
        pairs = batch.step.to_submit()
        for prompt, draw in pairs:
            group_id, self._next_group_id = self._next_group_id, self._next_group_id + 1
            self._draws[group_id] = _Draw(batch_id, prompt, draw)
            queue.append((group_id, batch.rows[prompt]))
        return len(pairs)

    # -- scoring ----------------------------------------------------------------------------------------------------

    async def _score_group(self, group: Any) -> list[Any]:
        if not self.ada_sampling.pooled:
            return await self._score_update_group(group)
        groups = [group, *take_waiting_groups(self)]
        samples = await self._scored(merge_rollout_groups(groups))
        per_draw = samples_per_conversation(groups, samples)
        touched = {self._draws[one.group_id].batch for one in groups}
        for batch_id in touched:
            self._batches[batch_id].step.stats.scoring_batches += 1  # one reward call served this batch
        for one, (rewards, draw_samples) in zip(groups, per_draw, strict=True):
            draw = self._draws.pop(one.group_id)
            batch = self._batches[draw.batch]
            for sample in draw_samples:  # its own draw's version and id, not the merged group's
                sample.model_version, sample.group_id = one.model_version, one.group_id
            batch.samples[(draw.prompt, draw.draw)] = draw_samples
            batch.versions.setdefault(draw.prompt, []).append(one.model_version)
            batch.step.complete(draw.prompt, draw.draw, rewards)
            self._queue_draws(draw.batch, self._continuing)
        return self._finish_batches(touched)

    def _finish_batches(self, batch_ids: set[int]) -> list[Any]:
        """Finish those of `batch_ids` (the batches a scoring call touched) whose every prompt is done."""
        kept = []
        for batch_id in sorted(b for b in batch_ids if self._batches[b].step.done):
            batch = self._batches.pop(batch_id)
            # A resumed run's rows that the checkpoint's state already counted are not counted twice.
            again = {prompt for prompt, row in enumerate(batch.row_ids) if row in self._rows_already_counted}
            with contextlib.ExitStack() as skipping:
                for memory in draw_memories(self.sampler):
                    skipping.enter_context(_updates_skipping(memory, again))
                selection = batch.step.finish()
            self._rows_already_counted.difference_update(batch.row_ids)
            self._count_rows(batch.row_ids)
            batch.step.stats.seconds = time.monotonic() - batch.opened_at
            metrics = {**selection.metrics, **batch.step.stats.metrics()}
            dropped = 0
            spans = []
            taken = [True] * len(selection.prompts)  # the prompts whose samples the stream hands to the trainer
            for prompt, result in enumerate(selection.prompts):
                if self.ada_sampling.settings.refills:
                    self._count_dapo_prompt(result.has_signal)
                samples = {}
                if dapo.drops(self.ada_sampling.settings, result.has_signal):
                    dropped += 1
                else:
                    versions = batch.versions.get(prompt, [])
                    spans.append(max(versions) - min(versions) if versions else 0)
                    samples = {draw: batch.samples.get((prompt, draw), []) for draw in result.kept}
                if not any(samples.values()):  # dropped, no draw (all skipped), or none with a training sequence
                    taken[prompt] = False
                    self._drop_row(batch.row_ids[prompt])
                    continue
                kept_prompt = _KeptPrompt(result, selection.pools[prompt], batch.row_ids[prompt], samples)
                if self.ada_sampling.normalises_over_the_update:
                    self._kept_for_the_update.append(kept_prompt)
                else:
                    kept += self._samples_of(kept_prompt, result)
            kept += self._finish_updates()
            if self.ada_sampling.settings.refills:
                metrics["dapo/prompts_dropped_total"] = float(dropped)
            # The rows passed over are an increment, so a `total`, which TRL's log window sums.
            if isinstance(self._gate, StreamGate):
                self._gate.count_kept(len(selection.prompts) - dropped)
                metrics["gate/passed_over_total"] = float(self._gate.take_passed_over())
                metrics["gate/stream_epoch"] = float(self._gate.epoch)
            elif self._gate is not None:
                metrics["priority/passed_over_total"] = float(self._gate.take_passed_over())
            metrics["async/pool_version_span_max"] = float(max(spans, default=0))
            # Where the draws went (`draws/*`), as rates over the log window, in place of the step's per-batch shares.
            pushed: dict[str, float | tuple[float, float]] = {
                f"ada/{name}": value
                for name, value in metrics.items()
                if not (math.isnan(value) or name.startswith("draws/"))
            }
            rates = draw_rates(selection_draws(selection.prompts, selection.pools, in_update=taken))
            pushed.update({f"ada/{name}": rate for name, rate in rates.items()})
            pushed.update(advantage_metrics([sample.advantage for sample in kept]))
            self._push_metrics(pushed)
        return kept

    def _finish_updates(self) -> list[Any]:
        """The samples of each whole update's worth of DAPO's held prompts, their weights normalised together."""
        unit = self.ada_sampling.prompts_per_batch
        samples = []
        while len(self._kept_for_the_update) >= unit:
            update, self._kept_for_the_update = self._kept_for_the_update[:unit], self._kept_for_the_update[unit:]
            kept_rewards = [[held.pool[draw] for draw in held.result.kept] for held in update]
            results = finish_update([held.result for held in update], kept_rewards, self.ada_sampling.settings)
            for held, result in zip(update, results, strict=True):
                samples += self._samples_of(held, result)
        return samples

    def _samples_of(self, kept: _KeptPrompt, result: PromptResult) -> list[Any]:
        """A kept prompt's samples with the advantages of `result`, under one group id: TRL's row id for it."""
        samples = []
        pool_std = rules.mean_and_std(kept.pool)[1]
        for draw, advantage in zip(result.kept, result.advantages, strict=True):
            for sample in kept.samples[draw]:
                sample.advantage = float(advantage)
                # TRL's group id for the row (its row counter): what its resume and epoch counting read.
                sample.group_id = kept.row_id
                sample.metrics["reward_std"] = pool_std  # TRL's reward_std: the rewards the baseline reads
                samples.append(sample)
        oldest = min(sample.model_version for sample in samples)
        for sample in samples:
            sample.metrics[GROUP_VERSION_KEY] = float(oldest)  # kept or dropped whole for staleness
        return samples

    def _count_rows(self, row_ids: Sequence[int]) -> None:
        """Record that the sampler counted `row_ids` (compactly: rows finish nearly in order)."""
        self._counted_above.update(row_ids)
        while self._counted_below in self._counted_above:
            self._counted_above.remove(self._counted_below)
            self._counted_below += 1

    def _drop_row(self, row_id: int) -> None:
        """Record that row `row_id` is done without a sample, which TRL's resume position would otherwise stop at."""
        self._dropped.add(row_id)

    def worker_state(self) -> WorkerState:
        """The state the trainer asks for ([`WorkerState`]); the dropped rows it hands over are forgotten here."""
        state = WorkerState(
            sampler=self.sampler.state_dict(),
            counted_below=self._counted_below,
            # The rows a resumed run's loaded state counted and this run has not drawn again yet: counted too.
            counted_above=sorted(self._counted_above | self._rows_already_counted),
            dropped=sorted(self._dropped),
            passed_over=sorted(self._passed_over_rows),
        )
        self._dropped = set()
        return state

    def _answer_state_request(self, number: int) -> None:
        """On the event loop: answer request `number` with the state pickled now (the loop's one consistent moment)."""
        self._state_channel.answers.put((number, pickle.dumps(self.worker_state())))

    def _watch_state_requests(self) -> None:
        """The watcher thread: hands each request to the event loop until the loop is closed."""
        channel = self._state_channel
        while not self._loop.is_closed():
            try:
                number = channel.requests.get(timeout=1.0)
            except queue.Empty:
                continue
            except (EOFError, OSError):  # the trainer's end of the queue is gone
                return
            try:
                self._loop.call_soon_threadsafe(self._answer_state_request, number)
            except RuntimeError:  # the loop closed meanwhile: the trainer's health check reports why
                return

    def run(self) -> None:
        if self._state_channel is not None:
            threading.Thread(target=self._watch_state_requests, daemon=True, name="ada-state-requests").start()
        super().run()

    async def _scored(self, group: Any) -> list[Any]:
        """TRL's `_score_group`; an error of a reward function names it (the parent only sees this message)."""
        try:
            return await super()._score_group(group)
        except Exception as error:
            name = failing_reward_name(error, self.reward_funcs, self.reward_func_names)
            raise RuntimeError(
                f"{name} raised while the rollout worker scored draws for policy version {group.model_version}: "
                f"{type(error).__name__}: {error}"
            ) from error

    async def _score_update_group(self, group: Any) -> list[Any]:
        """A group of `num_generations` (TRL's): its own advantages; without a signal it is dropped under DAPO."""
        samples = await self._scored(group)
        settings = self.ada_sampling.settings
        rewards = [r for r, _ in samples_per_conversation([group], samples)]
        has_signal = dapo.group_has_signal(rewards, settings)
        metrics: dict[str, float | tuple[float, float]] = {}
        if settings.refills:
            dropped = dapo.drops(settings, has_signal)
            metrics.update({"ada/dapo/groups_dropped_total": float(dropped), "ada/dapo/groups_total": 1.0})
            self._count_dapo_prompt(not dropped)
            if dropped:
                samples = []
        # Where the draws went (`draws/*`): this group's part of the log window's rates.
        positives, negatives = rules.count_outcomes(rewards, settings.positive_threshold)
        pass_rate = positives / (positives + negatives) if positives + negatives else math.nan
        useful = has_signal and bool(samples)
        group_draws = PromptDraws(pass_rate, len(rewards), useful, len(rewards) if useful else 0)
        metrics.update({f"ada/{name}": rate for name, rate in draw_rates([group_draws]).items()})
        metrics.update(advantage_metrics([sample.advantage for sample in samples]))
        self._push_metrics(metrics)
        if not samples:
            self._drop_row(group.group_id)  # TRL's group id is the row's id here (`_repeat_iterator`)
        return samples

    def _count_dapo_prompt(self, has_signal: bool) -> None:
        """DAPO's bound (`dapo_max_refills`): once `dapo_max_refills + 1` batches' worth of prompts in a row have
        not given one batch's worth with a signal, raise `BatchExhaustedError` rather than draw and drop for ever."""
        settings = self.ada_sampling.settings
        batch = self.ada_sampling.prompts_per_batch
        self._dapo_prompts_judged += 1
        self._dapo_prompts_with_signal += bool(has_signal)
        if self._dapo_prompts_with_signal >= batch:
            self._dapo_prompts_judged = self._dapo_prompts_with_signal = 0
            return
        if self._dapo_prompts_judged < (settings.dapo_max_refills + 1) * batch:
            return
        message = (
            f"DAPO found only {self._dapo_prompts_with_signal} of {batch} prompts with a non-zero reward variance "
            f"(zero_variance_tolerance={settings.zero_variance_tolerance:g}) in the last {self._dapo_prompts_judged} "
            f"prompts drawn ({settings.dapo_max_refills} extra generation batches of {batch}: dapo_max_refills="
            f"{settings.dapo_max_refills}); every group of the others had a constant reward and was dropped. Check that "
            "the reward functions can tell these completions apart (a reward that always returns the same value), raise "
            "dapo_max_refills, or use sampler='seq_balance', which spends extra samples on the same prompts instead of "
            "dropping them."
        )
        logger.error(message)
        raise dapo.BatchExhaustedError(message)

    # -- a server that stopped answering ------------------------------------------------------------------------

    async def _retry(self, coro_factory: Any, *, label: str, max_attempts: int = 1) -> Any:
        # TRL's retries keep a worker whose server died retrying for hours; once requests have failed for
        # `server_timeout` seconds with none answered since, `VLLMServerUnresponsive` (not retried) ends the worker.
        timeout = self.ada_sampling.server_timeout
        if timeout is None:
            return await super()._retry(coro_factory, label=label, max_attempts=max_attempts)
        import aiohttp

        async def attempt() -> Any:
            request = asyncio.ensure_future(coro_factory())
            try:
                # A server that accepts and never answers fails only after `request_timeout`: watch `/health`.
                while not (await asyncio.wait({request}, timeout=HEALTH_POLL_S))[0]:
                    await self._check_server_answers(label, timeout)
                result = request.result()
            except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as error:
                now = time.monotonic()
                if self._server_failing_since is None:
                    self._server_failing_since = now
                if now - self._server_failing_since >= timeout:
                    last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                    raise VLLMServerUnresponsive(
                        f"{label} to {self.vllm_server_url} has failed for {now - self._server_failing_since:.0f} s "
                        f"with no request answered since (vllm_server_timeout={timeout:g}, request_timeout="
                        f"{self.request_timeout}; last: {last})"
                    ) from error
                raise
            finally:
                if not request.done():
                    request.cancel()
            self._server_failing_since = None
            self._last_answer_at = time.monotonic()
            return result

        return await super()._retry(attempt, label=label, max_attempts=max_attempts)

    async def _check_server_answers(self, label: str, timeout: float) -> None:
        """Raise `VLLMServerUnresponsive` once no request has been answered for `timeout` seconds and `/health` (asked
        at most once per `HEALTH_POLL_S`) does not answer either; a slow server that answers it is left alone."""
        import aiohttp

        now = time.monotonic()
        silent = now - self._last_answer_at
        if silent < timeout or now - self._health_checked_at < HEALTH_POLL_S:
            return
        self._health_checked_at = now
        probe = min(HEALTH_PROBE_TIMEOUT_S, timeout)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=probe)) as session:
                async with session.get(f"{self.vllm_server_url}/health") as response:
                    if response.status == 200:
                        return
                    answer = f"status {response.status}"
        except (TimeoutError, aiohttp.ClientError, OSError) as error:
            answer = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        raise VLLMServerUnresponsive(
            f"{label} to {self.vllm_server_url} has failed for {silent:.0f} s with no request answered since, and "
            f"/health does not answer ({answer}; vllm_server_timeout={timeout:g}, request_timeout={self.request_timeout})"
        )


def _set_within(event: Any, timeout: float) -> bool:
    """`event.set()` (a multiprocessing Event) in a daemon thread; whether it returned within `timeout` seconds."""
    setter = threading.Thread(target=event.set, daemon=True, name="ada-rollout-stop")
    setter.start()
    setter.join(timeout)
    return not setter.is_alive()


class RobustAsyncRolloutWorker(AsyncRolloutWorker):
    """TRL's `AsyncRolloutWorker` and loop, with a dead child found at the next health check and a `stop()` that
    cannot hang on it."""

    def check_health(self, stale_after_s: float) -> None:
        """TRL's check, and a child process that is gone (killed, or exited without reporting) fails it at once
        rather than once its heartbeat is `stale_after_s` old."""
        if self._failed_event.is_set():
            # The child's error travels through a queue's feeder thread and can arrive after the event: wait for it,
            # or TRL's check would chain no error.
            arrival_deadline = time.monotonic() + FAILURE_REPORT_ARRIVAL_S
            while self._exception_info_queue.empty() and time.monotonic() < arrival_deadline:
                time.sleep(0.05)
        super().check_health(stale_after_s)
        process = self._process
        if process is None or process._popen is None or process.is_alive():
            return
        code = process.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exited ({code})"
        raise RuntimeError(f"Rollout worker child (pid {process.pid}) {how} without reporting an error.")

    def stop(self) -> None:
        # TRL's stop() sets a multiprocessing Event, whose set() waits for every process waiting on it: a dead child
        # never wakes, so stop() would hang. A child that is gone, or cannot be told to stop, is reaped here instead.
        process = self._process
        if process is not None and process._popen is not None:
            if self._failed_event.is_set():
                process.join(timeout=15)  # it reported its failure and is exiting
            if process.is_alive() and _set_within(self._stop_event_mp, timeout=5.0):
                super().stop()  # the child was told: TRL joins it (terminating it after 15 s)
                return
            if process.is_alive():
                logger.warning("Rollout worker child (pid %s) cannot be told to stop; killing it.", process.pid)
                process.kill()
            process.join(timeout=5)
            self._process = None
            return
        super().stop()


class AdaAsyncRolloutWorker(RobustAsyncRolloutWorker):
    """TRL's `AsyncRolloutWorker` (the spawned worker process) running [`AdaRolloutLoop`]."""

    _loop_cls = AdaRolloutLoop
