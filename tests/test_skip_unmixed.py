"""
`skip_unmixed_above` (issue 24, item 2: GRESO's skip) and the reliability bins of the pass-rate estimates (item 4),
with Bernoulli rewards: no model, no torch. The trainer-level tests are at the end.
"""

import hashlib
import math
import random
import re

import pytest

from trl_ada.samplers import SamplerSettings, build_sampler, rules
from trl_ada.samplers.predictor import calibration_bins
from trl_ada.samplers.simulate import run_population


class FixedEstimator:
    """A pass-rate estimator that predicts a fixed rate per prompt key (the population's own rates: an oracle)."""

    strength = 2.0

    def __init__(self, rates):
        self.rates = dict(enumerate(rates))

    def estimate(self, keys):
        return [self.rates[key] for key in keys]

    def beta_parameters(self, keys):
        return [(self.strength * p, self.strength * (1.0 - p)) for p in self.estimate(keys)]

    prior_parameters = beta_parameters

    def update(self, keys, totals, positives):
        pass

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


SEQ = {"sampler": "seq_balance", "round_policy": "tracked", "num_generations": 8, "seed": 0}
CAP, N = 32, 8  # round_size * max_rounds and num_generations under SEQ


# Metrics renamed since the fingerprints below were recorded (TRL's asynchronous trainer reads "max"/"min" in a name
# as a reduction): the fingerprint uses the recorded names, so the same decisions still give the same digest.
RENAMED = {"est/budget_at_cap_share": "est/at_max_share", "est/budget_at_floor_share": "est/at_min_share"}


def fingerprint(**overrides):
    """The selections of 4 steps over a mixed population: what the sampler decided, before this change too."""
    settings = SamplerSettings(num_generations=8, seed=3, **overrides)
    population = [0.0, 0.02, 0.1, 0.3, 0.5, 0.7, 0.9, 0.98, 1.0] * 6
    selection = run_population(build_sampler(settings), population, seed=5, steps=4)
    metrics = sorted(
        (RENAMED.get(k, k), v)
        for k, v in selection.metrics.items()
        if "time" not in k and "/bin_" not in k and not k.startswith("draws/")
    )
    # `PromptResult.unnormalised_weight` and `draw_shares` (empty unless `train_on="pool"`), fields added since, are
    # left out like the new metrics (`replayed`, added and removed since, no longer appears).
    text = re.sub(r", unnormalised_weight=[^,)]+", "", repr((selection.prompts, selection.pools, metrics)))
    text = text.replace(", draw_shares=()", "").replace(", replayed=None", "")
    return hashlib.sha256(text.encode()).hexdigest()[:16], selection


# Recorded with the code before skip_unmixed_above existed (the reliability bins and the draw accounting, new
# metrics, are left out).
BEFORE = [
    ({"sampler": "seq_balance", "round_policy": "tracked"}, "e33e1152941d0be5"),
    ({"sampler": "est"}, "0ce3de1f947ba7bb"),
    ({"sampler": "est", "est_train_on": "downsample"}, "10c66271b4992a00"),
    ({"sampler": "seq_pos", "round_policy": "predictive", "pass_rate_predictor": "learned"}, "e412ec09ef4e57d0"),
]


@pytest.mark.parametrize(("overrides", "expected"), BEFORE)
def test_off_by_default_the_selections_are_those_from_before(overrides, expected):
    digest, selection = fingerprint(**overrides)
    assert digest == expected
    assert not any(key.startswith("skip/") for key in selection.metrics)


def test_on_but_never_confident_enough_changes_no_selection():
    # Warmed up, the all-wrong and all-right prompts read p̂ = 1/88.7: an unmixed group of 8 at 0.913, below 0.99.
    population = [0.0] * 20 + [1.0] * 20 + [0.5] * 20
    off = build_sampler(SamplerSettings(**SEQ))
    on = build_sampler(SamplerSettings(**SEQ, skip_unmixed_above=0.99))
    run_population(off, population, seed=1, steps=3)
    on.load_state_dict(off.state_dict())
    a, b = run_population(off, population, seed=2), run_population(on, population, seed=2)
    assert (a.prompts, a.pools) == (b.prompts, b.pools)
    assert b.metrics["skip/share"] == 0.0 and b.metrics["skip/draws_saved"] == 0.0
    assert "skip/mixed_share" not in b.metrics  # nothing skipped: no share of skipped prompts to report


