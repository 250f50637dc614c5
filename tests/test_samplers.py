"""Sampler rules with Bernoulli and hand-written rewards. Pure Python: no model, no torch."""

import json
import math
import random

import pytest

from trl_ada.cli import main as cli_main
from trl_ada.samplers import SamplerSettings, build_sampler, rules, simulate

NAN = math.nan


def run_step(settings, reward_of):
    """Drive one step; `reward_of(prompt_index, draw_index)` gives each completion's reward."""
    sampler = build_sampler(settings)
    step = sampler.begin(len(reward_of))
    while requests := step.requests():
        rewards = []
        for index, count in requests:
            start = len(step.pools[index])
            rewards.extend(reward_of[index](start + j) for j in range(count))
        step.observe(requests, rewards)
    return step.finish()


def constant(value):
    return lambda draw: value


# ---------------------------------------------------------------------------------------------------------------
# Exit rules and caps
# ---------------------------------------------------------------------------------------------------------------


def test_uniform_is_one_round_of_n_all_kept():
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=4)
    selection = run_step(settings, [constant(1.0), lambda d: float(d % 2)])
    assert selection.rounds == 1
    assert [len(pool) for pool in selection.pools] == [4, 4]
    assert [result.kept for result in selection.prompts] == [(0, 1, 2, 3), (0, 1, 2, 3)]


def test_seq_balance_exits_when_both_quotas_met_and_caps_unmixed_prompts():
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=4, max_rounds=3
    )
    # prompt 0 mixed from the first round; 1 always right; 2 first positive only in round 2; 3 one positive per round
    selection = run_step(
        settings,
        [lambda d: float(d % 2), constant(1.0), lambda d: float(d >= 4), lambda d: float(d % 4 == 0)],
    )
    assert [len(pool) for pool in selection.pools] == [4, 12, 8, 8]
    assert selection.rounds_per_prompt == (1, 3, 2, 2)
    assert selection.active_after_round == (3, 1, 0)


def test_seq_pos_exits_on_first_positive_round():
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_pos", num_generations=4, round_size=4, max_rounds=4
    )
    selection = run_step(settings, [constant(0.0), lambda d: float(d == 9), constant(1.0)])
    assert [len(pool) for pool in selection.pools] == [16, 12, 4]
    assert settings.validated().positive_quota == 1


def test_pool_never_exits_below_update_group_size():
    # round_size 2 < n 4: even with both outcomes after one round the prompt must draw again
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_pos", num_generations=4, round_size=2, max_rounds=4
    )
    selection = run_step(settings, [lambda d: float(d % 2)])
    assert len(selection.pools[0]) == 4


def test_quota_counts_use_threshold_and_ignore_unscorable():
    settings = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler="seq_balance",
        num_generations=2,
        round_size=2,
        max_rounds=3,
        positive_threshold=0.7,
    )
    # 0.6 is not positive at threshold 0.7; NaN is neither positive nor negative
    selection = run_step(settings, [lambda d: [0.6, NAN, 0.9, 0.2, 0.8, 0.1][d]])
    assert len(selection.pools[0]) == 4  # round 1: one negative; round 2 adds a positive and a negative
    assert selection.prompts[0].pass_rate == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------------------------
# Downsampling
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pool", "positives", "negatives"),
    [
        ([1, 0, 0, 0, 0, 0, 0, 0], 1, 3),  # short on positives: keep all of them
        ([1, 1, 1, 1, 1, 1, 1, 0], 3, 1),  # short on negatives: top up from positives
        ([1, 1, 1, 0, 0, 0, 1, 0], 2, 2),
        ([0] * 8, 0, 4),
    ],
)
def test_balanced_downsample_counts(pool, positives, negatives):
    kept = rules.downsample([float(r) for r in pool], 4, "balanced", 0.5, random.Random(0))
    assert kept == sorted(kept) and len(set(kept)) == 4
    assert sum(pool[i] for i in kept) == positives
    assert sum(1 - pool[i] for i in kept) == negatives


@pytest.mark.parametrize("n", [3, 5, 7])
@pytest.mark.parametrize(
    ("pool_positives", "pool_negatives", "positives"),
    [(8, 8, None), (1, 8, 1), (8, 1, None)],  # None: n // 2, or n - 1 when negatives run short
)
def test_balanced_downsample_odd_n(n, pool_positives, pool_negatives, positives):
    pool = [1.0] * pool_positives + [0.0] * pool_negatives
    kept = rules.downsample(pool, n, "balanced", 0.5, random.Random(n))
    kept_positives = sum(pool[i] for i in kept)
    if positives is None:
        positives = n // 2 if pool_negatives >= n - n // 2 else n - pool_negatives
    assert len(set(kept)) == n and kept_positives == positives  # the extra slot of an odd n is a negative's


