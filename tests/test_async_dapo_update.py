"""
DAPO's refill in the asynchronous worker normalises the weights once over an update's worth of kept prompts, as the
synchronous refill does (`tests/test_dapo_one_selection.py`), not over each generation batch's kept prompts alone. The
pools: A=[1,0,0,0] and B=[0,0,0,0] in the first generation batch, C=[1,1,0,0] and D=[1,1,1,1] in the next; B and D
have no signal and are dropped, so the prompts an update of two trains are A and C.
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo")
from test_async_worker_hardening import make_loop, one_draw  # noqa: E402

from trl_ada.async_grpo.rollout import AsyncSampling  # noqa: E402
from trl_ada.samplers import SamplerSettings, rules  # noqa: E402

POOLS = {0: [1, 0, 0, 0], 1: [0, 0, 0, 0], 2: [1, 1, 0, 0], 3: [1, 1, 1, 1]}
"""Row id -> its draws' rewards: A, B (first generation batch), C, D (the next)."""


@pytest.fixture(autouse=True)
def accelerate_state():
    # TRL's loop logs through accelerate's logger, which needs the state its child process sets up (`_child_main`).
    from accelerate.state import PartialState

    PartialState()


@pytest.fixture(scope="module")
def tokenizer():
    from async_fixtures import chat_tokenizer

    from trl_ada.tiny import load_tiny_arith_model

    return chat_tokenizer(load_tiny_arith_model()[1])


def settings(**knobs) -> SamplerSettings:
    return SamplerSettings(sampler="dapo", num_generations=4, seed=0, **knobs).validated()


def advantages_after_each_batch(loop) -> list[dict[int, list[float]]]:
    """Answer the loop's draws with `POOLS`, in submission order: the advantages of the samples each generation
    batch's last answer queued, by row id."""
    work = loop._repeat_iterator()
    queued: list[dict[int, list[float]]] = []
    while loop._counted_below < len(POOLS):
        group_id, row = next(work)
        draw = loop._draws[group_id]
        row_id = int(row["prompt"][0]["content"].split()[-1])
        group = one_draw(group_id, bool(POOLS[row_id][draw.draw]), prompt=draw.prompt, draw=draw.draw)
        group.prompts = [row["prompt"]]
        counted = loop._counted_below
        samples = asyncio.run(loop._score_group(group))
        if loop._counted_below > counted:  # a generation batch finished
            by_row: dict[int, list[float]] = {}
            for sample in samples:
                by_row.setdefault(sample.group_id, []).append(sample.advantage)
            queued.append(by_row)
    return queued


def scaled(pool: list[int], weight: float) -> list[float]:
    """A pool's advantages as the worker computes them: its group's baseline and std (`scale_rewards="group"`)."""
    mean, std = sum(pool) / len(pool), statistics.stdev(pool)
    return [weight * (r - mean) / (std + rules.STD_EPSILON) for r in pool]


def test_log_weights_are_normalised_over_the_prompts_an_update_trains(tokenizer):
    loop = make_loop(settings(objective="log"), tokenizer, prompts_per_batch=2, rows=len(POOLS))
    assert loop.ada_sampling.normalises_over_the_update
    first, second = advantages_after_each_batch(loop)
    assert first == {}  # A waits for the prompt that completes its update
    # The log objective weighs a prompt 1/p: A (p = 1/4) twice C (p = 1/2); normalised to mean 1 over A and C (each
    # batch normalising its own kept prompt gave both weight 1).
    assert second.keys() == {0, 2}
    assert second[0] == pytest.approx(scaled(POOLS[0], 4 / 3))
    assert second[2] == pytest.approx(scaled(POOLS[2], 2 / 3))


def test_a_linear_objective_queues_each_batchs_kept_prompts_at_once(tokenizer):
    # Every weight is 1 whatever the batch: nothing to normalise together, so nothing waits.
    assert not AsyncSampling(settings(), prompts_per_batch=2).normalises_over_the_update
    sampling = AsyncSampling(settings(objective="log", normalize_weights=False), prompts_per_batch=2)
    assert not sampling.normalises_over_the_update
    loop = make_loop(settings(objective="log", normalize_weights=False), tokenizer, prompts_per_batch=2, rows=4)
    first, second = advantages_after_each_batch(loop)
    assert first.keys() == {0} and second.keys() == {2}
