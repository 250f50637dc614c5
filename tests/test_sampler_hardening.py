"""Upgrading a plain `GRPOConfig` never rejects a config that `GRPOTrainer` accepts, and keeps every value set."""

import ast
import logging
import math
import random
import warnings
from dataclasses import fields
from pathlib import Path

import pytest
from trl import GRPOConfig

from trl_ada import AdaGRPOConfig
from trl_ada.samplers import SamplerSettings, build_sampler, rules
from trl_ada.samplers.tracker import DecayedBetaTracker

LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]

GRPO_VARIANTS = (
    [{"num_generations": n} for n in [*range(2, 10), 33, 64]]
    + [{"scale_rewards": value} for value in [True, False, "group", "batch", "none"]]  # TRL maps True / False
    + [{"multi_objective_aggregation": "normalize_then_sum"}]
    + [{"loss_type": loss_type} for loss_type in LOSS_TYPES]
    + [
        {"num_generations": 3, "steps_per_generation": 4},
        {"num_generations": 5, "generation_batch_size": 20},
        {"num_generations": 7, "scale_rewards": "batch", "loss_type": "dr_grpo", "seed": 11},
    ]
)


def grpo_config(tmp_path, **overrides):
    n = overrides.get("num_generations", 8)  # TRL's default
    return GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        bf16=False,
        per_device_train_batch_size=n,
        **overrides,
    )


@pytest.mark.parametrize("overrides", GRPO_VARIANTS, ids=lambda overrides: repr(overrides)[1:-1])
def test_every_grpo_config_upgrades_and_keeps_its_values(tmp_path, overrides):
    args = grpo_config(tmp_path, **overrides)
    before = {f.name: getattr(args, f.name) for f in fields(GRPOConfig)}
    upgraded = AdaGRPOConfig.from_grpo_config(args)
    assert {f.name: getattr(upgraded, f.name) for f in fields(GRPOConfig)} == before
    settings = upgraded.sampler_settings()  # what the trainer builds its sampler from
    assert settings.max_pool_size >= upgraded.num_generations


@pytest.mark.parametrize(("n", "round_size"), [(32, 8), (33, 9), (64, 16)])
def test_upgrade_widens_rounds_only_as_far_as_num_generations_needs(tmp_path, n, round_size):
    upgraded = AdaGRPOConfig.from_grpo_config(grpo_config(tmp_path, num_generations=n))
    assert (upgraded.sampler, upgraded.round_size, upgraded.max_rounds) == ("seq_balance", round_size, 4)
    assert (upgraded.positive_quota, upgraded.negative_quota) == (n // 2, n - n // 2)


def test_explicit_ada_config_still_rejects_a_cap_below_num_generations(tmp_path):
    with pytest.raises(ValueError, match="Raise round_size or max_rounds"):
        AdaGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            report_to="none",
            num_generations=64,
            per_device_train_batch_size=64,
        )


def test_normalize_then_sum_falls_back_to_uniform_with_a_warning(tmp_path, caplog):
    args = grpo_config(tmp_path, num_generations=4, multi_objective_aggregation="normalize_then_sum")
    with caplog.at_level(logging.WARNING, logger="trl_ada.config"):
        upgraded = AdaGRPOConfig.from_grpo_config(args)
    assert upgraded.sampler == "uniform"
    assert "pool baseline" in caplog.text and "sampler='uniform'" in caplog.text
    with pytest.raises(ValueError, match="sum_then_normalize"):  # asked for explicitly, the combination still fails
        AdaGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, report_to="none", multi_objective_aggregation="normalize_then_sum"
        )


# ---------------------------------------------------------------------------------------------------------------------
# Masked (truncated) completions: neither side of the exit rule, kept last, still in the baseline
# ---------------------------------------------------------------------------------------------------------------------


def test_masked_completions_do_not_satisfy_the_exit_rule():
    sampler = build_sampler(
        SamplerSettings(
            scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=4, max_rounds=3
        )
    )
    step = sampler.begin(1)
    requests = step.requests()
    # Two positives and two negatives, but both negatives were cut off: only the positives count.
    step.observe(requests, [1.0, 0.0, 1.0, 0.0], masked=[False, True, False, True])
    assert step.outcomes == [(2, 0)]
    assert step.requests() == [(0, 4)]  # still active: it needs two complete negatives


