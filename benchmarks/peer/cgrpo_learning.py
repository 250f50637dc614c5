"""
The peer package trl-cgrpo (C-GRPO, `CGRPOTrainer`) trained on the arithmetic testbeds (the finite sets and the stream)
exactly as `scripts/benchmark_learning.py` trains one method there, stopped at the same completions budget.

Run it in its own virtualenv (trl-cgrpo 0.2.0 needs TRL < 1.15; `bash benchmarks/peer/setup_cgrpo_venv.sh`):

    .venv-cgrpo/bin/python benchmarks/peer/cgrpo_learning.py --out benchmarks/results/peer-cgrpo/hard \\
        --train_data benchmarks/results/finite/data/train_hard.jsonl \\
        --heldout_data benchmarks/results/finite/data/heldout_hard.jsonl --epochs 10 \\
        --prompts_per_step 20 --eval_every 25 --eval_samples 2 --learning_rate 1e-4 \\
        --completions_budget 58216 --seeds 0 1 2 3 4

`--task trace` trains the trace-arithmetic testbed's model on its paper set, as the trace tournament does
(`recipes/finite-arithmetic/run_tournament.sh trace`; commands in `benchmarks/results/peer-cgrpo/README.md`).

Without `--train_data` it trains on the problem stream of `benchmark_learning.py`'s default mode instead (its 16
prompts per step, `--heldout_size` held-out problems at one sample each), writing `run_one`'s keys:

    .venv-cgrpo/bin/python benchmarks/peer/cgrpo_learning.py --out benchmarks/results/peer-cgrpo/stream \\
        --steps 300 --eval_every 25 --heldout_size 600 --learning_rate 1e-4 --completions_budget 78891 \\
        --seeds 0 1 2 3 4

What is shared with `benchmark_learning.py`'s finite mode (the same functions of `benchmarks/harness/`, not copies):
the shipped tiny model (`task_parts`), the JSON-lines sets (`load_rows`), the prompts per step, the learning rate and
every other training argument (`training_args`), the held-out evaluation (`heldout_pass_rates`, same seed, same
samples per prompt), the step cap (`budget_steps`) and the evaluation points and stop (`EvaluationPlan`: each eighth
of the budget). Each run is written as `OUT/runs/cgrpo-seed{seed}.json` with the keys of `run_finite`'s JSON, so
`tournament_summary` reads it; `--report_with DIR` builds the tournament table of these runs together with the runs
in `DIR` (e.g. DAPO's).

What C-GRPO needs here and how it is given:

- **An answer extractor.** C-GRPO's conformal set is computed over the *extracted final answers* of the completions
  drawn for a prompt so far: each distinct answer gets its empirical frequency, answers enter the set in decreasing
  frequency until their mass reaches the calibrated threshold, and a prompt stops drawing at the first budget where
  that set is a single answer (right or wrong: the set never looks at the reference). The extractor is the one the
  task's reward compares to the answer: on the arithmetic testbeds `trl_ada.tasks.arithmetic.extract_answer` (the
  text before the first eos or newline, stripped); with `--task trace`, `extract_final_answer` (the digits after
  `:A=`; a missing or malformed answer is None, which C-GRPO reads as the empty answer).
- **A calibration set.** Its thresholds are fitted on held-out prompts, which its README requires to be disjoint
  from the training set; they are taken out of the *training* set (`--calibration_size` prompts, 50 by default,
  drawn with the run's seed), never from the evaluation set, so C-GRPO trains on that many fewer prompts. On the
  stream, they are its first 50 distinct prompts, and every later draw of one of them is dropped from training.
- **Its budgets.** The package defaults: `budget_grid` 2, 4, 8, 16, 32 (the group width, so a step holds
  `prompts_per_step * 32` rows, the unused ones padded and masked), `recalibrate_every` 50 steps, the whole
  calibration set at every calibration, `delta` chosen from the policy's solve rate, APS score.

Completions are counted where they are generated (the trainer's `_base_generate`, every budget increment and every
calibration rollout), not where they are scored: C-GRPO's padded rows reach the reward function but are never drawn.
Calibration rollouts count towards the budget and appear in the draw accounting as drawn and not useful.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl_ada.samplers.accounting import BANDS, PromptDraws, draw_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the shared harness, benchmarks/harness

from harness.arithmetic import (
    PROMPTS_PER_STEP,
    TASKS,
    epoch_visits,
    heldout_by_band,
    heldout_pass_rates,
    indexed_dataset,
    load_rows,
    steps_per_epoch,
    task_parts,
    testbed_settings,
)
from harness.runs import reusable, run_path
from harness.tournament import tournament_summary, tournament_table
from harness.training import EvaluationPlan, budget_steps, evaluation_callback, train_seconds, training_args

logger = logging.getLogger("cgrpo_learning")

METHOD = "cgrpo"
LABEL = "trl-cgrpo 0.2.0 (C-GRPO)"
PEER_PACKAGE = "trl-cgrpo==0.2.0"
DEFAULT_BUDGET_GRID = (2, 4, 8, 16, 32)
DEFAULT_CALIBRATION_SIZE = 50
DEFAULT_RECALIBRATE_EVERY = 50


@dataclass(frozen=True)
class Training:
    """What every C-GRPO run of an invocation shares: its step cap (before a budget raises it), evaluation, learning
    rate and completions budget, C-GRPO's own settings and the task (`harness.arithmetic.TASKS`)."""

    steps: int
    eval_every: int
    learning_rate: float
    completions_budget: int | None
    calibration_size: int
    budget_grid: tuple[int, ...]
    recalibrate_every: int
    task: str = "arithmetic"

    def step_cap(self, prompts_per_step: int) -> int:
        """The run's step cap at `prompts_per_step` (`budget_steps`: enough to reach the budget)."""
        return budget_steps(self.completions_budget, self.steps, prompts_per_step)


