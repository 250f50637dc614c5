"""
One vLLM weight sync per training step, however many sampling rounds the step runs (`trl_ada/generation/weight_sync.py`).

No vLLM needed: TRL's real `VLLMGeneration` (its `__init__`, `generate` and `sync_weights`, unchanged) is built with
only the vLLM engine faked: `_init_vllm` is replaced by what it leaves behind (the `LLM`, put to sleep at once in
sleep mode) with a recording stand-in for vLLM's `LLM` (colocate mode) or TRL's `VLLMClient` (server mode). It is
plugged into an `AdaGRPOTrainer` on the tiny model, so TRL's `_generate_single_turn` (its `_last_loaded_step` check)
and trl-ada's rounds run as in training. A reward that is always 0 makes `seq_balance` run all `MAX_ROUNDS` rounds of
every step.

The fake engine tracks which memory is resident, as vLLM's sleep mode does, and flags generating or loading weights
while asleep, and waking memory that is already awake (vLLM's executor ignores that with a warning; its allocator would
map the memory again).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import TINY_MODEL_KWARGS, tiny_args
from trl.generation import vllm_generation as vllm_generation_module
from trl.generation.vllm_generation import VLLMGeneration

import trl_ada.trainer as trainer_module
from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.generation.weight_sync import one_weight_sync_per_step
from trl_ada.tiny import build_tiny_model
from trl_ada.trl_seam.grpo_private import last_loaded_step
from trl_ada.trl_seam.vllm_generation import set_vllm_weights_sleeping

STEPS = 3
MAX_ROUNDS = 3
ROUND_SIZE = 4
ROWS_PER_CALL = 8  # every generate call: 2 prompts (batch of 8, num_generations 4) x 4 (round_size, or n for DAPO)
SEQ_BALANCE = {"sampler": "seq_balance", "round_size": ROUND_SIZE, "max_rounds": MAX_ROUNDS}
# Generation calls per step of each sampling setup (the reward is always 0): seq_balance runs all its rounds; DAPO
# finds no informative group and draws all its refill batches (one round each); both stacked: rounds x batches.
SAMPLINGS = {
    "seq_balance": (SEQ_BALANCE, MAX_ROUNDS),
    "dapo": ({"sampler": "dapo", "dapo_max_refills": 2, "dapo_on_exhausted": "keep_partial"}, 3),
    "seq_balance+dapo": (
        {**SEQ_BALANCE, "dapo_refill": True, "dapo_max_refills": 1, "dapo_on_exhausted": "keep_partial"},
        2 * MAX_ROUNDS,
    ),
}


def never_right(completions: list[str], **kwargs: Any) -> list[float]:
    """Reward 0 everywhere: `seq_balance` never finds a positive, so every step runs all `MAX_ROUNDS` rounds."""
    return [0.0] * len(completions)


class FakeSamplingParams:
    """`vllm.SamplingParams` (TRL builds one per colocated generate call)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FakeEngine:
    """
    vLLM's `LLM` with sleep mode, as far as TRL uses it: `sleep`, `wake_up`, `generate`, `reset_prefix_cache` and the
    live model's `load_weights`. Tracks which memory is resident and records every call with the trainer's global step.
    """

    def __init__(self, completion_ids: list[int], fail_on_generate: int | None = None) -> None:
        self.completion_ids = completion_ids
        self.fail_on_generate = fail_on_generate  # 1-based index of a `generate` call that raises
        self.awake = {"weights": True, "kv_cache": True}  # an `LLM` starts awake; TRL puts it to sleep at once
        self.events: list[tuple[str, int | None, Any]] = []
        self.errors: list[str] = []
        self.step: Callable[[], int | None] = lambda: None
        model = SimpleNamespace(load_weights=self._load_weights)
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model)))
        )

    def _record(self, name: str, detail: Any = None) -> None:
        self.events.append((name, self.step(), detail))

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        self._record("sleep", level)
        self.awake = dict.fromkeys(self.awake, False)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        self._record("wake_up", tuple(tags or ()))
        for tag in tags or list(self.awake):
            if self.awake[tag]:
                self.errors.append(f"wake_up({tag!r}) while {tag} is awake (step {self.step()})")
            self.awake[tag] = True
        return all(self.awake.values())

    def _load_weights(self, weights: list[tuple[str, Any]]) -> set[str]:
        if not self.awake["weights"]:
            self.errors.append(f"load_weights into sleeping weights (step {self.step()})")
        for name, _ in weights:
            self._record("load_weights", name)
        return set()

    def reset_prefix_cache(self) -> bool:
        self._record("reset_prefix_cache")  # the last thing `sync_weights` does: one per sync
        return True

    def generate(self, prompts: list[dict[str, Any]], sampling_params: Any, use_tqdm: bool = True) -> list[Any]:
        calls = 1 + sum(1 for name, _, _ in self.events if name == "generate")
        self._record("generate", len(prompts))
        if not all(self.awake.values()):
            self.errors.append(f"generate while asleep: {self.awake} (step {self.step()})")
        if calls == self.fail_on_generate:
            raise RuntimeError(f"injected failure in generate call {calls}")
        logprobs = [{token: SimpleNamespace(rank=1, logprob=-1.0)} for token in self.completion_ids]
        completion = SimpleNamespace(token_ids=list(self.completion_ids), logprobs=logprobs)
        return [SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[completion]) for p in prompts]

    # -- what the tests read ------------------------------------------------------------------------------------------

    def count(self, name: str) -> Counter:
        """How many `name` events per global step."""
        return Counter(step for event, step, _ in self.events if event == name)

    def asleep(self) -> bool:
        return not any(self.awake.values())


