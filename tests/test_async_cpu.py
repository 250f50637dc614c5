"""TRL's own asynchronous trainer (`trl.experimental.async_grpo.AsyncGRPOTrainer`, not a subclass) trains on CPU.

With the fixtures of `tests/async_fixtures.py` standing in for what needs vLLM (a completions server that samples
from the tiny model over real HTTP, a weight transfer that loads the trainer's tensors into it, TRL's own rollout loop
run in a thread), `AsyncGRPOTrainer` runs three optimizer steps of the tiny arithmetic model with the exact-match
reward: its parameters move, every sync reaches the served model (whose answers change), and everything it trains on
is what the server sampled, with the server's log-probs. The fixtures' own behaviour is checked first.
"""

from __future__ import annotations

import gc
import json
import queue
import threading
import time
import urllib.request

import pytest
import torch

pytest.importorskip("aiohttp")
pytest.importorskip(
    "trl.experimental.async_grpo.packing", reason="TRL's async trainer trains on CPU from 1.16 (tree packing)"
)

from async_fixtures import (
    FakeCompletionsServer,
    InProcessWeightTransfer,
    ThreadRolloutWorker,
    allow_cpu_training,
    chat_tokenizer,
    conversational,
    cpu_config,
    save_chat_model,  # noqa: E402
    trainer_loop_kwargs,
)
from transformers import AutoModelForCausalLM, TrainerCallback  # noqa: E402
from trl.experimental import async_grpo  # noqa: E402
from trl.experimental.async_grpo import async_grpo_trainer as trainer_module  # noqa: E402

from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset  # noqa: E402
from trl_ada.tiny import load_tiny_arith_model  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_chat_model(tmp_path_factory.mktemp("tiny-arith-chat"))


@pytest.fixture(scope="module")
def tokenizer():
    _, tokenizer = load_tiny_arith_model()
    return chat_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def dataset():
    """Levels 0-2, where the model is right about half the time at temperature 1, so most groups have a signal."""
    return conversational(make_dataset(32, seed=0, levels=[0, 1, 2]))


@pytest.fixture
def server(model_dir, tokenizer):
    with FakeCompletionsServer(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tokenizer) as srv:
        yield srv


