"""
What happens when the vLLM server (server mode) goes away during sampling: a clear error, in bounded time.

TRL's `VLLMClient` sends its requests without a timeout, and a read timeout cannot tell a dead server from a long
generation. So while a generation request is in flight, [`vllm_server_errors`] polls the server's `GET /health`
(answered by vLLM's HTTP process even while it generates) and abandons the request once that has failed for
`vllm_server_timeout` seconds; the trainer then raises a [`VLLMServerError`] naming the server, the round and the
step, and saying how to resume (docs/vllm.md).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..checkpoints import latest_complete_checkpoint
from ..trl_seam.vllm_generation import fail_the_processes_waiting_for_completions

T = TypeVar("T")

_WATCHED = "_trl_ada_health_watched"
_CLASS_METHOD = object()
"""Marks a patched method that was the class's own (no instance attribute to put back)."""


class VLLMServerError(RuntimeError):
    """The vLLM server (server mode) stopped answering during a sampling round."""


class VLLMServerUnresponsive(ConnectionError):
    """`GET /health` kept failing for the whole timeout while a request was waiting for the server's answer."""


def _is_server_failure(error: BaseException) -> bool:
    if isinstance(error, VLLMServerUnresponsive):
        return True
    # TRL's VLLMClient talks HTTP through `requests`, which is not a dependency of trl_ada: import it only here.
    try:
        import requests
    except ImportError:  # pragma: no cover - server mode cannot run without requests
        return False
    return isinstance(error, requests.exceptions.RequestException)


def _server_url(trainer: Any) -> str:
    client = getattr(getattr(trainer, "vllm_generation", None), "vllm_client", None)
    if client is not None:
        return client.base_url
    args = trainer.args
    return args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"


def vllm_server_message(
    trainer: Any, round_index: int | None, error: BaseException, during: str | None = None, step: int | None = None
) -> str:
    """What happened (server, round or `during`, step: the one under way unless given, the client's error) and how
    to continue."""
    during = during or f"sampling round {round_index}"
    step = trainer.state.global_step + 1 if step is None else step
    return (
        f"The vLLM server at {_server_url(trainer)} stopped answering during {during} of "
        f"training step {step} ({type(error).__name__}: {error}). Training cannot continue "
        f"without it. Restart the server with the same model on the same host and port, then "
        f"{resume_advice(trainer.args.output_dir)}"
    )


def resume_advice(output_dir: str) -> str:
    """How to continue a run that stopped: from its latest complete checkpoint, or from the start when it has none."""
    checkpoint = latest_complete_checkpoint(output_dir)
    if checkpoint is not None:
        return (
            f"resume from the latest complete checkpoint, {checkpoint}: `trainer.train(resume_from_checkpoint=True)` "
            "(`--resume_from_checkpoint true` with scripts/train_ada.py)."
        )
    return (
        f"start the run again: {output_dir!r} holds no complete checkpoint yet (set `save_steps` to make runs "
        "resumable)."
    )


def _health_failure(url: str, timeout: float) -> str | None:
    """None when `GET url` answers 200 within `timeout`, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:  # refused, reset, timed out
        return str(getattr(error, "reason", error))


class HealthWatch:
    """Tells when `GET health_url` has failed for `timeout` seconds in a row: `check()` once per `interval` while
    waiting on the server raises [`VLLMServerUnresponsive`] once it has."""

    def __init__(self, health_url: str, timeout: float, waiting_for: str = "a generation request") -> None:
        self.health_url, self.timeout, self.waiting_for = health_url, timeout, waiting_for
        self.interval = min(5.0, max(0.5, timeout / 10))  # seconds between two checks
        self._failing_since: float | None = None

    def reset(self) -> None:
        """The server answered (a request came back): whatever failed before does not count toward the timeout."""
        self._failing_since = None

    def check(self) -> None:
        failure = _health_failure(self.health_url, timeout=self.interval)
        if failure is None:
            self._failing_since = None
            return
        now = time.monotonic()
        self._failing_since = now if self._failing_since is None else self._failing_since
        if now - self._failing_since >= self.timeout:
            raise VLLMServerUnresponsive(
                f"{self.health_url} has not answered for {now - self._failing_since:.0f} s (vllm_server_timeout="
                f"{self.timeout:g}; last: {failure}) while {self.waiting_for} was waiting for its answer"
            )


def call_watching_health(
    call: Callable[[], T], health_url: str, timeout: float, waiting_for: str = "a generation request"
) -> T:
    """`call()`, abandoned with [`VLLMServerUnresponsive`] once `GET health_url` has failed for `timeout` seconds in a
    row (it runs in a daemon thread: a blocking socket read cannot be interrupted)."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the caller's thread below
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="trl-ada-vllm-request", daemon=True).start()
    watch = HealthWatch(health_url, timeout, waiting_for)
    while not done.wait(watch.interval):
        try:
            watch.check()
        except VLLMServerUnresponsive:
            if not done.is_set():
                raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def watch_server_health(client: Any, timeout: float) -> None:
    """Make `client.generate` (a TRL `VLLMClient`) give up on a server whose `/health` fails for `timeout` s. Idempotent."""
    if getattr(client, _WATCHED, False):
        return
    generate = client.generate
    health_url = f"{client.base_url}/health"

    @functools.wraps(generate)
    def watched_generate(*args: Any, **kwargs: Any) -> Any:
        return call_watching_health(functools.partial(generate, *args, **kwargs), health_url, timeout)

    client.generate = watched_generate
    setattr(client, _WATCHED, True)


