"""
The continuous schedule (`generation_schedule="continuous"`): a generation batch's draws without rounds, on a vLLM
server.

The main process drives the sampling: it keeps each active prompt's draws in flight on the server (how many is the
round policy's, `trl_ada.samplers.continuous.ContinuousStep`), collects completions as they return, and aborts the
draws of a prompt that exited. A returned draw is scored when it is next in its prompt's submission order (so a draw
that is aborted, or that finished but waited behind an earlier one when its prompt exited, never reaches a reward
function). Scoring runs on every process, in small batches ("scoring batches", at most one draw per prompt each):
the main process broadcasts which prompts a batch holds, and every process runs the trainer's round code on it
(`AdaGRPOTrainer._run_round`), whose `_generate` is TRL's own, with the server's request replaced by the completions
already generated (`trl_seam.replayed_completions`). So a scoring batch is decoded, scored, gathered and held exactly
like a round, the rows stay on the process that scored them, and the step ends as rounds end: downsampling, baselines,
weights and the routing of kept rows are unchanged. The weights are pushed once, before the first draw.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from accelerate.utils import broadcast_object_list

from .pools import PoolEntry, RoundLayout
from .samplers import Selection
from .server_draws import ServerDraws
from .trl_seam import completions_payload, replayed_completions, server_sampling_params, tokenize_prompts
from .weight_sync import sync_server_weights_for_step

logger = logging.getLogger(__name__)

_SCORE, _DONE, _FAILED = "score", "done", "failed"


@dataclasses.dataclass
class ScheduleStats:
    """Where one generation batch's draws went, and its generation wall time (main process)."""

    submitted: int = 0
    scored: int = 0
    aborted_in_flight: int = 0
    """Draws still running on the server when their prompt exited: aborted there."""
    dropped_finished: int = 0
    """Draws that had finished but waited behind an earlier draw of their prompt when it exited: never scored."""
    scoring_batches: int = 0
    seconds: float = 0.0

    def metrics(self, num_prompts: int) -> dict[str, float]:
        return {
            "continuous/submitted_per_prompt": self.submitted / num_prompts,
            "continuous/aborted_in_flight": float(self.aborted_in_flight),
            "continuous/dropped_finished": float(self.dropped_finished),
            "continuous/scoring_batches": float(self.scoring_batches),
            "continuous/seconds": self.seconds,
        }


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
    if trainer.accelerator.is_main_process:
        try:
            selection = _drive(trainer, group_inputs, keys, pools, stats)
        except BaseException as error:
            broadcast_object_list([(_FAILED, f"{type(error).__name__}: {error}")])
            raise
        broadcast_object_list([(_DONE, None)])
        shared = [selection, trainer.ada_sampler.state_dict()]
    else:
        _follow(trainer, group_inputs, pools)
        shared = [None, None]
    # The sampler's generator (downsampling) and tracker advanced on the main process only.
    selection, state = broadcast_object_list(shared)
    if not trainer.accelerator.is_main_process:
        trainer.ada_sampler.load_state_dict(state)
    return selection, stats


def _drive(
    trainer: Any,
    group_inputs: list[dict[str, Any]],
    keys: list[str],
    pools: list[list[PoolEntry]],
    stats: ScheduleStats,
) -> Selection:
    started = time.perf_counter()
    step = trainer.ada_sampler.begin_continuous(len(group_inputs), keys)
    prompt_ids = tokenize_prompts(trainer, [row["prompt"] for row in group_inputs])
    client = trainer.vllm_generation.vllm_client
    payload = completions_payload(client, server_sampling_params(trainer.vllm_generation), prompt_ids[0])
    returned: list[dict[int, dict]] = [{} for _ in group_inputs]  # finished, not yet scored
    next_draw = [0] * len(group_inputs)  # the draw each prompt scores next (submission order)
    ready: set[int] = set()  # prompts whose next draw is back: kept up to date, so no loop rescans every prompt
    masked = trainer.mask_truncated_completions
    with ServerDraws(client.base_url, payload, trainer.args.continuous_max_in_flight) as draws:
        while not step.done:
            for prompt, draw in step.to_submit():
                draws.submit((prompt, draw), prompt_ids[prompt])
            # Block for a new completion only when nothing already back can be scored: a prompt's later draw that
            # came back with the one just scored is scored now, not after some other draw finishes.
            for (prompt, draw), choice in draws.wait(timeout=0 if ready else None):
                returned[prompt][draw] = choice
                if draw == next_draw[prompt]:
                    ready.add(prompt)
            batch = sorted(ready)
            if not batch:
                if draws.in_flight == 0:
                    raise RuntimeError("continuous schedule: nothing in flight and nothing to score, yet not done")
                continue
            requests = [(g, 1) for g in batch]
            broadcast_object_list([(_SCORE, requests)])
            layout = RoundLayout.plan(requests, trainer.accelerator.num_processes)
            # Every requested row is one prompt's next draw; the padding rows repeat the first one's.
            choices = {g: returned[g].pop(next_draw[g]) for g in batch}
            with replayed_completions(
                client, payload, [prompt_ids[g] for g in layout.padded], [choices[g] for g in layout.padded]
            ):
                order, entries, rewards = trainer._run_round(requests, group_inputs, stats.scoring_batches + 1)
            stats.scoring_batches += 1
            for g, entry, reward in zip(order, entries, rewards, strict=True):
                pools[g].append(entry)
                aborts = step.complete(g, next_draw[g], reward, masked=masked and entry.truncated)
                next_draw[g] += 1
                stats.scored += 1
                for prompt, draw in aborts:
                    if returned[prompt].pop(draw, None) is not None:
                        stats.dropped_finished += 1
                    step.discard(prompt, draw)
                stats.aborted_in_flight += draws.abort(aborts)
            # A prompt whose following draw came back early stays ready (an exited prompt's were dropped above).
            ready = {g for g in batch if next_draw[g] in returned[g]}
        stats.submitted = draws.submitted
    stats.seconds = time.perf_counter() - started
    return step.finish()


def _follow(trainer: Any, group_inputs: list[dict[str, Any]], pools: list[list[PoolEntry]]) -> None:
    """A process other than the main one: score the batches the main process announces, until it says done."""
    batches = 0
    while True:
        [(kind, content)] = broadcast_object_list([None])
        if kind == _DONE:
            return
        if kind == _FAILED:
            raise RuntimeError(f"The main process's continuous sampling failed: {content}")
        batches += 1
        order, entries, _ = trainer._run_round(content, group_inputs, batches)
        for g, entry in zip(order, entries, strict=True):
            pools[g].append(entry)
