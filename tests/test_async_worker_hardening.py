"""
The asynchronous trainer's rollout worker (`trl_ada/async_grpo/rollout.py`) and what the trainer takes from it
(`trl_ada/async_grpo/async_grpo_trainer.py`): DAPO's bound on drawing, the sampler state and dropped rows handed over at a save,
staleness per group, and the pass-rate predictor in a saved model (issue 32, items 13-16). The worker's pieces are
driven by hand or in a thread against the stand-in completions server of `tests/async_fixtures.py`.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import multiprocessing as mp
import queue
import random
import threading
import time

import numpy as np
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
from trl_ada.schedules import prompt_keys
from trl_ada.trl_seam import async_grpo_private

pytest.importorskip("aiohttp")
rollout_worker = pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
from trl_ada import AdaAsyncGRPOConfig  # noqa: E402
from trl_ada.async_grpo.async_grpo_trainer import RolloutWorkerError, StaleGroups, worker_failure  # noqa: E402
from trl_ada.async_grpo.rollout import (  # noqa: E402
    GROUP_VERSION_KEY,
    AdaRolloutLoop,
    AsyncSampling,
    SamplerStateChannel,
    WorkerState,
)


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


def make_loop(
    settings: SamplerSettings,
    tokenizer,
    prompts_per_batch: int = 1,
    rows: int = 6,
    loop: dict | None = None,
    **sampling,
) -> AdaRolloutLoop:
    """The loop as the worker builds it, over `rows` prompts "question i"; `loop`: further loop arguments."""
    dataset = {"prompt": [[{"role": "user", "content": f"question {i}"}] for i in range(rows)]}
    loop_kwargs = dict(
        model_name="tiny",
        dataset=Dataset.from_dict(dataset),
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
        ada_sampling=AsyncSampling(settings, prompts_per_batch=prompts_per_batch, **sampling),
        **loop_kwargs,
        **(loop or {}),
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
    from trl_ada.trl_seam import async_grpo_private

    return async_grpo_private.merge_rollout_groups(
        [one_draw(group_id, right, draw=d) for d, right in enumerate(rewards)]
    )


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
    # What the trainer raises (on every process: `_check_worker_health_while_training`) names the cause and the knob.
    trainer = type("Trainer", (), {})()
    trainer.args, trainer.state = args, type("State", (), {"global_step": 0})()
    failure = worker_failure(trainer, raised.value)
    assert isinstance(failure, RolloutWorkerError)
    assert "BatchExhaustedError: DAPO found only 0 of 1 prompts" in str(failure)
    assert "dapo_max_refills=10" in str(failure) and "training step 1" in str(failure)
    # Bounded: the 11 prompts judged, the next two the generate loop had opened (it takes work ahead for each free
    # slot) and what was in flight when the error stopped it; without the bound it drew for the whole 60 s.
    assert drawn <= 13 * args.num_generations + args.max_inflight_tasks, drawn
    del worker, raised
    gc.collect()


class FailsOnceWithItsReport:
    """A worker whose `check_health` fails as TRL's does: the child's report, chained, goes to the first check only
    (TRL takes it off a queue); later checks raise the bare "child has failed"."""

    def __init__(self) -> None:
        self.reports = ["VLLMServerUnresponsive: vllm /v1/completions to http://127.0.0.1:1 has failed for 3 s\n..."]
        self.checks = 0

    def check_health(self, stale_after_s: float) -> None:
        self.checks += 1
        cause = RuntimeError(self.reports.pop()) if self.reports else None
        raise RuntimeError("Rollout worker child has failed; see chained exception.") from cause


def test_a_failure_a_save_saw_first_is_still_explained_where_training_stops(tmp_path):
    # The server died while a checkpoint was being saved: the save's check took TRL's report of the failure (and
    # saved anyway, as it should). Training then stopped on the next check with a bare "child has failed"
    # RolloutWorkerError instead of the VLLMServerError naming the server (tests/test_async_faults.py, under load).
    from trl_ada.async_grpo.async_grpo_trainer import AdaAsyncGRPOTrainer
    from trl_ada.generation.faults import VLLMServerError

    class Trainer:  # the trainer's two health checks, on what they read of it
        _check_worker_health = AdaAsyncGRPOTrainer._check_worker_health
        _check_worker_health_while_training = AdaAsyncGRPOTrainer._check_worker_health_while_training

    trainer = Trainer()
    trainer.args = type("Args", (), {"vllm_server_base_url": "http://127.0.0.1:1", "output_dir": str(tmp_path)})()
    trainer.state = type("State", (), {"global_step": 2})()
    trainer.accelerator = type("Accelerator", (), {"num_processes": 1})()
    trainer._batches_dispatched = 0
    trainer._worker_error = None
    trainer.rollout_worker = worker = FailsOnceWithItsReport()
    unexplained = trainer._check_worker_health  # what a save and the end of training call (no broadcast)
    while_training = trainer._check_worker_health_while_training  # what TRL's rollout queue calls while it waits
    with pytest.raises(RuntimeError) as at_the_save:
        unexplained(60.0)
    assert worker_failure(trainer, at_the_save.value).__class__ is VLLMServerError
    for _ in range(2):  # the training loop's checks after it, and the stop's
        with pytest.raises(VLLMServerError, match="stopped answering during generation of training step 3"):
            while_training(60.0)
        with pytest.raises(RuntimeError) as later:
            unexplained(60.0)
        assert later.value is at_the_save.value
    assert worker.checks == 1  # TRL's check ran once: no wait for a report that will not come again


# -- item 14: the sampler state is asked for at a save; nothing is written between saves ---------------------------


def outcome(question: str, draw: int) -> bool:
    """A fixed outcome per (prompt, draw index); questions 0, 3, 6, ... are never right (no signal: dropped)."""
    index = int(question.split()[-1])
    return index % 3 != 0 and random.Random(f"{question}/{draw}").random() < 0.5


def drive(loop: AdaRolloutLoop, rows: int) -> list:
    """Answer the loop's draws in submission order until it has finished (counted) `rows` rows; the samples."""
    if not hasattr(loop, "test_work"):
        loop.test_work = loop._repeat_iterator()  # one row stream per loop, as TRL's generate loop holds it
    work = loop.test_work
    samples = []
    while loop._counted_below < rows:
        group_id, row = next(work)
        draw = loop._draws[group_id]
        question = row["prompt"][0]["content"]
        batch = loop._batches[draw.batch]
        group = one_draw(group_id, outcome(question, draw.draw), prompt=draw.prompt, draw=draw.draw)
        group.prompts = [row["prompt"]]
        samples += asyncio.run(loop._score_group(group))
        assert batch is not None
    return samples


