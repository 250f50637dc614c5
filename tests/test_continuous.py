"""The round-free schedule (`ContinuousStep`) against rounds of one draw, with a fake continuous-batching engine."""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable
from dataclasses import replace

import pytest

from trl_ada.samplers import ContinuousStep, SamplerSettings, build_sampler, rules

# Draw outcome: (reward, masked, length). Lengths only decide the arrival order.
Draw = tuple[float, bool, float]


def table(seed: int, draw: Callable[[random.Random], Draw]) -> Callable[[int, int], Draw]:
    """A fixed outcome per (prompt, draw), whoever asks first: both schedules then see the same i.i.d. sequences."""
    cache: dict[tuple[int, int], Draw] = {}

    def outcome(prompt: int, index: int) -> Draw:
        if (prompt, index) not in cache:
            cache[prompt, index] = draw(random.Random(f"{seed}/{prompt}/{index}"))
        return cache[prompt, index]

    return outcome


def correlated(p: float, right_length: float = 1.0, wrong_length: float = 4.0) -> Callable[[random.Random], Draw]:
    """Right with probability p, and then short: lengths are exponential with a mean set by correctness."""

    def draw(rng: random.Random) -> Draw:
        right = rng.random() < p
        # Non-binary rewards, so the pool's mean reward is a statistic of its own, not p̂.
        reward = 1.0 if right else 0.4 * rng.random()
        return reward, False, rng.expovariate(1.0 / (right_length if right else wrong_length))

    return draw


class Engine:
    """
    Continuous batching on a clock: a draw submitted at time t finishes at t + its length, results come back in
    finish order. Aborted draws keep running and their results still arrive (as with a late abort): they must go to
    `discard`. Records every abort with what the prompt had in flight at that moment.
    """

    def __init__(self, step: ContinuousStep, outcome: Callable[[int, int], Draw], in_order: bool = False) -> None:
        self.step, self.outcome, self.in_order = step, outcome, in_order
        self.clock = 0.0
        self.queue: list[tuple[float, int, int, int]] = []
        self.sequence = 0
        self.submitted: set[tuple[int, int]] = set()
        self.running: dict[int, set[int]] = {}  # per prompt: submitted, result not returned yet
        self.max_in_flight = 0

    def submit(self) -> None:
        for prompt, draw in self.step.to_submit():
            assert (prompt, draw) not in self.submitted, "to_submit returned a pair twice"
            self.submitted.add((prompt, draw))
            self.running.setdefault(prompt, set()).add(draw)
            # In order: finish times grow with submission, so results return in submission order.
            finish = self.sequence if self.in_order else self.clock + self.outcome(prompt, draw)[2]
            heapq.heappush(self.queue, (finish, self.sequence, prompt, draw))
            self.sequence += 1
        self.max_in_flight = max(self.max_in_flight, self.step.in_flight)

    def run(self) -> None:
        step = self.step
        self.submit()
        while self.queue:
            self.clock, _, prompt, draw = heapq.heappop(self.queue)
            self.running[prompt].remove(draw)
            if step.is_aborted(prompt, draw):
                step.discard(prompt, draw)
                continue
            reward, masked, _ = self.outcome(prompt, draw)
            aborts = step.complete(prompt, draw, reward, masked)
            if aborts:
                # Exactly what the prompt still had running when it exited, all beyond its admitted pool.
                admitted = len(step.step.pools[prompt])
                assert aborts == [(prompt, d) for d in sorted(self.running[prompt])]
                assert all(d >= admitted for _, d in aborts)
            self.submit()
        assert step.done and step.in_flight == 0


def run_continuous(settings: SamplerSettings, outcome, num_prompts: int, keys=None, in_order: bool = False):
    sampler = build_sampler(settings)
    step = sampler.begin_continuous(num_prompts, keys)
    engine = Engine(step, outcome, in_order)
    engine.run()
    return step.finish(), step, engine