def post(server: FakeCompletionsServer, payload: dict) -> dict:
    request = urllib.request.Request(
        f"{server.base_url}/v1/completions", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def completion_payload(prompt_ids: list[int], seed: int, max_tokens: int = 6) -> dict:
    """What `_AsyncRolloutLoop._generate_one_turn` posts."""
    return {
        "model": "m",
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "repetition_penalty": 1.0,
        "n": 1,
        "return_token_ids": True,
        "logprobs": 0,
        "seed": seed,
    }


def config(tmp_path, server, **overrides):
    return cpu_config(async_grpo.AsyncGRPOConfig, tmp_path, server, **overrides)


def test_fake_server_samples_seeded_and_serves_swapped_weights(server, tokenizer):
    prompt_ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": " 23+ 45="}], return_dict=False, add_generation_prompt=True
    )
    first = post(server, completion_payload(prompt_ids, seed=7))["choices"][0]
    again = post(server, completion_payload(prompt_ids, seed=7))["choices"][0]
    assert first["token_ids"] == again["token_ids"] and first["logprobs"] == again["logprobs"]
    ids, logprobs = first["token_ids"], first["logprobs"]["token_logprobs"]
    assert len(ids) == len(logprobs) <= 6 and all(lp <= 0 for lp in logprobs)
    assert tokenizer.eos_token_id not in ids[:-1]  # sampling stops at eos, which is returned
    torch.testing.assert_close(server.score(prompt_ids, ids), logprobs, atol=1e-4, rtol=0)
    assert {tuple(post(server, completion_payload(prompt_ids, seed=s))["choices"][0]["token_ids"]) for s in range(8)}
    assert [r.seed for r in server.requests[:2]] == [7, 7] and server.requests[0].weight_version == 0

    with pytest.raises(KeyError):
        server.load_state_dict({"not.a.parameter": torch.zeros(1)})
    state = {name: tensor + 0.05 * torch.randn_like(tensor) for name, tensor in server.model.state_dict().items()}
    server.load_state_dict(state)
    assert server.weight_version == 1
    rescored = server.score(prompt_ids, ids)
    assert not torch.allclose(torch.tensor(rescored), torch.tensor(logprobs), atol=1e-3)
    after = post(server, completion_payload(prompt_ids, seed=7))["choices"][0]
    assert (after["token_ids"], after["logprobs"]["token_logprobs"]) != (ids, logprobs)
    assert server.requests[-1].weight_version == 1

    # A per-token delay answers the shorter of two concurrent completions first.
    server.seconds_per_token = 0.3
    answers: queue.Queue = queue.Queue()
    long = threading.Thread(target=lambda: answers.put(("long", post(server, completion_payload(prompt_ids, 1)))))
    long.start()
    time.sleep(0.02)
    short = threading.Thread(target=lambda: answers.put(("short", post(server, completion_payload(prompt_ids, 2, 1)))))
    short.start()
    long.join(10), short.join(10)
    order = [answers.get_nowait() for _ in range(2)]
    if len(order[1][1]["choices"][0]["token_ids"]) > 1:  # the unbounded one was longer than one token
        assert [name for name, _ in order] == ["short", "long"]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_thread_worker_surfaces_a_loop_failure(tmp_path, server, model_dir, tokenizer, dataset):
    def broken_reward(completions, **kwargs):
        raise ZeroDivisionError("reward exploded")

    args = config(tmp_path, server)
    worker = ThreadRolloutWorker(
        **trainer_loop_kwargs(
            args, model=str(model_dir), dataset=dataset, reward_funcs=broken_reward, processing_class=tokenizer
        )
    )
    worker.start()
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(RuntimeError, match="has failed") as raised:
            while time.monotonic() < deadline:
                worker.check_health(stale_after_s=60)
                time.sleep(0.05)
        assert "ZeroDivisionError: reward exploded" in str(raised.value.__cause__)
    finally:
        worker.stop()
    # TRL's `run()` closes its event loop with the generate task still pending when the score loop raises (the child
    # process would just exit); collect that task here, where its "Event loop is closed" is expected.
    del worker, raised
    gc.collect()


def test_trainer_loop_kwargs_are_what_the_trainer_passes(tmp_path, monkeypatch, server, model_dir, tokenizer, dataset):
    """`trainer_loop_kwargs` keeps up with `AsyncGRPOTrainer.__init__`'s `AsyncRolloutWorker(...)` call, which can
    also build `ThreadRolloutWorker` itself when the trainer module's `AsyncRolloutWorker` is patched."""
    allow_cpu_training(monkeypatch)
    monkeypatch.setattr(trainer_module, "AsyncRolloutWorker", ThreadRolloutWorker)
    trainer = trainer_module.AsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        args=config(tmp_path, server, max_inflight_tasks=-1),  # also the trainer's inference of an unset value
        train_dataset=dataset,
        processing_class=tokenizer,
        weight_transfer=InProcessWeightTransfer(server),
    )
    assert isinstance(trainer.rollout_worker, ThreadRolloutWorker)
    expected = trainer_loop_kwargs(
        config(tmp_path, server, max_inflight_tasks=-1),
        model=str(model_dir),
        dataset=dataset,
        reward_funcs=exact_match_reward,
        processing_class=tokenizer,
    )
    assert expected["max_inflight_tasks"] == trainer.args.max_inflight_tasks == 4 * 8
    assert trainer.rollout_worker._loop_kwargs == ThreadRolloutWorker(**expected)._loop_kwargs


class StepTimes(TrainerCallback):
    def __init__(self):
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())