class CompletionLedger:
    """Completions generated per optimizer step (training draws and calibration rollouts alike) and, per step, what
    became of each prompt's draws, as `trl_ada.samplers.accounting.PromptDraws`."""

    def __init__(self) -> None:
        self.generated: list[int] = []
        self.calibration: list[int] = []
        self.prompts: list[list[PromptDraws]] = []

    def _grow(self, step: int) -> None:
        while len(self.generated) <= step:
            self.generated.append(0)
            self.calibration.append(0)
            self.prompts.append([])

    def add_generated(self, step: int, rows: int, *, calibration: bool = False) -> None:
        """`rows` completions generated while optimizer step `step` (0-based: steps finished so far) was computed."""
        self._grow(step)
        self.generated[step] += rows
        if calibration:
            self.calibration[step] += rows

    def add_prompts(self, step: int, prompts: Sequence[PromptDraws]) -> None:
        self._grow(step)
        self.prompts[step].extend(prompts)

    def completions_before(self, step: int) -> int:
        """Completions generated by the first `step` optimizer steps."""
        return sum(self.generated[:step])

    def draws(self, steps: int | None = None) -> dict[str, Any]:
        """The draw accounting of the first `steps` steps (all by default) in `harness.training.draw_accounting`'s
        shape: drawn, useful and trained totals, and drawn and useful per band."""
        prompts = [p for step in self.prompts[:steps] for p in step]
        counters = draw_metrics(prompts)
        bands = {
            band: {"drawn": counters[f"draws/{band}/drawn_total"], "useful": counters[f"draws/{band}/useful_total"]}
            for band in BANDS
        }
        return {
            "total": counters["draws/drawn_total"],
            "useful": counters["draws/useful_total"],
            "trained": counters["draws/trained_total"],
            "bands": {band: counts for band, counts in bands.items() if counts["drawn"]},
        }


def group_draws(rewards: Sequence[float], group_size: int) -> list[PromptDraws]:
    """One `PromptDraws` per prompt group of a C-GRPO generation batch: `rewards` holds `group_size` consecutive rows
    per prompt, NaN for the padded rows (never drawn). A group carries a signal when its drawn rows are not all equal,
    and then every drawn row is trained on."""
    if len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards are not whole groups of {group_size}.")
    prompts = []
    for start in range(0, len(rewards), group_size):
        drawn = [r for r in rewards[start : start + group_size] if not math.isnan(r)]
        pass_rate = sum(r > 0 for r in drawn) / len(drawn) if drawn else math.nan
        mixed = len(set(drawn)) > 1
        prompts.append(PromptDraws(pass_rate=pass_rate, draws=len(drawn), useful=mixed, trained=len(drawn) * mixed))
    return prompts


def calibration_draws(answers: Sequence[str], gold: str) -> PromptDraws:
    """A calibration prompt's rollouts: drawn, never trained on (its pass rate: extracted answers equal to `gold`)."""
    pass_rate = sum(answer == gold for answer in answers) / len(answers) if answers else math.nan
    return PromptDraws(pass_rate=pass_rate, draws=len(answers), useful=False, trained=0)


