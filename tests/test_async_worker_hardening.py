"""
The asynchronous trainer's rollout worker (`trl_ada/async_grpo/rollout.py`) and what the trainer takes from it
(`trl_ada/async_grpo/trainer.py`): DAPO's bound on drawing, the sampler state and dropped rows handed over at a save,
staleness per group, and the pass-rate predictor in a saved model (issue 32, items 13-16). The worker's pieces are
driven by hand or in a thread against the stand-in completions server of `tests/async_fixtures.py`.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import multiprocessing as mp
import queue
import time

import pytest
import torch
from async_fixtures import (
    FakeCompletionsServer,
    ThreadRolloutWorker,
    chat_tokenizer,
    conversational,
    cpu_config,
    save_chat_model,
    trainer_loop_kwargs,
)
from datasets import Dataset

from trl_ada.samplers import SamplerSettings
from trl_ada.samplers.dapo import BatchExhaustedError

pytest.importorskip("aiohttp")
rollout_worker = pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
from trl_ada import AdaAsyncGRPOConfig  # noqa: E402
from trl_ada.async_grpo.rollout import AdaRolloutLoop, AsyncSampling  # noqa: E402
from trl_ada.async_grpo.trainer import RolloutWorkerError, worker_failure  # noqa: E402


@pytest.fixture(autouse=True)
def accelerate_state():
    # TRL's loop logs through accelerate's logger, which needs the state its child process sets up (`_child_main`).
    from accelerate.state import PartialState

    PartialState()


@pytest.fixture(scope="module")
def tokenizer():
    from trl_ada.tiny import load_tiny_arith_model

    return chat_tokenizer(load_tiny_arith_model()[1])


def right_answer(completions, **kwargs):
    return [1.0 if completion[0]["content"] == "right" else 0.0 for completion in completions]


def always_zero(completions, **kwargs):
    """A reward that cannot tell completions apart: every DAPO group is constant."""
    return [0.0] * len(completions)


def make_loop(settings: SamplerSettings, tokenizer, prompts_per_batch: int = 1, **sampling) -> AdaRolloutLoop:
    rows = {"prompt": [[{"role": "user", "content": f"question {i}"}] for i in range(6)]}
    loop_kwargs = dict(
        model_name="tiny",
        dataset=Dataset.from_dict(rows),
        reward_funcs=[right_answer],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        rollout_buffer=queue.Queue(),
        model_version_value=mp.Value("i", 0),
        heartbeat_value=mp.Value("d", 0.0),
        failed_event=mp.Event(),
        exception_info_queue=queue.Queue(),
        metrics_queue=queue.Queue(),
        num_generations=settings.num_generations,
        max_inflight_tasks=8,
    )
    accepted = inspect.signature(rollout_worker._AsyncRolloutLoop.__init__).parameters
    loop_kwargs = {key: value for key, value in loop_kwargs.items() if key in accepted}
    return AdaRolloutLoop(
        ada_sampling=AsyncSampling(settings, prompts_per_batch=prompts_per_batch, **sampling), **loop_kwargs
    )


def one_draw(group_id: int, right: bool, version: int = 0, prompt: int = 0, draw: int = 0):
    """TRL's `RolloutGroup` of one draw, its completion "right" or "wrong" (its ids name the prompt and draw)."""
    ids = [100 + prompt, draw, 0]
    sequence = rollout_worker.TrainingSequence(
        input_ids=[7, *ids],
        completion_mask=[0, 1, 1, 1],
        old_log_probs=[0.0, -0.1, -0.2, -0.3],
        rollout_id=str(group_id),
    )
    return rollout_worker.RolloutGroup(
        prompts=[[{"role": "user", "content": f"question {prompt}"}]],
        reward_kwargs={},
        completions=[[{"role": "assistant", "content": "right" if right else "wrong"}]],
        completions_ids=[ids],
        completions_sequences=[[sequence]],
        tool_call_counts=[0],
        tool_failure_counts=[0],
        model_version=version,
        group_id=group_id,
        env_rewards=[],
        rollout_rewards=[None],
    )


def update_group(rewards: list[bool], group_id: int):
    from trl_ada import trl_seam

    return trl_seam.merge_rollout_groups([one_draw(group_id, right, draw=d) for d, right in enumerate(rewards)])


# -- item 13: async DAPO's bound -------------------------------------------------------------------------------------


def test_async_dapo_fails_naming_the_cause_after_dapo_max_refills_batches_without_a_signal(tokenizer):
    settings = SamplerSettings(sampler="dapo", num_generations=4, seed=0, dapo_max_refills=2).validated()
    loop = make_loop(settings, tokenizer, prompts_per_batch=2)
    # A batch's worth of groups with a signal (2) within three batches' worth (6) keeps it going, twice...
    for group_id in range(12):
        rewards = [True, False, False, False] if group_id in (2, 5, 10, 11) else [False] * 4
        asyncio.run(loop._score_group(update_group(rewards, group_id)))
    # ...then 6 constant groups in a row (3 batches of 2) stop it.
    for group_id in range(12, 17):
        assert asyncio.run(loop._score_group(update_group([False] * 4, group_id))) == []
    with pytest.raises(BatchExhaustedError, match=r"only 0 of 2 prompts .* last 6 prompts .* dapo_max_refills=2"):
        asyncio.run(loop._score_group(update_group([False] * 4, 17)))


@pytest.mark.wall_clock_limit(90)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_async_dapo_with_a_constant_reward_stops_the_worker_and_the_trainer_says_why(
    tmp_path, tokenizer, wall_clock_guard
):
    # The worker in a thread, against the stand-in server: before the bound it drew and dropped for ever with a fresh
    # heartbeat, so the trainer's health check never failed (this loop ran out its 60 s).
    from transformers import AutoModelForCausalLM

    from trl_ada.tasks.arithmetic import make_dataset

    model_dir = save_chat_model(tmp_path / "model")
    dataset = conversational(make_dataset(16, seed=0, levels=[0, 1]))
    with FakeCompletionsServer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer) as srv:
        args = cpu_config(AdaAsyncGRPOConfig, tmp_path, srv, sampler="dapo", max_completion_length=2)
        kwargs = trainer_loop_kwargs(
            args, model=str(model_dir), dataset=dataset, reward_funcs=always_zero, processing_class=tokenizer
        )
        settings = args.sampler_settings()
        worker = ThreadRolloutWorker(
            loop_cls=AdaRolloutLoop, ada_sampling=AsyncSampling(settings, prompts_per_batch=1), **kwargs
        )
        worker.start()
        try:
            started = time.monotonic()
            with pytest.raises(RuntimeError, match="has failed") as raised:
                while time.monotonic() - started < 60:
                    worker.check_health(stale_after_s=60)
                    time.sleep(0.05)
            drawn = len(srv.requests)
        finally:
            worker.stop()
    # What the trainer raises (on every process: `_explain_worker_failures`) names the cause and the knob.
    trainer = type("Trainer", (), {})()
    trainer.args, trainer.state = args, type("State", (), {"global_step": 0})()
    failure = worker_failure(trainer, raised.value)
    assert isinstance(failure, RolloutWorkerError)
    assert "BatchExhaustedError: DAPO found only 0 of 1 prompts" in str(failure)
    assert "dapo_max_refills=10" in str(failure) and "training step 1" in str(failure)
    assert drawn <= 11 * args.num_generations + args.max_inflight_tasks  # 11 prompts judged, and what was in flight
    del worker, raised
    gc.collect()