def test_balanced_downsample_uses_unscorable_last():
    pool = [NAN, 1.0, NAN, 0.0, 1.0]
    kept = rules.downsample(pool, 4, "balanced", 0.5, random.Random(0))
    assert sum(math.isnan(pool[i]) for i in kept) == 1


def test_balanced_downsample_is_uniform_within_a_side():
    # 2 positives out of 6: each positive index should be kept with probability 2/6 = 1/3
    pool = [1.0] * 6 + [0.0] * 6
    rng = random.Random(1)
    trials = 6000
    hits = [0] * 6
    for _ in range(trials):
        for i in rules.downsample(pool, 4, "balanced", 0.5, rng):
            if i < 6:
                hits[i] += 1
    tolerance = 4 * math.sqrt((1 / 3) * (2 / 3) / trials)  # four binomial standard errors
    for count in hits:
        assert abs(count / trials - 1 / 3) < tolerance


def test_kept_group_is_mixed_whenever_pool_is():
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=8, max_rounds=4
    )
    draws = random.Random(3)
    pass_rates = [draws.random() for _ in range(300)]
    selection = run_step(settings, [lambda d, p=p: float(draws.random() < p) for p in pass_rates])
    for pool, result in zip(selection.pools, selection.prompts):
        pool_mixed = 0 < sum(pool) < len(pool)
        kept = [pool[i] for i in result.kept]
        assert len(kept) == 4
        assert (0 < sum(kept) < 4) == pool_mixed


# ---------------------------------------------------------------------------------------------------------------
# Baseline, scale, weights, advantages
# ---------------------------------------------------------------------------------------------------------------


def test_pool_baseline_and_advantage():
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=8, max_rounds=1
    )
    pool = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]  # p̂ = 0.25
    selection = run_step(settings, [lambda d: pool[d]])
    result = selection.prompts[0]
    assert result.baseline == pytest.approx(0.25)
    assert result.scale is None
    kept = [pool[i] for i in result.kept]
    assert sorted(kept) == [0.0, 0.0, 1.0, 1.0]
    assert list(result.advantages) == pytest.approx([r - 0.25 for r in kept])


def test_group_baseline_and_group_scaling_match_trl_formula():
    settings = SamplerSettings(
        seed=0,
        sampler="seq_balance",
        num_generations=4,
        round_size=8,
        max_rounds=1,
        baseline="group",
        scale_rewards="group",
    )
    pool = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    result = run_step(settings, [lambda d: pool[d]]).prompts[0]
    kept = [pool[i] for i in result.kept]
    mean = sum(kept) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in kept) / 3)  # unbiased, as torch.std
    assert result.baseline == pytest.approx(0.5)
    assert list(result.advantages) == pytest.approx([(r - mean) / (std + 1e-4) for r in kept])


def test_batch_scaling_uses_std_of_all_kept_rewards():
    settings = SamplerSettings(seed=0, sampler="uniform", num_generations=2, scale_rewards="batch")
    selection = run_step(settings, [lambda d: [1.0, 0.0][d], constant(1.0)])
    batch_std = math.sqrt(sum((r - 0.75) ** 2 for r in [1, 0, 1, 1]) / 3)
    assert selection.prompts[0].scale == pytest.approx(batch_std)
    assert selection.prompts[0].advantages[0] == pytest.approx(0.5 / (batch_std + 1e-4))


@pytest.mark.parametrize(
    ("objective", "pass_rate", "expected"),
    [
        ("linear", 0.2, 1.0),
        ("log", 0.2, 5.0),
        ("log", 0.05, 10.0),
        ("log", 0.0, 10.0),
        ("power", 0.25, 0.5 * 0.25**-0.5),
    ],
)
def test_objective_weight(objective, pass_rate, expected):
    assert rules.objective_weight(pass_rate, objective, 0.5, 10.0) == pytest.approx(expected)