class CompletionCounting:
    """Mixin over `trl_cgrpo.CGRPOTrainer` (put it first in the bases) that records in `completion_ledger` every
    completion the trainer generates (`_base_generate`: training increments and calibration rollouts) and what became
    of each prompt's draws (`_calculate_rewards` for training groups, `_outcomes` during `calibrate`)."""

    completion_ledger: CompletionLedger
    _calibration_prompts: list[PromptDraws] | None = None

    def _base_generate(self, prompt_ids, *args, **kwargs):
        result = super()._base_generate(prompt_ids, *args, **kwargs)
        calibrating = self._calibration_prompts is not None
        self.completion_ledger.add_generated(self.state.global_step, len(prompt_ids), calibration=calibrating)
        return result

    def calibrate(self):
        self._calibration_prompts = []
        try:
            return super().calibrate()
        finally:
            self.completion_ledger.add_prompts(self.state.global_step, self._calibration_prompts)
            self._calibration_prompts = None

    def _outcomes(self, texts, example):
        outcomes = super()._outcomes(texts, example)
        if self._calibration_prompts is not None:
            gold = str(example[self.args.calibration_answer_column]).strip()
            self._calibration_prompts.append(calibration_draws(outcomes, gold))
        return outcomes

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._padded_rows is not None:  # a training batch, its padded rows' rewards NaN by now
            first_reward = [row[0] for row in rewards.tolist()]
            self.completion_ledger.add_prompts(self.state.global_step, group_draws(first_reward, self.num_generations))
        return rewards


