"""trl_ada.generation.faults without vLLM: a stalled request is abandoned once /health fails; lost-server errors are explained."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
import time
from types import SimpleNamespace

import pytest
import requests

from trl_ada.generation.faults import (
    HealthWatch,
    VLLMServerError,
    VLLMServerUnresponsive,
    call_watching_health,
    server_calls_of_one_sync,
    vllm_server_errors,
)


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


class _Generation:
    """TRL's `VLLMGeneration` in server mode, as the main process runs it: the gathers, the client's request, then the
    completions broadcast the other processes wait in."""

    def __init__(self, client) -> None:
        self.vllm_client = client

    def generate(self, prompts):
        return self.vllm_client.generate(prompts=prompts)


def _two_process_trainer(tmp_path, client):
    trainer = _trainer(tmp_path)
    trainer.vllm_generation = _Generation(client)
    trainer.accelerator = SimpleNamespace(num_processes=2)
    return trainer


def _failing_client(error: Exception):
    def generate(**kwargs):
        raise error

    return SimpleNamespace(base_url="http://10.0.0.1:8000", generate=generate)


def test_a_failed_request_is_sent_to_the_processes_waiting_for_its_completions(tmp_path, monkeypatch):
    # Issue 32, item 22: the other processes wait in TRL's completions broadcast; they receive the main process's
    # VLLMServerError there (tests/test_multiprocess.py runs it on two processes).
    import trl_ada.generation.faults as faults

    sent: list[BaseException] = []
    monkeypatch.setattr(faults, "fail_the_processes_waiting_for_completions", sent.append)
    client = _failing_client(requests.exceptions.ConnectionError("Connection aborted"))
    trainer = _two_process_trainer(tmp_path, client)
    with pytest.raises(VLLMServerError) as info:
        with vllm_server_errors(trainer, round_index=2):
            trainer.vllm_generation.generate([[1, 2]])
    assert sent == [info.value]
    assert str(info.value).startswith(
        "The vLLM server at http://10.0.0.1:8000 stopped answering during sampling round 2"
    )
    assert isinstance(info.value.__cause__, requests.exceptions.ConnectionError)
    # Any other failure of the request is sent as itself; the methods are the objects' own again afterwards.
    client.generate = _failing_client(Exception("Request failed: 400, bad prompt")).generate
    with pytest.raises(Exception, match="Request failed: 400") as info:
        with vllm_server_errors(trainer, round_index=3):
            trainer.vllm_generation.generate([[1, 2]])
    assert sent[1:] == [info.value]
    assert "generate" not in vars(trainer.vllm_generation)


def test_a_request_outside_trls_generation_is_not_sent(tmp_path, monkeypatch):
    # A rollout_func may call the client itself: the other processes do not wait in TRL's broadcast then.
    import trl_ada.generation.faults as faults

    sent: list[BaseException] = []
    monkeypatch.setattr(faults, "fail_the_processes_waiting_for_completions", sent.append)
    trainer = _two_process_trainer(tmp_path, _failing_client(requests.exceptions.ConnectionError("refused")))
    with pytest.raises(VLLMServerError):
        with vllm_server_errors(trainer, round_index=1):
            trainer.vllm_generation.vllm_client.generate(prompts=[[1, 2]])
    assert sent == []


# ---------------------------------------------------------------------------------------------------------------
# The continuous schedule: its draws are its own requests, watched the same way (issue 21, item 1)
# ---------------------------------------------------------------------------------------------------------------


class FrozenServer:
    """A socket that accepts every connection (requests and `/health` alike) and never answers any."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.connections: list[socket.socket] = []
        self.base_url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.connections.append(self.socket.accept()[0])

    def close(self) -> None:
        for connection in self.connections:
            connection.close()
        self.socket.close()


@pytest.fixture
def frozen_server():
    server = FrozenServer()
    yield server
    server.close()


def in_thread(call, seconds: float):
    """Run `call` in a thread; return what it raised (or returned) within `seconds`, so a hang fails the test."""
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s: the call hangs"
    return outcome


def test_server_draws_give_up_on_a_server_that_accepts_and_never_answers(frozen_server):
    from trl_ada.schedules.server_draws import ServerDraws

    with ServerDraws(frozen_server.base_url, {"model": "m"}, health_timeout=1.0) as draws:
        draws.submit(("p", 0), [1, 2])
        start = time.monotonic()
        outcome = in_thread(draws.wait, 20)
    assert isinstance(outcome.get("error"), VLLMServerUnresponsive), outcome
    assert "/health has not answered" in str(outcome["error"])
    assert 1.0 <= time.monotonic() - start < 10


