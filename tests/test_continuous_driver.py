"""
The continuous schedule's driver loop (`continuous_schedule._drive`) against a scripted server on a simulated clock.

No HTTP and no model: the server's draws finish at scripted times, the trainer's round code is a stand-in that scores
with scripted rewards, and the checks are on the loop's timing. `tests/test_continuous_schedule.py` runs the same
loop over real HTTP and a real trainer.
"""

from __future__ import annotations

import contextlib
import random
from types import SimpleNamespace
from typing import Any

import pytest

import trl_ada.continuous_schedule as schedule_module
from trl_ada.continuous_schedule import ScheduleStats, _drive
from trl_ada.samplers import SamplerSettings, build_sampler


class ScriptedDraws:
    """
    Stands in for `ServerDraws`: a draw submitted at simulated time t finishes at t + its scripted duration. `wait`
    advances the clock to the next finish only when it may block; every call is logged with what the driver could
    have scored at that moment, so a test can tell a needless block from a necessary one.
    """

    def __init__(self, duration: Any, scored: dict[int, int], exited: Any) -> None:
        self.duration, self.scored, self.exited = duration, scored, exited
        self.now = 0.0
        self.finish_at: dict[tuple[int, int], float] = {}
        self.returned: set[tuple[int, int]] = set()
        self.blocking_waits_with_work_ready = 0
        self.blocking_waits = 0
        self.submitted = 0

    @property
    def in_flight(self) -> int:
        return len(self.finish_at)

    def submit(self, key: tuple[int, int], prompt_ids: Any) -> None:
        self.finish_at[key] = self.now + self.duration(*key)
        self.submitted += 1

    def _ready(self) -> bool:
        # A returned draw that is next in its (still active) prompt's submission order can be scored right now.
        return any(d == self.scored.get(g, 0) and not self.exited.watch(g) for g, d in self.returned)

    def wait(self, timeout: float | None = None) -> list[tuple[tuple[int, int], dict]]:
        if timeout is None:
            self.blocking_waits += 1
            self.blocking_waits_with_work_ready += self._ready()
            if self.finish_at and not any(t <= self.now for t in self.finish_at.values()):
                self.now = min(self.finish_at.values())
        done = sorted(key for key, t in self.finish_at.items() if t <= self.now)
        for key in done:
            del self.finish_at[key]
            self.returned.add(key)
        return [(key, {"draw": key}) for key in done]

    def abort(self, keys: Any) -> int:
        count = 0
        for key in keys:
            count += self.finish_at.pop(key, None) is not None
        return count

    def __enter__(self) -> ScriptedDraws:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def scripted_run(monkeypatch: pytest.MonkeyPatch, settings: SamplerSettings, num_prompts: int, seed: int):
    rng = random.Random(seed)
    # Two draws of a prompt often finish at the same moment (equal lengths), as short completions do on a server.
    durations = {}
    rewards = {}

    def duration(g: int, d: int) -> float:
        return durations.setdefault((g, d), float(rng.choice([1, 1, 2, 3])))

    def reward(g: int, d: int) -> float:
        return rewards.setdefault((g, d), float(random.Random(f"{seed}/{g}/{d}").random() < 0.3 + 0.1 * (g % 5)))

    scored: dict[int, int] = {}
    exited = SimpleNamespace(watch=lambda g: False)  # set once the step exists: has prompt g exited?
    sampler = build_sampler(settings)
    holder: dict[str, ScriptedDraws] = {}

    def make_draws(*args: Any, **kwargs: Any) -> ScriptedDraws:
        holder["draws"] = ScriptedDraws(duration, scored, exited)
        return holder["draws"]

    def run_round(requests, group_inputs, batch_number):
        order = [g for g, _ in requests]
        rewards_out = []
        for g in order:
            d = scored.get(g, 0)
            scored[g] = d + 1
            rewards_out.append(reward(g, d))
        return order, [SimpleNamespace(truncated=False, key=(g, scored[g] - 1)) for g in order], rewards_out

    trainer = SimpleNamespace(
        ada_sampler=sampler,
        vllm_generation=SimpleNamespace(vllm_client=SimpleNamespace(base_url="http://scripted")),
        mask_truncated_completions=False,
        args=SimpleNamespace(continuous_max_in_flight=512),
        accelerator=SimpleNamespace(num_processes=1),
        _run_round=run_round,
    )
    monkeypatch.setattr(schedule_module, "ServerDraws", make_draws)
    monkeypatch.setattr(schedule_module, "tokenize_prompts", lambda trainer, prompts: [[1, 2]] * len(prompts))
    monkeypatch.setattr(schedule_module, "server_sampling_params", lambda generation: {})
    monkeypatch.setattr(schedule_module, "completions_payload", lambda client, params, prompt: {})
    monkeypatch.setattr(schedule_module, "replayed_completions", lambda *args: contextlib.nullcontext())
    monkeypatch.setattr(schedule_module, "broadcast_object_list", lambda objects: objects)

    begin = sampler.begin_continuous

    def begin_and_watch(*args: Any, **kwargs: Any):
        step = begin(*args, **kwargs)
        exited.watch = lambda g: step.in_flight_target(g) == 0
        return step

    monkeypatch.setattr(sampler, "begin_continuous", begin_and_watch)
    pools: list[list[Any]] = [[] for _ in range(num_prompts)]
    stats = ScheduleStats()
    selection = _drive(trainer, [{"prompt": "x"}] * num_prompts, [str(g) for g in range(num_prompts)], pools, stats)
    return selection, pools, stats, holder["draws"], reward