class FakeClient:
    """TRL's `VLLMClient` (server mode), as far as `VLLMGeneration` uses it: the weight push counts as the sync."""

    base_url = "http://127.0.0.1:9"  # never contacted: the health watch polls only if a request takes > 0.5 s

    def __init__(self, completion_ids: list[int]) -> None:
        self.completion_ids = completion_ids
        self.events: list[tuple[str, int | None, Any]] = []
        self.step: Callable[[], int | None] = lambda: None

    def update_named_params(self, metadata: list, named_params: Iterator) -> None:
        self.events.append(("sync", self.step(), sum(1 for _ in named_params)))

    def reset_prefix_cache(self) -> None:
        self.events.append(("reset_prefix_cache", self.step(), None))

    def generate(self, prompts: list[list[int]], n: int = 1, **kwargs: Any) -> dict[str, Any]:
        self.events.append(("generate", self.step(), len(prompts)))
        rows = len(prompts) * n
        return {
            "prompt_ids": prompts,
            "completion_ids": [list(self.completion_ids) for _ in range(rows)],
            "logprobs": [[[-1.0] for _ in self.completion_ids] for _ in range(rows)],
            "logprob_token_ids": [[[t] for t in self.completion_ids] for _ in range(rows)],
        }

    def count(self, name: str) -> Counter:
        return Counter(step for event, step, _ in self.events if event == name)


