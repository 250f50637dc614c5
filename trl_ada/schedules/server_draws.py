"""Single completions from a vLLM server, each its own request, any of which can be aborted (vLLM aborts a request
whose connection closed). The requests are those TRL's `VLLMClient` builds (its payload, one prompt, `n=1`), sent
from an asyncio loop on a background thread over plain HTTP/1.1 connections, one per draw: standard library only,
since the training side of server mode needs nothing but TRL's own dependencies."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import queue
import threading
import time
import urllib.parse
from collections.abc import Hashable, Sequence
from typing import Any

from ..generation.faults import HealthWatch

logger = logging.getLogger(__name__)


# Descriptors left for everything else the training process opens (checkpoints, datasets, collectives' sockets).
SPARE_OPEN_FILES = 256


def ensure_open_files(connections: int) -> None:
    """Make sure this process may hold `connections` draws in flight (one socket each) besides `SPARE_OPEN_FILES`:
    raise the soft open-file limit up to the hard one if needed (vLLM's server does the same for itself), or fail
    with the fix. On platforms without POSIX resource limits there is nothing to check."""
    try:
        import resource
    except ImportError:
        return
    needed = connections + SPARE_OPEN_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        logger.info("Raised the open-file limit from %d to %d for %d draws in flight.", soft, needed, connections)
        return
    raise ValueError(
        f"continuous_max_in_flight={connections} keeps that many HTTP connections open, and this process may open "
        f"{hard} files at most (`ulimit -Hn`), {SPARE_OPEN_FILES} of which trl-ada leaves to everything else. Lower "
        f"continuous_max_in_flight to {max(hard - SPARE_OPEN_FILES, 1)} or less, or raise the hard limit."
    )


class ServerDrawError(RuntimeError):
    """A draw's request failed: the server answered with an error, or the connection could not be made or broke."""


class ServerDraws:
    """Sends draws to a vLLM server and hands back the ones that finished. Not thread-safe: one caller thread.

    Args:
        base_url: The server's `http://host:port` (TRL's `VLLMClient.base_url`).
        payload: The `/v1/completions` body TRL's client builds for one prompt (its sampling parameters); each draw
            sends it with its own `prompt` and `n=1`.
        max_connections: Draws in flight on the server at most; later ones wait here, in submission order (each draw
            holds one connection, and the process's file descriptors are limited).
        health_timeout: While `wait` blocks, the server's `GET /health` is checked (`trl_ada.generation.faults.HealthWatch`);
            once it has failed for this many seconds (`vllm_server_timeout`), `wait` raises `VLLMServerUnresponsive`.
            A draw's own request has no read timeout: a long generation is not a dead server. None: no watch.
    """

    def __init__(
        self, base_url: str, payload: dict[str, Any], max_connections: int = 2048, health_timeout: float | None = None
    ) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"Not an http(s) server URL: {base_url!r}")
        self._host = url.hostname
        self._port = url.port or (443 if url.scheme == "https" else 80)
        self._ssl = url.scheme == "https"
        self._path = (url.path.rstrip("/") or "") + "/v1/completions"
        self._payload = {key: value for key, value in payload.items() if key != "prompt"} | {"n": 1}
        health_url = urllib.parse.urlunsplit((url.scheme, url.netloc, url.path.rstrip("/") + "/health", "", ""))
        self._health = None if health_timeout is None else HealthWatch(health_url, health_timeout, "a draw")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="trl-ada-server-draws", daemon=True)
        self._thread.start()
        self._slots = asyncio.Semaphore(max_connections)  # bound to the loop that first waits on it
        self._futures: dict[Hashable, concurrent.futures.Future] = {}
        # Finished draws, as their requests end (aborted ones too: `wait` skips them). `wait` then costs O(draws
        # finished), not O(draws in flight): thousands can be in flight.
        self._finished: queue.SimpleQueue[tuple[Hashable, concurrent.futures.Future]] = queue.SimpleQueue()

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    def submit(self, key: Hashable, prompt_ids: Sequence[int]) -> None:
        """Send one draw for the prompt with these token ids; `key` names it in `wait` and `abort`."""
        if key in self._futures:
            raise ValueError(f"draw {key!r} is already in flight")
        body = json.dumps({**self._payload, "prompt": [list(prompt_ids)]}).encode()
        future = asyncio.run_coroutine_threadsafe(self._post(body), self._loop)
        self._futures[key] = future
        future.add_done_callback(lambda done, key=key: self._finished.put((key, done)))

    def wait(self, timeout: float | None = None) -> list[tuple[Hashable, dict[str, Any]]]:
        """Block until at least one draw finished (or `timeout` seconds passed), then return every finished draw as
        `(key, choice)`, `choice` being the server's completion choice. A failed draw raises `ServerDrawError`; a
        server whose `/health` fails for `health_timeout` seconds while this waits raises `VLLMServerUnresponsive`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        finished: list[tuple[Hashable, dict[str, Any]]] = []
        while self._futures:
            try:
                if finished:
                    key, future = self._finished.get_nowait()
                else:
                    key, future = self._next_finished(deadline)
            except queue.Empty:
                break
            if self._futures.get(key) is not future:
                continue  # aborted: no longer ours
            del self._futures[key]
            finished.append((key, future.result()))
            if self._health is not None:
                self._health.reset()  # the server answered
        return finished

    def _next_finished(self, deadline: float | None) -> tuple[Hashable, concurrent.futures.Future]:
        """The next finished draw, waiting at most until `deadline` (queue.Empty then), watching the server's health."""
        while True:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            if self._health is None:
                return self._finished.get(timeout=remaining)
            step = self._health.interval if remaining is None else min(remaining, self._health.interval)
            try:
                return self._finished.get(timeout=step)
            except queue.Empty:
                if remaining is not None and remaining <= step:
                    raise
            self._health.check()

    def abort(self, keys: Sequence[Hashable]) -> int:
        """Abort these draws (closing a draw's connection makes vLLM abort its request); returns how many were in
        flight. Unknown or finished keys are ignored."""
        count = 0
        for key in keys:
            future = self._futures.pop(key, None)
            if future is not None:
                future.cancel()
                count += 1
        return count

    def close(self) -> None:
        """Abort every draw still in flight (their connections closed before this returns) and stop the loop."""
        self.abort(list(self._futures))
        try:
            asyncio.run_coroutine_threadsafe(self._cancel_all(), self._loop).result(timeout=30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    async def _cancel_all(self) -> None:
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __enter__(self) -> ServerDraws:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def _post(self, body: bytes) -> dict[str, Any]:
        async with self._slots:
            try:
                reader, writer = await asyncio.open_connection(self._host, self._port, ssl=self._ssl or None)
            except OSError as error:  # refused, unreachable, unknown host: the server is not there
                raise ServerDrawError(
                    f"cannot connect to the vLLM server at {self._host}:{self._port}: {error}"
                ) from error
            try:
                head = (
                    f"POST {self._path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
                status_line = await reader.readline()
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = headers.get("content-length")
                data = await (reader.readexactly(int(length)) if length is not None else reader.read())
            except (OSError, asyncio.IncompleteReadError) as error:
                raise ServerDrawError(f"connection to the vLLM server broke: {error}") from error
            finally:
                # Closing the connection is also the abort: a cancelled task ends here.
                writer.close()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or parts[1] != "200":
            raise ServerDrawError(f"vLLM server answered {status_line.decode('latin-1').strip()!r}: {data[:500]!r}")
        choices = json.loads(data)["choices"]
        if len(choices) != 1:
            raise ServerDrawError(f"expected one choice per draw, got {len(choices)}")
        return choices[0]