def test_log_weights_are_clipped_then_normalised_over_informative_prompts():
    settings = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler="seq_balance",
        num_generations=2,
        round_size=4,
        max_rounds=1,
        objective="log",
    )
    # p̂ = 1/4 (w 4), 1/2 (w 2), 0 (w clipped to 10, but no signal: excluded from the mean)
    pools = [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0], [0.0] * 4]
    selection = run_step(settings, [lambda d, p=p: p[d] for p in pools])
    weights = [r.weight for r in selection.prompts]
    assert weights[0] == pytest.approx(4 / 3) and weights[1] == pytest.approx(2 / 3)
    assert weights[2] == pytest.approx(10 / 3)
    assert all(a == 0.0 for a in selection.prompts[2].advantages)  # no signal stays no signal

    raw = run_step(
        SamplerSettings(
            **{
                "num_generations": 4,
                "scale_rewards": "none",
                "seed": 0,
                **{**settings.__dict__, "normalize_weights": False},
            }
        ),
        [lambda d, p=p: p[d] for p in pools],
    )
    assert [r.weight for r in raw.prompts] == pytest.approx([4.0, 2.0, 10.0])


def test_unscorable_completions_get_zero_advantage_and_stay_out_of_the_baseline():
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=4)
    pool = [1.0, NAN, 0.0, 0.0]
    result = run_step(settings, [lambda d: pool[d]]).prompts[0]
    assert result.baseline == pytest.approx(1 / 3)
    assert result.advantages[1] == 0.0


def test_zero_variance_uses_a_tolerance():
    assert rules.has_zero_variance([0.3, 0.3 + 1e-9, 0.3], 1e-6)
    assert not rules.has_zero_variance([0.3, 0.31, 0.3], 1e-6)


def test_seeded_determinism():
    settings = SamplerSettings(
        scale_rewards="none", sampler="seq_balance", num_generations=4, round_size=8, max_rounds=2, seed=7
    )
    pools = [[float(random.Random(i).random() < 0.5) for _ in range(16)] for i in range(20)]
    first = run_step(settings, [lambda d, p=p: p[d] for p in pools])
    second = run_step(settings, [lambda d, p=p: p[d] for p in pools])
    other = run_step(
        SamplerSettings(
            **{"num_generations": 4, "scale_rewards": "none", "seed": 0, **{**settings.__dict__, "seed": 8}}
        ),
        [lambda d, p=p: p[d] for p in pools],
    )
    assert first == second
    assert [r.kept for r in first.prompts] != [r.kept for r in other.prompts]


def test_step_protocol_errors():
    step = build_sampler(SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=2)).begin(1)
    requests = step.requests()
    with pytest.raises(RuntimeError):
        step.requests()
    with pytest.raises(ValueError):
        step.observe(requests, [1.0])
    with pytest.raises(RuntimeError):
        step.finish()


def test_sampler_state_round_trip():
    sampler = build_sampler(
        SamplerSettings(
            scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=8, max_rounds=1
        )
    )
    sampler.rng.random()
    state = sampler.state_dict()
    expected = [sampler.rng.random() for _ in range(3)]
    restored = build_sampler(sampler.settings)
    restored.load_state_dict(json.loads(json.dumps(state)))  # survives JSON (lists instead of tuples)
    assert [restored.rng.random() for _ in range(3)] == expected


# ---------------------------------------------------------------------------------------------------------------
# Settings validation
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampler": "seq_magic"}, "sampler='seq_magic' is not supported"),
        ({"sampler": "seq_balance", "est_mean_samples": 8}, "Remove est_mean_samples"),
        ({"num_generations": 8, "round_size": 2, "max_rounds": 3}, "round_size * max_rounds"),
        ({"positive_quota": 20, "negative_quota": 20}, "can never be reached"),
        ({"sampler": "seq_pos", "negative_quota": 2}, "Remove negative_quota"),
        ({"sampler": "uniform", "positive_quota": 1}, "Remove positive_quota"),
        ({"objective": "sqrt"}, "objective='sqrt' is not supported"),
        ({"power_alpha": 1.5}, "power_alpha"),
        ({"max_weight": 0.0}, "max_weight"),
        ({"positive_quota": 0}, "positive_quota must be at least 1"),
        ({"round_size": 0}, "round_size must be at least 1"),
    ],
)
def test_invalid_settings_raise_with_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace("(", r"\(").replace(")", r"\)")):
        SamplerSettings(**{"num_generations": 4, "scale_rewards": "none", "seed": 0, **kwargs}).validated()


