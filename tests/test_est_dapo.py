"""Reinforce-Ada-Est (tracker, allocation, weights) and DAPO's batch filling, as pure rules."""

import random

import pytest

from trl_ada.samplers import SamplerSettings, build_sampler, rules, simulate
from trl_ada.samplers.dapo import BatchExhaustedError, BatchFiller
from trl_ada.samplers.tracker import DecayedBetaTracker

# ---------------------------------------------------------------------------------------------------------------
# Tracker
# ---------------------------------------------------------------------------------------------------------------


def test_tracker_decay_and_prior():
    tracker = DecayedBetaTracker(decay=0.5, prior_alpha=1.0, prior_beta=3.0)
    assert tracker.estimate(["x"]) == [0.25]  # unseen: alpha / (alpha + beta)
    tracker.update(["x"], [8], [8])
    assert tracker.estimate(["x"]) == [pytest.approx((8 + 1) / (8 + 4))]
    tracker.update(["x"], [4], [0])  # N = 0.5 * 8 + 4 = 8, K = 0.5 * 8 + 0 = 4
    assert tracker.counts["x"] == (8.0, 4.0)
    assert tracker.estimate(["x"]) == [pytest.approx(5 / 12)]


def test_tracker_never_reads_zero_or_one():
    tracker = DecayedBetaTracker(decay=1.0, prior_alpha=0.5, prior_beta=0.5)
    tracker.update(["all_wrong", "all_right"], [10_000, 10_000], [0, 10_000])
    low, high = tracker.estimate(["all_wrong", "all_right"])
    assert 0.0 < low < 1e-4 and 1 - 1e-4 < high < 1.0


def test_tracker_keys_survive_state_round_trip():
    tracker = DecayedBetaTracker(0.9, 1.0, 1.0)
    tracker.update(["a", "b"], [4, 6], [1, 5])
    restored = DecayedBetaTracker(0.9, 1.0, 1.0)
    restored.load_state_dict(tracker.state_dict())
    assert restored.estimate(["b", "a", "c"]) == tracker.estimate(["b", "a", "c"])


# ---------------------------------------------------------------------------------------------------------------
# Allocation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_allocation_sums_exactly_and_respects_bounds(seed):
    rng = random.Random(seed)
    count = rng.randint(1, 60)
    low = rng.randint(1, 4)
    high = low + rng.randint(0, 30)
    total = rng.randint(count * low, count * high)
    scores = [rng.uniform(0.01, 10.0) for _ in range(count)]
    budgets = rules.allocate_budget(scores, total, low, high)
    assert sum(budgets) == total
    assert all(low <= b <= high for b in budgets)
    # proportional where unclipped: a larger score never gets a smaller budget
    for i in range(count):
        for j in range(count):
            if scores[i] > scores[j]:
                assert budgets[i] >= budgets[j]


def test_allocation_largest_remainder():
    # scale 1: targets 2.6, 2.3, 2.1 -> floors 2, 2, 2 with 1 left over: goes to the largest fraction (0.6)
    assert rules.allocate_budget([2.6, 2.3, 2.1], 7, 1, 10) == [3, 2, 2]
    # two left over: 0.6 and 0.3 win
    assert rules.allocate_budget([2.6, 2.3, 2.1], 8, 1, 10) == [3, 3, 2]


def test_allocation_clips_then_shares_the_rest():
    # unclipped 1/sqrt(p) shares would be 10 : 1 : 1; the cap 8 moves the excess to the others
    budgets = rules.allocate_budget([10.0, 1.0, 1.0], 12, 2, 8)
    assert budgets == [8, 2, 2]
    budgets = rules.allocate_budget([10.0, 1.0, 1.0], 15, 2, 8)
    assert budgets[0] == 8 and sum(budgets) == 15 and budgets[1] + budgets[2] == 7


