"""
The continuous schedule's driver loop (`trl_ada.schedules.continuous._drive`) against a scripted server on a simulated clock.

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

import trl_ada.schedules.continuous as schedule_module
import trl_ada.schedules.rounds as rounds_module
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.schedules.continuous import ScheduleStats, _drive


class ScriptedDraws:
    """
    Stands in for `ServerDraws`: a draw submitted at simulated time t finishes at t + its scripted duration. `wait`
    advances the clock to the next finish; every call is logged with what the driver could have scored at that
    moment, so a test can tell a needless block from a necessary one.
    """

    def __init__(self, duration: Any, scored: set[tuple[int, int]]) -> None:
        self.duration, self.scored = duration, scored
        self.now = 0.0
        self.finish_at: dict[tuple[int, int], float] = {}
        self.returned: set[tuple[int, int]] = set()
        self.blocking_waits_with_work_ready = 0
        self.blocking_waits = 0
        self.submitted = 0
        self.most_in_flight: dict[int, int] = {}

    @property
    def in_flight(self) -> int:
        return len(self.finish_at)

    def submit(self, key: tuple[int, int], prompt_ids: Any) -> None:
        self.finish_at[key] = self.now + self.duration(*key)
        self.submitted += 1
        flying = sum(g == key[0] for g, _ in self.finish_at)
        self.most_in_flight[key[0]] = max(self.most_in_flight.get(key[0], 0), flying)

    def wait(self, timeout: float | None = None) -> list[tuple[tuple[int, int], dict]]:
        if timeout is None:
            self.blocking_waits += 1
            # Every draw back is in its prompt's pool: one back and not yet scored could have been scored instead.
            self.blocking_waits_with_work_ready += bool(self.returned - self.scored)
            if self.finish_at and not any(t <= self.now for t in self.finish_at.values()):
                self.now = min(self.finish_at.values())
        done = sorted(key for key, t in self.finish_at.items() if t <= self.now)
        for key in done:
            del self.finish_at[key]
            self.returned.add(key)
        return [(key, {"draw": key}) for key in done]

    def abort(self, keys: Any) -> int:
        return sum(self.finish_at.pop(key, None) is not None for key in keys)

    def __enter__(self) -> ScriptedDraws:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def scripted_run(monkeypatch: pytest.MonkeyPatch, settings: SamplerSettings, num_prompts: int, seed: int):
    rng = random.Random(seed)
    # Two draws of a prompt often finish at the same moment (equal lengths), as short completions do on a server.
    durations = {}

    def duration(g: int, d: int) -> float:
        return durations.setdefault((g, d), float(rng.choice([1, 1, 2, 3])))

    def reward(g: int, d: int) -> float:
        return float(random.Random(f"{seed}/{g}/{d}").random() < 0.3 + 0.1 * (g % 5))

    scored: set[tuple[int, int]] = set()
    announced: list[list[tuple[int, int]]] = []
    sampler = build_sampler(settings)
    holder: dict[str, ScriptedDraws] = {}

    def make_draws(*args: Any, **kwargs: Any) -> ScriptedDraws:
        holder["draws"] = ScriptedDraws(duration, scored)
        return holder["draws"]

    def broadcast(objects):
        kind, content = objects[0]
        if kind == "score":
            announced.append(list(content))
        return objects

    def run_round(trainer_, requests, group_inputs, batch_number):
        rows = announced[batch_number - 1]  # the (prompt, draw) pairs the driver announced for this batch
        assert [g for g, _ in rows] == [g for g, count in requests for _ in range(count)]
        scored.update(rows)
        entries = [SimpleNamespace(truncated=False, key=key) for key in rows]
        return [g for g, _ in rows], entries, [reward(*key) for key in rows]

    trainer = SimpleNamespace(
        ada_sampler=sampler,
        vllm_generation=SimpleNamespace(vllm_client=SimpleNamespace(base_url="http://scripted")),
        mask_truncated_completions=False,
        args=SimpleNamespace(continuous_max_in_flight=512, vllm_server_timeout=240.0),
        accelerator=SimpleNamespace(num_processes=1),
    )
    monkeypatch.setattr(rounds_module, "run_round", run_round)
    monkeypatch.setattr(schedule_module, "ServerDraws", make_draws)
    monkeypatch.setattr(schedule_module, "tokenize_prompts", lambda trainer, prompts: [[1, 2]] * len(prompts))
    monkeypatch.setattr(schedule_module, "server_sampling_params", lambda generation: {})
    monkeypatch.setattr(schedule_module, "completions_payload", lambda client, params, prompt: {})
    monkeypatch.setattr(schedule_module, "replayed_completions", lambda *args, **kwargs: contextlib.nullcontext())
    monkeypatch.setattr(schedule_module, "_contained_rewards", lambda *args: contextlib.nullcontext())
    monkeypatch.setattr(schedule_module, "broadcast_object_list", broadcast)

    entries: list[dict[int, Any]] = [{} for _ in range(num_prompts)]
    stats = ScheduleStats()
    selection = _drive(trainer, [{"prompt": "x"}] * num_prompts, [str(g) for g in range(num_prompts)], entries, stats)
    return selection, entries, stats, holder["draws"], reward, announced


@pytest.mark.parametrize("policy", ["fixed", "predictive"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_driver_scores_every_draw_back_and_fills_the_pools_of_rounds(monkeypatch, policy, seed):
    settings = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler="seq_balance",
        num_generations=4,
        round_size=4,
        max_rounds=4,
        round_policy=policy,
    )
    selection, entries, stats, draws, reward, announced = scripted_run(monkeypatch, settings, 8, seed)
    # The loop blocked for a new completion only when nothing already back was left to score.
    assert draws.blocking_waits > 0
    assert draws.blocking_waits_with_work_ready == 0
    # Each draw was scored once, and a scoring batch may hold several draws of one prompt (all are in its pool).
    rows = [key for batch in announced for key in batch]
    assert sorted(rows) == sorted(set(rows)) == sorted(draws.returned)
    assert any(len({g for g, _ in batch}) < len(batch) for batch in announced)
    # The pools are the rounds-with-the-same-settings pools on the same draws, each entry at its draw index.
    step = build_sampler(settings).begin(8, [str(g) for g in range(8)])
    while requests := step.requests():
        step.observe(requests, [reward(g, len(step.pools[g]) + j) for g, count in requests for j in range(count)])
    assert selection.pools == step.finish().pools
    for g, by_draw in enumerate(entries):
        assert sorted(by_draw) == list(range(len(selection.pools[g])))
        assert all(entry.key == (g, d) for d, entry in by_draw.items())
        # In flight: at most the prompt's current block (a round's request), never past its next exit check.
        assert draws.most_in_flight[g] <= settings.max_pool_size
        if policy == "fixed":
            assert draws.most_in_flight[g] == settings.round_size
    assert stats.submitted == draws.submitted == sum(len(pool) for pool in selection.pools)
    assert stats.metrics() == {
        "continuous/scoring_batches": float(len(announced)),
        "continuous/draws_per_scoring_batch": len(rows) / len(announced),
        "continuous/seconds": stats.seconds,
    }


def test_server_draws_wait_returns_each_finished_draw_once_and_never_an_aborted_one():
    from fake_vllm_server import FakeVLLMServer

    from trl_ada.schedules.server_draws import ServerDraws

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

    from trl_ada.schedules.server_draws import SPARE_OPEN_FILES, ensure_open_files

    limits = {"soft": 1024, "hard": 4096}
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (limits["soft"], limits["hard"]))

    def setrlimit(kind, value):
        limits["soft"], limits["hard"] = value

    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    ensure_open_files(512)  # 512 + the spare fit under 1024: nothing changes
    assert limits == {"soft": 1024, "hard": 4096}
    with caplog.at_level("INFO", logger="trl_ada.schedules.server_draws"):
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


def test_a_replay_mismatch_is_recorded_and_answered_in_the_requests_shape_when_asked():
    # On the main process inside a scoring batch, the other processes wait in the completions broadcast: a mismatch
    # must not raise there (it is raised after the batch), and the answer must have the request's shape.
    from trl_ada.trl_seam.vllm_generation import replayed_completions

    class Client:  # `_post` is a method, as on TRL's VLLMClient: the replay shadows it on the instance
        def _post(self, url, **kwargs):
            return {"sent": True}

    client = Client()
    payload = {"model": "m", "n": 1, "max_tokens": 8}
    choices = [{"token_ids": [1]}, {"token_ids": [2]}]
    mismatches: list = []
    with replayed_completions(client, payload, [[5], [6]], choices, mismatches=mismatches):
        answer = client._post(
            "http://x/v1/completions", json={"model": "m", "n": 1, "max_tokens": 8, "prompt": [[5]] * 3}
        )
    assert answer == {"choices": [choices[0], choices[1], choices[0]]}
    assert len(mismatches) == 1 and "other prompts" in str(mismatches[0])
    with pytest.raises(RuntimeError, match="differs from the continuous draws' in \\['max_tokens'\\]"):
        with replayed_completions(client, payload, [[5], [6]], choices):
            client._post("http://x/v1/completions", json={"model": "m", "n": 1, "max_tokens": 9, "prompt": [[5], [6]]})