def test_prompts_predicted_near_0_or_1_are_skipped_and_the_saving_is_the_cap_minus_n():
    population = [0.0] * 40 + [1.0] * 40 + [0.5] * 40
    off = build_sampler(SamplerSettings(**SEQ))
    on = build_sampler(SamplerSettings(**SEQ, skip_unmixed_above=0.9))
    run_population(off, population, seed=1, steps=3)  # the tracker learns the population (decay 0.9)
    on.load_state_dict(off.state_dict())
    p_hat = on.estimator.estimate([0])[0]
    # (K + 1) / (N + 2) with K = 0 and N = 32 (1 + 0.9 + 0.81) decayed draws
    assert p_hat == pytest.approx(1 / (2 + 32 * 2.71)) and rules.unmixed_chance(p_hat, N) > 0.9
    a, b = run_population(off, population, seed=2), run_population(on, population, seed=2)
    # A pool that never mixes never exits seq_balance: without the skip it draws the cap, with it exactly n.
    assert [len(pool) for pool in a.pools[:80]] == [CAP] * 80
    assert [len(pool) for pool in b.pools[:80]] == [N] * 80
    metrics = b.metrics
    assert metrics["skip/share"] == pytest.approx(80 / 120)
    # The logged saving is the expectation under p̂: the cap, unless the pool mixes early (P(>= 4 positives in 32
    # draws at p̂) < C(32, 4) p̂^4 < 1e-3, so the cap minus n up to 24 x 1e-3 per prompt).
    assert metrics["skip/draws_saved"] == pytest.approx(80 * (CAP - N), abs=80 * 24e-3)
    assert metrics["skip/mixed_share"] == 0.0  # true p is 0 or 1: the prediction was right about every one
    assert metrics["skip/predicted_unmixed"] == pytest.approx(rules.unmixed_chance(p_hat, N))
    # Without the skip it would (almost surely) draw 32 and mix unless all 32 agree; with it, unless 8 agree.
    lost = rules.unmixed_chance(p_hat, N) - rules.unmixed_chance(p_hat, CAP)
    assert metrics["skip/expected_signal_lost"] == pytest.approx(lost, abs=1e-3)


def test_the_expected_saving_matches_the_draws_a_prompt_makes_without_the_skip():
    # An oracle estimator (p̂ = p = 0.03): the logged saving is E[draws without the skip] - n, computed exactly over
    # every path of rounds; run the same prompts without the skip and count. Draws lie in [n, cap], so their std is
    # at most (cap - n) / 2 = 12 and the mean of T = 2000 prompts is within 4 * 12 / sqrt(T) = 1.07 of it; the share of
    # mixed pools within 4 * 0.5 / sqrt(T) = 0.045 of its expectation.
    trials, p = 2000, 0.03
    population = [p] * trials
    settings = {**SEQ, "seed": 4}
    on = build_sampler(SamplerSettings(**settings, skip_unmixed_above=0.7), FixedEstimator(population))
    off = build_sampler(SamplerSettings(**settings), FixedEstimator(population))
    assert rules.unmixed_chance(p, N) > 0.7
    skipped = run_population(on, population, seed=7)
    unskipped = run_population(off, population, seed=8)
    assert skipped.metrics["skip/share"] == 1.0 and {len(pool) for pool in skipped.pools} == {N}
    saving = skipped.metrics["skip/draws_saved"] / trials
    drawn = sum(len(pool) for pool in unskipped.pools) / trials
    assert saving == pytest.approx(drawn - N, abs=4 * 12 / math.sqrt(trials))
    mixed = sum(0 < sum(pool) < len(pool) for pool in unskipped.pools) / trials
    expected_lost = mixed - (1 - rules.unmixed_chance(p, N))
    assert skipped.metrics["skip/expected_signal_lost"] == pytest.approx(
        expected_lost, abs=4 * 0.5 / math.sqrt(trials)
    )