def run_rounds(settings: SamplerSettings, outcome, num_prompts: int, keys=None):
    """The reference: rounds of one draw each, with the same cap (`max_rounds` = the cap)."""
    sampler = build_sampler(settings)
    step = sampler.begin(num_prompts, keys)
    while requests := step.requests():
        draws = [outcome(index, len(step.pools[index]) + j) for index, count in requests for j in range(count)]
        step.observe(requests, [reward for reward, _, _ in draws], [masked for _, masked, _ in draws])
    return step.finish(), step


def one_draw_rounds(settings: SamplerSettings) -> SamplerSettings:
    return replace(settings, round_size=1, max_rounds=settings.max_pool_size, round_policy="fixed")


def z_score(a: list[float], b: list[float]) -> float:
    """Difference of two independent sample means in units of its standard error."""

    def mean_var(x: list[float]) -> tuple[float, float]:
        mean = math.fsum(x) / len(x)
        return mean, math.fsum((v - mean) ** 2 for v in x) / (len(x) - 1)

    (ma, va), (mb, vb) = mean_var(a), mean_var(b)
    return (ma - mb) / math.sqrt(va / len(a) + vb / len(b))


def pool_statistics(pools) -> dict[str, list[float]]:
    return {
        "size": [float(len(pool)) for pool in pools],
        "pass_rate": [sum(r > 0.5 for r in pool) / len(pool) for pool in pools],
        "mean_reward": [math.fsum(pool) / len(pool) for pool in pools],
    }


# ---------------------------------------------------------------------------------------------------------------
# Exactness: the pools are those of rounds of one draw, whatever the arrival order and the in-flight target
# ---------------------------------------------------------------------------------------------------------------


def mixed_draw(rng: random.Random) -> Draw:
    """Rewards with NaN (unscorable) and masked (truncated) completions, lengths unrelated to anything."""
    u = rng.random()
    reward = math.nan if u < 0.05 else float(rng.random() < 0.35)
    return reward, rng.random() < 0.1, rng.expovariate(1.0)


CASES = [
    ("fixed", 1, True),  # one draw in flight, results in order: literally rounds of one draw
    ("fixed", 8, False),
    ("predictive", 8, False),
    ("tracked", 4, False),
]


@pytest.mark.parametrize("sampler_name", ["seq_pos", "seq_balance"])
@pytest.mark.parametrize(("policy", "round_size", "in_order"), CASES)
def test_selection_equals_rounds_of_one_draw(sampler_name, policy, round_size, in_order):
    settings = SamplerSettings(
        sampler=sampler_name,
        num_generations=4,
        round_size=round_size,
        max_rounds=16 // round_size,
        round_policy=policy,
        objective="log",
        scale_rewards="group",
        seed=7,
    )
    outcome = table(3, mixed_draw)
    keys = [f"prompt-{i}" for i in range(40)]
    got, cstep, engine = run_continuous(settings, outcome, 40, keys, in_order)
    want, rstep = run_rounds(one_draw_rounds(settings), outcome, 40, keys)

    assert got.pools == want.pools
    # repr compares floats exactly and NaN equal to NaN (a pool of only unscorable draws has a NaN baseline).
    assert repr(got.prompts) == repr(want.prompts)
    assert (got.rounds, got.active_after_round, got.rounds_per_prompt) == (
        want.rounds,
        want.active_after_round,
        want.rounds_per_prompt,
    )
    plain = {key: value for key, value in got.metrics.items() if not key.startswith("continuous/")}
    assert repr(sorted(plain.items())) == repr(sorted(want.metrics.items()))
    assert cstep.step.masked == rstep.masked and cstep.step.outcomes == rstep.outcomes
    stats = cstep.stats
    assert stats.admitted == sum(len(pool) for pool in got.pools)
    assert stats.submitted == stats.admitted + stats.finished_but_discarded + stats.aborted == len(engine.submitted)
    if round_size == 1:
        assert stats.submitted == stats.admitted and engine.max_in_flight <= 40