def _continuous_trainer(tmp_path, base_url, main: bool):
    from trl_ada.samplers import SamplerSettings, build_sampler

    return SimpleNamespace(
        ada_sampler=build_sampler(
            SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="seq_balance")
        ),
        vllm_generation=SimpleNamespace(vllm_client=SimpleNamespace(base_url=base_url)),
        mask_truncated_completions=False,
        args=SimpleNamespace(
            continuous_max_in_flight=64, vllm_server_timeout=1.0, output_dir=str(tmp_path), vllm_server_base_url=None
        ),
        state=SimpleNamespace(global_step=2),
        accelerator=SimpleNamespace(is_main_process=main, num_processes=2),
    )


def test_a_frozen_server_on_the_continuous_schedule_is_a_vllm_server_error_on_every_process(
    tmp_path, frozen_server, monkeypatch
):
    import trl_ada.schedules.continuous as schedule
    from trl_ada.samplers.streaming import ScheduleStats

    checkpoint = tmp_path / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    announced: list = []
    monkeypatch.setattr(schedule, "sync_server_weights_for_step", lambda trainer: None)
    monkeypatch.setattr(schedule, "tokenize_prompts", lambda trainer, prompts: [[1, 2]] * len(prompts))
    monkeypatch.setattr(schedule, "server_sampling_params", lambda generation: {})
    monkeypatch.setattr(schedule, "completions_payload", lambda client, params, prompt: {"model": "m"})
    monkeypatch.setattr(schedule, "broadcast_object_list", lambda objects: announced.extend(objects) or objects)
    main = _continuous_trainer(tmp_path, frozen_server.base_url, main=True)
    rows = [{"prompt": "x"}] * 2
    outcome = in_thread(lambda: schedule.sample_continuously(main, rows, ["a", "b"], [[], []]), 30)
    error = outcome.get("error")
    assert isinstance(error, VLLMServerError), outcome
    message = str(error)
    assert message.startswith(
        f"The vLLM server at {frozen_server.base_url} stopped answering during continuous sampling (the draws of "
        "scoring batch 1) of training step 3"
    )
    assert str(checkpoint) in message and "resume_from_checkpoint=True" in message
    assert isinstance(error.__cause__, VLLMServerUnresponsive)
    # The other processes, waiting for the main process's next announcement, raise the same error.
    assert announced == [("failed", ("server", message))]
    monkeypatch.setattr(schedule, "broadcast_object_list", lambda objects: announced)
    follower = _continuous_trainer(tmp_path, frozen_server.base_url, main=False)
    with pytest.raises(VLLMServerError) as on_follower:
        schedule._follow(follower, rows, ["a", "b"], [{}, {}], ScheduleStats())
    assert str(on_follower.value) == message


def test_a_server_nothing_listens_on_is_a_vllm_server_error_on_the_continuous_schedule(tmp_path, monkeypatch):
    # Issue 32, item 22: the draw's connection was opened outside the request's `try`, so a refused connection came out
    # as a bare ConnectionRefusedError (announced to the other processes as "some other failure"), not as the error
    # that names the server and says how to go on.
    import trl_ada.schedules.continuous as schedule

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    base_url = f"http://127.0.0.1:{port}"  # closed again: nothing listens there
    announced: list = []
    monkeypatch.setattr(schedule, "sync_server_weights_for_step", lambda trainer: None)
    monkeypatch.setattr(schedule, "tokenize_prompts", lambda trainer, prompts: [[1, 2]] * len(prompts))
    monkeypatch.setattr(schedule, "server_sampling_params", lambda generation: {})
    monkeypatch.setattr(schedule, "completions_payload", lambda client, params, prompt: {"model": "m"})
    monkeypatch.setattr(schedule, "broadcast_object_list", lambda objects: announced.extend(objects) or objects)
    main = _continuous_trainer(tmp_path, base_url, main=True)
    outcome = in_thread(lambda: schedule.sample_continuously(main, [{"prompt": "x"}] * 2, ["a", "b"], [[], []]), 30)
    error = outcome.get("error")
    assert isinstance(error, VLLMServerError), outcome
    message = str(error)
    assert message.startswith(
        f"The vLLM server at {base_url} stopped answering during continuous sampling (the draws of scoring batch 1) "
        f"of training step 3 (ServerDrawError: cannot connect to the vLLM server at 127.0.0.1:{port}: "
    ), message
    assert "Restart the server with the same model on the same host and port, then start the run again" in message
    assert announced == [("failed", ("server", message))]