@pytest.mark.parametrize(("n", "positives", "negatives"), [(2, 1, 1), (3, 1, 2), (5, 2, 3), (7, 3, 4), (8, 4, 4)])
def test_quota_defaults(n, positives, negatives):
    # Odd n: the extra slot is a negative's, exactly what a balanced group of n takes.
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="seq_balance", num_generations=n).validated()
    assert (settings.positive_quota, settings.negative_quota) == (positives, negatives)
    assert (
        SamplerSettings(scale_rewards="none", seed=0, sampler="seq_pos", num_generations=n).validated().positive_quota
        == 1
    )


# ---------------------------------------------------------------------------------------------------------------
# simulate against closed forms (the paper's setting: n=4, M=8, 4 rounds)
# ---------------------------------------------------------------------------------------------------------------


def binom_cdf_tails(draws, p, low, high):
    """P(K <= low) + P(K >= high) for K ~ Bin(draws, p)."""
    pmf = [math.comb(draws, k) * p**k * (1 - p) ** (draws - k) for k in range(draws + 1)]
    return sum(pmf[: low + 1]) + sum(pmf[high:])


def expected_rounds(continue_probabilities):
    """E[R] and Var[R] for R = 1 + #rounds continued, from P(R > t) for t = 1..R_max-1."""
    survival = [1.0, *continue_probabilities]  # P(R > t) for t = 0..
    mean = sum(survival)
    second = sum((2 * t + 1) * s for t, s in enumerate(survival))
    return mean, second - mean**2


TRIALS = 20_000


@pytest.mark.parametrize("p", [0.05, 0.1, 0.5, 0.9])
def test_simulate_seq_balance_matches_closed_form(p):
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=8, max_rounds=4
    )
    (result,) = simulate(settings, [p], trials=TRIALS, seed=11)
    # not exited after t rounds of 8: fewer than 2 positives or fewer than 2 negatives among 8t draws
    survival = [binom_cdf_tails(8 * t, p, 1, 8 * t - 1) for t in (1, 2, 3)]
    mean_rounds, var_rounds = expected_rounds(survival)
    assert result.mean_rounds == pytest.approx(mean_rounds, abs=4 * math.sqrt(var_rounds / TRIALS) + 1e-9)
    assert result.mean_samples == pytest.approx(8 * mean_rounds, abs=4 * 8 * math.sqrt(var_rounds / TRIALS) + 1e-9)
    mixed = 1 - p**32 - (1 - p) ** 32  # balanced downsampling keeps both outcomes whenever the pool has them
    assert result.mixed_share == pytest.approx(mixed, abs=4 * math.sqrt(mixed * (1 - mixed) / TRIALS) + 1e-3)


@pytest.mark.parametrize("p", [0.02, 0.1, 0.6])
def test_simulate_seq_pos_matches_closed_form(p):
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_pos", num_generations=4, round_size=8, max_rounds=4
    )
    (result,) = simulate(settings, [p], trials=TRIALS, seed=5)
    q = (1 - p) ** 8  # a round of 8 with no positive
    mean_rounds, var_rounds = expected_rounds([q, q**2, q**3])
    assert result.mean_samples == pytest.approx(8 * mean_rounds, abs=4 * 8 * math.sqrt(var_rounds / TRIALS) + 1e-9)
    # mixed: first round mixed, or a later round brings the first positive after all-negative rounds
    mixed = (1 - q - p**8) + sum(q**t * (1 - q) for t in (1, 2, 3))
    assert result.mixed_share == pytest.approx(mixed, abs=4 * math.sqrt(mixed * (1 - mixed) / TRIALS) + 1e-3)


@pytest.mark.parametrize("n", [3, 5, 7])
@pytest.mark.parametrize("p", [0.1, 0.8])
def test_simulate_seq_balance_odd_n_matches_closed_form(n, p):
    trials = 5000
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=n, round_size=8, max_rounds=4
    )
    positive_quota, negative_quota = n // 2, n - n // 2
    (result,) = simulate(settings, [p], trials=trials, seed=n)
    # not exited after t rounds of 8: fewer than n // 2 positives or fewer than n - n // 2 negatives among 8t draws
    survival = [binom_cdf_tails(8 * t, p, positive_quota - 1, 8 * t - negative_quota + 1) for t in (1, 2, 3)]
    mean_rounds, var_rounds = expected_rounds(survival)
    assert result.mean_rounds == pytest.approx(mean_rounds, abs=4 * math.sqrt(var_rounds / trials) + 1e-9)
    mixed = 1 - p**32 - (1 - p) ** 32
    assert result.mixed_share == pytest.approx(mixed, abs=4 * math.sqrt(mixed * (1 - mixed) / trials) + 1e-3)