def test_allocation_rejects_infeasible_totals():
    with pytest.raises(ValueError):
        rules.allocate_budget([1.0, 1.0], 1, 1, 4)
    with pytest.raises(ValueError):
        rules.allocate_budget([1.0, 1.0], 9, 1, 4)


def test_residual_weight_times_budget_is_the_log_objective():
    # N ∝ p^-s and w = p^-(1-s): N * w ∝ 1/p for every s (eps -> 0)
    for s in (0.0, 0.5, 1.0):
        for p in (0.05, 0.3, 0.9):
            weight = rules.residual_weight(p, s, 1e-12, 1e9)
            assert weight * p**-s == pytest.approx(1 / p)
    assert rules.residual_weight(0.0, 0.5, 0.01, 5.0) == 5.0  # clipped


# ---------------------------------------------------------------------------------------------------------------
# EstSampler steps
# ---------------------------------------------------------------------------------------------------------------


def run_est(settings, keys, rate_of, steps=1, seed=0):
    sampler = build_sampler(settings)
    draws = random.Random(seed)
    for _ in range(steps):
        step = sampler.begin(len(keys), keys)
        requests = step.requests()
        assert len(requests) == len(keys)
        step.observe(requests, [float(draws.random() < rate_of[i]) for i, c in requests for _ in range(c)])
        assert step.requests() == []  # est draws everything in one round
        selection = step.finish()
    return sampler, step, selection


def test_est_train_on_all_keeps_every_completion_with_fixed_total():
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=4)
    keys = [f"p{i}" for i in range(10)]
    _, step, selection = run_est(settings, keys, [0.1 * i for i in range(10)], steps=3)
    assert sum(len(r.kept) for r in selection.prompts) == 10 * 4
    assert all(len(r.kept) == len(pool) for r, pool in zip(selection.prompts, selection.pools))
    for result, pool in zip(selection.prompts, selection.pools):
        mean = sum(pool) / len(pool)
        assert result.baseline == pytest.approx(mean)
        # SamplerSettings' scale_rewards defaults to "none": advantage = w * (r - pool mean)
        assert list(result.advantages) == pytest.approx([result.weight * (r - mean) for r in pool])


@pytest.mark.parametrize(("mean_samples", "total"), [(None, 8 * 8), (5.2, round(8 * 5.2))])
def test_est_downsample_draws_its_own_budget_then_keeps_n(mean_samples, total):
    settings = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler="est",
        num_generations=4,
        est_train_on="downsample",
        est_max_samples=12,
        est_mean_samples=mean_samples,
    )
    sampler, _, selection = run_est(settings, list("abcdefgh"), [0.05, 0.5, 0.95, 0.3] * 2, steps=2)
    assert sampler.settings.est_mean_samples == (8 if mean_samples is None else mean_samples)  # None: 2n
    budgets = [len(pool) for pool in selection.pools]
    assert sum(budgets) == total  # N_total = round(B * est_mean_samples), not B * n
    assert len(set(budgets)) > 1  # step 2 allocates from the pass rates tracked in step 1
    assert all(4 <= b <= 12 for b in budgets)
    assert all(len(r.kept) == 4 for r in selection.prompts)


def test_est_weights_a_prompt_by_its_budget_only_when_it_trains_every_draw():
    """The hybrid's `1/p̂` is `N ∝ p̂^-s` (a prompt's share of the update) times the residual weight: `all` trains it;
    `downsample` trains a group of n per prompt whatever its budget, so its weight is the residual alone (docs)."""
    for train_on, trained in (("all", lambda budget: budget), ("downsample", lambda budget: 4)):
        settings = SamplerSettings(
            scale_rewards="none", seed=0, sampler="est", num_generations=4, est_train_on=train_on,
            normalize_weights=False,
        )  # fmt: skip
        sampler = build_sampler(settings)
        sampler.estimator.update(["hard", "easy"], [100, 100], [6, 92])
        step = sampler.begin(2, ["hard", "easy"])
        budgets = list(step.budgets)
        requests = step.requests()
        step.observe(requests, [float(i % 2) for _, c in requests for i in range(c)])
        selection = step.finish()
        for result, pool, budget in zip(selection.prompts, selection.pools, budgets, strict=True):
            pass_rate = sum(r > 0.5 for r in pool) / len(pool)
            residual = rules.residual_weight(pass_rate, 0.5, settings.est_epsilon, settings.max_weight)
            assert result.weight == pytest.approx(residual) and len(result.kept) == trained(budget)
        assert budgets[0] > budgets[1]  # the hard prompt's larger budget reaches the update only under "all"