def test_tracked_updates_the_tracker_at_finish_and_uses_it_next_step():
    settings = SamplerSettings(
        sampler="seq_balance", num_generations=4, round_size=8, max_rounds=4, round_policy="tracked"
    )
    sampler = build_sampler(settings)
    keys = ["easy", "hard"]
    outcome = table(5, lambda rng: (float(rng.random() < 0.5), False, rng.expovariate(1.0)))
    step = sampler.begin_continuous(2, keys)
    Engine(step, outcome).run()
    assert sampler.tracker.counts == {}  # only finish() updates it, as end_step does in rounds
    step.finish()
    outcomes = step.step.outcomes
    assert sampler.tracker.counts == {key: (float(p + q), float(p)) for key, (p, q) in zip(keys, outcomes)}
    # The next step's first in-flight target is the predictive request under the updated prior.
    nxt = sampler.begin_continuous(2, keys)
    s = sampler.settings
    for index, (alpha, beta) in enumerate(sampler.tracker.beta_parameters(keys)):
        expected = rules.predictive_request(
            s.positive_quota, s.negative_quota, alpha, beta, s.round_confidence, s.num_generations, s.max_pool_size
        )
        assert nxt.in_flight_target(index) == expected


# ---------------------------------------------------------------------------------------------------------------
# Unbiased pools: submission order matches sequential sampling in law; arrival order does not
# ---------------------------------------------------------------------------------------------------------------

STAT_SETTINGS = {
    "seq_balance": (SamplerSettings(sampler="seq_balance", num_generations=4, round_size=8, max_rounds=4), 0.3),
    "seq_pos": (SamplerSettings(sampler="seq_pos", num_generations=4, round_size=8, max_rounds=4), 0.1),
}
PROMPTS = 3000


def arrival_order_pools(settings: SamplerSettings, outcome, num_prompts: int) -> list[list[float]]:
    """
    The deliberately WRONG variant: admit each result the moment it arrives, keeping `round_size` in flight. Same
    engine clock, exit rule and cap; only the admission order differs.
    """
    sampler = build_sampler(settings)
    step = sampler.begin(num_prompts)
    cap, queue, clock = sampler.settings.max_pool_size, [], 0.0
    submitted, running = [0] * num_prompts, [0] * num_prompts
    done = [False] * num_prompts

    def top_up(prompt: int) -> None:
        want = sampler.demand(step, prompt)
        while not done[prompt] and running[prompt] < want and submitted[prompt] < cap:
            draw = submitted[prompt]
            heapq.heappush(queue, (clock + outcome(prompt, draw)[2], prompt, draw))
            submitted[prompt] += 1
            running[prompt] += 1

    for prompt in range(num_prompts):
        top_up(prompt)
    while queue:
        clock, prompt, draw = heapq.heappop(queue)
        running[prompt] -= 1
        if done[prompt]:
            continue
        step.add(prompt, [outcome(prompt, draw)[0]])
        done[prompt] = sampler.demand(step, prompt) == 0
        top_up(prompt)
    return step.pools


@pytest.mark.parametrize("sampler_name", sorted(STAT_SETTINGS))
def test_submission_order_pools_match_sequential_sampling(sampler_name):
    settings, p = STAT_SETTINGS[sampler_name]
    # Independent draws for the two schedules: equal in law, compared within Monte-Carlo error.
    got, _, _ = run_continuous(settings, table(11, correlated(p)), PROMPTS)
    want, _ = run_rounds(one_draw_rounds(settings), table(12, correlated(p)), PROMPTS)
    ours, reference = pool_statistics(got.pools), pool_statistics(want.pools)
    for name in ours:
        # 4 standard errors: a false alarm has probability ~6e-5 per statistic (the seeds are fixed anyway).
        assert abs(z_score(ours[name], reference[name])) < 4.0, name
    # p̂ as the Selection reports it (no masks here) is the pool's share of positives.
    assert [r.pass_rate for r in got.prompts] == ours["pass_rate"]