def tracked_settings(**knobs) -> SamplerSettings:
    return SamplerSettings(
        sampler="seq_balance", num_generations=4, round_size=2, max_rounds=4, seed=0, round_policy="tracked", **knobs
    ).validated()


def count_state_dicts(sampler) -> list[None]:
    """Count `sampler.state_dict()` calls (the serialisation a write of the state costs): one entry per call."""
    calls, state_dict = [], sampler.state_dict

    def counted():
        calls.append(None)
        return state_dict()

    sampler.state_dict = counted
    return calls


@pytest.mark.wall_clock_limit(60)
def test_the_worker_writes_nothing_between_saves_and_hands_its_state_and_dropped_rows_when_asked(
    tmp_path, tokenizer, wall_clock_guard
):
    channel = SamplerStateChannel()
    settings = tracked_settings(dapo_refill=True, dapo_max_refills=100)
    loop = make_loop(settings, tokenizer, rows=60, loop={"ada_state_channel": channel})
    calls = count_state_dicts(loop.sampler)
    started = time.monotonic()
    drive(loop, rows=30)
    # Before: the whole state serialised (and written) after batches at most a second apart, and every dropped row
    # rewritten to a file that only a checkpoint emptied.
    assert not calls, (len(calls), time.monotonic() - started)
    dropped = {row for row in range(30) if row % 3 == 0}  # constant rows: DAPO's filter drops them
    assert loop._dropped == dropped

    # The trainer asks (at a save): the loop answers on its event loop, through the watcher thread.
    running = threading.Thread(target=loop._loop.run_forever, daemon=True)
    running.start()
    threading.Thread(target=loop._watch_state_requests, daemon=True).start()
    try:
        answer = channel.ask(timeout=10)
        assert len(calls) == 1
        assert answer.sampler == loop.sampler.state_dict()
        assert (answer.counted_below, answer.counted_above) == (30, [])  # compact: every row below 30 counted
        assert answer.dropped == sorted(dropped)
        # Handed over, the rows are forgotten: the worker keeps only the rows dropped since the last answer.
        assert loop._dropped == set() and channel.ask(timeout=10).dropped == []
        loop._loop.call_soon_threadsafe(loop._loop.stop)
        running.join(5)
        drive(loop, rows=36)
        assert loop._dropped == {30, 33}
    finally:
        if loop._loop.is_running():
            loop._loop.call_soon_threadsafe(loop._loop.stop)
            running.join(5)
        loop._loop.close()