@pytest.mark.parametrize("mode", ["balanced", "random"])
def test_masked_completions_are_kept_only_when_nothing_else_fills_the_group(mode):
    rewards = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    for seed in range(50):
        kept = rules.downsample(rewards, 4, mode, 0.5, random.Random(seed), excluded={0, 1})
        assert not {0, 1} & set(kept)  # four complete completions are enough
        kept = rules.downsample(rewards, 4, mode, 0.5, random.Random(seed), excluded={0, 1, 2})
        assert {3, 4, 5} <= set(kept) and len(set(kept) & {0, 1, 2}) == 1


def test_masked_completions_stay_in_the_pool_baseline():
    sampler = build_sampler(SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=4))
    step = sampler.begin(1)
    step.observe(step.requests(), [1.0, 0.0, 0.0, 0.0], masked=[False, False, False, True])
    (result,) = step.finish().prompts
    assert result.baseline == pytest.approx(0.25)  # every draw of the policy, as TRL's group mean
    assert result.pass_rate == pytest.approx(1 / 3)  # outcomes count complete completions only


# ---------------------------------------------------------------------------------------------------------------------
# Unscorable prompts (every reward function returned None): they fill their group and exit, never draw to the cap
# ---------------------------------------------------------------------------------------------------------------------

NAN = float("nan")


@pytest.mark.parametrize("policy", ["fixed", "predictive", "tracked"])
def test_a_prompt_with_only_unscorable_draws_exits_after_its_first_round(policy):
    sampler = build_sampler(
        SamplerSettings(
            scale_rewards="none",
            seed=0,
            sampler="seq_balance",
            num_generations=4,
            round_size=8,
            max_rounds=4,
            round_policy=policy,
        )
    )
    step = sampler.begin(2, ["unscorable", "scored"])
    requests = step.requests()
    sizes = dict(requests)
    step.observe(requests, [NAN] * sizes[0] + [0.0] * sizes[1])
    assert [index for index, _ in step.requests()] == [1]  # the all-None prompt is done; the all-wrong one goes on


def test_an_unscorable_prompt_still_fills_its_update_group():
    # round_size 2 < n = 4: it draws exactly the 2 its group still lacks, then stops (not the cap of 8)
    sampler = build_sampler(
        SamplerSettings(
            scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=2, max_rounds=4
        )
    )
    step = sampler.begin(1)
    while requests := step.requests():
        step.observe(requests, [NAN] * sum(count for _, count in requests))
    selection = step.finish()
    assert len(selection.pools[0]) == 4 and selection.rounds == 2
    assert selection.prompts[0].advantages == (0.0,) * 4
    assert selection.metrics["unscorable_share"] == 1.0


def test_a_partly_scored_prompt_keeps_drawing():
    sampler = build_sampler(
        SamplerSettings(
            scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=4, max_rounds=4
        )
    )
    step = sampler.begin(1)
    step.observe(step.requests(), [NAN, NAN, NAN, 0.0])
    assert step.requests() == [(0, 4)]  # one scored negative: it still looks for positives


def test_the_continuous_schedule_stops_an_unscorable_prompt_too():
    sampler = build_sampler(
        SamplerSettings(
            scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=8, max_rounds=4
        )
    )
    step = sampler.begin_continuous(1)
    for prompt, draw in step.to_submit():
        step.complete(prompt, draw, NAN)
    assert step.done and step.to_submit() == []
    assert len(step.finish().pools[0]) == 8


# ---------------------------------------------------------------------------------------------------------------------
# Weight clips are finite: an infinite max_weight made NaN advantages (issue 32, item 18)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0])
@pytest.mark.parametrize("name", ["max_weight", "est_epsilon"])
def test_weight_clips_must_be_positive_and_finite(tmp_path, name, value):
    sampler = "est" if name == "est_epsilon" else "seq_balance"
    with pytest.raises(ValueError, match=f"{name} must be a positive finite number"):
        SamplerSettings(sampler=sampler, **{name: value}).validated()
    with pytest.raises(ValueError, match=f"{name} must be a positive finite number"):  # at config time, too
        AdaGRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", sampler=sampler, **{name: value})


