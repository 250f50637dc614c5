"""
Remembered baselines and SPO in the asynchronous worker (`AdaRolloutLoop`): with `scale_rewards="none"` or `"batch"`
the worker centres each prompt on its tracked pass rate (SPO's rule: read before this visit's draws are added), DAPO
keeps an unmixed group that carries a signal under it, and `sampler="spo"` draws its prompts from the one stream by
priority (`PriorityWalk`), settling every row it passes over as the resume position needs.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")

from test_async_new_samplers import Stream, question  # noqa: E402
from test_async_rules import async_config  # noqa: E402
from test_async_worker_hardening import make_loop  # noqa: E402

from trl_ada.async_grpo.async_grpo_trainer import async_sampling  # noqa: E402
from trl_ada.async_grpo.rollout import PriorityWalk  # noqa: E402
from trl_ada.experimental.spo import SpoOptions  # noqa: E402
from trl_ada.schedules import prompt_key  # noqa: E402


@pytest.fixture(autouse=True)
def accelerate_state():
    from accelerate.state import PartialState

    PartialState()


@pytest.fixture(scope="module")
def tokenizer():
    from async_fixtures import chat_tokenizer

    from trl_ada.tiny import load_tiny_arith_model

    return chat_tokenizer(load_tiny_arith_model()[1])


def tracked_mean(settings, draws: int, rights: int) -> float:
    """The tracker's pass rate after one visit of `draws` with `rights` right: its decayed Beta posterior's mean."""
    alpha, beta = settings.pass_rate_prior_alpha, settings.pass_rate_prior_beta
    return (alpha + rights) / (alpha + beta + draws)


def advantages_by_row(samples) -> dict[int, list[float]]:
    rows: dict[int, list[float]] = {}
    for sample in samples:
        rows.setdefault(sample.group_id, []).append(sample.advantage)
    return rows


def test_an_unmixed_group_with_history_is_centred_on_its_tracked_pass_rate(tmp_path, tokenizer):
    sampling = async_sampling(
        async_config(tmp_path, sampler="uniform", num_generations=4, baseline="tracked", scale_rewards="none")
    )
    # TRL's group-std advantages cannot serve it: the worker scores every draw and centres the pools itself.
    assert sampling.pooled and not sampling.trl_advantages and sampling.prompts_per_batch == 1
    loop = make_loop(sampling.settings, tokenizer, rows=2)
    calls = Counter()

    def right(index: int, draw: int) -> bool:  # question 0: right at its first visit, wrong at its second
        calls[index] += 1
        return calls[index] <= 4 if index == 0 else draw % 2 == 0

    stream = Stream(loop, right)
    stream.run(rows=4)  # rows 0, 2: question 0; rows 1, 3: question 1
    rows = advantages_by_row(stream.samples)
    # A first visit has no history: the pool's own mean (all right: no signal; half right: +-1/2).
    assert rows[0] == [0.0] * 4 and sorted(rows[1]) == [-0.5, -0.5, 0.5, 0.5]
    # The second visit, all wrong, against the pass rate its first visit left: -p̂ on every draw.
    expected = -tracked_mean(loop.ada_sampling.settings, draws=4, rights=4)
    assert rows[2] == pytest.approx([expected] * 4) and expected == pytest.approx(-5 / 6)
    assert sorted(rows[3]) == pytest.approx([-0.5, -0.5, 0.5, 0.5])  # history 1/2, as the pool


def test_dapo_keeps_an_all_wrong_group_whose_history_gives_it_a_signal(tmp_path, tokenizer):
    sampling = async_sampling(
        async_config(tmp_path, sampler="dapo", num_generations=4, baseline="tracked", scale_rewards="none")
    )
    loop = make_loop(sampling.settings, tokenizer, rows=2)
    stream = Stream(loop, lambda index, draw: index == 1 and draw % 2 == 0)  # question 0 never right
    stream.run(rows=4)
    rows = advantages_by_row(stream.samples)
    # Its first visit, unmixed with no history, is dropped; its second is wrong against p̂ = 1/6, a signal: kept.
    assert 0 not in rows and 0 in loop._dropped
    assert rows[2] == pytest.approx([-tracked_mean(loop.ada_sampling.settings, draws=4, rights=0)] * 4)


def test_spos_batch_normalisation_waits_for_a_generation_batch(tmp_path, tokenizer):
    sampling = async_sampling(async_config(tmp_path, sampler="uniform", num_generations=4, **SpoOptions.recipe))
    assert sampling.prompts_per_batch == 8  # a rule over the batch: TRL's defaults give 8 samples a step, at least 8
    loop = make_loop(sampling.settings, tokenizer, prompts_per_batch=sampling.prompts_per_batch, rows=8)
    stream = Stream(loop, lambda index, draw: draw < index % 4)  # question i: i % 4 of 4 right
    stream.run(rows=8)
    rows = advantages_by_row(stream.samples)
    # First visits: each prompt centred on its pool, then every centred reward divided by their spread over the rows
    # with a signal (questions 1-3 and 5-7); unmixed groups stay at 0.
    centred = {i: [(1.0 if d < i % 4 else 0.0) - (i % 4) / 4 for d in range(4)] for i in range(8)}
    signal = [value for i in range(8) if i % 4 for value in centred[i]]
    spread = statistics.stdev(signal) + 1e-4  # unbiased, as torch.std, plus TRL's epsilon
    for i in range(8):
        assert sorted(rows[i]) == pytest.approx(sorted(v / spread if i % 4 else 0.0 for v in centred[i])), i


class FixedPriorities:
    """A prompt chooser whose priorities are fixed by key."""

    def __init__(self, priorities: dict[str, float], largest: float) -> None:
        self.priorities, self.largest = priorities, largest

    def prompt_priorities(self, keys):
        return [self.priorities[key] for key in keys]

    def max_priority(self) -> float:
        return self.largest


def test_the_priority_walk_draws_each_prompt_with_its_priority_over_the_largest():
    walk = PriorityWalk(FixedPriorities({"a": 0.55, "b": 0.275, "c": 0.055}, 0.55), dataset_size=3, seed=0)
    visits = 3000
    drawn = Counter()
    for row in range(visits):
        key = "abc"[row % 3]
        drawn[key] += not walk.passes_over(key, row)
    for key, share in (("a", 1.0), ("b", 0.5), ("c", 0.1)):
        # Binomial over 1,000 visits each: within 4 standard deviations.
        bound = 4 * (share * (1 - share) / (visits / 3)) ** 0.5
        assert abs(drawn[key] / (visits / 3) - share) <= max(bound, 1e-9), key
    assert walk.passed_over_total == visits - sum(drawn.values())
    assert walk.take_passed_over() == walk.passed_over_total
    assert walk.take_passed_over() == 0  # an increment since the last call


def test_a_rows_coin_depends_on_the_seed_and_the_row_alone():
    priorities = FixedPriorities({"a": 0.3, "b": 0.2}, 0.55)
    whole = PriorityWalk(priorities, dataset_size=2, seed=7)
    decisions = [whole.passes_over("ab"[row % 2], row) for row in range(200)]
    resumed = PriorityWalk(priorities, dataset_size=2, seed=7)  # a resume that starts at row 120
    assert [resumed.passes_over("ab"[row % 2], row) for row in range(120, 200)] == decisions[120:]
    other_seed = PriorityWalk(priorities, dataset_size=2, seed=8)
    assert [other_seed.passes_over("ab"[row % 2], row) for row in range(200)] != decisions


def test_a_walk_whose_priorities_are_all_zero_draws_after_one_walk_of_the_dataset():
    walk = PriorityWalk(FixedPriorities({"a": 0.0, "b": 0.0, "c": 0.0}, 0.55), dataset_size=3, seed=0)
    assert [walk.passes_over("abc"[row % 3], row) for row in range(8)] == [True] * 3 + [False] + [True] * 3 + [False]


QUESTIONS = 12
HOPELESS = range(4)
"""Questions never answered right; the others right on every other draw (mixed, p̂ near 1/2: SPO's largest weight)."""


def spo_loop(tmp_path, tokenizer, **sampling):
    resolved = async_sampling(async_config(tmp_path, sampler="spo", num_generations=2, **SpoOptions.recipe))
    return make_loop(
        resolved.settings, tokenizer, prompts_per_batch=resolved.prompts_per_batch, rows=QUESTIONS, **sampling
    )


def right_unless_hopeless(index: int, draw: int) -> bool:
    return index not in HOPELESS and draw % 2 == 0


def test_spo_in_the_stream_passes_over_prompts_its_tracker_reads_as_settled(tmp_path, tokenizer):
    loop = spo_loop(tmp_path, tokenizer)
    assert isinstance(loop._gate, PriorityWalk) and loop.ada_sampling.pooled
    stream = Stream(loop, right_unless_hopeless)
    stream.run(rows=QUESTIONS * 10)
    met, drawn = Counter(), Counter()
    for row, was_drawn, _ in stream.rows_met:
        met[row % QUESTIONS] += 1
        drawn[row % QUESTIONS] += was_drawn
    mixed = [q for q in range(QUESTIONS) if q not in HOPELESS]
    # A mixed question reads p̂ = 1/2, the largest weight: always drawn. A hopeless one's p̂ falls: passed over often.
    assert all(drawn[q] == met[q] for q in mixed)
    # Its chance per visit after k visits of 2 wrong: (sqrt(p̂(1-p̂)) + 0.05) / 0.55 with p̂ = 1 / (2 + 2(1 + λ + ...)),
    # 0.71 at the third visit and falling; over the 44 visits, well below all of them.
    assert all(drawn[q] <= met[q] for q in HOPELESS)
    assert sum(drawn[q] for q in HOPELESS) < 0.85 * sum(met[q] for q in HOPELESS), {
        q: (drawn[q], met[q]) for q in HOPELESS
    }
    # Every row passed over is settled without a sample: the resume position moves past it.
    passed = {row for row, was_drawn, _ in stream.rows_met if not was_drawn}
    state = loop.worker_state()
    assert passed and passed <= set(state.dropped) and passed <= set(state.passed_over)
    assert not passed & {sample.group_id for sample in stream.samples}
    assert state.counted_below >= QUESTIONS * 10
    # The tracker travels with the worker's state: a resumed worker reads the same priorities.
    resumed = spo_loop(tmp_path, tokenizer, initial_state=json.loads(json.dumps(state.sampler)))
    keys = [prompt_key(question(i)) for i in range(QUESTIONS)]
    assert resumed.sampler.prompt_priorities(keys) == loop.sampler.prompt_priorities(keys)
    assert spo_loop(tmp_path, tokenizer).sampler.prompt_priorities(keys) != loop.sampler.prompt_priorities(keys)


def test_dapos_kept_prompts_are_normalised_over_a_whole_update(tmp_path, tokenizer):
    sampling = async_sampling(async_config(tmp_path, sampler="dapo", num_generations=4, **SpoOptions.recipe))
    assert sampling.normalises_over_the_update and sampling.prompts_per_batch == 8
    loop = make_loop(sampling.settings, tokenizer, prompts_per_batch=8, rows=8)
    stream = Stream(loop, lambda index, draw: draw < index % 4)  # questions 0 and 4 never right
    stream.run(rows=16)
    # The first visits keep 6 prompts (0 and 4 dropped), the second all 8 (0 and 4 wrong against p̂ = 1/6): the first
    # update holds 8 kept prompts from both batches, normalised together to unit spread over their rows.
    update = sorted({sample.group_id for sample in stream.samples})[:8]
    assert update == [1, 2, 3, 5, 6, 7, 8, 9]
    advantages = [sample.advantage for sample in stream.samples if sample.group_id in update]
    assert statistics.stdev(advantages) == pytest.approx(1.0, abs=1e-3)
