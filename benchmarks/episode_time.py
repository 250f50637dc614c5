"""
How sampling rounds interact with agent episodes, on a CPU tool task.

With tools, a completion is an episode: TRL's tool loop generates, runs the tool calls the completions made, appends
the results and generates again for the rows that called a tool, until no row calls one. One sampling round is one
such loop over its share of draws, so a round costs as many batched `generate` calls as its longest episode has turns,
and a seq_balance step pays that once per round. Tool calls themselves run one after another inside TRL's loop (a
synchronous tool is called row by row), so their time grows with the number of calls, not with the rounds.

This trains the tiny tool-calling model (`trl_ada.testing.tiny_agents`: "What is a+b?" with an `add` tool, called in
about half of the draws) with `GRPOTrainer` (n=4, the baseline, measured in the same run) and with `AdaGRPOTrainer` under
`seq_balance` (fixed and predictive round policies), each with a tool that answers at once and one that takes
`--tool-latency` seconds (a sandbox or an API), and reports per generation batch: completions drawn, rounds, generate
calls (turns), tool calls, the sampling wall time split into tool time and the rest, and `ada/round_time/*`.

    python benchmarks/episode_time.py [--steps 10] [--tool-latency 0.05] [--json out.json]

About 2 minutes on 2 cores. `--quick` runs one step per configuration (a smoke run, no numbers worth reading).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS_PER_BATCH = 8
NUM_GENERATIONS = 4


def timed_tool(latency: float, calls: list[float]):
    """`add` with a fixed latency; every call's wall time is appended to `calls`."""
    from trl_ada.testing.tiny_agents import add

    @functools.wraps(add)  # TRL builds the tool's schema from the name, signature and docstring
    def tool(a: int, b: int) -> int:
        start = time.perf_counter()
        if latency:
            time.sleep(latency)
        result = add(a, b)
        calls.append(time.perf_counter() - start)
        return result

    return tool


def run(name: str, sampler: str | None, round_policy: str, latency: float, args, out_dir: Path) -> dict:
    import torch
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.testing.tiny_agents import answer_reward, get_tool_model, make_tool_dataset

    torch.manual_seed(0)
    tool_calls: list[float] = []
    per_batch: list[dict] = []
    base = GRPOTrainer if sampler is None else AdaGRPOTrainer

    class Timed(base):
        def _generate_and_score_completions(self, inputs):
            if not self.model.training:
                return super()._generate_and_score_completions(inputs)
            self._turns, calls_before = 0, len(tool_calls)
            start = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            batch = {
                "sampling_seconds": self._sampling_seconds,
                "batch_seconds": time.perf_counter() - start,
                "generate_calls": self._turns,
                "tool_calls": len(tool_calls) - calls_before,
                "tool_seconds": sum(tool_calls[calls_before:]),
            }
            per_batch.append(batch)
            return output

        def _generate_single_turn(self, *a, **kw):
            self._turns += 1
            return super()._generate_single_turn(*a, **kw)

        if sampler is None:

            def _generate(self, prompts):  # GRPOTrainer: generation (with its tool loop) is the sampling phase
                start = time.perf_counter()
                output = super()._generate(prompts)
                self._sampling_seconds = time.perf_counter() - start
                return output

        else:

            def _sample(self, inputs):  # every round, tool loops included
                start = time.perf_counter()
                kept = super()._sample(inputs)
                self._sampling_seconds = time.perf_counter() - start
                return kept

    common = dict(
        output_dir=str(out_dir / name),
        per_device_train_batch_size=PROMPTS_PER_BATCH * NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS,
        max_completion_length=40,
        max_steps=args.steps,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
    )
    config = (
        GRPOConfig(**common)
        if sampler is None
        else AdaGRPOConfig(**common, sampler=sampler, round_size=4, max_rounds=4, round_policy=round_policy)
    )
    model, tokenizer = get_tool_model()
    trainer = Timed(
        model,
        [answer_reward],
        args=config,
        train_dataset=make_tool_dataset(256, seed=1),
        processing_class=tokenizer,
        tools=[timed_tool(latency, tool_calls)],
    )
    trainer.remove_callback(PrinterCallback)  # the table below is the output
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    summary = {
        "name": name,
        "tool_latency": latency,
        "steps": len(per_batch),
        "train_seconds": wall,
        "completions_per_batch": statistics.fmean(
            entry.get("ada/samples_per_prompt/mean", NUM_GENERATIONS) * PROMPTS_PER_BATCH for entry in logs
        ),
        "rounds_per_batch": statistics.fmean(entry.get("ada/rounds", 1.0) for entry in logs),
        "round_time_max": statistics.fmean(entry["ada/round_time/max"] for entry in logs)
        if sampler is not None
        else None,
        "tool_call_frequency": statistics.fmean(entry.get("tools/call_frequency", 0.0) for entry in logs),
        "reward": statistics.fmean(entry["reward"] for entry in logs),
    }
    for key in ("sampling_seconds", "batch_seconds", "generate_calls", "tool_calls", "tool_seconds"):
        summary[key] = statistics.fmean(batch[key] for batch in per_batch)
    summary["generation_seconds"] = summary["sampling_seconds"] - summary["tool_seconds"]
    summary["seconds_per_completion"] = summary["sampling_seconds"] / summary["completions_per_batch"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tool-latency", type=float, default=0.05)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="one step per configuration (smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.steps = 1
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(1)  # tiny matrices: a second thread only adds synchronisation
    configs = [
        ("GRPO n=4", None, "fixed"),
        ("seq_balance, fixed rounds", "seq_balance", "fixed"),
        ("seq_balance, predictive rounds", "seq_balance", "predictive"),
    ]
    latencies = [0.0] if args.quick else [0.0, args.tool_latency]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up (discarded): the first training of a process pays one-time costs (imports, allocator, caches).
        run("warm-up", None, "fixed", 0.0, argparse.Namespace(steps=1), Path(tmp))
        for latency in latencies:
            for name, sampler, policy in configs:
                results.append(run(name, sampler, policy, latency, args, Path(tmp)))
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"steps": args.steps, "results": results}, indent=2))


def table(results: list[dict]) -> str:
    lines = [
        "| configuration | tool latency | completions / batch | rounds | generate calls | tool calls | tool s | "
        "other sampling s | sampling s | x GRPO | s per completion | x GRPO | slowest round s | reward |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        baseline = next(r for r in results if r["name"] == "GRPO n=4" and r["tool_latency"] == result["tool_latency"])
        round_max = "" if result["round_time_max"] is None else f"{result['round_time_max']:.2f}"
        lines.append(
            f"| {result['name']} | {result['tool_latency'] * 1000:.0f} ms | {result['completions_per_batch']:.1f} | "
            f"{result['rounds_per_batch']:.2f} | {result['generate_calls']:.1f} | {result['tool_calls']:.1f} | "
            f"{result['tool_seconds']:.2f} | {result['generation_seconds']:.2f} | {result['sampling_seconds']:.2f} | "
            f"{result['sampling_seconds'] / baseline['sampling_seconds']:.2f} | "
            f"{result['seconds_per_completion'] * 1000:.0f} ms | "
            f"{result['seconds_per_completion'] / baseline['seconds_per_completion']:.2f} | {round_max} | "
            f"{result['reward']:.3f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
