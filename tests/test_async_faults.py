"""
`AdaAsyncGRPOTrainer` with TRL's REAL rollout worker: a spawned child process (`AdaAsyncRolloutWorker`) generating from
the stand-in completions server of `tests/async_fixtures.py` over HTTP, on CPU. TRL's worker refuses to be built
without vLLM (`is_vllm_available()` in the parent); the child itself only needs aiohttp, so the parent's check is
patched and nothing else is. The trainer builds the worker itself (no `rollout_worker=`).

Then issue 23's faults, each bounded in time and leaving no process behind:

- unpicklable reward functions (a lambda, a closure) fail in `__init__`, before the model loads, with TRL's message
  (TRL itself fails at train start, in `AsyncRolloutWorker.start`);
- a reward function raising in the child: a `RolloutWorkerError` naming it, the child's traceback chained;
- the child killed: a `RolloutWorkerError` at the trainer's next health check (5 s), not once the heartbeat is stale,
  with every sampler (`uniform` runs TRL's own loop in our worker class, which finds a dead child and stops it);
- the server gone or frozen (`/v1/completions` never answering): the worker gives up once requests have failed for
  `vllm_server_timeout` (TRL alone retries for hours), and the trainer raises `VLLMServerError` naming the server and
  the checkpoint to resume from.

Without `AdaAsyncRolloutWorker.stop()`, every one of these hangs for ever after the error: TRL's `stop()` sets a
multiprocessing Event whose `set()` waits for the dead child's stop watcher to wake.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
import traceback

import pytest
import torch

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo.packing", reason="TRL's async trainer trains on CPU from 1.16")

from async_fixtures import (
    FaultyServer,
    InProcessWeightTransfer,
    ThreadRolloutWorker,
    chat_tokenizer,
    conversational,
    cpu_config,
    save_chat_model,
)
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module  # noqa: E402
from trl.experimental.async_grpo import async_rollout_worker  # noqa: E402

from trl_ada import AdaAsyncGRPOConfig, AdaAsyncGRPOTrainer  # noqa: E402
from trl_ada.async_grpo.async_grpo_trainer import RolloutWorkerError, spawns_a_child  # noqa: E402
from trl_ada.async_grpo.rollout import AdaAsyncRolloutWorker, AdaRolloutLoop, RobustAsyncRolloutWorker  # noqa: E402
from trl_ada.checkpoints import SAMPLER_STATE_NAME, checkpoint_problem, latest_complete_checkpoint  # noqa: E402
from trl_ada.generation.faults import VLLMServerError  # noqa: E402
from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset  # noqa: E402
from trl_ada.tiny import load_tiny_arith_model  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("tiny-arith-chat"))


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer(load_tiny_arith_model()[1])


@pytest.fixture(scope="module")
def dataset():
    return conversational(make_dataset(48, seed=0, levels=[0, 1, 2, 3]))


@pytest.fixture
def server(model_dir, tokenizer):
    with FaultyServer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer) as srv:
        yield srv


def _live_children() -> list[int]:
    """PIDs of this process's children that are still running (not zombies), read from /proc."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        # multiprocessing's resource tracker is shared by the whole session and outlives every test by design.
        if int(ppid) == os.getpid() and state != "Z" and "resource_tracker" not in cmdline:
            found.append(int(entry))
    return found


@pytest.fixture
def real_worker(monkeypatch):
    """TRL's spawned worker allowed without vLLM; after the test, no child process may be left running."""
    monkeypatch.setattr(async_rollout_worker, "is_vllm_available", lambda: True)
    yield
    leftover = multiprocessing.active_children()  # also reaps the ones that ended
    deadline = time.monotonic() + 5
    while _live_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = _live_children()
    for pid in alive:  # never leave one behind, even when failing
        os.kill(pid, 9)
    assert not leftover and not alive, f"child processes outlived the test: {leftover} {alive}"


def config(tmp_path, server, **overrides):
    return cpu_config(
        AdaAsyncGRPOConfig,
        tmp_path,
        server,
        **{**dict(max_steps=2, sampler="seq_balance", round_size=2, max_rounds=6), **overrides},
    )


class WorkerPids(TrainerCallback):
    """Records the rollout worker's child pid at every optimizer step."""

    def __init__(self):
        self.pids: list[int] = []
        self.trainer = None

    def on_step_end(self, args, state, control, **kwargs):
        self.pids.append(self.trainer.rollout_worker._process.pid)


