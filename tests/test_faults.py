"""trl_ada.faults without vLLM: a stalled request is abandoned once /health fails; lost-server errors are explained."""

from __future__ import annotations

import http.server
import threading
import time
from types import SimpleNamespace

import pytest
import requests

from trl_ada.faults import VLLMServerError, VLLMServerUnresponsive, call_watching_health, vllm_server_errors


class _Handler(http.server.BaseHTTPRequestHandler):
    healthy = True

    def do_GET(self):  # noqa: N802 - http.server's naming
        self.send_response(200 if type(self).healthy else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Handler,), {"healthy": True}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/health"


def test_slow_call_on_a_healthy_server_completes(health_server):
    # Longer than the timeout, but the server keeps answering /health: a long generation is not a dead server.
    assert call_watching_health(lambda: time.sleep(1.5) or "done", _url(health_server), timeout=0.5) == "done"


def test_stalled_call_is_abandoned_when_health_fails(health_server):
    health_server.RequestHandlerClass.healthy = False
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(VLLMServerUnresponsive, match="has not answered"):
        call_watching_health(release.wait, _url(health_server), timeout=1.0)
    assert time.monotonic() - start < 5
    release.set()


def test_errors_of_the_call_pass_through(health_server):
    def fail():
        raise ValueError("bad request")

    with pytest.raises(ValueError, match="bad request"):
        call_watching_health(fail, _url(health_server), timeout=1.0)


def _trainer(tmp_path, mode="server"):
    client = SimpleNamespace(base_url="http://10.0.0.1:8000", generate=lambda *a, **k: None)
    return SimpleNamespace(
        use_vllm=True,
        vllm_mode=mode,
        vllm_generation=SimpleNamespace(vllm_client=client),
        args=SimpleNamespace(output_dir=str(tmp_path), vllm_server_timeout=240.0),
        state=SimpleNamespace(global_step=2),
    )


def test_lost_server_becomes_a_clear_error(tmp_path):
    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    with pytest.raises(VLLMServerError) as info:
        with vllm_server_errors(_trainer(tmp_path), round_index=2):
            raise requests.exceptions.ConnectionError("Max retries exceeded")
    message = str(info.value)
    assert message.startswith("The vLLM server at http://10.0.0.1:8000 stopped answering during sampling round 2 of ")
    assert "training step 3" in message and str(checkpoint) in message and "resume_from_checkpoint=True" in message
    assert isinstance(info.value.__cause__, requests.exceptions.ConnectionError)


def test_no_checkpoint_says_start_again(tmp_path):
    with pytest.raises(VLLMServerError, match="holds no complete checkpoint yet"):
        with vllm_server_errors(_trainer(tmp_path), round_index=1):
            raise requests.exceptions.ReadTimeout("read timed out")


@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_other_errors_pass_through(tmp_path, mode):
    with pytest.raises(KeyError):
        with vllm_server_errors(_trainer(tmp_path, mode), round_index=1):
            raise KeyError("not the server")
    if mode == "colocate":
        with pytest.raises(requests.exceptions.ConnectionError):
            with vllm_server_errors(_trainer(tmp_path, mode), round_index=1):
                raise requests.exceptions.ConnectionError("colocate mode has no server")