@pytest.mark.parametrize("sampler_name", sorted(STAT_SETTINGS))
def test_arrival_order_would_bias_the_pools(sampler_name):
    settings, p = STAT_SETTINGS[sampler_name]
    wrong = pool_statistics(arrival_order_pools(settings, table(13, correlated(p)), PROMPTS))
    reference = pool_statistics(run_rounds(one_draw_rounds(settings), table(12, correlated(p)), PROMPTS)[0].pools)
    # Right answers are short, so arrival order fills pools with them first: p̂ is pushed up by many errors.
    assert z_score(wrong["pass_rate"], reference["pass_rate"]) > 10.0
    assert z_score(wrong["mean_reward"], reference["mean_reward"]) > 10.0


# ---------------------------------------------------------------------------------------------------------------
# Aborts, discards and misuse
# ---------------------------------------------------------------------------------------------------------------


def test_exit_aborts_running_draws_and_drops_waiting_ones():
    settings = SamplerSettings(sampler="seq_pos", num_generations=2, round_size=4, max_rounds=2)
    step = build_sampler(settings).begin_continuous(1)
    assert not step.done
    assert step.to_submit() == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert step.to_submit() == []  # each pair once
    # Draw 2 (right) returns first: it waits for draws 0 and 1, and nothing new is submitted.
    assert step.complete(0, 2, 1.0) == []
    assert step.to_submit() == [] and step.in_flight == 3
    assert step.complete(0, 0, 0.0) == []  # admitted: pool [0.0], one more draw outstanding wanted -> top up
    assert step.to_submit() == [(0, 4)]
    # Draw 1 (right) admits the pool [0, 1]: the exit rule holds. Draw 2 waited and is dropped; 3 and 4 are aborted.
    assert step.complete(0, 1, 1.0) == [(0, 3), (0, 4)]
    assert step.done and step.in_flight == 0 and step.step.pools == [[0.0, 1.0]]
    stats = step.stats
    assert (stats.submitted, stats.admitted, stats.finished_but_discarded, stats.aborted) == (5, 2, 1, 2)
    with pytest.raises(ValueError, match="aborted"):
        step.complete(0, 3, 1.0)
    step.discard(0, 3)  # its result arrived anyway
    step.discard(0, 4)  # the engine confirms the abort
    with pytest.raises(ValueError, match="not in flight"):
        step.complete(0, 2, 1.0)  # already completed (and dropped)
    with pytest.raises(ValueError, match="not aborted"):
        step.discard(0, 1)
    selection = step.finish()
    assert selection.pools == ((0.0, 1.0),) and selection.prompts[0].kept == (0, 1)
    assert selection.metrics["continuous/wasted_share"] == 3 / 5
    with pytest.raises(RuntimeError, match="finished"):
        step.to_submit()


def test_unknown_draws_and_early_finish_raise():
    step = build_sampler(SamplerSettings(sampler="seq_balance")).begin_continuous(2)
    with pytest.raises(RuntimeError, match="in flight"):
        step.finish()
    with pytest.raises(ValueError, match="not in flight"):
        step.complete(0, 0, 1.0)  # not submitted yet
    step.to_submit()
    with pytest.raises(ValueError, match="not in flight"):
        step.complete(0, 99, 1.0)
    with pytest.raises(ValueError, match="unknown prompt"):
        step.complete(2, 0, 1.0)
    step.complete(0, 0, 1.0)
    with pytest.raises(ValueError, match="not in flight"):
        step.complete(0, 0, 1.0)  # twice


@pytest.mark.parametrize("name", ["uniform", "dapo", "est"])
def test_samplers_without_an_exit_rule_are_rejected(name):
    sampler = build_sampler(SamplerSettings(sampler=name))
    with pytest.raises(ValueError, match="sampler='seq_pos' or sampler='seq_balance'"):
        sampler.begin_continuous(2, ["a", "b"])
    with pytest.raises(ValueError, match="sampler='seq_pos' or sampler='seq_balance'"):
        ContinuousStep(sampler, 2, ["a", "b"])