@contextlib.contextmanager
def vllm_server_errors(trainer: Any, round_index: int) -> Iterator[None]:
    """
    Around one sampling round's generation: in server mode, the main process's TRL client watches the server's health,
    and a lost server (a failed or abandoned request) becomes a [`VLLMServerError`] raised on every process. Any other
    error passes through unchanged.
    """
    server_mode = getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "server"
    generation = getattr(trainer, "vllm_generation", None) if server_mode else None
    client = getattr(generation, "vllm_client", None)
    if client is not None:  # only the main process talks to the server
        watch_server_health(client, float(trainer.args.vllm_server_timeout))
    try:
        with _request_failures_reach_every_process(trainer, round_index, generation, client):
            yield
    except Exception as error:
        if not (server_mode and _is_server_failure(error)):
            raise
        raise VLLMServerError(vllm_server_message(trainer, round_index, error)) from error


_CLIENT_REQUESTS = ("generate", "image_features")
"""The `VLLMClient` calls `VLLMGeneration.generate` makes on the main process while the others wait for the answer."""


@contextlib.contextmanager
def _request_failures_reach_every_process(
    trainer: Any, round_index: int, generation: Any, client: Any
) -> Iterator[None]:
    """
    On the main process of several, in server mode: while open, a request of TRL's `VLLMGeneration.generate` that
    fails raises on every process, by answering the broadcast of completions the others wait in with the error (a lost
    server as the main process's [`VLLMServerError`], word for word). Requests made elsewhere (a `rollout_func`'s) are
    left alone: the other processes do not wait in that broadcast then.
    """
    if client is None or getattr(getattr(trainer, "accelerator", None), "num_processes", 1) < 2:
        yield
        return
    inside_generate = False

    def trls_generate(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal inside_generate
            inside_generate = True
            try:
                return method(*args, **kwargs)
            finally:
                inside_generate = False

        return call

    def request(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return method(*args, **kwargs)
            except Exception as error:
                if not inside_generate:
                    raise
                if not _is_server_failure(error):
                    fail_the_processes_waiting_for_completions(error)
                    raise
                lost = VLLMServerError(vllm_server_message(trainer, round_index, error))
                fail_the_processes_waiting_for_completions(lost)
                raise lost from error

        return call

    wrappers = [(generation, "generate", trls_generate)] + [(client, name, request) for name in _CLIENT_REQUESTS]
    with _methods_wrapped(wrappers):
        yield


@contextlib.contextmanager
def _methods_wrapped(
    wrappers: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]],
) -> Iterator[None]:
    """While open, each callable `target.name` of `wrappers` is shadowed by an instance attribute `wrap(method)`;
    closing puts back what the object had (its own instance attribute, or nothing)."""
    patched: list[tuple[Any, str, Any]] = []  # (target, name, its own instance attribute or _CLASS_METHOD)
    try:
        for target, name, wrap in wrappers:
            method = getattr(target, name, None)
            if callable(method):
                patched.append((target, name, vars(target).get(name, _CLASS_METHOD)))
                setattr(target, name, wrap(method))
        yield
    finally:
        for target, name, own in reversed(patched):
            if own is _CLASS_METHOD:
                delattr(target, name)
            else:
                setattr(target, name, own)


@contextlib.contextmanager
def server_calls_of_one_sync(
    targets: list[Any],
    method_names: tuple[str, ...],
    health_url: str,
    timeout: float,
    in_caller_thread: tuple[str, ...] = (),
) -> Iterator[list[BaseException]]:
    """
    While open, the calls `method_names` of each of `targets` (the main process's server-facing objects during one
    weight sync) are abandoned once `GET health_url` has failed for `timeout` s, except those `in_caller_thread`. The
    first call that fails is appended to the yielded list and every later call is skipped (its iterator arguments
    drained), so the main process still reaches each barrier of the sync; the caller raises the failure after it.
    """
    failures: list[BaseException] = []

    def watched(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            in_thread = name in in_caller_thread
            if not failures:
                try:
                    if in_thread:
                        return method(*args, **kwargs)
                    call_with_arguments = functools.partial(method, *args, **kwargs)
                    return call_watching_health(
                        call_with_arguments, health_url, timeout, f"the weight sync's `{name}`"
                    )
                except Exception as error:
                    failures.append(error)
                    if not in_thread:
                        return None  # an abandoned call's thread may still be reading its arguments
            for argument in (*args, *kwargs.values()):  # what a failed or skipped call left of its iterators
                if isinstance(argument, Iterator):
                    for _ in argument:
                        pass
            return None

        return call

    with _methods_wrapped(
        [(target, name, functools.partial(watched, name)) for target in targets for name in method_names]
    ):
        yield failures
