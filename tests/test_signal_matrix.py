"""
The signal-integrity matrix: for the accepted combinations of every setting that changes an advantage (sampler x
baseline x scale_rewards x normalize_advantages x objective x train_on x DAPO refills, with
steps_per_generation, the zero-variance boundary and the loss's normaliser), the advantages in the batch TRL trains on
are the sampler's and obey what their definitions imply (tests/signal_matrix.py says which checks). The trainer runs
a set of combinations that holds every accepted pair of values (a pairwise covering set: the combinations are too
many to train); two processes run a fixed few; the asynchronous worker is checked against the same expectations.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
from pathlib import Path

import pytest
from conftest import launch_two_processes, starts_low_digit
from signal_matrix import AXES, RUN_AXES, accepted_combinations, check_update, check_updates, run_combination
from trl import GRPOConfig

from trl_ada import AdaGRPOConfig
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.settings import TRL_OWNED_KNOBS
from trl_ada.samplers.signal import ADVANTAGE_SETTINGS, DRAW_SETTINGS, grpo_rule_holds, trl_advantages_stand_in
from trl_ada.tasks.arithmetic import make_dataset


def _pairs(case: dict) -> set:
    return set(itertools.combinations(sorted((key, repr(value)) for key, value in case.items()), 2))


@functools.cache
def covering_cases() -> list[dict]:
    """A small set of (combination + run settings) that holds every accepted pair of values, chosen greedily."""
    runs = [dict(zip(RUN_AXES, values, strict=True)) for values in itertools.product(*RUN_AXES.values())]
    cases = [{**dict(combination), **run} for combination in accepted_combinations() for run in runs]
    needed = set().union(*(_pairs(case) for case in cases))
    chosen = []
    while needed:
        best = max(cases, key=lambda case: len(_pairs(case) & needed))
        chosen.append(best)
        needed -= _pairs(best)
    return chosen


def case_id(case: dict) -> str:
    return "-".join(str(value) for value in case.values())


def split(case: dict) -> tuple[dict, dict]:
    return {k: case[k] for k in AXES}, {k: case[k] for k in RUN_AXES}


@pytest.fixture(scope="module")
def small_dataset():
    # Four prompts, each four times: every prompt comes back within a few steps, so remembered baselines
    # have history, and DAPO's refills still find rows to draw.
    from datasets import concatenate_datasets

    return concatenate_datasets([make_dataset(4, seed=0)] * 4)


@pytest.mark.parametrize("case", covering_cases(), ids=case_id)
def test_what_trl_trains_is_what_the_sampler_computed(tmp_path, tokenizer, small_dataset, case):
    combination, run = split(case)
    trainer = run_combination(combination, run, str(tmp_path), tokenizer, small_dataset, starts_low_digit)
    check_updates(trainer)
    # The trained batch's statistics are logged once per generation batch, so that a blow-up shows on the first step.
    logged = [entry for entry in trainer.state.log_history if "ada/advantages/abs_max" in entry]
    assert len(logged) == len(trainer.updates)
    assert max(entry["ada/advantages/abs_max"] for entry in logged) == pytest.approx(
        max(float(update["trained"].abs().max()) for update in trainer.updates), rel=1e-5
    )


def test_the_covering_set_holds_every_value_of_every_axis():
    cases = covering_cases()
    for axis, values in {**AXES, **RUN_AXES}.items():
        accepted = {dict(c)[axis] for c in accepted_combinations()} if axis in AXES else set(values)
        assert {case[axis] for case in cases} == accepted, axis


def test_every_knob_that_can_change_an_advantage_is_in_the_decision():
    """A knob trl-ada adds is either one the decision reads (`ADVANTAGE_SETTINGS`) or one that changes only what is
    drawn (`DRAW_SETTINGS`); a new knob in neither fails here, so it cannot bypass the decision."""
    added = {f.name for f in dataclasses.fields(AdaGRPOConfig)} - {f.name for f in dataclasses.fields(GRPOConfig)}
    knobs = added | TRL_OWNED_KNOBS
    assert not set(ADVANTAGE_SETTINGS) & DRAW_SETTINGS
    assert knobs <= set(ADVANTAGE_SETTINGS) | DRAW_SETTINGS, sorted(knobs - set(ADVANTAGE_SETTINGS) - DRAW_SETTINGS)


def test_trl_stands_in_only_where_its_advantages_are_the_samplers():
    """The per-update decision reads the values: each setting off GRPO's rule, or one advantage off GRPO's, is enough
    to hand TRL the sampler's advantages."""
    settings = SamplerSettings(sampler="uniform", num_generations=4, seed=0).validated()
    rewards = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]]
    grpo = [[0.75, -0.25, -0.25, -0.25], [0.25, 0.25, -0.75, 0.25]]  # r - mean; each group's std is 0.5
    grpo = [[a / (0.5 + 1e-4) for a in group] for group in grpo]
    assert trl_advantages_stand_in(settings, "downsample", rewards, grpo)
    off = [list(grpo[0]), [*grpo[1][:3], grpo[1][3] * 1.01]]
    assert not trl_advantages_stand_in(settings, "downsample", rewards, off)
    assert not trl_advantages_stand_in(settings, "downsample", [rewards[0][:3], rewards[1]], grpo)  # 3 rows: not n
    for knobs in (
        {"baseline": "tracked", "scale_rewards": "none"},
        {"normalize_advantages": True, "scale_rewards": "none"},
        {"objective": "log"},
        {"max_weight": 0.5},
    ):
        changed = dataclasses.replace(settings, **knobs)
        assert not grpo_rule_holds(changed)
        assert not trl_advantages_stand_in(changed, "downsample", rewards, grpo)
    assert not grpo_rule_holds(settings, "pool")


