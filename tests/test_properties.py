"""
Property-based tests (hypothesis) of the sampler rules. Pure Python: no model, no torch.

Every expected value is re-derived here from SPEC.md (and, for `uniform`, from TRL's `GRPOTrainer` advantage code),
never computed by calling the function under test. The properties:

- exit rule and quotas: a pool stops at the first round boundary where `#pos >= K_pos`, `#neg >= K_neg` and the pool
  holds at least `n`, or at the cap; quota defaults; rounds, per-prompt rounds and active counts follow;
- balanced downsampling: sizes, sides and top-up in closed form; `random` mode; determinism; mixed pools stay mixed;
- advantages `w * (r - pool mean)` (optionally `/ (std + 1e-4)`) with the objective's clipped, normalised weight;
- `est` budgets: exact totals, bounds, floor or ceiling of the water-filled target, monotone in the score and p̂;
- the tracker's decayed Beta estimate in closed form;
- `uniform` reproduces GRPO's advantages (TRL's formula written out below);
- the sampler state survives the JSON round trip of `ada_sampler_state.json` with identical later decisions.

CI runs a fixed, derandomized profile (same examples every run). For a deeper local search with fresh random examples
set `TRL_ADA_PROPERTY_EXPLORE=<factor>` (e.g. 20): every test then runs `factor` times its examples, not derandomized.
"""

import json
import math
import os
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trl_ada.samplers import SamplerSettings, build_sampler, rules
from trl_ada.samplers.signal import trl_advantages_stand_in
from trl_ada.samplers.tracker import DecayedBetaTracker

NAN = math.nan
STD_EPSILON = 1e-4  # TRL's GRPOTrainer: advantages / (std + 1e-4)

_EXPLORE = int(os.environ.get("TRL_ADA_PROPERTY_EXPLORE", "0") or 0)
_BASE = settings(
    deadline=None,
    derandomize=not _EXPLORE,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def examples(count: int) -> settings:
    """The CI profile with `count` examples (times `TRL_ADA_PROPERTY_EXPLORE` in an exploring run)."""
    return settings(_BASE, max_examples=count * max(_EXPLORE, 1))


# ---------------------------------------------------------------------------------------------------------------------
# Strategies and independent re-derivations of the rules
# ---------------------------------------------------------------------------------------------------------------------

# Rewards need not be binary (SPEC: "the pool mean is always the mean of the raw rewards"); NaN is unscorable.
REWARD = st.one_of(
    st.sampled_from([0.0, 1.0]),
    st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, NAN]),
    st.floats(-2.0, 2.0, allow_nan=False),
)
THRESHOLD = st.sampled_from([0.5, 0.0, 0.7, -0.5])


@st.composite
def reward_sequence(draw, length: int) -> list[float]:
    """One prompt's draws in order: constant, Bernoulli with some pass rate, or arbitrary rewards."""
    kind = draw(st.sampled_from(["bernoulli", "any", "constant"]))
    if kind == "constant":
        return [draw(st.sampled_from([0.0, 1.0]))] * length
    if kind == "bernoulli":
        rate = draw(st.sampled_from([0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98]))
        rng = random.Random(draw(st.integers(0, 2**16)))
        return [float(rng.random() < rate) for _ in range(length)]
    return draw(st.lists(REWARD, min_size=length, max_size=length))


def side(reward: float, masked: bool, threshold: float) -> str:
    """SPEC: positive means `reward > threshold`; unscorable (NaN) and masked completions are on neither side."""
    if masked or math.isnan(reward):
        return "neither"
    return "pos" if reward > threshold else "neg"


def outcome_counts(rewards, masks, threshold) -> tuple[int, int]:
    sides = [side(r, m, threshold) for r, m in zip(rewards, masks, strict=True)]
    return sides.count("pos"), sides.count("neg")