@pytest.mark.parametrize("schedule", ["rounds", "continuous"])
def test_the_measured_lost_signal_is_the_bernoulli_rate_of_a_mixed_group(schedule):
    # Predicted (and true) p = 0.05: an unmixed group of 8 with chance 0.95^8 + 0.05^8 = 0.663 > 0.6, so every prompt
    # is skipped and draws 8; it comes back mixed with chance 0.337. Binomial std over T = 4000 prompts:
    # sqrt(0.337 * 0.663 / T) = 0.0075; tolerance 4 std.
    trials, p = 4000, 0.05
    population = [p] * trials
    sampler = build_sampler(SamplerSettings(**SEQ, skip_unmixed_above=0.6), FixedEstimator(population))
    selection = run_population(sampler, population, seed=11, schedule=schedule)
    rate = 1 - rules.unmixed_chance(p, N)
    assert selection.metrics["skip/share"] == 1.0
    assert selection.metrics["skip/predicted_unmixed"] == pytest.approx(1 - rate)
    assert selection.metrics["skip/mixed_share"] == pytest.approx(rate, abs=4 * math.sqrt(rate * (1 - rate) / trials))
    # the skipped prompts still train: mixed ones carry a signal, as GRPO's groups of n would
    signal = sum(result.has_signal for result in selection.prompts) / trials
    assert signal == selection.metrics["skip/mixed_share"]


def test_est_gives_skipped_prompts_the_least_budget_and_the_rest_to_the_others():
    # Half the prompts predicted 0.05 (skipped at 0.6), half 0.5. est_train_on="all": the total stays B * n = 8B;
    # the skipped get est_min_samples = 2 each, the others share 8B - 2(B/2) = 7B, i.e. 14 each. A skipped prompt
    # comes back mixed with chance 2p(1 - p) = 0.095: std over 2000 of them 0.0066, tolerance 4 std.
    half, p = 2000, 0.05
    population = [p] * half + [0.5] * half
    settings = SamplerSettings(sampler="est", num_generations=8, seed=0, skip_unmixed_above=0.6)
    sampler = build_sampler(settings, FixedEstimator(population))
    step = sampler.begin(2 * half, list(range(2 * half)))
    assert step.skipped == [True] * half + [False] * half
    assert step.budgets == [2] * half + [14] * half and sum(step.budgets) == 8 * 2 * half
    without = step.budgets_without_skip
    rng = random.Random(3)
    requests = step.requests()
    step.observe(requests, [float(rng.random() < population[i]) for i, count in requests for _ in range(count)])
    metrics = step.finish().metrics
    assert metrics["skip/draws_saved"] == sum(without[:half]) - 2 * half  # exact: est's budgets are deterministic
    rate = 2 * p * (1 - p)
    assert metrics["skip/mixed_share"] == pytest.approx(rate, abs=4 * math.sqrt(rate * (1 - rate) / half))


def test_allocation_with_skips_when_the_others_cannot_take_the_rest():
    # 4 prompts, total 32, bounds [2, 10]: one unskipped prompt takes 10 at most, so the 3 skipped split 22.
    assert rules.allocate_budget_with_skips([1.0] * 4, [True, True, False, True], 32, 2, 10) == [8, 7, 10, 7]
    assert rules.allocate_budget_with_skips([1.0] * 3, [True] * 3, 24, 2, 32) == [8, 8, 8]  # all skipped: even
    assert rules.allocate_budget_with_skips([1.0, 3.0], [False, False], 8, 2, 8) == rules.allocate_budget(
        [1.0, 3.0], 8, 2, 8
    )


def test_the_skip_needs_a_prediction_and_a_probability():
    with pytest.raises(ValueError, match="predicts none"):
        build_sampler(SamplerSettings(sampler="seq_balance", round_policy="predictive", skip_unmixed_above=0.9))
    for value in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="probability in"):
            build_sampler(SamplerSettings(sampler="est", skip_unmixed_above=value))
    with pytest.raises(ValueError, match="has no effect"):
        build_sampler(SamplerSettings(sampler="dapo", skip_unmixed_above=0.9))
    # a learned predictor gives the predictive policy a prediction
    build_sampler(
        SamplerSettings(
            sampler="seq_pos", round_policy="predictive", pass_rate_predictor="learned", skip_unmixed_above=0.9
        )
    )


