"""
The continuous schedule (`generation_schedule="continuous"`): a generation batch's draws without rounds, on a vLLM
server.

The main process drives the sampling: each prompt draws its rounds as blocks of separate one-draw requests, without
waiting for the other prompts (`trl_ada.samplers.continuous.ContinuousStep`, the pure rule this module drives, decides
the blocks, and its pools are those of rounds with the same settings). Every submitted draw enters its prompt's pool,
so a draw is scored as soon as it is back, in whatever order. Scoring runs on every process, in "scoring batches"
(every draw back since the last one): the main process broadcasts which (prompt, draw) pairs a batch holds, and every
process runs the trainer's round code on it (`trl_ada.schedules.rounds.run_round`), whose `_generate` is TRL's own,
with the server's request replaced by the completions already generated (`trl_seam.replayed_completions`). So a scoring
batch is decoded, scored, gathered and held exactly like a round, the rows stay on the process that scored them (placed
in their pool by draw index), and the step ends as rounds end: downsampling, baselines, weights and the routing of kept
rows are unchanged. Every process also runs the sampling step itself, fed the same scoring batches with the same
(gathered) rewards in the same order, so the selection and the sampler's state (its generator, tracker or learned
predictor) come out the same everywhere, as in rounds, without being sent: of the schedule's own messages, only each
scoring batch's (prompt, draw) pairs cross processes. The weights are pushed once, before the first draw.

Failures end the step on every process. While the main process waits for draws it watches the server's `/health`
(`vllm_server_timeout`, as rounds do), so a dead or frozen server becomes a `VLLMServerError` everywhere. A reward
function or replay that fails on the main process inside a scoring batch cannot raise there at once: the other
processes sit in that batch's collectives (the completions broadcast, the reward gather). The failure is recorded,
the batch's collectives complete (the replayed completions are answered anyway, the failed rewards are NaN), and the
error is raised after the batch, when every process waits for the main process's next announcement.

The draws go through AdaGRPOTrainer's vLLM client and collectives, so [`ContinuousSchedule`]'s driver must hold the
trainer (`driver.trainer`, as `trl_ada.schedules.driver.TrainerDriver` does); the functions below take the trainer.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather

from ..generation.faults import VLLMServerError, VLLMServerUnresponsive, vllm_server_message
from ..generation.weight_sync import sync_server_weights_for_step
from ..rewards.registry import failing_reward_name
from ..samplers import ScheduleStats, Selection
from ..trl_seam import completions_payload, replayed_completions, server_sampling_params, tokenize_prompts
from . import rounds
from .base import ScheduledBatch, ScheduleDriver
from .pools import PoolEntry
from .rounds import RoundLayout
from .server_draws import ServerDrawError, ServerDraws

logger = logging.getLogger(__name__)

_SCORE, _DONE, _FAILED = "score", "done", "failed"
_SERVER, _OTHER = "server", "other"


class ContinuousSchedule:
    """Round-free: each draw its own request to the vLLM server, the exit rule checked per prompt (see above)."""

    name = "continuous"

    def sample(
        self, driver: ScheduleDriver, group_inputs: list[dict[str, Any]], keys: Sequence[Any]
    ) -> ScheduledBatch:
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
    trainer: Any, group_inputs: list[dict[str, Any]], keys: list[str], pools: list[list[PoolEntry]]
) -> tuple[Selection, ScheduleStats]:
    """
    One generation batch (`group_inputs`: one dataset row per prompt, on every process) under the continuous schedule;
    fills `pools` (every prompt's entries in submission order) and returns the selection, the same on every process.
    Collective: every process calls it.
    """
    sync_server_weights_for_step(trainer)
    stats = ScheduleStats()
    entries: list[dict[int, PoolEntry]] = [{} for _ in group_inputs]  # per prompt: pool entry by draw index
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


def _drive(
    trainer: Any,
    group_inputs: list[dict[str, Any]],
    keys: list[str],
    entries: list[dict[int, PoolEntry]],
    stats: ScheduleStats,
) -> Selection:
    started = time.perf_counter()
    step = trainer.ada_sampler.begin_continuous(len(group_inputs), keys)
    step.stats = stats  # one record of the batch: the step counts its draws into it, this loop its scoring batches
    prompt_ids = tokenize_prompts(trainer, [row["prompt"] for row in group_inputs])
    client = trainer.vllm_generation.vllm_client
    payload = completions_payload(client, server_sampling_params(trainer.vllm_generation), prompt_ids[0])
    masked = trainer.mask_truncated_completions
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
                stats.scoring_batches += 1
                # TRL asks for the padded layout's rows (the padding repeats the first row: see `RoundLayout`).
                layout = RoundLayout.plan([(g, 1) for g, _ in rows], trainer.accelerator.num_processes)
                padded = [i if i < len(rows) else 0 for i in range(len(layout.padded))]
                replay = (client, payload, [prompt_ids[rows[i][0]] for i in padded], [back[i][1] for i in padded])
                scored = _score_batch(trainer, group_inputs, rows, stats.scoring_batches, replay)
                for (g, draw), (entry, reward) in zip(rows, scored, strict=True):
                    entries[g][draw] = entry
                    step.complete(g, draw, reward, masked=masked and entry.truncated)
    except (ServerDrawError, VLLMServerUnresponsive) as error:
        during = f"continuous sampling (the draws of scoring batch {stats.scoring_batches + 1})"
        raise VLLMServerError(vllm_server_message(trainer, None, error, during=during)) from error
    stats.seconds = time.perf_counter() - started
    return step.finish()


def _follow(
    trainer: Any,
    group_inputs: list[dict[str, Any]],
    keys: list[str],
    entries: list[dict[int, PoolEntry]],
    stats: ScheduleStats,
) -> Selection:
    """
    A process other than the main one: score the batches the main process announces, until it says done, and run the
    sampling step as the main process does (`_drive`: the draws submitted before each batch, then the batch's draws
    completed in its order); return the step's selection.
    """
    started = time.perf_counter()
    step = None  # begun with the first announcement, so a failure the main process announces first is raised first
    masked = trainer.mask_truncated_completions
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
        stats.scoring_batches += 1
        scored = _score_batch(trainer, group_inputs, content, stats.scoring_batches)
        for (g, draw), (entry, reward) in zip(content, scored, strict=True):
            entries[g][draw] = entry
            step.complete(g, draw, reward, masked=masked and entry.truncated)


def _score_batch(
    trainer: Any,
    group_inputs: list[dict[str, Any]],
    rows: list[tuple[int, int]],
    batch_index: int,
    replay: tuple[Any, dict[str, Any], list[list[int]], list[dict]] | None = None,
) -> list[tuple[PoolEntry, float]]:
    """
    Score one batch of (prompt, draw) rows on every process (the main process passes `replay`: the client, payload,
    prompt ids and choices its completions are answered with); return each row's pool entry and reward. A failure of
    the replay or of a reward function on this process is raised after the batch's collectives have completed.
    """
    requests = [(g, 1) for g, _ in rows]  # one row per draw: TRL then asks for each prompt with n=1
    mismatches: list[BaseException] = []
    reward_failures: list[BaseException] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_contained_rewards(trainer, reward_failures))
        if replay is not None:
            client, payload, prompt_ids, choices = replay
            stack.enter_context(replayed_completions(client, payload, prompt_ids, choices, mismatches=mismatches))
        order, entries, rewards = rounds.run_round(trainer, requests, group_inputs, batch_index)
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
    return list(zip(entries, rewards, strict=True))


@contextlib.contextmanager
def _contained_rewards(trainer: Any, failures: list[BaseException]) -> Iterator[None]:
    """
    While scoring a batch, a reward computation that raises on this process is recorded in `failures` and answered
    with NaN rewards, gathered as TRL's `_calculate_rewards` ends (the other processes wait in that gather).
    """
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