def test_counted_from_is_every_row_counted_at_or_past_a_position():
    state = WorkerState(sampler={}, counted_below=10, counted_above=[12, 15])
    assert state.counted_from(7) == [7, 8, 9, 12, 15]
    assert state.counted_from(13) == [15]


# -- item 16: a resume does not count again what the checkpoint's state counted -----------------------------------


def counts_of(loop: AdaRolloutLoop, questions: range) -> dict[int, tuple[float, float]]:
    counts = loop.sampler.estimator.counts
    keys = prompt_keys([{"prompt": [{"role": "user", "content": f"question {i}"}]} for i in questions])
    return {i: counts.get(str(key)) for i, key in zip(questions, keys, strict=True)}


def test_a_resumed_worker_does_not_count_again_the_rows_its_saved_state_counted(tokenizer):
    settings = tracked_settings()
    first = make_loop(settings, tokenizer, rows=12)
    drive(first, rows=8)
    state = first.worker_state()
    # The checkpoint's resume position is row 3 (rows 3-7 were drawn and counted, not trained): the resume draws them
    # again and trains them, but the tracker must not count their draws a second time.
    ahead = state.counted_from(3)
    assert ahead == [3, 4, 5, 6, 7]
    resumed = make_loop(
        settings,
        tokenizer,
        rows=12,
        initial_state=state.sampler,
        loop={"dataset_start_index": 3, "ada_rows_already_counted": [row - 3 for row in ahead]},
    )
    samples = drive(resumed, rows=7)  # rows 3-9 of the dataset
    assert {sample.group_id for sample in samples} >= {0, 1}  # the rows counted ahead still train
    assert counts_of(resumed, range(3, 8)) == counts_of(first, range(3, 8))  # before: counted twice
    assert all(counts_of(resumed, range(8, 10)).values())  # the rows the saved state had not seen are counted
    assert resumed._rows_already_counted == set()  # each skipped once only
    # What the resumed run hands to its own next save still names the rows its loaded state counted ahead.
    again = make_loop(settings, tokenizer, rows=12, loop={"ada_rows_already_counted": [4, 6]})
    drive(again, rows=2)
    assert again.worker_state().counted_from(0) == [0, 1, 4, 6]


# -- item 15: a prompt's samples are trained or dropped whole for staleness ---------------------------------------


def queued_sample(group_id: int, version: int, oldest: int | None = None):
    metrics = {"reward": 1.0} if oldest is None else {"reward": 1.0, GROUP_VERSION_KEY: float(oldest)}
    return rollout_worker.RolloutSample(
        prompt=[],
        completion=[],
        input_ids=np.array([7, group_id, version]),
        completion_mask=np.array([0, 1, 1]),
        old_log_probs=np.array([0.0, -0.1, -0.2]),
        advantage=1.0,
        model_version=version,
        group_id=group_id,
        metrics=metrics,
    )


@pytest.mark.wall_clock_limit(30)
def test_a_prompts_samples_are_trained_or_dropped_whole_for_staleness_and_a_dropped_row_counts_as_done(
    wall_clock_guard,
):
    from collections import defaultdict

    from trl.experimental.async_grpo.async_grpo_trainer import RolloutQueueDataset

    rollout_queue = queue.Queue()
    version = [5]
    metrics = defaultdict(list)
    dataset = RolloutQueueDataset(
        rollout_queue, lambda: version[0], lambda _: None, 60.0, metrics, max_staleness=1, poll_interval_s=0.1
    )
    done: set[int] = set()
    dataset.queue = StaleGroups(dataset, done.add)
    # Row 10: a pool whose early draws (version 3) are stale and later ones (5) fresh: dropped whole, not its
    # negatives alone. Row 11: oldest draw 4, kept whole, even where a weight sync comes between its samples.
    # Row 12: TRL's own group (one version for all, no key): dropped whole.
    for sample in [
        queued_sample(10, 3, oldest=3),
        queued_sample(10, 5, oldest=3),
        queued_sample(11, 4, oldest=4),
        queued_sample(11, 5, oldest=4),
        queued_sample(11, 4, oldest=4),
        queued_sample(12, 2),
        queued_sample(12, 2),
        queued_sample(13, 5, oldest=5),
    ]:
        rollout_queue.put(sample)
    read = iter(dataset)
    trained = [next(read), next(read)]
    version[0] = 6  # a weight sync between the group's samples: TRL's own check alone drops the third
    trained += [next(read), next(read)]
    assert [item["group_id"] for item in trained] == [11, 11, 11, 13]
    assert all(GROUP_VERSION_KEY not in item["metrics"] for item in trained)  # not logged as a metric
    assert done == {10, 12}  # the resume position passes the rows that went stale
    assert sum(metrics["sample/dropped_stale_total"]) == 4.0