def expected_kept_sides(size: int, positives: int, negatives: int) -> tuple[int, int, int]:
    """
    SPEC step 4 in closed form: `min(n/2, #pos)` positives and the rest negatives, topping up from the other side when
    one side is short (`n // 2` positives for an odd `n`), the unscorable/masked last. Returns (pos, neg, neither).
    """
    kept_pos = min(positives, max(size // 2, size - negatives))
    kept_neg = min(negatives, max(size - size // 2, size - positives))
    return kept_pos, kept_neg, max(0, size - positives - negatives)


def round_requests(rewards, flags, n, m, max_rounds, k_pos, k_neg, threshold) -> list[int]:
    """
    One prompt's requests, round by round, under fixed rounds of M (SPEC, Algorithm 2): before each round t <= R the
    prompt retires when its pool holds at least n with #pos >= K_pos and #neg >= K_neg, or holds the cap R*M; else it
    asks for M. One refinement of the working tree (base.py `demand`): a non-empty pool none of whose draws was scored
    (every reward NaN) only tops up to n, since further draws are no more likely to be scored.
    """
    cap, size, requests = m * max_rounds, 0, []
    while len(requests) < max_rounds and size < cap:
        positives, negatives = outcome_counts(rewards[:size], flags[:size], threshold)
        if size >= n and positives >= k_pos and negatives >= k_neg:
            break
        if size and all(math.isnan(x) for x in rewards[:size]):
            request = min(max(n - size, 0), cap - size)
        else:
            request = min(m, cap - size)
        if request == 0:
            break
        requests.append(request)
        size += request
    return requests


def scorable(values):
    return [v for v in values if not math.isnan(v)]


def sample_std(values) -> float:
    """Unbiased std (torch.std, TRL's nanstd) of the scorable values; NaN with fewer than two."""
    values = scorable(values)
    if len(values) < 2:
        return NAN
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def drive(sampler, draws, masks=None, keys=None):
    """
    Run one step, handing prompt `i` its next draws from `draws[i]` in order. Returns the selection and the rounds'
    requests.
    """
    step = sampler.begin(len(draws), keys)
    history = []
    while requests := step.requests():
        history.append(requests)
        rewards, flags = [], []
        for index, count in requests:
            start = len(step.pools[index])
            assert start + count <= len(draws[index]), "a prompt asked for more draws than its cap"
            rewards.extend(draws[index][start : start + count])
            if masks is not None:
                flags.extend(masks[index][start : start + count])
        step.observe(requests, rewards, flags if masks is not None else None)
    return step.finish(), history


# ---------------------------------------------------------------------------------------------------------------------
# Exit rule and quotas
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def sequential_case(draw):
    sampler = draw(st.sampled_from(["seq_pos", "seq_balance"]))
    n = draw(st.integers(2, 6))
    round_size = draw(st.integers(1, 8))
    fewest_rounds = -(-n // round_size)  # the cap must hold an update group
    max_rounds = draw(st.integers(fewest_rounds, fewest_rounds + 3))
    cap = round_size * max_rounds
    positive_quota = negative_quota = None
    if draw(st.booleans()):
        if sampler == "seq_pos":
            positive_quota = draw(st.integers(1, cap))
        else:
            positive_quota = draw(st.integers(1, cap - 1))
            negative_quota = draw(st.integers(1, cap - positive_quota))
    num_prompts = draw(st.integers(1, 5))
    draws = [draw(reward_sequence(cap)) for _ in range(num_prompts)]
    masks = None
    if draw(st.booleans()):
        masks = [
            draw(st.lists(st.sampled_from([False, False, False, True]), min_size=cap, max_size=cap)) for _ in draws
        ]
    config = SamplerSettings(
        scale_rewards="none",
        sampler=sampler,
        num_generations=n,
        round_size=round_size,
        max_rounds=max_rounds,
        positive_quota=positive_quota,
        negative_quota=negative_quota,
        positive_threshold=draw(THRESHOLD),
        seed=draw(st.integers(0, 1000)),
    )
    return config, draws, masks


@examples(150)
@given(sequential_case())
def test_sequential_pools_stop_at_the_first_round_boundary_where_the_exit_rule_holds(case):
    """
    Property (SPEC, Algorithm 2 with fixed rounds of M): with quotas K_pos/K_neg (defaults: seq_pos 1/0, seq_balance
    floor(n/2)/ceil(n/2), what a balanced group takes), prompt x's pool is its first t*M draws for the smallest round t
    <= R after which #pos >= K_pos, #neg >= K_neg and the pool holds at least n (masked and unscorable count on neither
    side), else its first R*M draws (see `round_requests` for the one refinement: pools of unscored draws only). Each
    round asks every active prompt for M, ascending; rounds_per_prompt, the step's rounds and the prompts active after
    each round follow; every kept group has n completions whose sides follow the balanced rule.
    """
    config, draws, masks = case
    n, m, r, threshold = config.num_generations, config.round_size, config.max_rounds, config.positive_threshold
    masks_or_none = masks if masks is not None else [[False] * len(d) for d in draws]
    if config.sampler == "seq_pos":
        k_pos = 1 if config.positive_quota is None else config.positive_quota
        k_neg = 0
    else:
        k_pos = n // 2 if config.positive_quota is None else config.positive_quota
        k_neg = n - n // 2 if config.negative_quota is None else config.negative_quota

    expected_requests = [
        round_requests(rewards, flags, n, m, r, k_pos, k_neg, threshold)
        for rewards, flags in zip(draws, masks_or_none, strict=True)
    ]
    expected_sizes = [sum(requests) for requests in expected_requests]

    sampler = build_sampler(config)
    assert (sampler.options.positive_quota, sampler.options.negative_quota) == (k_pos, k_neg)
    selection, history = drive(sampler, draws, masks)

    assert [len(pool) for pool in selection.pools] == expected_sizes
    for pool, rewards in zip(selection.pools, draws, strict=True):  # the pool is the first draws, in draw order
        assert list(pool) == pytest.approx(rewards[: len(pool)], nan_ok=True)
    assert list(selection.rounds_per_prompt) == [len(requests) for requests in expected_requests]
    assert selection.rounds == len(history) == max(len(requests) for requests in expected_requests)
    assert list(selection.active_after_round) == [
        sum(len(requests) > t for requests in expected_requests) for t in range(1, selection.rounds + 1)
    ]
    for t, requests in enumerate(history):  # round t asks each prompt still active its request, ascending by prompt
        assert requests == [(i, e[t]) for i, e in enumerate(expected_requests) if len(e) > t]

    for pool, flags, result in zip(selection.pools, masks_or_none, selection.prompts, strict=True):
        kept = list(result.kept)
        assert kept == sorted(set(kept)) and len(kept) == n and all(0 <= i < len(pool) for i in kept)
        positives, negatives = outcome_counts(pool, flags[: len(pool)], threshold)
        sides = [side(pool[i], flags[i], threshold) for i in kept]
        assert (sides.count("pos"), sides.count("neg"), sides.count("neither")) == expected_kept_sides(
            n, positives, negatives
        )


@examples(60)
@given(
    sampler=st.sampled_from(["seq_pos", "seq_balance"]),
    round_size=st.integers(2, 8),
    max_rounds=st.integers(1, 4),
    excess=st.integers(1, 5),
    data=st.data(),
)
def test_quotas_beyond_the_cap_are_rejected(sampler, round_size, max_rounds, excess, data):
    """
    Property: quotas that no pool within the cap R*M can meet (K_pos + K_neg > R*M) are rejected with a `ValueError`
    instead of silently drawing the whole cap for every prompt.
    """
    needed = round_size * max_rounds + excess
    positive_quota = needed if sampler == "seq_pos" else data.draw(st.integers(1, needed - 1))
    config = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler=sampler,
        num_generations=2,
        round_size=round_size,
        max_rounds=max_rounds,
        positive_quota=positive_quota,
        negative_quota=None if sampler == "seq_pos" else needed - positive_quota,
    )
    with pytest.raises(ValueError, match="quota"):
        config.validated()


@examples(60)
@given(
    case=sequential_case(),
    policy=st.sampled_from(["predictive", "tracked"]),
    confidence=st.sampled_from([0.3, 0.7, 0.95]),
)
def test_any_round_policy_evaluates_the_exit_rule_only_at_its_round_boundaries(case, policy, confidence):
    """
    Property (SPEC: rounds are one schedule; the exit rule is evaluated where rounds evaluate it): whatever the round
    policy sizes the rounds to, a prompt's pool is its first draws, never exceeds the cap R*M, did not satisfy the
    exit rule after any earlier round of its own, and at the end either satisfies it or is at the cap (or, unscored
    throughout, holds its update group: see `round_requests`). The predictive
    policy's first request is M (nothing to predict from yet). Checked over two steps so the tracker has history.
    """
    config, draws, masks = case
    config = replace(config, round_policy=policy, round_confidence=confidence)
    n, cap, threshold = config.num_generations, config.round_size * config.max_rounds, config.positive_threshold
    masks_or_none = masks if masks is not None else [[False] * len(d) for d in draws]
    sampler = build_sampler(config)
    k_pos, k_neg = sampler.options.positive_quota, sampler.options.negative_quota

    def exited(index: int, size: int) -> bool:
        positives, negatives = outcome_counts(draws[index][:size], masks_or_none[index][:size], threshold)
        return size >= n and positives >= k_pos and negatives >= k_neg

    keys = list(range(len(draws)))
    for _ in range(2):
        selection, history = drive(sampler, draws, masks, keys)
        assert len(history) <= config.max_rounds
        boundaries = [[] for _ in draws]  # each prompt's pool size after each of its rounds
        sizes = [0] * len(draws)
        for requests in history:
            for index, count in requests:
                assert count >= 1
                sizes[index] += count
                boundaries[index].append(sizes[index])
        if policy == "predictive":
            assert history[0] == [(index, min(config.round_size, cap)) for index in keys]
        for index, pool in enumerate(selection.pools):
            assert len(pool) == sizes[index] <= cap
            assert list(pool) == pytest.approx(draws[index][: len(pool)], nan_ok=True)
            assert not any(exited(index, size) for size in boundaries[index][:-1])
            unscored = all(math.isnan(x) for x in pool)  # see round_requests: such a pool only tops up to n
            assert exited(index, len(pool)) or len(pool) == cap or (unscored and len(pool) >= n)
            assert len(selection.prompts[index].kept) == n


# ---------------------------------------------------------------------------------------------------------------------
# Balanced downsampling
# ---------------------------------------------------------------------------------------------------------------------


@st.composite
def downsample_case(draw):
    rewards = draw(st.lists(REWARD, min_size=1, max_size=40))
    size = draw(st.integers(1, len(rewards)))
    excluded = draw(st.sets(st.integers(0, len(rewards) - 1), max_size=len(rewards)) | st.just(set()))
    return rewards, size, excluded, draw(THRESHOLD), draw(st.integers(0, 2**32 - 1))


@examples(300)
@given(downsample_case())
def test_balanced_downsample_sizes_sides_and_top_up(case):
    """
    Property (SPEC step 4): the kept group is `size` distinct pool indices in draw order holding min(size/2, #pos)
    positives and the rest negatives, topped up from the other side when one side is short; unscorable and excluded
    (masked) completions only when both sides are exhausted. A pool with both outcomes keeps both (size >= 2), and the
    same generator seed gives the same group (every process seeds it identically).
    """
    rewards, size, excluded, threshold, seed = case
    kept = rules.downsample(rewards, size, "balanced", threshold, random.Random(seed), excluded=excluded)
    assert kept == sorted(set(kept)) and len(kept) == size and all(0 <= i < len(rewards) for i in kept)

    flags = [i in excluded for i in range(len(rewards))]
    positives, negatives = outcome_counts(rewards, flags, threshold)
    sides = [side(rewards[i], flags[i], threshold) for i in kept]
    kept_sides = (sides.count("pos"), sides.count("neg"), sides.count("neither"))
    assert kept_sides == expected_kept_sides(size, positives, negatives)
    if size >= 2 and positives and negatives:
        assert kept_sides[0] >= 1 and kept_sides[1] >= 1
    assert rules.downsample(rewards, size, "balanced", threshold, random.Random(seed), excluded=excluded) == kept


@examples(150)
@given(downsample_case())
def test_random_downsample_keeps_excluded_completions_only_to_fill_the_group(case):
    """
    Property: `downsample="random"` keeps `size` distinct indices in draw order, and an excluded (masked) completion
    only when the others cannot fill the group: exactly max(0, size - #others) of them.
    """
    rewards, size, excluded, threshold, seed = case
    kept = rules.downsample(rewards, size, "random", threshold, random.Random(seed), excluded=excluded)
    assert kept == sorted(set(kept)) and len(kept) == size and all(0 <= i < len(rewards) for i in kept)
    others = len(rewards) - len(excluded)
    assert len(set(kept) & excluded) == max(0, size - others)


# ---------------------------------------------------------------------------------------------------------------------
# Baselines, scales, weights and advantages of a sequential step
# ---------------------------------------------------------------------------------------------------------------------


@examples(100)
@given(
    case=sequential_case(),
    scale=st.sampled_from(["none", "group", "batch"]),
    objective=st.sampled_from(["linear", "log", "power"]),
    power_alpha=st.sampled_from([0.25, 0.5, 1.0]),
    max_weight=st.sampled_from([2.0, 10.0]),
    normalize=st.booleans(),
)
def test_advantages_are_the_weighted_centred_rewards_of_spec_step_5(
    case, scale, objective, power_alpha, max_weight, normalize
):
    """
    Property (SPEC step 5, pool baseline): A_i = w_x * (r_i - mean(S_x)), divided by (std + 1e-4) of the pool
    (`group`) or of every kept reward (`batch`); the baseline is the mean of the pool's raw scorable rewards; w_x is
    linear 1, log 1/p̂, power alpha p̂^(alpha-1), clipped at max_weight, then (when normalising) divided by its mean over
    the prompts with a signal. A prompt whose pool rewards are constant has no signal and all-zero advantages.
    Binary rewards, so p̂ (share of positives) is the pool mean.
    """
    config, draws, _ = case
    draws = [[1.0 if (r > 0.5) else 0.0 for r in seq] for seq in draws]  # binary: p̂ is the pool mean
    config = replace(
        config,
        positive_threshold=0.5,
        scale_rewards=scale,
        objective=objective,
        power_alpha=power_alpha if objective == "power" else SamplerSettings.power_alpha,
        max_weight=max_weight,
        normalize_weights=normalize,
    )
    selection, _ = drive(build_sampler(config), draws)
    kept_rewards = [[pool[i] for i in r.kept] for pool, r in zip(selection.pools, selection.prompts, strict=True)]
    batch_std = sample_std([x for group in kept_rewards for x in group])

    def raw_weight(p: float) -> float:
        if objective == "linear":
            return 1.0
        if p == 0.0:
            return max_weight
        return min(1.0 / p if objective == "log" else power_alpha * p ** (power_alpha - 1.0), max_weight)

    means = [sum(pool) / len(pool) for pool in selection.pools]
    signal = [min(pool) != max(pool) for pool in selection.pools]
    weights = [raw_weight(p) for p in means]
    if normalize and any(signal):
        mean_weight = sum(w for w, s in zip(weights, signal, strict=True) if s) / sum(signal)
        weights = [w / mean_weight for w in weights]

    for pool, result, kept, mean, weight, useful in zip(
        selection.pools, selection.prompts, kept_rewards, means, weights, signal, strict=True
    ):
        assert result.baseline == pytest.approx(mean)
        assert result.pass_rate == pytest.approx(mean)
        assert result.has_signal == useful
        assert result.weight == pytest.approx(weight)
        std = {"none": None, "group": sample_std(pool), "batch": batch_std}[scale]
        std = 0.0 if std is not None and math.isnan(std) else std
        expected = [
            (weight * (x - mean) / (1.0 if std is None else std + STD_EPSILON)) if useful else 0.0 for x in kept
        ]
        assert list(result.advantages) == pytest.approx(expected, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------------------------
# Est budgets
# ---------------------------------------------------------------------------------------------------------------------


def water_filled_targets(scores, total, low, high):
    """SPEC/Algorithm 1: targets clip(c * score, low, high) with the scale c found so that they sum to the total."""

    def used(c):
        return sum(min(max(c * s, low), high) for s in scores)

    lo, hi = 0.0, 1.0
    while used(hi) < total:
        hi *= 2.0
    while hi - lo > 1e-13 * hi:
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if used(mid) < total else (lo, mid)
    return [min(max(hi * s, low), high) for s in scores]


def assert_largest_remainder_rounding(budgets, targets):
    """Each budget is its target rounded down or up, and no target rounded down had a larger remainder than one up."""
    assert all(abs(b - t) < 1.0 + 1e-6 for b, t in zip(budgets, targets, strict=True))
    up = [1.0 - (b - t) for b, t in zip(budgets, targets, strict=True) if b > t + 1e-6]  # remainders rounded up
    down = [t - b for b, t in zip(budgets, targets, strict=True) if b < t - 1e-6]  # remainders rounded down
    if up and down:
        assert min(up) >= max(down) - 1e-6


@st.composite
def allocation_case(draw):
    scores = draw(st.lists(st.floats(0.01, 100.0), min_size=1, max_size=40))
    low = draw(st.integers(0, 5))
    high = low + draw(st.integers(0, 40))
    total = draw(st.integers(len(scores) * low, len(scores) * high))
    return scores, total, low, high


@examples(200)
@given(allocation_case())
def test_budgets_sum_exactly_stay_in_bounds_and_round_the_water_filled_target(case):
    """
    Property (SPEC est): budgets are integers in [N_min, N_max] summing to N_total exactly; each is the floor or
    ceiling of its water-filled target clip(c * score, N_min, N_max), by largest remainder; and a higher score never
    gets a smaller budget.
    """
    scores, total, low, high = case
    budgets = rules.allocate_budget(scores, total, low, high)
    assert all(isinstance(b, int) and low <= b <= high for b in budgets)
    assert sum(budgets) == total
    assert_largest_remainder_rounding(budgets, water_filled_targets(scores, total, low, high))
    for i, j in ((i, j) for i in range(len(scores)) for j in range(len(scores))):
        if scores[i] > scores[j]:
            assert budgets[i] >= budgets[j]


@examples(50)
@given(allocation_case(), st.sampled_from([-1, 1]))
def test_infeasible_totals_are_rejected(case, direction):
    """Property: a total outside [B * N_min, B * N_max] cannot be met within the bounds and raises `ValueError`."""
    scores, _, low, high = case
    total = len(scores) * low - 1 if direction < 0 else len(scores) * high + 1
    if total < 0:
        total = len(scores) * high + 1
    with pytest.raises(ValueError):
        rules.allocate_budget(scores, total, low, high)


class FixedEstimator:
    """A pass-rate estimator (the `PassRateEstimator` protocol) that reads given p̂ and records its updates."""

    def __init__(self, rates):
        self.rates = dict(rates)
        self.updates = []

    def estimate(self, keys):
        return [self.rates[key] for key in keys]

    def update(self, keys, totals, positives):
        self.updates.append((list(keys), list(totals), list(positives)))

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


@st.composite
def est_case(draw):
    n = draw(st.integers(2, 6))
    train_on = draw(st.sampled_from(["all", "downsample"]))
    if train_on == "all":
        low = draw(st.integers(2, n))
        high = draw(st.integers(n, 4 * n))
        mean = None  # must be n: TRL's batch holds B * n rows
    else:
        low = draw(st.integers(n, n + 4))
        high = draw(st.integers(low, low + 20))
        mean = draw(st.integers(10 * low, 10 * high)) / 10
    num_prompts = draw(st.integers(1, 12))
    rates = draw(st.lists(st.floats(0.001, 0.999), min_size=num_prompts, max_size=num_prompts))
    config = SamplerSettings(
        scale_rewards="none",
        sampler="est",
        num_generations=n,
        est_train_on=train_on,
        est_min_samples=low,
        est_max_samples=high,
        est_mean_samples=mean,
        est_sample_power=draw(st.sampled_from([0.25, 0.5, 1.0])),
        max_weight=draw(st.sampled_from([3.0, 10.0])),
        seed=draw(st.integers(0, 1000)),
    )
    pools = [draw(reward_sequence(high)) for _ in range(num_prompts)]
    pools = [[1.0 if r > 0.5 else 0.0 for r in pool] for pool in pools]  # binary: p̂ of the pool is its mean
    return config, rates, pools


@examples(150)
@given(est_case())
def test_est_budgets_exact_total_bounds_and_monotone_in_pass_rate(case):
    """
    Property (SPEC est, Algorithm 1): one round; prompt x draws N_x in [N_min, N_max]; the N_x sum to
    N_total = B * est_mean_samples (n with est_train_on='all') up to rounding, exactly an integer within 0.5; N_x is the
    largest-remainder rounding of the water-filled target ∝ p̂_x^-s, so a harder prompt (lower p̂) never draws fewer.
    Training on 'all' keeps every draw, 'downsample' keeps n; advantages are w_x * (r - pool mean) with the residual
    weight w_x = (p̄_x + eps)^-(1-s) from the step's own pool, clipped, normalised over the prompts with a signal; the
    estimator is updated once with each pool's size and positives.
    """
    config, rates, pools = case
    keys = [f"prompt-{i}" for i in range(len(rates))]
    estimator = FixedEstimator(zip(keys, rates, strict=True))
    sampler = build_sampler(config, estimator)
    n, s = config.num_generations, config.est_sample_power
    low, high = config.est_min_samples, config.est_max_samples
    mean_samples = n if config.est_train_on == "all" else config.est_mean_samples

    selection, history = drive(sampler, pools, keys=keys)
    budgets = [len(pool) for pool in selection.pools]
    assert len(history) == 1 and history[0] == list(enumerate(budgets))
    assert all(low <= b <= high for b in budgets)
    assert abs(sum(budgets) - len(rates) * mean_samples) <= 0.5
    if config.est_train_on == "all":
        assert sum(budgets) == len(rates) * n
    total = sum(budgets)
    # N ∝ p̂^-s as est.py and AdaGRPOConfig document it (SPEC/the paper's Algorithm 1 write 1/sqrt(p̂ + eps): see the
    # report of issue 21 item 18; the monotonicity below holds either way).
    assert_largest_remainder_rounding(budgets, water_filled_targets([p**-s for p in rates], total, low, high))
    for i in range(len(rates)):
        for j in range(len(rates)):
            if rates[i] < rates[j]:
                assert budgets[i] >= budgets[j]

    means = [sum(pool) / len(pool) for pool in selection.pools]
    signal = [min(pool) != max(pool) for pool in selection.pools]
    weights = [min((p + config.est_epsilon) ** -(1.0 - s), config.max_weight) for p in means]
    if any(signal):
        mean_weight = sum(w for w, useful in zip(weights, signal, strict=True) if useful) / sum(signal)
        weights = [w / mean_weight for w in weights]
    for pool, result, mean, weight, useful in zip(
        selection.pools, selection.prompts, means, weights, signal, strict=True
    ):
        if config.est_train_on == "all":
            assert result.kept == tuple(range(len(pool)))
        else:
            assert len(result.kept) == n
        assert result.weight == pytest.approx(weight)
        expected = [weight * (pool[i] - mean) if useful else 0.0 for i in result.kept]
        assert list(result.advantages) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert estimator.updates == [(keys, budgets, [int(sum(pool)) for pool in selection.pools])]


@examples(100)
@given(
    decay=st.floats(0.05, 1.0),
    alpha=st.floats(0.01, 5.0),
    beta=st.floats(0.01, 5.0),
    visits=st.lists(
        st.tuples(st.sampled_from(["a", "b", 3]), st.integers(0, 64), st.floats(0.0, 1.0)), min_size=0, max_size=20
    ),
)
def test_tracker_is_the_decayed_beta_estimate(decay, alpha, beta, visits):
    """
    Property (SPEC est): after visits (n_t, k_t) of a key, N = sum_t λ^(T-t) n_t and K = sum_t λ^(T-t) k_t over that
    key's own visits, and p̂ = (K + α) / (N + α + β), strictly inside (0, 1); other keys' visits do not touch it.
    """
    tracker = DecayedBetaTracker(decay, alpha, beta)
    history: dict = {}
    for key, total, share in visits:
        hits = round(total * share)
        tracker.update([key], [total], [hits])
        history.setdefault(key, []).append((total, hits))
    keys = ["a", "b", 3, "never-seen"]
    for key, estimate in zip(keys, tracker.estimate(keys), strict=True):
        seen = history.get(key, [])
        big_n = sum(decay ** (len(seen) - 1 - t) * total for t, (total, _) in enumerate(seen))
        big_k = sum(decay ** (len(seen) - 1 - t) * hits for t, (_, hits) in enumerate(seen))
        assert estimate == pytest.approx((big_k + alpha) / (big_n + alpha + beta), rel=1e-9)
        assert 0.0 < estimate < 1.0


# ---------------------------------------------------------------------------------------------------------------------
# uniform is GRPO
# ---------------------------------------------------------------------------------------------------------------------


def grpo_advantages(groups, scale_rewards):
    """
    TRL's GRPOTrainer (`_generate_and_score_completions`, sum_then_normalize), written out: the baseline is the group's
    nanmean; with scale_rewards 'group' divide by the group's nanstd (Bessel-corrected, NaN below two values) + 1e-4,
    with 'batch' by the nanstd of every reward of the batch + 1e-4, with 'none' not at all; NaN advantages become 0.
    """
    batch_std = sample_std([r for group in groups for r in group])
    advantages = []
    for group in groups:
        values = scorable(group)
        mean = sum(values) / len(values) if values else NAN
        std = sample_std(group) if scale_rewards == "group" else batch_std
        for reward in group:
            advantage = reward - mean
            if scale_rewards != "none":
                advantage = advantage / (std + STD_EPSILON)
            advantages.append(0.0 if math.isnan(advantage) else advantage)
    return advantages


@st.composite
def grpo_case(draw, reward):
    n = draw(st.integers(2, 8))
    num_prompts = draw(st.integers(1, 6))
    groups = [draw(st.lists(reward, min_size=n, max_size=n)) for _ in range(num_prompts)]
    return n, groups, draw(st.sampled_from(["group", "batch", "none"])), draw(st.sampled_from(["pool", "group"]))


def uniform_advantages(n, groups, scale, baseline, tolerance):
    config = SamplerSettings(
        seed=0,
        sampler="uniform",
        num_generations=n,
        scale_rewards=scale,
        baseline=baseline,
        zero_variance_tolerance=tolerance,
    )
    selection, history = drive(build_sampler(config), groups)
    assert history == [[(index, n) for index in range(len(groups))]]  # one round of n per prompt
    assert all(result.kept == tuple(range(n)) for result in selection.prompts)
    kept_rewards = [result.kept_rewards(pool) for result, pool in zip(selection.prompts, selection.pools)]
    advantages = [result.advantages for result in selection.prompts]
    # The one decision of what TRL trains lets TRL's own advantages stand in for these: they are GRPO's.
    assert trl_advantages_stand_in(config.validated(), "downsample", kept_rewards, advantages)
    return [a for result in selection.prompts for a in result.advantages]


@examples(200)
@given(grpo_case(st.one_of(st.floats(-10.0, 10.0, allow_nan=False), st.sampled_from([0.0, 1.0, NAN]), st.just(0.1))))
def test_uniform_advantages_are_grpo_advantages(case):
    """
    Property (SPEC: uniform must reproduce GRPOTrainer): with `zero_variance_tolerance=0` (no numerical
    zero-variance cut), uniform keeps all n draws of each prompt and its advantages equal TRL's GRPO advantages for
    any rewards (unscorable ones included), every scale_rewards and either baseline (the pool is the group).
    """
    n, groups, scale, baseline = case
    ours = uniform_advantages(n, groups, scale, baseline, tolerance=0.0)
    assert ours == pytest.approx(grpo_advantages(groups, scale), rel=1e-9, abs=1e-9)


@examples(100)
@given(grpo_case(st.one_of(st.integers(-8, 16).map(lambda k: k / 8), st.just(NAN))))
def test_uniform_with_the_default_tolerance_is_grpo_on_rewards_that_vary_or_not(case):
    """
    Property: with the default `zero_variance_tolerance` the same holds whenever a group's rewards are either constant
    or spread beyond the tolerance (here: multiples of 1/8), so the zero-variance cut only ever zeroes what GRPO
    zeroes.
    """
    n, groups, scale, baseline = case
    ours = uniform_advantages(
        n,
        groups,
        scale,
        baseline,
        tolerance=SamplerSettings(num_generations=4, scale_rewards="none", seed=0).zero_variance_tolerance,
    )
    assert ours == pytest.approx(grpo_advantages(groups, scale), rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------------------------
# State round trip through the checkpoint's JSON
# ---------------------------------------------------------------------------------------------------------------------


STATEFUL_CONFIGS = {
    "seq_balance": dict(sampler="seq_balance", num_generations=4, round_size=4, max_rounds=3),
    "seq_pos_tracked": dict(
        sampler="seq_pos", num_generations=3, round_size=2, max_rounds=4, round_policy="tracked", round_confidence=0.6
    ),
    "est_all": dict(sampler="est", num_generations=4),
    "est_downsample": dict(sampler="est", num_generations=3, est_train_on="downsample", est_max_samples=10),
}


def run_steps(sampler, batches, rates, seed):
    """One step per batch of prompt keys, every draw Bernoulli(rates[key]) from a generator fixed by (seed, step)."""
    decisions = []
    for step_index, keys in enumerate(batches):
        rng = random.Random(seed * 1000 + step_index)
        cap = sampler.settings.max_pool_size
        draws = [[float(rng.random() < rates[key]) for _ in range(cap)] for key in keys]
        selection, history = drive(sampler, draws, keys=keys)
        decisions.append(
            (
                history,
                selection.pools,
                [(r.kept, r.advantages, r.weight) for r in selection.prompts],
                selection.rounds_per_prompt,
            )
        )
    return decisions


@examples(60)
@given(
    name=st.sampled_from(sorted(STATEFUL_CONFIGS)),
    rates=st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.5, 0.8, 1.0]), min_size=8, max_size=8),
    before=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), min_size=0, max_size=3),
    after=st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=6), min_size=1, max_size=3),
    seed=st.integers(0, 10_000),
)
def test_sampler_state_round_trips_through_the_checkpoint_json(name, rates, before, after, seed):
    """
    Property (SPEC: the tracker is training state, saved with every checkpoint and restored on resume): after any
    steps, a new sampler that loads the state as the trainer writes and reads `ada_sampler_state.json` (`json.dump` of
    {"sampler": state_dict(), "refill": ...}, then `json.load`) makes exactly the decisions the original makes on the
    same later draws (requests, pools, kept groups, advantages, weights), and their states stay identical.
    """
    config = SamplerSettings(
        **{"num_generations": 4, "scale_rewards": "none", **STATEFUL_CONFIGS[name]}, seed=seed % 97
    )
    original = build_sampler(config)
    run_steps(original, before, rates, seed)
    written = json.dumps({"sampler": original.state_dict(), "refill": {"epoch": 0}})
    restored = build_sampler(config)
    restored.load_state_dict(json.loads(written)["sampler"])
    assert json.dumps(restored.state_dict()) == json.dumps(original.state_dict())

    assert run_steps(restored, after, rates, seed + 1) == run_steps(original, after, rates, seed + 1)
    assert json.dumps(restored.state_dict()) == json.dumps(original.state_dict())