def test_the_largest_finite_max_weight_keeps_advantages_finite():
    # A graded reward below the threshold (p̂ = 0, yet a signal) under the log objective: its weight is the clip.
    settings = SamplerSettings(
        sampler="seq_balance",
        objective="log",
        max_weight=1e300,
        num_generations=4,
        round_size=4,
        max_rounds=1,
        positive_quota=1,
        negative_quota=1,
        scale_rewards="none",
    )
    step = build_sampler(settings.validated()).begin(2)
    step.observe(step.requests(), [0.1, 0.3, 0.2, 0.4, 1.0, 0.0, 1.0, 0.0])
    hard, mixed = step.finish().prompts
    assert all(math.isfinite(a) for a in hard.advantages + mixed.advantages)
    assert hard.weight > 1.0 and mixed.weight > 0.0  # the other prompt keeps a (small) weight


# ---------------------------------------------------------------------------------------------------------------------
# A custom estimator's Beta parameters are checked where the round policies read them (issue 32, item 21)
# ---------------------------------------------------------------------------------------------------------------------


class BadPriorEstimator(DecayedBetaTracker):
    """A custom estimator whose Beta parameters are `parameters`, whatever the keys (alpha = 0: the report's case)."""

    def __init__(self, parameters):
        super().__init__(decay=0.9, prior_alpha=1.0, prior_beta=1.0)
        self.parameters = parameters

    def beta_parameters(self, keys):
        return list(self.parameters)

    prior_parameters = beta_parameters


@pytest.mark.parametrize(
    ("policy", "parameters", "message"),
    [
        ("tracked", [(0.0, 1.0)], r"BadPriorEstimator\.beta_parameters returned \(alpha, beta\) = \(0\.0, 1\.0\)"),
        ("predictive", [(0.0, 1.0)], r"BadPriorEstimator\.prior_parameters returned \(alpha, beta\) = \(0\.0, 1\.0\)"),
        ("tracked", [(math.inf, 1.0)], r"\(alpha, beta\) = \(inf, 1\.0\) for prompt 'prompt'"),
        ("tracked", [(1.0, math.nan)], r"\(alpha, beta\) = \(1\.0, nan\)"),
        ("tracked", [], r"returned 0 \(alpha, beta\) pairs for 1 prompts"),
    ],
)
def test_round_policies_check_an_estimators_beta_parameters(policy, parameters, message):
    settings = SamplerSettings(sampler="seq_pos", num_generations=4, round_policy=policy, scale_rewards="none")
    sampler = build_sampler(settings, estimator=BadPriorEstimator(parameters))
    with pytest.raises(ValueError, match=message):
        step = sampler.begin(1, ["prompt"])
        step.requests()  # before the fix: "math domain error" here (alpha = 0), or NaN requests


def test_est_names_the_estimator_that_returned_a_bad_estimate():
    class Certain(DecayedBetaTracker):
        def estimate(self, keys):
            return [1.0 for _ in keys]

    sampler = build_sampler(SamplerSettings(sampler="est", num_generations=4), estimator=Certain(0.9, 1.0, 1.0))
    with pytest.raises(ValueError, match=r"Certain\.estimate returned 1\.0 for prompt 'a'; estimates must lie"):
        sampler.begin(1, ["a"])


# ---------------------------------------------------------------------------------------------------------------------
# Metric names: TRL's asynchronous trainer reduces a metric by the words of its name (issue 32, item 20)
# ---------------------------------------------------------------------------------------------------------------------

PACKAGE = Path(__file__).resolve().parents[1] / "trl_ada"

SAMPLER_CONFIGS = [
    {"sampler": "uniform"},
    {"sampler": "seq_pos", "dapo_refill": True},
    {"sampler": "seq_balance", "round_policy": "predictive", "objective": "log"},
    {"sampler": "seq_balance", "round_policy": "tracked", "skip_unmixed_above": 0.5},
    {"sampler": "seq_pos", "round_policy": "tracked", "pass_rate_predictor": "learned", "skip_unmixed_above": 0.5},
    {"sampler": "est"},
    {"sampler": "est", "pass_rate_predictor": "learned", "skip_unmixed_above": 0.5, "est_train_on": "downsample"},
    {"sampler": "dapo"},
]