@pytest.mark.wall_clock_limit(240)
def test_async_grpo_trainer_trains_on_cpu(
    tmp_path, monkeypatch, server, model_dir, tokenizer, dataset, wall_clock_guard
):
    allow_cpu_training(monkeypatch)
    # Record what the trainer's collator packs, in order (the dataloader may collate one micro-batch ahead).
    collated: list[list[dict]] = []
    original_torch_call = trainer_module.DataCollatorForRollout.torch_call

    def recording_torch_call(self, examples):
        (rows,) = examples
        collated.append([sample for row in rows for sample in row.samples])
        return original_torch_call(self, examples)

    monkeypatch.setattr(trainer_module.DataCollatorForRollout, "torch_call", recording_torch_call)

    args = config(tmp_path, server)
    worker = ThreadRolloutWorker(
        **trainer_loop_kwargs(
            args, model=str(model_dir), dataset=dataset, reward_funcs=exact_match_reward, processing_class=tokenizer
        )
    )
    transfer = InProcessWeightTransfer(server)
    steps = StepTimes()
    trainer = async_grpo.AsyncGRPOTrainer(
        model=str(model_dir),
        reward_funcs=exact_match_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_worker=worker,
        weight_transfer=transfer,
        callbacks=[steps],
    )
    assert trainer.model.device.type == "cpu" and trainer.model.dtype == torch.float32
    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}

    started = time.perf_counter()
    trainer.train()
    step_s = [b - a for a, b in zip([started, *steps.ends], steps.ends)]
    print(f"\nAsyncGRPOTrainer on CPU: step times {[round(s, 3) for s in step_s]} s")

    # Three optimizer steps, every parameter moved.
    assert trainer.state.global_step == 3 and len(steps.ends) == 3
    assert trainer.state.log_history[-1]["train_loss"] is not None
    for name, param in trainer.model.named_parameters():
        assert not torch.equal(before[name], param.detach()), f"{name} did not change"

    # Weights: one cold sync at train begin, then one per step, each landing in the served model.
    assert transfer.initialized and transfer.destroyed and not server.paused
    assert transfer.syncs == server.weight_version == 4
    assert transfer.last_names == [name for name, _ in trainer.model.named_parameters()]
    served = server.model.state_dict()
    for name, param in trainer.model.named_parameters():
        assert torch.equal(served[name], param.detach()), f"{name} not synced"
    answered = [r for r in server.requests if r.answered_at is not None]
    assert not [r.error for r in server.requests if r.error]
    assert {r.weight_version for r in answered} >= {1}
    old = next(r for r in answered if r.weight_version == 1)  # sampled under the cold-synced (initial) policy
    again = post(server, completion_payload(old.prompt_ids, old.seed, old.params["max_tokens"]))["choices"][0]
    assert (again["token_ids"], again["logprobs"]["token_logprobs"]) != (old.completion_ids, old.logprobs)

    # Everything trained is what the server sampled, with the server's log-probs as the old policy's.
    assert len(collated) >= 3 and all(len(batch) == 8 for batch in collated[:3])
    produced = {}  # the same tokens can be sampled again, under another weight version (other log-probs)
    for r in answered:
        produced.setdefault((tuple(r.prompt_ids), tuple(r.completion_ids)), []).append(r)

    def served_versions(sample: dict) -> set[int]:
        """The weight versions under which the server sampled exactly this sample (tokens and log-probs)."""
        mask = sample["completion_mask"].astype(bool)
        ids, old_logprobs = sample["input_ids"], torch.tensor(sample["old_log_probs"][mask])
        records = produced.get((tuple(ids[~mask].tolist()), tuple(ids[mask].tolist())), [])
        return {r.weight_version for r in records if torch.equal(old_logprobs, torch.tensor(r.logprobs))}

    for sample in (s for batch in collated for s in batch):
        assert served_versions(sample), f"trained on a sample the server did not produce: {sample['input_ids']}"
    # Step 1 trains the initial policy on samples of the cold-synced (initial) weights, so the trainer's log-probs
    # (tree attention, fused head) must equal the server's.
    assert all(served_versions(sample) == {1} for sample in collated[0])
    first = trainer.state.log_history[0]
    assert first["kl"] < 1e-4, {k: first[k] for k in ("kl", "ratio", "sample/staleness_max")}
    assert worker._thread is None  # stopped by the trainer at train end