def test_est_downsample_gives_the_hard_prompt_more_than_n():
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="est", num_generations=4, est_train_on="downsample"
    )
    sampler = build_sampler(settings)
    sampler.estimator.update(["hard", "easy"], [100, 100], [6, 92])  # p̂ = 7/102 ≈ 0.07 and 93/102 ≈ 0.91
    step = sampler.begin(2, ["hard", "easy"])
    # N_total = 2 * 2n = 16; N ∝ p̂^-1/2 gives 12.5 : 3.5, the easy prompt clips up to n = 4, the hard one takes 12
    assert step.budgets == [12, 4]


def test_est_needs_keys_and_tracks_them_across_order():
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=4)
    sampler = build_sampler(settings)
    with pytest.raises(ValueError, match="stable key"):
        sampler.begin(3)
    sampler.estimator.update(["hard", "easy"], [40, 40], [0, 40])
    step = sampler.begin(2, ["easy", "hard"])  # order of the batch does not matter, keys do
    assert step.budgets[1] > step.budgets[0]


def expected_budgets(pass_rates, n, low, high, power):
    """Continuous water-filling of N ∝ p^-power to a mean of n, bounds [low, high]."""
    scores = [p**-power for p in pass_rates]
    lo, hi = 0.0, high / min(scores)
    for _ in range(200):
        mid = (lo + hi) / 2
        if sum(min(max(mid * s, low), high) for s in scores) < n * len(scores):
            lo = mid
        else:
            hi = mid
    return [min(max(hi * s, low), high) for s in scores]


def test_simulate_est_learns_the_allocation_over_steps():
    rates = [0.05, 0.2, 0.5, 0.8]
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=4, pass_rate_decay=1.0)
    first = simulate(settings, rates, trials=300, steps=1, seed=3)
    last = simulate(settings, rates, trials=300, steps=40, seed=3)
    # step 1: nothing tracked yet, every prompt reads the prior 0.5 and gets the mean budget
    assert [r.mean_samples for r in first] == [4.0] * 4
    expected = expected_budgets(rates, 4, 2, 16, 0.5)
    for result, target in zip(last, expected):
        # With decay 1 the tracker has ~40 visits x N samples; the estimate's relative variance (1-p)/(pN) makes
        # E[p̂^-1/2] exceed p^-1/2 by about 3/8 of it (under 3% here), and rounding moves budgets by < 1 sample.
        assert result.mean_samples == pytest.approx(target, rel=0.06, abs=0.5)
    assert sum(r.mean_samples for r in last) == pytest.approx(16.0)  # the total budget is exact