def build(
    tmp_path,
    server,
    model_dir,
    tokenizer,
    dataset,
    callbacks=(),
    reward_funcs=exact_match_reward,
    weight_transfer=None,
    **overrides,
):
    trainer = AdaAsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=reward_funcs,
        args=config(tmp_path, server, **overrides),
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=weight_transfer or InProcessWeightTransfer(server),
        callbacks=list(callbacks),
    )
    for callback in callbacks:
        callback.trainer = trainer
    return trainer


# ---------------------------------------------------------------------------------------------------------------------
# 1. The real spawned worker trains
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.wall_clock_limit(120)
def test_the_real_spawned_worker_trains_seq_balance(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, real_worker, wall_clock_guard
):
    collated: list[list[dict]] = []
    original = trainer_module.DataCollatorForRollout.torch_call

    def recording(self, examples):
        (rows,) = examples
        collated.append([sample for row in rows for sample in row.samples])
        return original(self, examples)

    monkeypatch.setattr(trainer_module.DataCollatorForRollout, "torch_call", recording)
    pids = WorkerPids()
    start = time.monotonic()
    trainer = build(tmp_path, server, model_dir, tokenizer, dataset, callbacks=[pids])
    worker = trainer.rollout_worker
    assert type(worker) is AdaAsyncRolloutWorker and worker._loop_cls is AdaRolloutLoop
    trainer.train()
    print(f"trained in {time.monotonic() - start:.1f} s")
    assert trainer.state.global_step == 2
    assert len(set(pids.pids)) == 1 and pids.pids[0] != os.getpid()  # one child, not this process
    assert worker._process is None  # stopped at the end of train()
    assert sum(len(batch) for batch in collated) >= 16 and server.requests
    logged = {key for entry in trainer.state.log_history for key, value in entry.items() if value is not None}
    assert {"ada/samples_per_prompt/mean", "ada/async/pool_version_span_max"} <= logged


# ---------------------------------------------------------------------------------------------------------------------
# 2. Reward functions that cannot be pickled fail in __init__, before the model loads
# ---------------------------------------------------------------------------------------------------------------------


def _closure_reward():
    scale = 1.0

    def scaled(completions, **kwargs):
        return [scale] * len(completions)

    return scaled