def test_the_asynchronous_worker_decides_with_the_same_rule():
    """The asynchronous worker queues TRL's own advantages only where the synchronous decision would let them stand
    in (and its own worker can compute them: pools no larger than the group, group scaling, rules per prompt)."""
    pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
    from trl_ada.async_grpo.rollout import AsyncSampling

    for combination in map(dict, accepted_combinations()):
        if combination["train_on"] == "pool" or combination["dapo_refill"] is not None:
            continue
        knobs = {k: v for k, v in combination.items() if k not in ("train_on", "dapo_refill")}
        try:
            settings = SamplerSettings(num_generations=4, seed=0, **knobs).validated()
            sampling = AsyncSampling(settings, prompts_per_batch=4)
        except ValueError:
            continue
        if sampling.trl_advantages:
            assert grpo_rule_holds(settings) and settings.max_pool_size <= 4, combination


TWO_PROCESS_SCRIPT = Path(__file__).parent / "signal_matrix_run.py"


@pytest.mark.slow
def test_two_processes_train_what_the_sampler_computed(tmp_path):
    """The matrix's checks on two gloo processes (tests/signal_matrix_run.py), each rank's run checked there."""
    reports = launch_two_processes(TWO_PROCESS_SCRIPT, tmp_path, timeout=480)
    for rank, report in enumerate(reports):
        assert report["process_index"] == rank and report["num_processes"] == 2
        assert report["failures"] == {}, report["failures"]
        assert report["checked"] == report["cases"] > 0
    assert reports[0]["trained"] == reports[1]["trained"]  # both ranks saw one gathered batch


# -- The asynchronous worker, against the same expectations ----------------------------------------------------------

ASYNC_CASES = [
    {"sampler": "spo", "baseline": "tracked", "scale_rewards": "none", "normalize_advantages": True},
    {"sampler": "dapo", "baseline": "tracked", "scale_rewards": "none"},
    {
        "sampler": "seq_balance",
        "normalize_advantages": True,
        "scale_rewards": "none",
        "round_size": 2,
        "max_rounds": 4,
    },
    {"sampler": "seq_balance", "objective": "log", "round_size": 2, "max_rounds": 4},
    {"sampler": "uniform", "baseline": "group", "objective": "log", "scale_rewards": "batch"},
    {"sampler": "est", "est_max_samples": 8},
]