def test_the_skip_state_is_the_estimator_s_a_resumed_sampler_skips_the_same_prompts():
    population = [0.0] * 10 + [0.5] * 10
    settings = SamplerSettings(**SEQ, skip_unmixed_above=0.8)
    first = build_sampler(settings)
    run_population(first, population, seed=1, steps=3)
    resumed = build_sampler(settings)
    resumed.load_state_dict(first.state_dict())
    a, b = run_population(first, population, seed=2), run_population(resumed, population, seed=2)
    assert a.metrics["skip/share"] > 0 and (a.prompts, a.pools, a.metrics) == (b.prompts, b.pools, b.metrics)


# -- the reliability bins ---------------------------------------------------------------------------------------------


def test_calibration_bins_are_exact_on_a_hand_made_case():
    estimates = [0.05, 0.1, 0.12, 0.3, 1.0, 0.95, 0.5]
    totals = [4, 2, 3, 0, 3, 1, 5]
    positives = [1, 1, 0, 0, 3, 0, 5]
    bins = calibration_bins(estimates, totals, positives)
    assert len(bins) == 30  # every bin, zeros included
    expected = {0: (4, 1, 0.2), 1: (5, 1, 2 * 0.1 + 3 * 0.12), 5: (5, 5, 2.5), 9: (4, 3, 3.95)}
    for b in range(10):
        draws, hits, predicted = expected.get(b, (0, 0, 0.0))
        assert bins[f"bin_{b}/draws"] == draws and bins[f"bin_{b}/positives"] == hits, b
        assert bins[f"bin_{b}/predicted"] == pytest.approx(predicted), b
    assert calibration_bins([0.5], [0], [0]) == {}


def test_the_samplers_that_read_an_estimator_log_the_bins_and_the_others_do_not():
    population = [0.1, 0.9] * 8
    for settings in (SamplerSettings(**SEQ), SamplerSettings(sampler="est", num_generations=8, seed=0)):
        selection = run_population(build_sampler(settings), population, seed=0, steps=2)
        draws = sum(selection.metrics[f"pass_rate_predictor/bin_{b}/draws"] for b in range(10))
        assert draws == sum(len(pool) for pool in selection.pools)  # every draw is binned once
    fixed = run_population(build_sampler(SamplerSettings(sampler="seq_balance")), population, seed=0).metrics
    assert not any(key.startswith("pass_rate_predictor/") for key in fixed)


# -- in the trainer (tiny model, CPU) ---------------------------------------------------------------------------------


def test_the_trainer_skips_logs_the_skip_and_writes_the_reliability_diagram(tmp_path, tokenizer, arithmetic_dataset):
    from pathlib import Path

    from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tiny import build_tiny_model

    # Fresh prompts read the tracker's prior 0.5: an unmixed group of n = 4 with chance 2 / 16 = 0.125 > 0.1, so
    # every prompt of the first step is skipped and draws exactly 4.
    config = AdaGRPOConfig(
        **tiny_args(tmp_path / "out", max_steps=3),
        sampler="seq_balance",
        round_policy="tracked",
        round_size=4,
        max_rounds=3,
        skip_unmixed_above=0.1,
    )
    model = build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)
    trainer = AdaGRPOTrainer(
        model, [starts_low_digit], args=config, train_dataset=arithmetic_dataset, processing_class=tokenizer
    )
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3
    first = logged[0]
    assert first["ada/skip/share"] == 1.0 and first["ada/samples_per_prompt/mean"] == 4.0
    for entry in logged:
        for name in ("share", "draws_saved"):
            assert math.isfinite(entry[f"ada/skip/{name}"]), name
        assert sum(entry[f"ada/pass_rate_predictor/bin_{b}/draws"] for b in range(10)) > 0
    assert 0.0 <= first["ada/skip/mixed_share"] <= 1.0 and first["ada/skip/draws_saved"] > 0
    trainer.create_model_card(model_name="tiny-ada")
    out = Path(trainer.args.output_dir)
    assert (out / "plots" / "pass_rate_calibration.png").stat().st_size > 1000
    assert "(plots/pass_rate_calibration.png)" in (out / "README.md").read_text()
