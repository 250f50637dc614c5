"""A stand-in for `trl vllm-serve` over real HTTP, for the continuous schedule's tests on machines without vLLM.

It serves what TRL's `VLLMClient` and trl-ada's `ServerDraws` use: `GET /health`, `GET /v1/models`,
`POST /reset_prefix_cache` and `POST /v1/completions` (one choice per prompt and `n`, with token ids and per-token
log-probs in vLLM's format). A completion is a random digit then `<eos>`-terminated padding digits; "correct" ones
(first digit below 5) are shorter, and a request is answered after `seconds_per_token` per completion token, so short
(correct) completions come back first, as on a real engine. A client that closes its connection before the answer
aborts the request: the server sees the close while it "decodes" and records the request as aborted.

With `dies_at_request=k`, the server's engine "dies" when the k-th `/v1/completions` request arrives, as a vLLM server
whose engine died mid-generation: that request and every later one are never answered, and `/health` answers 503.
"""

from __future__ import annotations

import contextlib
import json
import random
import select
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _BackloggedHTTPServer(ThreadingHTTPServer):
    """Listens with uvicorn's backlog, as `trl vllm-serve` does: the continuous schedule opens one connection per draw,
    and the standard library's 5 pending connections overflow when both processes connect at once on a loaded machine."""

    request_queue_size = 2048


@dataclass
class Request:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    aborted: bool = False


@dataclass
class FakeVLLMServer:
    digit_ids: list[int]
    """Token ids of "0".."9"."""
    eos_id: int
    seconds_per_token: float = 0.01
    seed: int = 0
    dies_at_request: int | None = None
    requests: list[Request] = field(default_factory=list)
    completion_requests: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._rng = random.Random(self.seed)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/health":
                    self._reply({}, status=503 if server.dead else 200)
                elif self.path.rstrip("/") == "/v1/models":
                    self._reply({"data": [{"id": "fake-tiny"}]})
                else:
                    self._reply({"error": self.path}, status=404)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.rstrip("/") == "/reset_prefix_cache":
                    self._reply({"success": True})
                elif self.path.rstrip("/") == "/v1/completions":
                    server._complete(self, json.loads(body))
                else:
                    self._reply({"error": self.path}, status=404)

            def _reply(self, payload: dict, status: int = 200) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._http = _BackloggedHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def dead(self) -> bool:
        return self.dies_at_request is not None and self.completion_requests >= self.dies_at_request

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def _draw(self, prompt_ids: list[int], max_tokens: int) -> Request:
        with self._lock:
            first = self._rng.randrange(10)
            length = 1 if first < 5 else 4  # correct completions are shorter
            tokens = [self.digit_ids[first]] + [self.digit_ids[self._rng.randrange(10)] for _ in range(length - 1)]
            completion = [*tokens, self.eos_id][:max_tokens]
            logprobs = [round(-self._rng.uniform(0.1, 3.0), 4) for _ in completion]
            request = Request(list(prompt_ids), completion, logprobs)
            self.requests.append(request)
            return request

    def _complete(self, handler: BaseHTTPRequestHandler, payload: dict[str, Any]) -> None:
        self.completion_requests += 1
        if self.dead:  # never answered: wait until the client or the server closes the connection
            with contextlib.suppress(OSError):
                while handler.connection.recv(1024):
                    pass
            handler.close_connection = True
            return
        draws = [
            self._draw(prompt, payload.get("max_tokens", 16))
            for prompt in payload["prompt"]
            for _ in range(payload["n"])
        ]
        # "Decode": wait as long as the longest completion takes; a client that hangs up meanwhile aborts them all.
        delay = self.seconds_per_token * max(len(draw.completion_ids) for draw in draws)
        readable, _, _ = select.select([handler.connection], [], [], delay)
        if readable and not handler.connection.recv(
            1, socket.MSG_PEEK
        ):  # MSG_PEEK: b"" means the client closed the connection
            for draw in draws:
                draw.aborted = True
            handler.close_connection = True
            return
        choices = [
            {
                "index": i,
                "text": "",
                "prompt_token_ids": draw.prompt_ids,
                "token_ids": draw.completion_ids,
                "finish_reason": "stop",
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in draw.completion_ids],
                    "token_logprobs": draw.logprobs,
                    "top_logprobs": [None] * len(draw.completion_ids),
                },
            }
            for i, draw in enumerate(draws)
        ]
        handler._reply({"choices": choices})