@pytest.mark.parametrize("knobs", ASYNC_CASES, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_the_asynchronous_worker_trains_what_the_sampler_computed(tokenizer, knobs):
    pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
    import torch
    from test_async_rollout import NUM_PROMPTS, by_prompt, drive_one_batch, make_loop

    settings = SamplerSettings(num_generations=4, seed=3, **knobs).validated()
    loop = make_loop(settings, NUM_PROMPTS, tokenizer)
    assert loop.ada_sampling.pooled  # every one of these is off GRPO's rule: the worker computes the advantages
    config = dataclasses.replace(settings)
    config.train_on, config.loss_type = "downsample", "grpo"
    unmixed_with_signal = 0
    for batch in range(3):  # later batches revisit every prompt: remembered baselines have history
        samples, _ = drive_one_batch(loop, seed=batch)
        prompts = by_prompt(samples)
        rewards = [reward for prompt in sorted(prompts) for _, reward, _, _, _ in prompts[prompt]]
        advantages = [advantage for prompt in sorted(prompts) for _, _, advantage, _, _ in prompts[prompt]]
        update = {
            "trained": torch.tensor(advantages, dtype=torch.float64),
            "sampler": torch.tensor(advantages, dtype=torch.float64),
            "shares": None,
            "rewards": torch.tensor(rewards, dtype=torch.float64),
            "group_sizes": [len(prompts[prompt]) for prompt in sorted(prompts)],
        }
        unmixed_with_signal += check_update(update, config)
        # What the worker queued for training is logged, as the synchronous trainer logs its trained batch.
        pushed = {}
        while not loop._metrics_queue.empty():
            pushed.update(loop._metrics_queue.get_nowait())
        assert pushed["ada/advantages/abs_max"] == pytest.approx(max(abs(a) for a in advantages))
    if settings.baseline == "tracked":
        assert unmixed_with_signal > 0


# -- Refusals that keep the signal sound ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", ["group", "batch"])
@pytest.mark.parametrize("baseline", ["tracked", "predicted"])
def test_a_remembered_baseline_refuses_a_std_it_could_divide_by_zero(scale, baseline):
    extra = {"pass_rate_predictor": "learned"} if baseline == "predicted" else {}
    settings = SamplerSettings(
        sampler="seq_balance", num_generations=4, baseline=baseline, scale_rewards=scale, **extra
    )
    with pytest.raises(ValueError, match="needs scale_rewards='none'") as error:
        settings.validated()
    assert "scale_rewards='batch' or" not in str(error.value)  # it recommends only what trains correctly


def test_a_predicted_baseline_names_every_missing_companion_at_once():
    with pytest.raises(ValueError) as error:
        SamplerSettings(sampler="dapo", num_generations=4, baseline="predicted").validated()
    assert "scale_rewards='none'" in str(error.value) and "pass_rate_predictor='learned'" in str(error.value)


def test_a_remembered_baseline_remembers_the_mean_reward_and_refuses_rewards_outside_0_1():
    sampler = build_sampler(
        SamplerSettings(sampler="dapo", num_generations=4, baseline="tracked", scale_rewards="none", seed=0)
    )

    def run(rewards):
        step = sampler.begin(1, ["x"])
        step.observe(step.requests(), rewards)
        return step.finish().prompts[0]

    run([0.5, 0.0, 0.5, 0.0])  # mean reward 0.25 (the pass rate at the default threshold would read 0)
    second = run([0.5, 0.5, 0.5, 0.5])
    # Beta(1, 1) prior plus 4 draws summing to 1.0: (1 + 1) / (4 + 2).
    assert second.baseline == pytest.approx(2 / 6)
    assert second.advantages == pytest.approx([0.5 - 2 / 6] * 4)
    with pytest.raises(ValueError, match=r"rewards in \[0, 1\]"):
        run([2.0, 0.0, 2.0, 0.0])


def test_spo_normalisation_centres_and_scales_the_update_and_is_bounded():
    """SPO's batch normalisation is `(A - mean A) / (std A + eps)`: nearly equal remembered pass rates on an all-wrong
    batch give advantages of size about 1 with both signs, never thousands."""
    sampler = build_sampler(
        SamplerSettings(
            sampler="spo", num_generations=2, baseline="tracked", scale_rewards="none", normalize_advantages=True
        )
    )
    sampler.baseline_history.counts = {"a": (8.0, 2.0), "b": (8.0, 2.003)}
    step = sampler.begin(2, ["a", "b"])
    step.observe(step.requests(), [0.0, 0.0, 0.0, 0.0])
    advantages = [a for result in step.finish().prompts for a in result.advantages]
    assert sum(advantages) == pytest.approx(0.0, abs=1e-9)
    n = len(advantages)
    assert max(abs(a) for a in advantages) <= (n - 1) / math.sqrt(n)
    assert {math.copysign(1, a) for a in advantages} == {-1.0, 1.0}


def test_the_pool_step_factor_gives_the_downsampled_rules_expected_gradient():
    """`train_on="pool"` with the step factor: for a row-normalised loss the update is exactly the expectation of the
    downsampled rule's over every group the balanced downsampling could keep (enumerated), for random per-row
    gradients; for a token-normalised one, a ratio of expectations (within a few percent on this pool)."""
    from trl_ada.samplers import rules

    rng = random.Random(0)
    pool = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    baseline = sum(pool) / len(pool)
    positives = [i for i, r in enumerate(pool) if r > 0.5]
    negatives = [i for i, r in enumerate(pool) if r <= 0.5]
    groups = [p + q for p in itertools.combinations(positives, 2) for q in itertools.combinations(negatives, 2)]
    gradients = [rng.gauss(0.0, 1.0) for _ in pool]
    tokens = [rng.randint(1, 6) for _ in pool]
    group = groups[0]
    shares = rules.outcome_shares(pool, group, 0.5)
    for normaliser, sizes in (("rows", [1] * len(pool)), ("tokens", tokens)):
        expected = sum(
            sum((pool[i] - baseline) * gradients[i] * (1 if normaliser == "rows" else tokens[i]) for i in g)
            / sum(sizes[i] for i in g)
            for g in groups
        ) / len(groups)
        factor = rules.pool_step_scale(sum(sizes), sum(s * c for s, c in zip(shares, sizes)))
        pooled = (
            factor
            * sum(
                s * (r - baseline) * g * (1 if normaliser == "rows" else c)
                for s, r, g, c in zip(shares, pool, gradients, tokens)
            )
            / sum(sizes)
        )
        if normaliser == "rows":
            assert pooled == pytest.approx(expected, rel=1e-12)
        else:
            assert pooled == pytest.approx(expected, rel=0.1)


def test_normalize_then_sum_is_refused_where_the_samplers_advantages_would_replace_trls():
    common = dict(output_dir="outputs/nts", use_cpu=True, bf16=False, report_to="none", num_generations=4)
    AdaGRPOConfig(**common, sampler="uniform", multi_objective_aggregation="normalize_then_sum")  # TRL's stands
    for knobs in ({"baseline": "tracked", "scale_rewards": "none"}, {"objective": "log"}):
        with pytest.raises(ValueError, match="normalize_then_sum"):
            AdaGRPOConfig(**common, sampler="uniform", multi_objective_aggregation="normalize_then_sum", **knobs)


def test_rewards_outside_0_1_stop_a_remembered_baseline_through_the_trainer(tmp_path, tokenizer, small_dataset):
    def two_or_zero(completions, **kwargs):
        return [2.0 * r for r in starts_low_digit(completions)]

    combination = {"sampler": "dapo", "baseline": "tracked", "scale_rewards": "none"}
    with pytest.raises(ValueError, match=r"rewards in \[0, 1\]"):
        run_combination(combination, {}, str(tmp_path), tokenizer, small_dataset, two_or_zero)
