"""The continuous schedule (`generation_schedule="continuous"`): a generation batch's draws without rounds, on a vLLM
server.

The main process submits each prompt's blocks as one-draw requests (`ContinuousStep`, the pure rule, decides them) and
scores every draw back since the last "scoring batch". Every process scores a batch with the trainer's round code
(`rounds.run_round`: TRL's own `_generate`, its server request answered with the completions already drawn by
`trl_seam.vllm_generation.replayed_completions`) and runs the sampling step itself on the same gathered rewards, so
only each batch's (prompt, draw) pairs cross processes and the selection and sampler state come out the same
everywhere. A failure on the main process is announced to the others; one inside a scoring batch (a reward function,
the replay) is raised after the batch's collectives complete, so no process waits for ever.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather

from ..generation.faults import VLLMServerError, VLLMServerUnresponsive, vllm_server_message
from ..generation.weight_sync import sync_server_weights_for_step
from ..rewards.reward_registry import failing_reward_name
from ..samplers import Selection
from ..samplers.streaming import ScheduleStats
from ..trl_seam.grpo_private import tokenize_prompts
from ..trl_seam.vllm_generation import completions_payload, replayed_completions, server_sampling_params
from . import rounds
from .pools import PoolEntry
from .rounds import RoundLayout
from .schedule import ScheduledBatch, ScheduleDriver
from .server_draws import ServerDrawError, ServerDraws

_SCORE, _DONE, _FAILED = "score", "done", "failed"
_SERVER, _OTHER = "server", "other"

_Rows = list[dict[str, Any]]
"""One dataset row per prompt of the batch."""
_Entries = list[dict[int, PoolEntry]]
"""Per prompt: its pool entries by draw index."""


class ContinuousSchedule:
    """Round-free: each draw its own request to the vLLM server, the exit rule checked per prompt (see above)."""

    name = "continuous"

    def sample(self, driver: ScheduleDriver, group_inputs: _Rows, keys: Sequence[Any]) -> ScheduledBatch:
        trainer = getattr(driver, "trainer", None)
        if trainer is None:
            raise TypeError(
                "generation_schedule='continuous' draws from AdaGRPOTrainer's vLLM server on every process; its "
                "driver must hold that trainer (trl_ada.schedules.driver.TrainerDriver)."
            )
        pools: list[list[PoolEntry]] = [[] for _ in group_inputs]
        selection, stats = sample_continuously(trainer, group_inputs, keys, pools)
        return ScheduledBatch(selection, pools, stats)


def sample_continuously(
    trainer: Any, group_inputs: _Rows, keys: list[str], pools: list[list[PoolEntry]]
) -> tuple[Selection, ScheduleStats]:
    """One generation batch (`group_inputs`: one dataset row per prompt, on every process) under the continuous
    schedule; fills `pools` (every prompt's entries in submission order) and returns the selection, the same on
    every process. Collective: every process calls it."""
    sync_server_weights_for_step(trainer)
    stats = ScheduleStats()
    entries: _Entries = [{} for _ in group_inputs]
    if trainer.accelerator.is_main_process:
        try:
            selection = _drive(trainer, group_inputs, keys, entries, stats)
        except BaseException as error:
            # A lost server is the same error, word for word, on every process; anything else names its type.
            if isinstance(error, VLLMServerError):
                broadcast_object_list([(_FAILED, (_SERVER, str(error)))])
            else:
                broadcast_object_list([(_FAILED, (_OTHER, f"{type(error).__name__}: {error}"))])
            raise
        broadcast_object_list([(_DONE, None)])
    else:
        # The same step, fed the same scoring batches and rewards in the same order: the selection and the sampler's
        # state (generator, tracker, learned predictor) come out as on the main process, with nothing sent but the
        # batches' (prompt, draw) pairs.
        selection = _follow(trainer, group_inputs, keys, entries, stats)
    for pool, by_draw, rewards in zip(pools, entries, selection.pools, strict=True):
        # Every submitted draw entered the pool: draws 0..k-1, k the pool's size.
        pool.extend(by_draw[draw] for draw in range(len(rewards)))
    return selection, stats


def _drive(trainer: Any, group_inputs: _Rows, keys: list[str], entries: _Entries, stats: ScheduleStats) -> Selection:
    started = time.perf_counter()
    step = trainer.ada_sampler.begin_continuous(len(group_inputs), keys)
    step.stats = stats  # one record of the batch: the step counts its draws into it, this loop its scoring batches
    prompt_ids = tokenize_prompts(trainer, [row["prompt"] for row in group_inputs])
    client = trainer.vllm_generation.vllm_client
    payload = completions_payload(client, server_sampling_params(trainer.vllm_generation), prompt_ids[0])
    timeout = float(trainer.args.vllm_server_timeout)
    try:
        with ServerDraws(client.base_url, payload, trainer.args.continuous_max_in_flight, timeout) as draws:
            while not step.done:
                for prompt, draw in step.to_submit():
                    draws.submit((prompt, draw), prompt_ids[prompt])
                # Every draw back is in its prompt's pool (ContinuousStep submits nothing past an exit check): score
                # all of them now, whatever their order.
                back = sorted(draws.wait())
                if not back:  # wait() returns nothing only when nothing is in flight
                    raise RuntimeError("continuous schedule: nothing in flight, yet some prompt is not done")
                rows = [key for key, _ in back]
                broadcast_object_list([(_SCORE, rows)])
                # TRL asks for the padded layout's rows (the padding repeats the first row: see `RoundLayout`).
                layout = RoundLayout.plan([(g, 1) for g, _ in rows], trainer.accelerator.num_processes)
                padded = [i if i < len(rows) else 0 for i in range(len(layout.padded))]
                replay = (client, payload, [prompt_ids[rows[i][0]] for i in padded], [back[i][1] for i in padded])
                _score_batch(trainer, step, group_inputs, rows, entries, replay)
    except (ServerDrawError, VLLMServerUnresponsive) as error:
        during = f"continuous sampling (the draws of scoring batch {stats.scoring_batches + 1})"
        raise VLLMServerError(vllm_server_message(trainer, None, error, during=during)) from error
    stats.seconds = time.perf_counter() - started
    return step.finish()


def _follow(trainer: Any, group_inputs: _Rows, keys: list[str], entries: _Entries, stats: ScheduleStats) -> Selection:
    """A process other than the main one: score the batches the main process announces, until it says done, and run the
    sampling step as the main process does (`_drive`: the draws submitted before each batch, then the batch's draws
    completed in its order); return the step's selection."""
    started = time.perf_counter()
    step = None  # begun with the first announcement, so a failure the main process announces first is raised first
    while True:
        [(kind, content)] = broadcast_object_list([None])
        if kind == _FAILED:
            failure, message = content
            if failure == _SERVER:
                raise VLLMServerError(message)
            raise RuntimeError(f"The main process's continuous sampling failed: {message}")
        if step is None:
            step = trainer.ada_sampler.begin_continuous(len(group_inputs), keys)
            step.stats = stats
        if kind == _DONE:
            stats.seconds = time.perf_counter() - started
            return step.finish()
        step.to_submit()
        _score_batch(trainer, step, group_inputs, content, entries)


def _score_batch(
    trainer: Any,
    step: Any,
    group_inputs: _Rows,
    rows: list[tuple[int, int]],
    entries: _Entries,
    replay: tuple[Any, dict[str, Any], list[list[int]], list[dict]] | None = None,
) -> None:
    """Score one batch of (prompt, draw) rows on every process (the main process passes `replay`: the client,
    payload, prompt ids and choices its completions are answered with), store each row's pool entry in `entries` and
    complete its draw in `step`. A failure of the replay or of a reward function on this process is raised after the
    batch's collectives have completed."""
    step.stats.scoring_batches += 1
    batch_index = step.stats.scoring_batches
    requests = [(g, 1) for g, _ in rows]  # one row per draw: TRL then asks for each prompt with n=1
    mismatches: list[BaseException] = []
    reward_failures: list[BaseException] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_contained_rewards(trainer, reward_failures))
        if replay is not None:
            client, payload, prompt_ids, choices = replay
            stack.enter_context(replayed_completions(client, payload, prompt_ids, choices, mismatches=mismatches))
        order, scored, rewards = rounds.run_round(trainer, requests, group_inputs, batch_index)
    if mismatches or reward_failures:
        where = f"scoring batch {batch_index} of training step {trainer.state.global_step + 1}"
    if mismatches:
        raise RuntimeError(f"The continuous schedule's replay failed during {where}: {mismatches[0]}")
    if reward_failures:
        error = reward_failures[0]
        raise RuntimeError(
            f"{failing_reward_name(error, trainer.reward_funcs, trainer.reward_func_names)} raised during {where}: "
            f"{type(error).__name__}: {error}. Checkpoints saved so far are intact; fix the reward function and "
            "resume with resume_from_checkpoint."
        ) from error
    assert order == [g for g, _ in rows]
    masked = trainer.mask_truncated_completions
    for (g, draw), entry, reward in zip(rows, scored, rewards, strict=True):
        entries[g][draw] = entry
        step.complete(g, draw, reward, masked=masked and entry.truncated)


@contextlib.contextmanager
def _contained_rewards(trainer: Any, failures: list[BaseException]) -> Iterator[None]:
    """While scoring a batch, a reward computation that raises on this process is recorded in `failures` and answered
    with NaN rewards, gathered as TRL's `_calculate_rewards` ends (the other processes wait in that gather)."""
    calculate = trainer._calculate_rewards

    def contained(inputs: Any, prompts: list, completions: list, completion_ids_list: list) -> torch.Tensor:
        try:
            return calculate(inputs, prompts, completions, completion_ids_list)
        except Exception as error:
            failures.append(error)
            shape = (len(prompts), len(trainer.reward_funcs))
            return gather(torch.full(shape, torch.nan, device=trainer.accelerator.device))

    trainer._calculate_rewards = contained  # an instance attribute shadows the method for this batch only
    try:
        yield
    finally:
        del trainer._calculate_rewards