def test_est_metrics_report_budget_and_tracked_quantiles():
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=4)
    _, _, selection = run_est(settings, list("abcd"), [0.05, 0.2, 0.5, 0.9], steps=5)
    metrics = selection.metrics
    assert metrics["samples_per_prompt/mean"] == 4.0
    assert (
        0
        < metrics["est/tracked_pass_rate/p10"]
        <= metrics["est/tracked_pass_rate/p50"]
        <= metrics["est/tracked_pass_rate/p90"]
        < 1
    )
    assert 0 <= metrics["est/budget_at_floor_share"] <= 1 and 0 <= metrics["est/budget_at_cap_share"] <= 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"est_min_samples": 10, "est_max_samples": 8}, "must not exceed"),
        ({"est_min_samples": 6}, "cannot meet"),
        ({"est_max_samples": 3}, "cannot meet"),
        ({"pass_rate_decay": 0.0}, "pass_rate_decay must lie in"),
        ({"pass_rate_decay": 1.5}, "pass_rate_decay must lie in"),
        ({"pass_rate_prior_alpha": 0.0}, "must be a positive finite"),
        ({"est_sample_power": 1.5}, "est_sample_power"),
        ({"est_train_on": "downsample", "est_min_samples": 2}, "at least 4"),
        ({"est_mean_samples": 6}, "est_mean_samples must be 4"),
        ({"est_train_on": "downsample", "est_max_samples": 6}, r"budget is 8 completions"),  # default 2n > max
        ({"est_train_on": "downsample", "est_mean_samples": 3}, "cannot meet"),
        ({"est_train_on": "downsample", "est_mean_samples": float("nan")}, "cannot meet"),
        ({"objective": "log"}, "splits the log objective"),
        ({"positive_quota": 1}, "Remove positive_quota"),
        ({"est_train_on": "some"}, "est_train_on='some' is not supported"),
    ],
)
def test_invalid_est_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplerSettings(sampler="est", num_generations=4, **{"scale_rewards": "none", "seed": 0, **kwargs}).validated()


# ---------------------------------------------------------------------------------------------------------------
# DAPO
# ---------------------------------------------------------------------------------------------------------------


def test_est_mean_samples_defaults():
    assert (
        SamplerSettings(scale_rewards="none", seed=0, sampler="est", num_generations=4).validated().est_mean_samples
        == 4
    )
    downsample = SamplerSettings(
        scale_rewards="none", seed=0, sampler="est", num_generations=4, est_train_on="downsample"
    ).validated()
    assert downsample.est_mean_samples == 8
    assert (downsample.est_min_samples, downsample.est_max_samples) == (4, 16)


def selection_for(pools):
    sampler = build_sampler(
        SamplerSettings(scale_rewards="none", seed=0, sampler="dapo", num_generations=len(pools[0]))
    )
    step = sampler.begin(len(pools))
    requests = step.requests()
    step.observe(requests, [r for pool in pools for r in pool])
    return step.finish()


def test_batch_filler_drops_zero_variance_groups_and_refills():
    filler = BatchFiller(num_prompts=3)
    filler.add(selection_for([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]))
    assert not filler.is_full and filler.informative == [(0, 0)]
    filler.add(selection_for([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]))
    assert filler.is_full
    assert filler.take(keep_partial=False) == [(0, 0), (1, 1), (1, 2)]
    metrics = filler.metrics()
    assert metrics["dapo/dropped_groups"] == 3 and metrics["dapo/extra_batches"] == 1
    # The kept share describes the update's groups (all informative here), not the 3 of 6 sampled ones dropped.
    assert metrics["zero_variance_share/kept"] == 0.0 and metrics["dapo/dropped_share"] == 0.5
    # With refills the batch's own selection leaves that share to the filler: logged once, over the update.
    assert "zero_variance_share/kept" not in selection_for([[1.0, 0.0], [1.0, 1.0]]).metrics


def test_batch_filler_kept_share_counts_padding():
    filler = BatchFiller(num_prompts=2)
    filler.add(selection_for([[1.0, 1.0], [1.0, 0.0]]))
    filler.take(keep_partial=True)
    assert filler.metrics()["zero_variance_share/kept"] == 0.5  # one informative group, one constant padding group