def test_health_watch_counts_failures_in_a_row_since_the_server_last_answered(health_server):
    watch = HealthWatch(_url(health_server), timeout=1.0)
    health_server.RequestHandlerClass.healthy = False
    watch.check()  # the first failure starts the clock
    time.sleep(1.1)
    watch.reset()  # a draw came back: the server answers, whatever /health said
    watch.check()  # failing again, counted from here
    time.sleep(1.1)
    with pytest.raises(VLLMServerUnresponsive, match="has not answered for 1 s"):
        watch.check()
    health_server.RequestHandlerClass.healthy = True
    watch.check()  # healthy: the clock stops
    health_server.RequestHandlerClass.healthy = False
    watch.check()


# ---------------------------------------------------------------------------------------------------------------
# The asynchronous trainer's weight sync: the main process's server calls between barriers (issue 23, item 6)
# ---------------------------------------------------------------------------------------------------------------


class SyncCalls:
    """What TRL's main process calls during a weight sync: a pause and resume over HTTP (TRL's own `VLLMClient`
    calls, timeout 1800 s), and a transfer taking an iterator."""

    def __init__(self, base_url: str) -> None:
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        self.client = VLLMClient(base_url)
        self.called: list[str] = []

    def pause(self) -> None:
        self.called.append("pause")
        self.client.pause()

    def send_weights(self, iterator) -> str:
        self.called.append("send_weights")
        for _ in iterator:
            pass
        return "sent"

    def resume(self) -> None:
        self.called.append("resume")
        self.client.resume()


def _parameters(taken: list[int]):
    for index in range(3):
        taken.append(index)  # on another process, a collective (FSDP's full_tensor) each
        yield f"p{index}", index


def test_a_weight_sync_goes_on_without_a_server_that_stopped_answering(frozen_server):
    calls = SyncCalls(frozen_server.base_url)
    taken: list[int] = []

    def sync():
        with server_calls_of_one_sync(
            [calls], ("pause", "send_weights", "resume"), f"{frozen_server.base_url}/health", timeout=1.0
        ) as failures:
            results = [calls.pause(), calls.send_weights(_parameters(taken)), calls.resume()]
        return failures, results

    start = time.monotonic()
    outcome = in_thread(sync, 20)
    failures, results = outcome["value"]
    # The pause is given up once /health has failed for the timeout (not after TRL's 1800 s); the rest is skipped,
    # the transfer's iterator drained all the same (the other processes' collectives), and the sync returns.
    assert 1.0 <= time.monotonic() - start < 10
    assert [type(failure) for failure in failures] == [VLLMServerUnresponsive]
    assert "/health has not answered" in str(failures[0])
    assert calls.called == ["pause"] and results == [None, None, None] and taken == [0, 1, 2]
    # Closing gives the object its own methods back.
    assert "pause" not in vars(calls) and calls.send_weights(iter(())) == "sent"


def test_a_weight_sync_on_an_answering_server_is_unchanged_and_a_failed_transfer_is_kept(health_server):
    base_url = f"http://127.0.0.1:{health_server.server_address[1]}"
    calls = SyncCalls(base_url)
    calls.client.pause = calls.client.resume = lambda: None  # the health server serves /health only
    taken: list[int] = []
    with server_calls_of_one_sync(
        [calls], ("pause", "send_weights", "resume"), f"{base_url}/health", timeout=1.0
    ) as failures:
        assert calls.send_weights(_parameters(taken)) == "sent"
        calls.pause()
    assert failures == [] and calls.called == ["send_weights", "pause"]

    def broken_transfer(iterator):
        next(iterator)
        raise RuntimeError("Weight sync to the vLLM server failed")

    taken.clear()
    calls.send_weights = broken_transfer
    with server_calls_of_one_sync(
        [calls], ("send_weights", "resume"), f"{base_url}/health", timeout=1.0, in_caller_thread=("send_weights",)
    ) as failures:
        assert calls.send_weights(_parameters(taken)) is None
        calls.resume()
    assert [str(failure) for failure in failures] == ["Weight sync to the vLLM server failed"]
    assert taken == [0, 1, 2]  # what the failed transfer left of its iterator was drained
    assert calls.called == ["send_weights", "pause"]  # resume was skipped
