"""The rounds schedule (`generation_schedule="rounds"`, the default): Algorithm 2 of the paper, each round every
active prompt's request in one batched generation. [`run_round`] is AdaGRPOTrainer's round (TRL's own `_generate`,
reward computation and gathers), which the continuous schedule also scores with; [`RoundLayout`] splits a round's
rows over the processes."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from accelerate.utils import gather_object

from ..generation.faults import vllm_server_errors
from ..rewards.reward_registry import failing_reward_name
from ..trl_seam.grpo_private import environment_pool, is_truncated, summed_rewards, take_pending_extra_logs
from .pools import LocalRow, PoolEntry, row_extra_fields
from .schedule import RoundResult, ScheduledBatch, ScheduleDriver, ScheduleStats


class RoundsSchedule:
    """Rounds: one batched generation per round for every active prompt (see the module docstring)."""

    name = "rounds"

    def sample(
        self, driver: ScheduleDriver, group_inputs: list[dict[str, Any]], keys: Sequence[Any]
    ) -> ScheduledBatch:
        """All rounds for one batch of prompts; with several processes every one runs it on the gathered rewards."""
        started = time.perf_counter()
        step = driver.sampler.begin(len(group_inputs), keys)
        pools: list[list[PoolEntry]] = [[] for _ in group_inputs]
        stats = ScheduleStats()
        while requests := step.requests():
            # A round waits for its slowest completion (or agent episode): its wall time is the price of a round.
            round_started = time.perf_counter()
            order, entries, rewards = driver.run_round(requests, group_inputs, step.rounds + 1)
            stats.round_seconds.append(time.perf_counter() - round_started)
            for g, entry in zip(order, entries, strict=True):
                pools[g].append(entry)
            stats.submitted += len(order)
            stats.admitted += len(order)
            # TRL masks truncated completions out of the loss: they must not satisfy an exit rule or take kept slots.
            masked = [entry.truncated for entry in entries] if driver.mask_truncated else None
            step.observe(requests, rewards, masked)
        selection = step.finish()
        stats.seconds = time.perf_counter() - started
        return ScheduledBatch(selection, pools, stats)


@dataclasses.dataclass(frozen=True)
class RoundLayout:
    """How one sampling round's requested rows are split over the processes (the same on every process)."""

    order: list[int]
    """The prompt (index into the batch) of each requested row, in request order."""
    block: int
    """Rows per prompt when every prompt asked for the same number, else 1 (vLLM server mode dedupes by it)."""
    padded: list[int]
    """`order` plus whole blocks of its first prompt, so every process gets the same number of whole blocks; the
    padding rows are generated and scored (collectives need equal shares) and then dropped."""
    num_processes: int

    @classmethod
    def plan(cls, requests: Sequence[tuple[int, int]], num_processes: int) -> RoundLayout:
        order = [g for g, count in requests for _ in range(count)]
        counts = {count for _, count in requests}
        block = counts.pop() if len(counts) == 1 else 1
        padded = order + [order[0]] * (-len(order) % math.lcm(block, num_processes))
        return cls(order, block, padded, num_processes)

    @property
    def share_size(self) -> int:
        return len(self.padded) // self.num_processes

    def share(self, rank: int) -> list[int]:
        """The prompts of the rows process `rank` generates."""
        return self.padded[rank * self.share_size : (rank + 1) * self.share_size]

    def holder(self, row: int) -> tuple[int, int]:
        """(process, position in its share) of requested row `row`."""
        return divmod(row, self.share_size)


def run_round(
    trainer: Any, requests: Sequence[tuple[int, int]], group_inputs: list[dict[str, Any]], round_index: int
) -> RoundResult:
    """Generate and score one round on all processes of an AdaGRPOTrainer; return each requested row's prompt (index
    into the batch), pool entry and summed reward, in request order. Only the rewards (TRL's own gather) and the
    truncation flags cross processes; each completion stays, compacted, on the process that generated it."""
    num_processes, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
    layout = RoundLayout.plan(requests, num_processes)
    share = layout.share(rank)
    share_inputs = [group_inputs[g] for g in share]

    with vllm_server_errors(trainer, round_index):  # a lost vLLM server: a clear error, not a hang
        prompts, fields = trainer._generate_round(share_inputs, layout.block)
    completion_ids = fields["completion_ids"]
    scored_inputs = _with_extra_fields(share_inputs, fields["extra_fields"])
    try:
        # Environment-owned rewards read `trainer.environments`: this round's episodes, one per row.
        rewards_per_func = trainer._calculate_rewards(scored_inputs, prompts, fields["completions"], completion_ids)
    except Exception as error:
        raise RuntimeError(
            f"{failing_reward_name(error, trainer.reward_funcs, trainer.reward_func_names)} raised during sampling "
            f"round {round_index} of training step {trainer.state.global_step + 1}: {type(error).__name__}: {error}. "
            "Checkpoints saved so far are intact; fix the reward function and resume with "
            "resume_from_checkpoint."
        ) from error
    extra_logs = _take_extra_logs(trainer, len(share))
    local_truncated = torch.tensor(
        [is_truncated(trainer, ids) for ids in completion_ids], dtype=torch.uint8, device=trainer.accelerator.device
    )
    truncated = trainer.accelerator.gather(local_truncated).bool().tolist()

    rewards = summed_rewards(trainer, rewards_per_func)[: len(layout.order)].tolist()
    with_environments = environment_pool(trainer) is not None
    entries = []
    for j in range(len(layout.order)):
        holder, i = layout.holder(j)
        row = None
        if holder == rank:
            row = LocalRow.from_generated(fields, i, extra_logs[i], prompts[i] if with_environments else None)
        entries.append(PoolEntry(rewards_per_func[j], truncated[j], holder, row))
    return RoundResult(layout.order, entries, rewards)


def _take_extra_logs(trainer: Any, num_rows: int) -> list[dict[str, Any]]:
    """Move the `log_extra` columns that reward functions wrote this round onto the rows they describe."""
    pending = take_pending_extra_logs(trainer)
    columns = sorted(set(gather_object(list(pending))))
    per_row: list[dict[str, Any]] = [{} for _ in range(num_rows)]
    for column in columns:
        values = pending.get(column, [])
        for i in range(num_rows):
            per_row[i][column] = values[i] if i < len(values) else None
    return per_row


def _with_extra_fields(inputs: list[dict[str, Any]], extra_fields: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Copies of a round's dataset rows (which share one dict per prompt) with a `rollout_func`'s extra fields merged
    in, as GRPOTrainer merges them before scoring."""
    if not extra_fields:
        return inputs
    return [{**row, **row_extra_fields(extra_fields, i)} for i, row in enumerate(inputs)]