@pytest.mark.parametrize("n", [3, 5, 7])
def test_exited_pools_fill_an_odd_balanced_group_without_top_up(n):
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=n, round_size=4, max_rounds=6
    )
    draws = random.Random(n)
    pass_rates = [draws.random() for _ in range(200)]
    selection = run_step(settings, [lambda d, p=p: float(draws.random() < p) for p in pass_rates])
    exited = 0
    for pool, result in zip(selection.pools, selection.prompts):
        kept = [pool[i] for i in result.kept]
        assert len(kept) == n
        if sum(pool) >= n // 2 and len(pool) - sum(pool) >= n - n // 2:  # the exit rule held
            exited += 1
            assert sum(kept) == n // 2
    assert exited > 100


def test_simulate_uniform_mixed_share_is_grpo_signal():
    (result,) = simulate(
        SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=8),
        [0.1],
        trials=TRIALS,
        seed=2,
    )
    mixed = 1 - 0.1**8 - 0.9**8  # 0.9^8 = 0.43 of the groups of 8 at p = 0.1 are all wrong
    assert result.mean_samples == 8 and result.mean_rounds == 1
    assert result.mixed_share == pytest.approx(mixed, abs=4 * math.sqrt(mixed * (1 - mixed) / TRIALS))


def test_simulate_is_seeded():
    settings = SamplerSettings(scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4)
    assert simulate(settings, [0.3], trials=500, seed=1) == simulate(settings, [0.3], trials=500, seed=1)


def test_cli_simulate_prints_one_json_object_per_pass_rate(capsys):
    code = cli_main(
        ["simulate", "--sampler", "seq_balance", "--num-generations", "4", "--pass-rates", "0.05", "0.5", "--trials"]
        + ["2000"]
    )
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [row["pass_rate"] for row in rows] == [0.05, 0.5]
    assert set(rows[0]) >= {"pass_rate", "mean_samples", "mean_rounds", "mixed_share"}
    assert rows[0]["mean_samples"] > rows[1]["mean_samples"]  # rare positives cost more rounds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-generations", "8", "--round-size", "2", "--max-rounds", "2"], "Raise round_size or max_rounds"),
        (["--sampler", "est", "--round-policy", "tracked"], "Use sampler='seq_pos' or 'seq_balance'"),
        (["--round-policy", "predictive", "--round-confidence", "1.5"], "round_confidence must lie in (0, 1)"),
        (["--sampler", "est", "--num-generations", "4", "--est-mean-samples", "6"], "est_mean_samples must be 4"),
    ],
)
def test_cli_simulate_rejects_bad_knobs_with_the_fix(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["simulate", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def cli_rows(capsys, argv):
    assert cli_main(["simulate", *argv]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]


def test_cli_simulate_tracked_round_policy_learns_over_steps(capsys):
    common = ["--pass-rates", "0.05", "0.2", "0.5", "0.8", "0.95", "--trials", "100", "--steps", "5", "--seed", "1"]
    common += ["--num-generations", "4"]
    fixed = cli_rows(capsys, common)
    tracked = cli_rows(capsys, [*common, "--round-policy", "tracked", "--round-confidence", "0.7"])
    # Seen 4 times before, a prompt's first request is sized from its tracked pass rate: most finish in one round,
    # where fixed rounds of 8 need about 3.4 rounds at p = 0.05 or 0.95.
    assert mean_of_rows(tracked, "mean_rounds") < 0.75 * mean_of_rows(fixed, "mean_rounds")


def test_cli_simulate_est_downsample_budget(capsys):
    rows = cli_rows(
        capsys,
        ["--sampler", "est", "--num-generations", "4", "--est-train-on", "downsample", "--est-mean-samples", "6"]
        + ["--steps", "3"]
        + ["--pass-rates", "0.05", "0.5", "0.95", "--trials", "50"],
    )
    assert mean_of_rows(rows, "mean_samples") == pytest.approx(6.0)  # N_total = round(150 * 6) over 150 prompts
    assert rows[0]["mean_samples"] > 6.0 > rows[2]["mean_samples"]  # the hard prompts get more


def mean_of_rows(rows, key):
    return sum(row[key] for row in rows) / len(rows)