@pytest.mark.parametrize("policy", ["fixed", "predictive"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_driver_scores_a_ready_draw_without_waiting_for_another(monkeypatch, policy, seed):
    settings = SamplerSettings(
        sampler="seq_balance", num_generations=4, round_size=4, max_rounds=4, round_policy=policy
    )
    selection, pools, stats, draws, reward = scripted_run(monkeypatch, settings, num_prompts=8, seed=seed)
    # The loop blocked for a new completion only when nothing already back could be scored.
    assert draws.blocking_waits > 0
    assert draws.blocking_waits_with_work_ready == 0
    # And the pools are still each prompt's first draws, in submission order, with their own rewards.
    for g, pool in enumerate(pools):
        assert [entry.key for entry in pool] == [(g, d) for d in range(len(pool))]
        assert list(selection.pools[g]) == [reward(g, d) for d in range(len(pool))]
    assert stats.scored == sum(len(pool) for pool in pools)


def test_server_draws_wait_returns_each_finished_draw_once_and_never_an_aborted_one():
    from fake_vllm_server import FakeVLLMServer

    from trl_ada.server_draws import ServerDraws

    # Completions of 2-10 tokens at 20 ms per token: every draw is still running right after submission.
    server = FakeVLLMServer(digit_ids=list(range(10, 20)), eos_id=2, seconds_per_token=0.02)
    try:
        payload = {"model": "fake-tiny", "max_tokens": 8, "logprobs": 0, "return_token_ids": True}
        with ServerDraws(server.base_url, payload) as draws:
            for d in range(12):
                draws.submit(("p", d), [5, 6, 7])
            assert draws.wait(timeout=0) == []  # nothing finished yet: no blocking, nothing returned
            aborted = [("p", d) for d in range(0, 12, 3)]
            assert draws.abort(aborted) == len(aborted)
            seen: list = []
            while draws.in_flight:
                got = draws.wait(timeout=None)
                assert got  # a blocking wait returns at least one draw
                seen.extend(key for key, _ in got)
            assert draws.wait(timeout=None) == []  # nothing in flight: returns at once
        assert sorted(seen) == sorted(set(seen)) == [("p", d) for d in range(12) if ("p", d) not in aborted]
        # The server answered exactly the draws handed back (an aborted one was cut off, or never reached it).
        assert sum(not request.aborted for request in server.requests) == len(seen)
    finally:
        server.close()


def test_open_file_limit_is_raised_to_fit_the_draws_in_flight(monkeypatch, caplog):
    import resource

    from trl_ada.server_draws import SPARE_OPEN_FILES, ensure_open_files

    limits = {"soft": 1024, "hard": 4096}
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (limits["soft"], limits["hard"]))

    def setrlimit(kind, value):
        limits["soft"], limits["hard"] = value

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    ensure_open_files(512)  # 512 + the spare fit under 1024: nothing changes
    assert limits == {"soft": 1024, "hard": 4096}
    with caplog.at_level("INFO", logger="trl_ada.server_draws"):
        ensure_open_files(2048)
    assert limits == {"soft": 2048 + SPARE_OPEN_FILES, "hard": 4096}
    assert "Raised the open-file limit from 1024" in caplog.text
    # Past the hard limit nothing can be raised: the error names the largest value that fits.
    with pytest.raises(ValueError, match=rf"Lower continuous_max_in_flight to {4096 - SPARE_OPEN_FILES} or less"):
        ensure_open_files(8192)
    assert limits["hard"] == 4096


def test_continuous_trainer_checks_the_open_file_limit_at_construction(
    tmp_path, monkeypatch, tokenizer, arithmetic_dataset
):
    import resource

    from conftest import TINY_MODEL_KWARGS, tiny_args

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tiny import build_tiny_model

    monkeypatch.setattr(resource, "getrlimit", lambda kind: (1024, 1024))
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=1, per_device_train_batch_size=16),
        sampler="seq_balance",
        generation_schedule="continuous",
        use_vllm=True,
        vllm_mode="server",
    )
    loaded = []
    monkeypatch.setattr(AdaGRPOTrainer.__mro__[1], "__init__", lambda *a, **k: loaded.append(1))
    with pytest.raises(ValueError, match="continuous_max_in_flight=2048 keeps that many HTTP connections open"):
        AdaGRPOTrainer(
            build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
            [lambda completions, **kwargs: [0.0] * len(completions)],
            args=config,
            train_dataset=arithmetic_dataset,
            processing_class=tokenizer,
        )
    assert loaded == []  # failed before GRPOTrainer set anything up