@pytest.mark.wall_clock_limit(30)
@pytest.mark.parametrize("kind", ["lambda", "closure"])
def test_unpicklable_reward_functions_fail_in_init_before_the_model_loads(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, real_worker, wall_clock_guard, kind
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(trainer_module, "create_model_from_path", no_model)
    reward = (lambda completions, **kwargs: [0.0] * len(completions)) if kind == "lambda" else _closure_reward()
    with pytest.raises(TypeError, match="must be picklable") as info:
        build(tmp_path, server, model_dir, tokenizer, dataset, reward_funcs=[exact_match_reward, reward])
    print(info.value)
    assert "Not picklable: reward_funcs[1]" in str(info.value)  # which one
    # sampler="uniform" builds TRL's own worker, which pickles the same arguments.
    with pytest.raises(TypeError, match="must be picklable"):
        build(
            tmp_path,
            server,
            model_dir,
            tokenizer,
            dataset,
            reward_funcs=reward,
            sampler="uniform",
            round_size=8,
            max_rounds=4,
        )


def test_only_workers_that_spawn_a_child_need_picklable_arguments():
    assert spawns_a_child(AdaAsyncRolloutWorker) and spawns_a_child(async_rollout_worker.AsyncRolloutWorker)
    assert not spawns_a_child(ThreadRolloutWorker)  # an in-thread worker takes closures


# ---------------------------------------------------------------------------------------------------------------------
# 3-5. A failing reward, a killed worker, a dead or frozen server: a clear error on the main process, in bounded time
# ---------------------------------------------------------------------------------------------------------------------


def exploding_reward(completions, **kwargs):
    """Module-level (picklable): it reaches the child, and raises there."""
    raise ValueError("the grader crashed")


class AtStep(TrainerCallback):
    """Runs `action(trainer)` once, at the end of optimizer step `step`, and records when."""

    def __init__(self, step, action):
        self.step, self.action = step, action
        self.trainer = None
        self.at: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.at is None:
            self.at = time.monotonic()
            self.action(self.trainer)


def train_until_failure(trainer, expected: type[BaseException]) -> tuple[BaseException, float]:
    """`trainer.train()`, which must raise `expected`; returns the error and the monotonic time it reached us."""
    with pytest.raises(expected) as info:
        trainer.train()
    raised_at = time.monotonic()
    print("".join(traceback.format_exception(info.value)))
    return info.value, raised_at


def chained_text(error: BaseException) -> str:
    """Every message of `error`'s cause chain (TRL chains the child's formatted traceback as a message)."""
    texts = []
    while error is not None:
        texts.append(str(error))
        error = error.__cause__
    return "\n".join(texts)


def resume_advice(trainer) -> str:
    """The end of a fault's message: the newest complete checkpoint (`checkpoint-1` at least, saved every step) and
    how to resume from it (while `test_async_checkpoints_are_complete` fails: no checkpoint, start again)."""
    output_dir = trainer.args.output_dir
    assert os.path.isdir(os.path.join(output_dir, "checkpoint-1"))
    checkpoint = latest_complete_checkpoint(output_dir)
    if checkpoint is None:
        return (
            f"start the run again: {output_dir!r} holds no complete checkpoint yet (set `save_steps` to make runs "
            "resumable)."
        )
    return (
        f"resume from the latest complete checkpoint, {checkpoint}: `trainer.train(resume_from_checkpoint=True)` "
        "(`--resume_from_checkpoint true` with scripts/train_ada.py)."
    )


def test_async_checkpoints_are_complete(tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    # What AdaAsyncGRPOTrainer._save_optimizer_and_scheduler writes.
    (checkpoint / SAMPLER_STATE_NAME).write_text(json.dumps({"sampler": {}, "trainer": "AdaAsyncGRPOTrainer"}))
    assert checkpoint_problem(checkpoint) is None
    assert latest_complete_checkpoint(tmp_path) == str(checkpoint)


FAULT_SETTINGS = dict(max_steps=50, heartbeat_stale_after_s=60)
"""Enough steps that the fault must surface; a heartbeat slack that none of the checks below waits for."""


@pytest.mark.wall_clock_limit(90)
def test_a_reward_function_raising_in_the_worker_stops_training_naming_it(
    tmp_path, server, model_dir, tokenizer, dataset, real_worker, wall_clock_guard
):
    trainer = build(
        tmp_path,
        server,
        model_dir,
        tokenizer,
        dataset,
        reward_funcs=[exact_match_reward, exploding_reward],
        **{**FAULT_SETTINGS, "heartbeat_stale_after_s": 10},
    )
    start = time.monotonic()
    error, raised_at = train_until_failure(trainer, RolloutWorkerError)
    print(f"raised {raised_at - start:.1f} s after train()")
    message = str(error)
    assert message.startswith(
        f"The rollout worker (generating from the vLLM server at {server.base_url}) stopped during training step 1: "
        "RuntimeError: Reward function 'exploding_reward' raised while the rollout worker scored draws for policy "
        "version 1: ValueError: the grader crashed."
    )
    assert "holds no complete checkpoint yet" in message and trainer.state.global_step == 0
    chain = chained_text(error)  # the worker's own traceback, down to the reward function's line
    assert "Rollout worker child has failed" in chain and 'raise ValueError("the grader crashed")' in chain
    assert "in exploding_reward" in chain
    assert raised_at - start < 45


SAMPLER_SETTINGS = {
    "seq_balance": {},  # the pooling worker (AdaAsyncRolloutWorker, AdaRolloutLoop)
    "uniform": dict(sampler="uniform", round_size=8, max_rounds=4),  # TRL's own loop, in our worker class
}
"""Each kind of worker the trainer builds: `config`'s overrides for it."""


@pytest.mark.wall_clock_limit(90)
@pytest.mark.parametrize("sampler", SAMPLER_SETTINGS)
def test_a_killed_worker_process_stops_training(
    tmp_path, server, model_dir, tokenizer, dataset, real_worker, wall_clock_guard, sampler
):
    pids = []

    def kill_worker(trainer):
        pids.append(trainer.rollout_worker._process.pid)
        os.kill(pids[0], signal.SIGKILL)

    kill = AtStep(1, kill_worker)
    trainer = build(
        tmp_path, server, model_dir, tokenizer, dataset, callbacks=[kill], save_strategy="steps", save_steps=1,
        **FAULT_SETTINGS, **SAMPLER_SETTINGS[sampler],
    )  # fmt: skip
    if sampler == "uniform":  # TRL's loop, unchanged (its groups and advantages), in our worker class
        worker = trainer.rollout_worker
        assert type(worker) is RobustAsyncRolloutWorker and worker._loop_cls is async_rollout_worker._AsyncRolloutLoop
    error, raised_at = train_until_failure(trainer, RolloutWorkerError)
    print(f"raised {raised_at - kill.at:.1f} s after the kill")
    assert str(error) == (
        f"The rollout worker (generating from the vLLM server at {server.base_url}) stopped during training step "
        f"{trainer.state.global_step + 1}: Rollout worker child (pid {pids[0]}) was killed by SIGKILL without "
        "reporting an error. Training cannot continue without it. Fix the cause (the worker's error and "
        f"traceback are chained to this one), then {resume_advice(trainer)}"
    )
    # Found dead at the trainer's next health check (every 5 s without a sample), not when the heartbeat is stale.
    assert raised_at - kill.at < 25


@pytest.mark.wall_clock_limit(90)
@pytest.mark.parametrize("fault", ["kill", "freeze", "stop"])
def test_a_dead_or_frozen_server_stops_training_with_the_server_and_the_checkpoint(
    tmp_path, server, model_dir, tokenizer, dataset, real_worker, wall_clock_guard, fault
):
    # "stop" keeps TRL's default request_timeout (600 s): the worker must not wait for a request to fail.
    request_timeout = 600 if fault == "stop" else 2
    stop_server = AtStep(1, lambda trainer: getattr(server, fault)())
    trainer = build(
        tmp_path, server, model_dir, tokenizer, dataset, callbacks=[stop_server], save_strategy="steps",
        save_steps=1, request_timeout=request_timeout, vllm_server_timeout=3, **FAULT_SETTINGS,
    )  # fmt: skip
    error, raised_at = train_until_failure(trainer, VLLMServerError)
    print(f"raised {raised_at - stop_server.at:.1f} s after the server's {fault}")
    message = str(error)
    assert message.startswith(
        f"The vLLM server at {server.base_url} stopped answering during generation of training step "
        f"{trainer.state.global_step + 1} (VLLMServerUnresponsive: "
    )
    assert f"to {server.base_url} has failed for " in message
    assert f"vllm_server_timeout=3, request_timeout={request_timeout}" in message
    if fault == "stop":
        assert "/health does not answer" in message
    assert message.endswith(
        "Training cannot continue without it. Restart the server with the same model on the same host and port, "
        f"then {resume_advice(trainer)}"
    )
    # vllm_server_timeout of failing requests (each up to request_timeout, retried after 1-2 s), then the next check.
    assert raised_at - stop_server.at < 30


class PausingOverHTTP(InProcessWeightTransfer):
    """The weights go in-process, but the pause and resume around them are TRL's HTTP calls (`VLLMClient.pause` and
    `resume`, timeout 1800 s), as TRL's NCCL `WeightTransferClient` and its LoRA sync make them."""

    def __init__(self, server):
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        super().__init__(server)
        self.client = VLLMClient(server.base_url)

    def pause(self):
        self.client.pause()

    def resume(self):
        self.client.resume()


@pytest.mark.wall_clock_limit(90)
def test_a_server_that_stops_answering_before_a_weight_sync_stops_training_there(
    tmp_path, server, model_dir, tokenizer, dataset, real_worker, wall_clock_guard
):
    # The server stops answering (everything: requests and /health) at the end of step 2, before its weight sync.
    # TRL's trainer waits in the sync's pause for 1800 s (the guard fails the test); ours gives up after
    # vllm_server_timeout and raises, naming the sync, the server and the checkpoint of step 1.
    stop_server = AtStep(2, lambda trainer: server.stop())
    trainer = build(
        tmp_path, server, model_dir, tokenizer, dataset, callbacks=[stop_server], save_strategy="steps",
        save_steps=1, vllm_server_timeout=3, weight_transfer=PausingOverHTTP(server), **FAULT_SETTINGS,
    )  # fmt: skip
    error, raised_at = train_until_failure(trainer, VLLMServerError)
    print(f"raised {raised_at - stop_server.at:.1f} s after the server stopped")
    assert str(error).startswith(
        f"The vLLM server at {server.base_url} stopped answering during the weight sync at the end of training step 2 "
        f"(VLLMServerUnresponsive: {server.base_url}/health has not answered for "
    )
    assert str(error).endswith(
        "Training cannot continue without it. Restart the server with the same model on the same host and port, "
        f"then {resume_advice(trainer)}"
    )
    assert "checkpoint-1" in str(error) and trainer.state.global_step == 2
    assert 3 <= raised_at - stop_server.at < 30


def test_a_synchronous_checkpoint_still_needs_its_refill_position(tmp_path):
    checkpoint = tmp_path / "checkpoint-1"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / SAMPLER_STATE_NAME).write_text(json.dumps({"sampler": {}}))  # no refill, no asynchronous trainer
    assert "no 'refill' object" in checkpoint_problem(checkpoint)
