"""Projected GPU time: each run's steps priced at the paper's setting (8 x H100, Qwen2.5-Math-1.5B, 512 prompts a
step, `benchmarks/generation_cost.py`'s defaults), so that methods that call the engine, draw and train in different
amounts are compared at what they would cost there rather than at what they cost on this CPU.

A step is priced from its shape (`harness.training.step_shapes`): its generate calls, completions and update rows,
scaled by 512 over the run's prompts per step. Each call costs the cost model's generation seconds for a call of the
step's mean call size (simulated on its engines, workload and lengths), plus its weight sync and reward-pool start;
each completion its Math-Verify scoring; each update row its old-log-prob pass and its share of the actor update."""

from __future__ import annotations

import ast
import bisect
import functools
import gzip
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GENERATION_GRID = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Completions in one generate call at which the cost model is simulated; between them it is read linearly."""


@dataclass(frozen=True)
class PaperStepCost:
    """What a step costs at the paper's setting, per generate call, completion and update row."""

    generation: tuple[tuple[float, float], ...]
    """(completions in one generate call, the cost model's seconds for it), ascending."""
    call_s: float
    """Per generate call: the weight sync into the engines and the reward pool's start."""
    reward_s_per_completion: float
    train_s_per_row: float
    """Per update row: the old-log-prob pass and the actor update (forward and backward)."""
    batch_prompts: int

    def generation_seconds(self, completions: float) -> float:
        """The generation seconds of one call of `completions`, linear between the simulated sizes (and past them
        along the last segment)."""
        sizes = [size for size, _ in self.generation]
        index = min(max(bisect.bisect_left(sizes, completions), 1), len(sizes) - 1)
        (x0, y0), (x1, y1) = self.generation[index - 1], self.generation[index]
        return y0 + (completions - x0) * (y1 - y0) / (x1 - x0)

    def step_seconds(self, calls: float, completions: float, rows: float, prompts_per_step: int) -> float:
        """One step of `calls` generate calls, `completions` drawn and `rows` trained at `prompts_per_step` prompts,
        priced at the paper's prompts per step."""
        scale = self.batch_prompts / prompts_per_step
        calls = max(calls, 1.0)
        per_call = completions * scale / calls
        return (
            calls * (self.generation_seconds(per_call) + self.call_s)
            + completions * scale * self.reward_s_per_completion
            + rows * scale * self.train_s_per_row
        )


@functools.lru_cache(maxsize=1)
def paper_step_cost(seed: int = 0, repeats: int = 3) -> PaperStepCost:
    """The cost model's prices at its default (paper) setting: each grid size's generate call simulated `repeats`
    times on the paper's prompt mix and lengths, and averaged."""
    benchmarks = str(Path(__file__).resolve().parents[1])
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import generation_cost as model

    setup = model.Setup()
    prompts = model.sample_population(setup.batch_prompts, setup.workload, seed)
    rng = random.Random(seed)
    generation = []
    for size in GENERATION_GRID:
        seconds = 0.0
        for _ in range(repeats):
            cluster = model.Cluster(setup.cost, setup.limits, setup.engines)
            requests = []
            for index in range(size):
                prompt_index = index % len(prompts)
                reward, length = model.draw_completion(prompts[prompt_index], setup.workload, rng)
                requests.append(
                    cluster.new_request(prompt_index, index, prompts[prompt_index].prompt_tokens, length, reward)
                )
            # A call holds each prompt's draws together, as the trainers send them.
            seconds += cluster.generate(sorted(requests, key=lambda request: request.prompt))
        generation.append((float(size), seconds / repeats))
    costs = setup.step_costs
    return PaperStepCost(
        generation=tuple(generation),
        call_s=costs.generate_call_s + costs.reward_call_s,
        reward_s_per_completion=costs.reward_s_per_completion,
        train_s_per_row=costs.actor_update_s_per_row + costs.old_logprob_s_per_row,
        batch_prompts=setup.batch_prompts,
    )


def shapes_from_log(path: Path, group_rows: int | None) -> dict[str, list[float]] | None:
    """A run's step shapes read back from its log (`METHOD-seedN.log` or `.log.gz`, the trainer's printed entries, one
    a step) for runs written before the run JSON held them; None when there is no log."""
    from harness.training import step_shapes

    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.exists():
            opener = gzip.open if candidate.suffix == ".gz" else open
            with opener(candidate, "rt") as handle:
                entries = [_entry(line) for line in handle if line.startswith("{") and "ada/draws/drawn_total" in line]
            return step_shapes(entries, group_rows)
    return None


def _entry(line: str) -> dict[str, float]:
    """One printed log entry (TRL prints its values as strings) as numbers."""
    entry = ast.literal_eval(line.strip())
    return {key: float(value) for key, value in entry.items() if _is_number(value)}


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def cumulative_seconds(shapes: dict[str, list[float]], prompts_per_step: int, cost: PaperStepCost) -> list[float]:
    """The projected seconds after each step, from 0 before the first."""
    total, out = 0.0, [0.0]
    for calls, completions, rows in zip(
        shapes["generate_calls"], shapes["completions"], shapes["update_rows"], strict=True
    ):
        total += cost.step_seconds(calls, completions, rows, prompts_per_step)
        out.append(total)
    return out


def add_projected_seconds(
    runs: Sequence[dict],
    runs_dir: Path,
    group_rows: Callable[[str, int], int | None],
    cost: PaperStepCost | None = None,
    prompts_per_step: int | None = None,
) -> None:
    """Adds `gpu_seconds` (projected at the paper's setting) to every curve point of each run whose step shapes are
    known (its JSON, or its log in `runs_dir`); `group_rows(method, prompts_per_step)`: a step's update rows, `None`
    for a whole-pool update. `prompts_per_step`: the testbed's, for runs whose JSON does not record it (the stream's,
    whose runs all match the invocation's settings). Runs with neither shapes nor a log are left as they are."""
    testbed_prompts_per_step = prompts_per_step
    for run in runs:
        prompts_per_step = run.get("prompts_per_step", testbed_prompts_per_step)
        if prompts_per_step is None:
            continue
        shapes = run.get("step_shapes")
        if shapes is None:
            log = runs_dir / f"{run['method']}-seed{run['seed']}.log"
            shapes = shapes_from_log(log, group_rows(run["method"], prompts_per_step))
        if shapes is None or len(shapes["completions"]) < run["curve"][-1]["step"]:
            continue
        cost = cost or paper_step_cost()
        seconds = cumulative_seconds(shapes, prompts_per_step, cost)
        for point in run["curve"]:
            point["gpu_seconds"] = seconds[point["step"]]