def metric_names_from_runs():
    """Every metric the samplers, the schedules' records and DAPO's filling report for a few short pure runs."""
    from trl_ada.samplers.dapo import BatchFiller
    from trl_ada.samplers.simulate import run_population
    from trl_ada.samplers.streaming import ScheduleStats

    population = [0.0, 0.05, 0.5, 0.95, 1.0, 0.3]
    names = set()
    for config in SAMPLER_CONFIGS:
        sampler = build_sampler(SamplerSettings(num_generations=4, **config))
        schedules = ["rounds", "continuous"] if config["sampler"].startswith("seq_") else ["rounds"]
        for schedule in schedules:
            selection = run_population(sampler, population, seed=0, steps=3, schedule=schedule)
            names |= set(selection.metrics)
            filler = BatchFiller(len(population))
            filler.add(selection)
            filler.take(keep_partial=True)
            names |= set(filler.metrics())
    names |= set(ScheduleStats(round_seconds=[0.1, 0.2]).metrics()) | set(ScheduleStats().metrics())
    return {f"ada/{name}" for name in names}


def metric_names_from_the_code():
    """Metric names written as literals anywhere in trl_ada: `...metrics["name"]`, the keys of a dict given to a
    `...metrics(...)` call (`_push_metrics({...})`, `metrics.update({...})`) and any `"ada/..."` dict key."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Subscript) and _called(node.value).endswith("metrics"):
                if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                    names.add(node.slice.value)
            elif isinstance(node, ast.Call) and "metrics" in _called(node.func) + _called(
                getattr(node.func, "value", None)
            ):
                for argument in node.args:
                    if isinstance(argument, ast.Dict):
                        names |= {
                            k.value for k in argument.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                        }
            elif isinstance(node, ast.Dict):
                names |= {
                    k.value
                    for k in node.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.startswith("ada/")
                }
    return names


def _called(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def trl_reduction(name):
    """What TRL's asynchronous trainer does to a logging window of `name`'s values (its own `_reduce_metric`)."""
    with warnings.catch_warnings():  # TRL warns on any import from trl.experimental
        warnings.simplefilter("ignore")
        from trl.experimental.async_grpo.async_grpo_trainer import _reduce_metric

    reduced = _reduce_metric(name, [1.0, 2.0, 4.0])
    return {7 / 3: "mean", 4.0: "max", 1.0: "min", 7.0: "sum"}[reduced]


def test_every_logged_metric_is_reduced_as_it_means_by_trls_rule():
    from trl_ada.reporting.metrics import LOG_WINDOW_REDUCTIONS, log_window_reduction

    from_runs, from_code = metric_names_from_runs(), metric_names_from_the_code()
    names = {name if name.startswith(("ada/", "sample/")) else f"ada/{name}" for name in from_runs | from_code}
    assert {"ada/samples_per_prompt/mean", "ada/est/tracked_prompts", "ada/skip/share", "ada/dapo/dropped_groups"} <= (
        from_runs
    )
    assert {"ada/async/pool_version_span_max", "ada/dapo/groups_total", "ada/unscorable_share"} <= names
    misread = {name: (trl_reduction(name), log_window_reduction(name)) for name in sorted(names)}
    misread = {name: pair for name, pair in misread.items() if pair[0] != pair[1]}
    assert not misread, f"TRL reduces these by their name, not as they mean: {misread} (TRL's, meant)"
    # the table names only metrics that exist
    assert {f"ada/{name}" for name in LOG_WINDOW_REDUCTIONS} - {"ada/sample/dropped_stale_total"} <= names


@pytest.mark.parametrize("steps", [0, -1])
def test_run_population_refuses_fewer_than_one_step(steps):
    # Before any draw, with a message that names the knob, as `simulate` and `plan` refuse it.
    from trl_ada.samplers.simulate import run_population

    sampler = build_sampler(SamplerSettings(num_generations=4, sampler="uniform"))
    with pytest.raises(ValueError, match="steps must be at least 1"):
        run_population(sampler, [0.5, 0.5], seed=0, steps=steps)