def vllm_trainer(
    tmp_path: Path,
    tokenizer: Any,
    dataset: Any,
    monkeypatch: pytest.MonkeyPatch,
    *,
    mode: str = "colocate",
    sleep_mode: bool = True,
    fail_on_generate: int | None = None,
    sampling: dict[str, Any] | None = None,
) -> tuple[AdaGRPOTrainer, Any]:
    """An `AdaGRPOTrainer` on the tiny model generating through TRL's real `VLLMGeneration` with a fake vLLM engine."""
    completion_ids = [*tokenizer("12", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    fake: FakeEngine | FakeClient
    fake = FakeEngine(completion_ids, fail_on_generate) if mode == "colocate" else FakeClient(completion_ids)

    def init_vllm(self: VLLMGeneration) -> None:
        # What TRL's `_init_vllm` leaves behind, with the engine (or client) faked.
        if self.mode == "colocate":
            self.llm = fake
            if self.enable_sleep_mode:
                self.llm.sleep(level=2)
            set_vllm_weights_sleeping(self, self.enable_sleep_mode)
        else:
            self.vllm_client = fake

    monkeypatch.setattr(VLLMGeneration, "_init_vllm", init_vllm)
    monkeypatch.setattr(vllm_generation_module, "SamplingParams", FakeSamplingParams, raising=False)
    config = AdaGRPOConfig(**tiny_args(tmp_path, max_steps=STEPS), **(sampling or SEQ_BALANCE))
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(model, never_right, args=config, train_dataset=dataset, processing_class=tokenizer)
    generation = VLLMGeneration(
        model=trainer.model,
        accelerator=trainer.accelerator,
        processing_class=tokenizer,
        mode=mode,
        server_base_url=FakeClient.base_url,
        enable_sleep_mode=sleep_mode,
        temperature=trainer.temperature,
        max_completion_length=trainer.max_completion_length,
        logprobs=0,
    )
    # What GRPOTrainer.__init__ sets when `use_vllm=True` (not settable here: vLLM is not installed).
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation = True, mode, generation
    trainer._last_loaded_step = -1
    fake.step = lambda: int(trainer.state.global_step)
    return trainer, fake


def rounds_per_step(fake: FakeEngine | FakeClient) -> Counter:
    return fake.count("generate")  # one vLLM generate call per sampling round (one process)


def no_fix(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager[None]:
    """The placeholder `one_weight_sync_per_step` had: TRL's own behaviour."""
    return contextlib.nullcontext()


# ---------------------------------------------------------------------------------------------------------------------
# colocate mode with sleep mode
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_colocate_sleep_mode_syncs_once_per_step(tmp_path, tokenizer, arithmetic_dataset, monkeypatch, sampling):
    config, calls = SAMPLINGS[sampling]
    trainer, engine = vllm_trainer(tmp_path, tokenizer, arithmetic_dataset, monkeypatch, sampling=config)
    generation = trainer.vllm_generation
    after_step: list[dict[str, Any]] = []
    sample = trainer._sample

    def sample_and_look(inputs):
        kept = sample(inputs)
        after_step.append(
            {
                "asleep": engine.asleep(),
                "weights_sleeping": generation._llm_weights_sleeping,
                "sleep_mode": generation.enable_sleep_mode,
                "patched": "sleep" in vars(engine),
            }
        )
        return kept

    trainer._sample = sample_and_look
    trainer.train()

    params = sum(1 for _ in trainer.model.parameters())
    assert rounds_per_step(engine) == dict.fromkeys(range(STEPS), calls)  # several generate calls per step
    assert engine.count("reset_prefix_cache") == dict.fromkeys(range(STEPS), 1)  # one sync per step
    assert engine.count("load_weights") == dict.fromkeys(range(STEPS), params)  # a full push each time
    assert engine.count("sleep") == {None: 1, **dict.fromkeys(range(STEPS), 1)}  # `_init_vllm`, then once per step
    assert last_loaded_step(trainer) == STEPS - 1
    assert engine.errors == []  # never generating or loading while asleep, never waking what is awake
    for step in range(STEPS):
        # TRL's first round (wake the weights, push them, wake the KV cache, generate); later rounds only generate
        # on the awake engine; one sleep at the end of the step.
        assert [(name, detail) for name, s, detail in engine.events if s == step and name != "load_weights"] == [
            ("wake_up", ("weights",)),
            ("reset_prefix_cache", None),
            ("wake_up", ("kv_cache",)),
            *[("generate", ROWS_PER_CALL)] * calls,
            ("sleep", 2),
        ]
    # After each step's rounds, and before TRL's loss: asleep, TRL's state restored, nothing left patched.
    expected = {"asleep": True, "weights_sleeping": True, "sleep_mode": True, "patched": False}
    assert after_step == [expected] * STEPS


def test_colocate_sleep_mode_without_the_fix_syncs_every_round(tmp_path, tokenizer, arithmetic_dataset, monkeypatch):
    """TRL's own behaviour (what the test above would see without `one_weight_sync_per_step`): one sync per round."""
    monkeypatch.setattr(trainer_module, "one_weight_sync_per_step", no_fix)
    trainer, engine = vllm_trainer(tmp_path, tokenizer, arithmetic_dataset, monkeypatch)
    trainer.train()
    assert rounds_per_step(engine) == dict.fromkeys(range(STEPS), MAX_ROUNDS)
    assert engine.count("reset_prefix_cache") == dict.fromkeys(range(STEPS), MAX_ROUNDS)
    assert engine.count("sleep") == {None: 1, **dict.fromkeys(range(STEPS), MAX_ROUNDS)}
    assert engine.errors == []


def test_colocate_sleep_mode_restored_when_a_round_fails(tmp_path, tokenizer, arithmetic_dataset, monkeypatch):
    """A failure in round 2 of step 1: the engine is still put to sleep once and TRL's state is restored."""
    trainer, engine = vllm_trainer(tmp_path, tokenizer, arithmetic_dataset, monkeypatch, fail_on_generate=2)
    generation = trainer.vllm_generation
    with pytest.raises(RuntimeError, match="injected failure in generate call 2"):
        trainer.train()
    assert [name for name, _, _ in engine.events if name != "load_weights"] == [
        "sleep",  # TRL's `_init_vllm`
        "wake_up",
        "reset_prefix_cache",
        "wake_up",
        "generate",
        "generate",  # raised
        "sleep",  # at the end of the failed step's rounds
    ]
    assert engine.asleep() and engine.errors == []
    assert "sleep" not in vars(engine)  # the engine's own method again
    assert generation.enable_sleep_mode and generation._llm_weights_sleeping

    # Training again on the same engine: TRL's weight-sleeping flag makes the first round re-sync, once per step.
    engine.events.clear()
    engine.fail_on_generate = None
    trainer.train()
    assert rounds_per_step(engine) == dict.fromkeys(range(STEPS), MAX_ROUNDS)
    assert engine.count("reset_prefix_cache") == dict.fromkeys(range(STEPS), 1)
    assert engine.asleep() and engine.errors == []


def test_context_manager_on_trl_generate(tokenizer, monkeypatch):
    """The context manager alone, around direct calls of TRL's `VLLMGeneration.generate` (no trainer)."""
    completion_ids = [*tokenizer("7", add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    engine = FakeEngine(completion_ids)

    def init_vllm(self: VLLMGeneration) -> None:
        self.llm = engine
        self.llm.sleep(level=2)
        set_vllm_weights_sleeping(self, True)

    monkeypatch.setattr(VLLMGeneration, "_init_vllm", init_vllm)
    monkeypatch.setattr(vllm_generation_module, "SamplingParams", FakeSamplingParams, raising=False)
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    accelerator = SimpleNamespace(process_index=0, state=SimpleNamespace(fsdp_plugin=None, deepspeed_plugin=None))
    generation = VLLMGeneration(model, accelerator, tokenizer, mode="colocate", enable_sleep_mode=True)
    trainer = SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_generation=generation)
    prompts = [tokenizer("1+1=", add_special_tokens=False)["input_ids"]] * 2

    def syncs() -> int:
        return sum(1 for name, _, _ in engine.events if name == "reset_prefix_cache")

    with one_weight_sync_per_step(trainer):
        for _ in range(4):
            _, completions, _, _ = generation.generate(prompts, None, num_generations=1)
            assert completions == [completion_ids] * 2
        assert not engine.asleep() and syncs() == 1  # awake between rounds, synced once
    assert engine.asleep() and syncs() == 1 and engine.errors == []
    assert [name for name, _, _ in engine.events].count("sleep") == 2  # `_init_vllm`'s and the step's

    for _ in range(2):  # TRL alone: one sync per call
        generation.generate(prompts, None, num_generations=1)
    assert syncs() == 3 and engine.asleep() and engine.errors == []

    with pytest.raises(KeyboardInterrupt), one_weight_sync_per_step(trainer):
        generation.generate(prompts, None, num_generations=1)
        raise KeyboardInterrupt
    assert engine.asleep() and "sleep" not in vars(engine) and generation.enable_sleep_mode
    assert generation._llm_weights_sleeping and syncs() == 4 and engine.errors == []

    with one_weight_sync_per_step(trainer):  # no generate call inside: nothing to put to sleep
        pass
    assert [name for name, _, _ in engine.events][-1] == "sleep" and syncs() == 4


# ---------------------------------------------------------------------------------------------------------------------
# modes that already synced once per step: unchanged
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_fix", [True, False], ids=["fix", "trl-alone"])
def test_server_mode_syncs_once_per_step(tmp_path, tokenizer, arithmetic_dataset, monkeypatch, with_fix):
    """Server mode: TRL's `_last_loaded_step` check already pushes the weights on a step's first round only."""
    if not with_fix:
        monkeypatch.setattr(trainer_module, "one_weight_sync_per_step", no_fix)
    trainer, client = vllm_trainer(tmp_path, tokenizer, arithmetic_dataset, monkeypatch, mode="server")
    trainer.train()
    params = sum(1 for _ in trainer.model.parameters())
    assert rounds_per_step(client) == dict.fromkeys(range(STEPS), MAX_ROUNDS)
    assert client.count("sync") == dict.fromkeys(range(STEPS), 1)
    assert all(detail == params for name, _, detail in client.events if name == "sync")
    for step in range(STEPS):
        assert [name for name, s, _ in client.events if s == step] == [
            "sync",
            "reset_prefix_cache",
            *["generate"] * MAX_ROUNDS,
        ]


def test_colocate_without_sleep_mode_untouched(tmp_path, tokenizer, arithmetic_dataset, monkeypatch):
    trainer, engine = vllm_trainer(tmp_path, tokenizer, arithmetic_dataset, monkeypatch, sleep_mode=False)
    trainer.train()
    assert rounds_per_step(engine) == dict.fromkeys(range(STEPS), MAX_ROUNDS)
    assert engine.count("reset_prefix_cache") == dict.fromkeys(range(STEPS), 1)
    assert engine.count("sleep") == engine.count("wake_up") == Counter()
    assert engine.errors == []


@pytest.mark.parametrize(
    "trainer",
    [
        SimpleNamespace(),  # built without __init__
        SimpleNamespace(use_vllm=False, vllm_mode="colocate"),  # transformers generation
        SimpleNamespace(use_vllm=True, vllm_mode="server", vllm_generation=SimpleNamespace()),
        SimpleNamespace(use_vllm=True, vllm_mode="colocate", vllm_generation=SimpleNamespace(enable_sleep_mode=False)),
    ],
    ids=["bare", "transformers", "server", "colocate-no-sleep"],
)
def test_no_op_outside_colocate_sleep_mode(trainer):
    before = vars(trainer).copy()
    with one_weight_sync_per_step(trainer):
        pass
    assert vars(trainer) == before
