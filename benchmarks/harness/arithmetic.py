"""The arithmetic testbeds of `scripts/benchmark_learning.py`, which the peer runner
(`benchmarks/peer/cgrpo_learning.py`) trains on too: the one-shot problem stream (`trl_ada.tiny`), its finite prompt
sets (JSON lines, visited for several epochs, the held-out one with a `band` column) and the trace-arithmetic task
(`trl_ada.tasks.trace_arithmetic`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROMPTS_PER_STEP = 16
"""The problem stream's prompts per optimizer step."""
TASKS = ("arithmetic", "trace")
"""`--task`: the one-shot arithmetic testbed (`trl_ada.tiny`) or the trace-arithmetic one (finite sets only)."""


def task_parts(task: str) -> tuple[Any, Any, int]:
    """A task's model loader, reward function and completion length in tokens."""
    if task == "trace":
        from trl_ada.tasks.trace_arithmetic import MAX_COMPLETION_LENGTH, final_answer_reward, load_tiny_trace_model

        return load_tiny_trace_model, final_answer_reward, MAX_COMPLETION_LENGTH
    from trl_ada.tasks.arithmetic import exact_match_reward
    from trl_ada.tiny import load_tiny_arith_model

    return load_tiny_arith_model, exact_match_reward, 8


def heldout_pass_rates(
    task: str, model: Any, tokenizer: Any, problems: Sequence[dict], *, num_samples: int, seed: int
) -> dict[str, Any]:
    """Held-out pass rate at temperature 1, overall and per ``level`` key, as `accuracy_by_level` returns it."""
    from trl_ada.tasks.arithmetic import accuracy_by_level, sample_completions

    sampling = {"temperature": 1.0, "num_samples": num_samples, "seed": seed}
    if task == "arithmetic":
        return accuracy_by_level(model, tokenizer, problems, max_new_tokens=8, **sampling)
    _, reward, max_new_tokens = task_parts(task)
    prompts = [problem["prompt"] for problem in problems]
    texts = sample_completions(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, keep_special_tokens=True, **sampling
    )
    rewards = reward(texts, [problem["answer"] for problem in problems for _ in range(num_samples)])
    per_level: dict[Any, list[float]] = {}
    for index, value in enumerate(rewards):
        per_level.setdefault(problems[index // num_samples]["level"], []).append(value)
    return {
        "overall": sum(rewards) / len(rewards),
        "per_level": {level: sum(values) / len(values) for level, values in sorted(per_level.items())},
    }


def load_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a JSON-lines prompt set (as `recipes/finite-arithmetic/build_data.sh` writes them)."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def steps_per_epoch(train_size: int, prompts_per_step: int) -> int:
    """Optimizer steps in one pass over the set: TRL's sampler drops an epoch's last, incomplete batch."""
    return train_size // prompts_per_step


def epoch_visits(visits: Sequence[Sequence[int]], per_epoch: int) -> list[dict[str, int]]:
    """Per epoch: the distinct rows scored and the most steps any row was scored in (1 when no row came twice).

    ``visits[k]`` holds the rows scored during optimizer step ``k`` (its batch, plus DAPO's refills).
    """
    stats = []
    for start in range(0, len(visits), per_epoch):
        counts: dict[int, int] = {}
        for step in visits[start : start + per_epoch]:
            for row in set(step):
                counts[row] = counts.get(row, 0) + 1
        stats.append({"distinct": len(counts), "max_steps_per_row": max(counts.values(), default=0)})
    return stats


def heldout_by_band(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A held-out set's rows as `heldout_pass_rates` takes them: the band in the ``level`` key, by which it groups."""
    return [{"prompt": row["prompt"], "answer": row["answer"], "level": row["band"]} for row in rows]


def indexed_dataset(rows: Sequence[dict[str, Any]]) -> Any:
    """A training set as a `datasets.Dataset`: prompt and answer, level and band when every row has them (the reward
    ignores them; they ride along), and each row's index (`row_index`), by which a reward records the rows a step
    scored."""
    from datasets import Dataset

    keys = ["prompt", "answer", *(key for key in ("level", "band") if all(key in row for row in rows))]
    columns = {key: [row[key] for row in rows] for key in keys}
    return Dataset.from_dict({**columns, "row_index": list(range(len(rows)))})


def testbed_settings(args: Any, steps: int, prompts_per_step: int, eval_samples: int) -> dict[str, Any]:
    """What a run on these testbeds depends on besides its method and seed, from a command line with the testbed's
    options (`--eval_every`, `--learning_rate`, `--completions_budget`, `--heldout_size`, `--train_data`,
    `--heldout_data`, `--task`): the step cap, evaluation, learning rate and budget, then the stream's held-out size or
    the finite sets, prompts per step and held-out samples, then the task. The budget is in only when set and the task
    only when it is not the default, so that runs recorded before either existed still match."""
    settings: dict[str, Any] = {"steps": steps, "eval_every": args.eval_every, "learning_rate": args.learning_rate}
    if args.completions_budget is not None:
        settings["completions_budget"] = args.completions_budget
    if args.train_data is None:
        settings["heldout_size"] = args.heldout_size
    else:
        settings |= {
            "train_data": str(args.train_data),
            "heldout_data": str(args.heldout_data),
            "prompts_per_step": prompts_per_step,
            "eval_samples": eval_samples,
        }
    if args.task != "arithmetic":
        settings["task"] = args.task
    return settings