def split_calibration(rows: Sequence[dict], size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """The training rows without `size` of them drawn at random with `seed`, and those `size` (the calibration set)."""
    if not 0 < size < len(rows):
        raise ValueError(
            f"--calibration_size {size}: give between 1 and {len(rows) - 1} (the training set has {len(rows)} prompts "
            "and the calibration prompts are taken out of it)."
        )
    chosen = set(random.Random(seed).sample(range(len(rows)), size))
    train = [row for i, row in enumerate(rows) if i not in chosen]
    calibration = [row for i, row in enumerate(rows) if i in chosen]
    return train, calibration


def run_record(
    seed: int, run: dict[str, Any], *, train_size: int, heldout_size: int, prompts_per_step: int, per_epoch: int
) -> dict[str, Any]:
    """A finite run's JSON from `train_cgrpo`'s result `run`, with the keys `benchmark_learning.run_finite` writes
    (and C-GRPO's own under `cgrpo`)."""
    ledger, step_seconds = run["ledger"], run["step_seconds"]
    return {
        "method": METHOD,
        "label": LABEL,
        "seed": seed,
        "train_size": train_size,
        "heldout_size": heldout_size,
        "prompts_per_step": prompts_per_step,
        "steps_per_epoch": per_epoch,
        "start_heldout": run["curve"][0]["heldout"],
        "curve": run["curve"],
        "median_step_seconds": statistics.median(step_seconds) if step_seconds else math.nan,
        "step_seconds": list(step_seconds),
        "run_seconds": run["run_seconds"],
        "epoch_visits": epoch_visits(run["visits"], per_epoch),
        "visits": run["visits"],
        "completions_per_step": list(ledger.generated),
        "calibration_completions": sum(ledger.calibration),
        "completions": sum(ledger.generated),
        "draws": ledger.draws(),
        "gate_passed_over": None,
        "cgrpo": run["extra"],
    }


def split_stream_calibration(rows: Sequence[dict], size: int) -> tuple[list[dict], list[dict]]:
    """A problem stream without its first `size` distinct prompts, and those prompts (the calibration set). The stream
    draws with replacement, so every later row with a calibration prompt is dropped too: C-GRPO never trains on one."""
    calibration: dict[str, dict] = {}
    for row in rows:
        if len(calibration) == size:
            break
        calibration.setdefault(row["prompt"], row)
    if len(calibration) < size or size < 1:
        raise ValueError(f"--calibration_size {size}: give between 1 and the stream's distinct prompts.")
    train = [row for row in rows if row["prompt"] not in calibration]
    return train, list(calibration.values())


def answer_extractor(task: str) -> Callable[[Any], str | None]:
    """The final answer C-GRPO's conformal set compares for `task`: the text the task's own reward checks."""
    if task == "trace":
        from trl_ada.tasks.trace_arithmetic import extract_final_answer

        return extract_final_answer  # None for a missing or malformed answer: C-GRPO reads it as the empty answer
    from trl_ada.tasks.arithmetic import extract_answer

    return extract_answer


def train_cgrpo(
    seed: int,
    training: Training,
    out: Path,
    rows: list[dict],
    calibration_rows: list[dict],
    prompts_per_step: int,
    evaluate: Callable[[Any, Any], dict[str, Any]],
) -> dict[str, Any]:
    """One C-GRPO run on `rows` (dicts with prompt and answer), calibrated on `calibration_rows`, stopped at its step
    cap or the completions budget; `evaluate(model, tokenizer)` gives a curve point's held-out fields. Returns the
    curve (held-out, completions and training seconds per point), the completion ledger, the visits and C-GRPO's own
    logs."""
    import torch
    from datasets import Dataset
    from trl_cgrpo import CGRPOConfig, CGRPOTrainer

    torch.set_num_threads(1)
    load_model, task_reward, max_completion_length = task_parts(training.task)
    model, tokenizer = load_model()
    steps = training.step_cap(prompts_per_step)
    plan = EvaluationPlan(steps, training.eval_every, training.completions_budget)
    rows_per_step = prompts_per_step * max(training.budget_grid)  # the group width is C-GRPO's largest budget
    arguments = training_args(
        str(out / f"{METHOD}-seed{seed}"), seed, steps, training.learning_rate, rows_per_step, max_completion_length
    )
    config = CGRPOConfig(
        **arguments, budget_grid=list(training.budget_grid), recalibrate_every=training.recalibrate_every
    )
    dataset = indexed_dataset(rows)
    calibration = Dataset.from_dict({key: [row[key] for row in calibration_rows] for key in ("prompt", "answer")})
    ledger = CompletionLedger()
    visits: list[set[int]] = []
    trainer: Any = None

    def exact_match(completions: list[Any], answer: list[str], row_index: list[int], **kwargs: Any) -> list[float]:
        """The task's reward; records which rows the step scored (padded rows included: they are the same prompts)."""
        step = trainer.state.global_step
        while len(visits) <= step:
            visits.append(set())
        visits[step].update(row_index)
        return task_reward(completions, answer)

    class CountingCGRPOTrainer(CompletionCounting, CGRPOTrainer):
        completion_ledger = ledger

    def point(step: int, trainer_model: Any) -> dict:
        samples = float(ledger.completions_before(step))
        return {"step": step, **evaluate(trainer_model, tokenizer), "samples": samples, "train_seconds": 0.0}

    curve: list[dict] = []

    trainer = CountingCGRPOTrainer(
        model,
        [exact_match],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[evaluation_callback(plan, ledger.completions_before, point, curve)],
        calibration_dataset=calibration,
        answer_extractor=answer_extractor(training.task),
    )
    started = time.perf_counter()
    start = point(0, trainer.model)
    trainer.train()
    run_seconds = time.perf_counter() - started
    entries = [e for e in trainer.state.log_history if "step_time" in e]
    for entry in [start, *curve]:
        entry["train_seconds"] = train_seconds([e for e in entries if e["step"] <= entry["step"]])
    logged = trainer.state.log_history
    extra = {
        "calibration_size": len(calibration_rows),
        "budget_grid": list(training.budget_grid),
        "recalibrate_every": training.recalibrate_every,
        "mean_k": [e["cgrpo/mean_k"] for e in logged if "cgrpo/mean_k" in e],
        "delta": [e["cgrpo/delta"] for e in logged if "cgrpo/delta" in e],
        "calibration_solve_rate": [
            e["cgrpo/calibration_solve_rate"] for e in logged if "cgrpo/calibration_solve_rate" in e
        ],
        "qhat": {k: [e[f"cgrpo/qhat_{k}"] for e in logged if f"cgrpo/qhat_{k}" in e] for k in training.budget_grid},
        "calibration_steps": [step for step, count in enumerate(ledger.calibration) if count],
    }
    return {
        "curve": [start, *curve],
        "ledger": ledger,
        "step_seconds": [e["step_time"] for e in entries],
        "visits": [sorted(v) for v in visits],
        "run_seconds": run_seconds,
        "steps_run": trainer.state.global_step,
        "extra": extra,
    }


def run_cgrpo(
    seed: int,
    training: Training,
    out: Path,
    *,
    train_data: Path,
    heldout_data: Path,
    eval_samples: int,
    prompts_per_step: int,
) -> dict[str, Any]:
    """One C-GRPO run over a finite prompt set (`benchmark_learning.run_finite`'s testbed); returns its JSON record."""
    heldout = heldout_by_band(load_rows(heldout_data))
    rows, calibration_rows = split_calibration(load_rows(train_data), training.calibration_size, seed)
    per_epoch = steps_per_epoch(len(rows), prompts_per_step)

    def evaluate(trainer_model: Any, tokenizer: Any) -> dict[str, Any]:
        result = heldout_pass_rates(
            training.task, trainer_model, tokenizer, heldout, num_samples=eval_samples, seed=seed
        )
        return {"epoch": 0.0, "heldout": result["overall"], "bands": dict(result["per_level"])}  # epoch set below

    run = train_cgrpo(seed, training, out, rows, calibration_rows, prompts_per_step, evaluate)
    for entry in run["curve"]:
        entry["epoch"] = entry["step"] / per_epoch
    return run_record(
        seed,
        run,
        train_size=len(rows),
        heldout_size=len(heldout),
        prompts_per_step=prompts_per_step,
        per_epoch=per_epoch,
    )


def run_stream(seed: int, training: Training, out: Path, *, heldout_size: int) -> dict[str, Any]:
    """One C-GRPO run on the problem stream (`benchmark_learning.run_one`'s testbed: its stream, held-out problems,
    evaluation and prompts per step); returns its JSON record in `run_one`'s shape."""
    from trl_ada.tasks.arithmetic import accuracy_by_level, held_out_problems, make_problems

    heldout = held_out_problems(heldout_size, seed=1234)
    steps = training.step_cap(PROMPTS_PER_STEP)
    stream = make_problems(max(steps * PROMPTS_PER_STEP * 2, 4000), seed=seed)
    rows, calibration_rows = split_stream_calibration(stream, training.calibration_size)

    def evaluate(trainer_model: Any, tokenizer: Any) -> dict[str, Any]:
        result = accuracy_by_level(
            trainer_model, tokenizer, heldout, temperature=1.0, num_samples=1, max_new_tokens=8, seed=seed
        )
        return {"heldout": result["overall"]}

    run = train_cgrpo(seed, training, out, rows, calibration_rows, PROMPTS_PER_STEP, evaluate)
    ledger = run["ledger"]
    return {
        "method": METHOD,
        "label": LABEL,
        "seed": seed,
        "start_heldout": run["curve"][0]["heldout"],
        "curve": run["curve"],
        "median_step_seconds": statistics.median(run["step_seconds"]) if run["step_seconds"] else math.nan,
        "train_pass_rate": [],
        "draws": ledger.draws(),
        "gate_passed_over": None,
        "completions": sum(ledger.generated),
        "calibration_completions": sum(ledger.calibration),
        "completions_per_step": list(ledger.generated),
        "steps_run": run["steps_run"],
        "cgrpo": run["extra"],
    }


def run_settings(args: argparse.Namespace, steps: int) -> dict[str, Any]:
    """What a run depends on: the settings `benchmark_learning.py` records for the same testbed (finite or stream),
    plus the peer's own under `peer`."""
    settings = testbed_settings(args, steps, args.prompts_per_step, args.eval_samples)
    settings["peer"] = {
        "package": PEER_PACKAGE,
        "budget_grid": list(args.budget_grid),
        "calibration_size": args.calibration_size,
        "recalibrate_every": args.recalibrate_every,
    }
    return settings


def shared_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings a `benchmark_learning.py` run of the same testbed records (the peer's own removed)."""
    return {key: value for key, value in settings.items() if key != "peer"}


def report(out: Path, runs: list[dict], reference_runs: Path, settings: dict[str, Any]) -> str:
    """The tournament table (`harness.tournament`) of these runs and the runs in `reference_runs` made with the same
    shared settings; written to `OUT/tournament.md` and `OUT/tournament.json`."""
    others = []
    for path in sorted(reference_runs.glob("*.json")):
        run = json.loads(path.read_text())
        if run.get("method") != METHOD and run.get("settings", {}) == shared_settings(settings):
            others.append(run)
    if not others:
        logger.warning("No run in %s has this testbed's settings: the table holds C-GRPO alone.", reference_runs)
    summary = tournament_summary([*others, *runs], settings["completions_budget"])
    (out / "tournament.json").write_text(json.dumps(summary, indent=1))
    table = tournament_table(summary)
    (out / "tournament.md").write_text(table)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="results folder (runs in OUT/runs)")
    parser.add_argument(
        "--train_data", type=Path, default=None, help="JSON-lines training set (finite mode; without it: the stream)"
    )
    parser.add_argument("--heldout_data", type=Path, default=None, help="JSON-lines held-out set with a 'band' column")
    parser.add_argument("--epochs", type=int, default=None, help="passes over --train_data (instead of --steps)")
    parser.add_argument(
        "--task",
        choices=TASKS,
        default="arithmetic",
        help="as benchmark_learning.py's: trace trains the trace-arithmetic model on its final-answer reward (needs "
        "--train_data), and C-GRPO's answer extractor is that reward's",
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--prompts_per_step", type=int, default=16, help="finite mode (the stream's is 16)")
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--eval_samples", type=int, default=1, help="finite mode (the stream's is 1)")
    parser.add_argument("--heldout_size", type=int, default=600, help="the stream's held-out problems")
    parser.add_argument("--learning_rate", type=float, default=3e-5)
    parser.add_argument("--completions_budget", type=int, default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--calibration_size", type=int, default=DEFAULT_CALIBRATION_SIZE)
    parser.add_argument("--budget_grid", type=int, nargs="+", default=list(DEFAULT_BUDGET_GRID))
    parser.add_argument("--recalibrate_every", type=int, default=DEFAULT_RECALIBRATE_EVERY)
    parser.add_argument("--reuse_runs", action="store_true", help="keep finished runs with these settings")
    parser.add_argument(
        "--report_with",
        type=Path,
        default=None,
        help="a runs folder of benchmark_learning.py on the same testbed (e.g. DAPO's): write OUT/tournament.md with "
        "them and these runs (needs --completions_budget)",
    )
    parser.add_argument("--report_only", action="store_true", help="start no run (with --report_with)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.report_with is not None and args.completions_budget is None:
        parser.error("--report_with compares at equal completions: give --completions_budget.")
    if (args.train_data is None) != (args.heldout_data is None):
        parser.error("--train_data and --heldout_data go together (finite mode); give neither for the stream.")
    if args.train_data is None and args.epochs is not None:
        parser.error("--epochs needs --train_data; the stream runs --steps.")
    if args.train_data is None and args.task != "arithmetic":
        parser.error(f"--task {args.task} runs on a fixed prompt set: give --train_data and --heldout_data.")
    steps = args.steps
    if args.train_data is not None:
        rows = load_rows(args.train_data)
        if args.epochs is not None:
            # As benchmark_learning.py counts them: epochs of the whole training set, before the calibration split.
            steps = args.epochs * steps_per_epoch(len(rows), args.prompts_per_step)
        split_calibration(rows, args.calibration_size, 0)  # bad sizes fail here, before any model is loaded
    elif args.calibration_size < 1:
        parser.error(f"--calibration_size {args.calibration_size}: give at least 1.")
    settings = run_settings(args, steps)
    training = Training(
        steps=steps, eval_every=args.eval_every, learning_rate=args.learning_rate,
        completions_budget=args.completions_budget, calibration_size=args.calibration_size,
        budget_grid=tuple(args.budget_grid), recalibrate_every=args.recalibrate_every, task=args.task,
    )  # fmt: skip
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in args.seeds:
        path = run_path(runs_dir, METHOD, seed)
        if (args.reuse_runs or args.report_only) and reusable(path, settings):
            runs.append(json.loads(path.read_text()))
            continue
        if args.report_only:
            continue
        started = time.time()
        with tempfile.TemporaryDirectory() as scratch:
            if args.train_data is None:
                result = run_stream(seed, training, Path(scratch), heldout_size=args.heldout_size)
            else:
                result = run_cgrpo(
                    seed, training, Path(scratch), train_data=args.train_data, heldout_data=args.heldout_data,
                    eval_samples=args.eval_samples, prompts_per_step=args.prompts_per_step,
                )  # fmt: skip
        result["settings"] = settings
        path.write_text(json.dumps(result))
        runs.append(result)
        last, calibration = result["curve"][-1], result["calibration_completions"]
        message = "seed %d: held-out %.3f at %d completions (%d calibration), %d steps, %.0f s"
        logger.info(message, seed, last["heldout"], last["samples"], calibration, last["step"], time.time() - started)
    if args.report_with is not None and runs:
        print(report(args.out, runs, args.report_with, settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