def test_batch_filler_at_the_cap_raises_or_pads_with_dropped_groups():
    filler = BatchFiller(num_prompts=2)
    filler.add(selection_for([[1.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(BatchExhaustedError, match="dapo_max_refills"):
        filler.take(keep_partial=False)
    assert filler.take(keep_partial=True) == [(0, 1), (0, 0)]


def one_round(settings, pools):
    """Finish a step whose only round draws each pool exactly (`round_size` = pool size, `max_rounds=1`)."""
    step = build_sampler(settings).begin(len(pools))
    requests = step.requests()
    assert [count for _, count in requests] == [len(pool) for pool in pools]
    step.observe(requests, [r for pool in pools for r in pool])
    return step.finish()


def test_keep_partial_pads_only_with_zero_advantage_groups():
    settings = SamplerSettings(
        scale_rewards="none",
        sampler="seq_balance",
        num_generations=4,
        round_size=8,
        max_rounds=1,
        downsample="random",
        baseline="pool",
        dapo_refill=True,
        dapo_on_exhausted="keep_partial",
        seed=3,  # with this seed the random group of the first pool misses its only positive
    )
    pools = [[1.0] + [0.0] * 7, [0.0] * 8, [1.0] * 8]
    selection = one_round(settings, pools)
    assert [pools[0][i] for i in selection.prompts[0].kept] == [0.0] * 4
    filler = BatchFiller(num_prompts=3)
    filler.add(selection)
    chosen = filler.take(keep_partial=True)
    padding = chosen[len(filler.informative) :]
    assert padding, "the batch must be short for this test"
    for _, g in padding:
        assert selection.prompts[g].advantages == (0.0,) * 4
    # The all-negative kept group still has a signal against the pool mean 1/8, so it is trained on, not padding.
    assert chosen[0] == (0, 0) and selection.prompts[0].advantages == pytest.approx((-0.125,) * 4)


def test_no_signal_follows_the_baseline_rewards():
    common = dict(sampler="seq_balance", num_generations=4, round_size=8, max_rounds=1, downsample="random", seed=3)
    mixed_pool_constant_group = [1.0] + [0.0] * 7  # seed 3 keeps four zeros, as above
    constant_up_to_noise = [0.3, 0.3 + 1e-9] * 4  # non-binary, std far below the tolerance 1e-6
    pools = [mixed_pool_constant_group, constant_up_to_noise, [1.0, 0.0] * 4]
    pool_baseline = one_round(
        SamplerSettings(**{"num_generations": 4, "scale_rewards": "none", "seed": 0, **common}, baseline="pool"), pools
    )
    group_baseline = one_round(
        SamplerSettings(**{"num_generations": 4, "scale_rewards": "none", "seed": 0, **common}, baseline="group"),
        pools,
    )
    assert [r.has_signal for r in pool_baseline.prompts] == [True, False, True]
    assert [r.has_signal for r in group_baseline.prompts] == [False, False, True]
    for selection in (pool_baseline, group_baseline):
        for result in selection.prompts:
            if not result.has_signal:
                assert result.advantages == (0.0,) * 4  # exactly, not float noise
        # the kept-group metric is unchanged: it describes the kept rewards, whatever the baseline
        assert selection.metrics["zero_variance_share/kept"] == pytest.approx(2 / 3)
        filler = BatchFiller(num_prompts=3)
        filler.add(selection)
        assert [r.has_signal for r in selection.prompts] == [(0, g) in filler.informative for g in range(3)]


def test_weight_normalisation_uses_the_same_signal_as_the_baseline():
    # Group baseline: the first prompt's kept group is all zeros, so it has no signal and stays out of the mean
    # weight although its pool is mixed; the second prompt is then the only one with a signal and gets weight 1.
    settings = SamplerSettings(
        scale_rewards="none",
        sampler="seq_balance",
        num_generations=4,
        round_size=8,
        max_rounds=1,
        downsample="random",
        baseline="group",
        objective="log",
        seed=3,
    )
    selection = one_round(settings, [[1.0] + [0.0] * 7, [1.0, 0.0] * 4])
    assert [r.has_signal for r in selection.prompts] == [False, True]
    assert selection.prompts[1].weight == pytest.approx(1.0)
    assert selection.metrics["weight/mean"] == pytest.approx(1.0)


def test_dapo_settings():
    assert SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="dapo").validated().refills
    assert (
        SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="seq_balance", dapo_refill=True)
        .validated()
        .refills
    )
    assert (
        not SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="seq_balance").validated().refills
    )
    with pytest.raises(ValueError, match="contradicts"):
        SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="dapo", dapo_refill=False).validated()
    with pytest.raises(ValueError, match="use sampler='dapo'"):
        SamplerSettings(
            num_generations=4, scale_rewards="none", seed=0, sampler="uniform", dapo_refill=True
        ).validated()
    with pytest.raises(ValueError, match="dapo_on_exhausted"):
        SamplerSettings(
            num_generations=4, scale_rewards="none", seed=0, sampler="dapo", dapo_on_exhausted="ignore"
        ).validated()