def test_the_loop_stamps_every_sample_of_a_prompt_with_its_oldest_version(tokenizer):
    loop = make_loop(tracked_settings(), tokenizer, rows=6)
    work = loop._repeat_iterator()
    samples, version = [], 0
    while not samples:
        group_id, row = next(work)
        draw = loop._draws[group_id]
        group = one_draw(group_id, draw.draw % 2 == 0, version=version, prompt=draw.prompt, draw=draw.draw)
        samples = asyncio.run(loop._score_group(group))
        version += 1
    assert {sample.metrics[GROUP_VERSION_KEY] for sample in samples} == {min(s.model_version for s in samples)}
    assert len({sample.model_version for sample in samples}) > 1  # the pool spans weight syncs


# -- item 16: a save writes the learned predictor, from the worker's state asked at the save ----------------------


class ThreadAdaWorker(ThreadRolloutWorker):
    """The test stand-in for `AdaAsyncRolloutWorker`: the same loop, in a thread (TRL's spawned worker needs vLLM)."""

    _loop_cls = AdaRolloutLoop


@pytest.mark.wall_clock_limit(300)
@pytest.mark.skipif(not async_grpo_private.has_tree_packing(), reason="TRL's async trainer trains on CPU from 1.16")
def test_a_save_writes_the_learned_predictor_and_the_rows_its_state_counted_ahead(
    tmp_path, tokenizer, wall_clock_guard
):
    from async_fixtures import InProcessWeightTransfer
    from transformers import AutoModelForCausalLM

    from trl_ada import AdaAsyncGRPOTrainer
    from trl_ada.async_grpo.async_grpo_trainer import ROWS_COUNTED_AHEAD
    from trl_ada.checkpoints import SAMPLER_STATE_NAME
    from trl_ada.samplers import build_sampler
    from trl_ada.samplers.predictor import PREDICTOR_DIR, PREDICTOR_FILE
    from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset

    class Trainer(AdaAsyncGRPOTrainer):
        rollout_worker_class = ThreadAdaWorker

    model_dir = save_chat_model(tmp_path / "model")
    dataset = conversational(make_dataset(32, seed=0, levels=[0, 1, 2, 3]))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with FakeCompletionsServer(model, tokenizer) as server:
        args = cpu_config(
            AdaAsyncGRPOConfig,
            tmp_path,
            server,
            sampler="est",
            pass_rate_predictor="learned",
            max_steps=2,
            save_strategy="steps",
            save_steps=2,
        )
        trainer = Trainer(
            model=str(model_dir),
            reward_funcs=exact_match_reward,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            weight_transfer=InProcessWeightTransfer(server),
        )
        trainer.train()
    out = tmp_path / "out"
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / PREDICTOR_DIR / PREDICTOR_FILE).is_file()  # before: never written by this trainer
    saved = json.loads((checkpoint / SAMPLER_STATE_NAME).read_text())
    position = json.loads((checkpoint / "rollout_state.json").read_text())["prompt_index"]
    assert saved[ROWS_COUNTED_AHEAD] and min(saved[ROWS_COUNTED_AHEAD]) >= position  # generation ran ahead
    # After training the worker is gone: the state it handed over when it stopped is what a final save writes.
    trainer.save_model()
    assert (out / PREDICTOR_DIR / PREDICTOR_FILE).is_file()
    warm = SamplerSettings(sampler="est", num_generations=4, pass_rate_predictor=str(out)).validated()
    predictor = build_sampler(warm).estimator  # a warm start from the output directory
    assert predictor.updates == json.loads((out / PREDICTOR_DIR / PREDICTOR_FILE).read_text())["updates"] > 0
