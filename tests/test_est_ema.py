"""`sampler="est_ema"`: the Reinforce-Ada authors' later single-round variant (their verl code, branch `hanze`,
`verl/trainer/ppo/ray_trainer_ema.py`), checked against that code's rules written out here: a Beta(1, 16) prior on
counts decayed by 0.9 per visit, successes above 0.7, one draw per prompt plus the rest of `8 x prompts` shared in
proportion to 1/p̂ (floors, then one more each to the largest fractional parts), every draw trained, against the
pool's pass rate, unscaled."""

import math

import pytest

from trl_ada import AdaGRPOConfig
from trl_ada.samplers import SamplerSettings, build_sampler


def authors_budgets(estimates, per_prompt):
    """Their allocation: one each, `(per_prompt - 1) * P` shared by 1/max(p, 1e-6), floors, then largest remainders."""
    weights = [1.0 / max(p, 1e-6) for p in estimates]
    rest = (per_prompt - 1) * len(estimates)
    exact = [rest * w / sum(weights) for w in weights]
    budgets = [1 + math.floor(x) for x in exact]
    leftover = rest - sum(math.floor(x) for x in exact)
    for i in sorted(range(len(exact)), key=lambda i: -(exact[i] - math.floor(exact[i])))[:leftover]:
        budgets[i] += 1
    return budgets


def authors_estimate(history):
    """(1 + K) / (17 + N), with K and N decayed by 0.9 at each visit before the visit's counts are added."""
    total = hits = 0.0
    for draws, successes in history:
        total, hits = 0.9 * total + draws, 0.9 * hits + successes
    return (1.0 + hits) / (17.0 + total)


def run_step(sampler, keys, outcome):
    step = sampler.begin(len(keys), keys)
    requests = step.requests()
    rewards = [outcome(index, draw) for index, count in requests for draw in range(count)]
    step.observe(requests, rewards)
    assert step.requests() == []  # one round per step
    return step, step.finish()


def test_est_ema_follows_the_authors_rules():
    sampler = build_sampler(SamplerSettings(sampler="est_ema", num_generations=8, seed=0))
    settings = sampler.settings
    assert (settings.pass_rate_prior_alpha, settings.pass_rate_prior_beta, settings.pass_rate_decay) == (1, 16, 0.9)
    assert settings.scale_rewards == "none" and settings.positive_threshold == 0.7
    keys = ["a", "b", "c", "d", "e"]
    # Prompt i is right on a share of draws that grows with i: 0, 1/4, 1/2, 3/4, 1; rewards 0.8 count as successes.
    history = {key: [] for key in keys}
    for visit in range(4):
        expected_estimates = [authors_estimate(history[key]) for key in keys]
        step, selection = run_step(sampler, keys, lambda i, d: 0.8 if d % 4 < i else 0.0)
        assert step.estimates == pytest.approx(expected_estimates)
        assert step.budgets == authors_budgets(expected_estimates, 8)
        assert sum(step.budgets) == 8 * len(keys)
        for key, pool, result in zip(keys, step.pools, selection.prompts, strict=True):
            history[key].append((len(pool), sum(r > 0.7 for r in pool)))
            # Every draw trained, against the pool's mean reward, unscaled and unweighted.
            assert result.kept == tuple(range(len(pool)))
            mean = sum(pool) / len(pool)
            expected = [0.0] * len(pool) if len(set(pool)) == 1 else [r - mean for r in pool]
            assert list(result.advantages) == pytest.approx(expected)
        if visit:
            assert step.budgets[0] > 4 * step.budgets[-1]  # the unsolved prompt draws most


def test_est_ema_alone_is_the_authors_variant_and_keeps_what_is_given(tmp_path):
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=8)
    config = AdaGRPOConfig(**common, sampler="est_ema")
    assert (config.pass_rate_prior_beta, config.est_min_samples, config.scale_rewards) == (16.0, 1, "none")
    assert AdaGRPOConfig(**common, sampler="est_ema", pass_rate_prior_beta=4.0).pass_rate_prior_beta == 4.0
    with pytest.raises(ValueError, match="skip_unmixed_above"):
        AdaGRPOConfig(**common, sampler="est_ema", skip_unmixed_above=0.9)