# ---------------------------------------------------------------------------------------------------------------
# Round policies
# ---------------------------------------------------------------------------------------------------------------


def test_quota_probability_matches_monte_carlo():
    rng = random.Random(0)
    trials = 20_000
    hits = 0
    for _ in range(trials):
        p = rng.betavariate(2.0, 5.0)
        positives = sum(rng.random() < p for _ in range(10))
        hits += positives >= 2 and 10 - positives >= 3
    expected = rules.quota_probability(10, 2, 3, 2.0, 5.0)
    assert hits / trials == pytest.approx(expected, abs=4 * (expected * (1 - expected) / trials) ** 0.5)


def test_predictive_request_is_the_smallest_sufficient_draw():
    request = rules.predictive_request(2, 2, 3.0, 9.0, 0.8, 1, 24)
    assert 4 < request < 24 and rules.quota_probability(request, 2, 2, 3.0, 9.0) >= 0.8
    assert rules.quota_probability(request - 1, 2, 2, 3.0, 9.0) < 0.8
    # nothing can reach the target: ask for the whole remaining room
    assert rules.predictive_request(2, 2, 0.01, 100.0, 0.99, 1, 24) == 24
    # at least the update group must be filled
    assert rules.predictive_request(0, 0, 1.0, 1.0, 0.9, 3, 24) == 3


def policy_settings(policy, **kwargs):
    return SamplerSettings(
        sampler="seq_balance",
        num_generations=4,
        round_size=8,
        max_rounds=4,
        positive_quota=2,
        negative_quota=2,
        round_policy=policy,
        **{"scale_rewards": "none", "seed": 0, **kwargs},
    )


RATES = [0.02 + 0.96 * i / 24 for i in range(25)]


def mean_of(results, field):
    return sum(getattr(r, field) for r in results) / len(results)


def test_tracked_policy_needs_fewer_rounds_once_prompts_repeat():
    fixed = simulate(policy_settings("fixed"), RATES, trials=80, steps=8, seed=1)
    tracked = simulate(policy_settings("tracked", round_confidence=0.7), RATES, trials=80, steps=8, seed=1)
    assert mean_of(tracked, "mean_rounds") < 0.85 * mean_of(fixed, "mean_rounds")
    assert mean_of(tracked, "mean_samples") < 1.2 * mean_of(fixed, "mean_samples")
    # the cap and the exit rule are unchanged, so the signal recovered is the same up to sampling noise
    assert mean_of(tracked, "mixed_share") == pytest.approx(mean_of(fixed, "mixed_share"), abs=0.02)


def test_predictive_policy_never_exceeds_the_cap_and_keeps_n():
    results = simulate(policy_settings("predictive", round_confidence=0.9), RATES, trials=40, seed=2)
    assert max(r.max_samples for r in results) <= 32
    assert all(r.mean_rounds <= 4 for r in results)


def test_round_policy_only_for_sequential_samplers():
    with pytest.raises(ValueError, match="round_policy='tracked'"):
        SamplerSettings(
            num_generations=4, scale_rewards="none", seed=0, sampler="est", round_policy="tracked"
        ).validated()
    with pytest.raises(ValueError, match="round_confidence"):
        policy_settings("predictive", round_confidence=1.0).validated()