# ---------------------------------------------------------------------------------------------------------------
# Cap, quotas, in-flight targets
# ---------------------------------------------------------------------------------------------------------------


def test_cap_bounds_submissions_and_an_unmixed_prompt_uses_all_of_it():
    settings = SamplerSettings(sampler="seq_pos", num_generations=4, round_size=8, max_rounds=3)
    always_wrong = table(1, lambda rng: (0.0, False, rng.expovariate(1.0)))
    selection, step, engine = run_continuous(settings, always_wrong, 5)
    assert [len(pool) for pool in selection.pools] == [24] * 5
    assert step.stats.submitted == step.stats.admitted == 5 * 24 and step.stats.aborted == 0
    assert engine.max_in_flight == 5 * 8  # fixed: round_size in flight per prompt


def test_quotas_decide_the_exit_draw_by_draw():
    settings = SamplerSettings(sampler="seq_balance", num_generations=4, positive_quota=3, negative_quota=1)
    sequences = [[1, 1, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]]
    outcome = table(0, lambda rng: (0.0, False, rng.random()))  # lengths only; rewards from `sequences`

    def scripted(prompt: int, draw: int) -> Draw:
        rewards = sequences[prompt]
        return (float(rewards[draw]) if draw < len(rewards) else 0.0), False, outcome(prompt, draw)[2]

    selection, _, _ = run_continuous(settings, scripted, 3)
    # The first prefix with >= 3 positives, >= 1 negative and >= n = 4 draws.
    assert [len(pool) for pool in selection.pools] == [4, 6, 5]


def test_in_flight_targets_follow_the_round_policy():
    base = SamplerSettings(sampler="seq_pos", num_generations=4, round_size=8, max_rounds=4)
    fixed = build_sampler(base).begin_continuous(1)
    assert len(fixed.to_submit()) == 8
    fixed.complete(0, 0, 1.0)
    assert fixed.in_flight_target(0) == 8 and fixed.to_submit() == [(0, 8)]  # kept topped up at round_size

    predictive = build_sampler(replace(base, round_policy="predictive")).begin_continuous(1)
    assert len(predictive.to_submit()) == 8  # nothing admitted: nothing to predict from
    predictive.complete(0, 0, 1.0)
    # The quota is met; the pool still needs n - 1 = 3 draws, and 7 are outstanding: nothing more is submitted.
    assert predictive.in_flight_target(0) == 3 and predictive.to_submit() == []

    tracked = build_sampler(replace(base, round_policy="tracked")).begin_continuous(1, ["x"])
    expected = rules.predictive_request(1, 0, 1.0, 1.0, base.round_confidence, 4, 32)
    assert len(tracked.to_submit()) == tracked.in_flight_target(0) == expected < 8


def test_predictive_targets_over_provision_less_than_fixed_on_easy_prompts():
    # Easy prompts under seq_pos: once the positive is in, the predictive target is just what the group still
    # needs, where fixed keeps round_size in flight. (On hard prompts the predictive request can exceed round_size:
    # it buys fewer sequential waits with more draws, as it buys fewer rounds in the rounds path.)
    base = SamplerSettings(sampler="seq_pos", num_generations=4, round_size=8, max_rounds=4)
    outcome = table(21, correlated(0.8))
    keys = list(range(300))
    fixed, fixed_step, _ = run_continuous(base, outcome, 300, keys)
    for policy in ("predictive", "tracked"):
        selection, step, _ = run_continuous(replace(base, round_policy=policy), outcome, 300, keys)
        assert selection.pools == fixed.pools  # the policy changes the cost, never the pools
        assert step.stats.admitted == fixed_step.stats.admitted
        assert step.stats.submitted < 0.9 * fixed_step.stats.submitted, policy
    assert step.stats.submitted < 0.5 * fixed_step.stats.submitted  # tracked: no blind first round of 8
