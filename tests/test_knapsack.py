"""
Knapsack-RL as a built-in sampler (`sampler="knapsack"`, issue 33 item 2): the allocation `allocate` against a
brute-force optimum, closed forms and properties; the sampler in `trl-ada simulate` and in the synchronous trainer.
"""

import itertools
import json
import math
import random
import time

import pytest
from conftest import tiny_args
from hypothesis import given
from hypothesis import strategies as st
from test_properties import examples

from trl_ada.experimental.knapsack import allocate, value
from trl_ada.samplers import SamplerSettings, build_sampler, sampler_names
from trl_ada.samplers.base import describe
from trl_ada.samplers.simulate import run_population


def brute_force(rates, budget, low, high, solved, unsolved):
    """The best total value over every allocation within the floors and caps that sums to the budget."""
    ranges = [[solved] if p == 1.0 else range(unsolved, high + 1) if p == 0.0 else range(low, high + 1) for p in rates]
    best = -math.inf
    for budgets in itertools.product(*ranges):
        if sum(budgets) == budget:
            best = max(best, math.fsum(value(p, k) for p, k in zip(rates, budgets)))
    return best


@pytest.mark.parametrize("seed", range(8))
def test_allocate_reaches_the_brute_force_optimum(seed):
    rng = random.Random(seed)
    count = rng.randint(2, 4)
    rates = [rng.choice([0.0, 1.0, rng.random(), rng.random(), round(rng.random(), 1)]) for _ in range(count)]
    low, high = 2, rng.randint(4, 7)
    solved = unsolved = 2
    mixed = sum(0.0 < p < 1.0 for p in rates)
    # Budgets up to what the mixed prompts and the unsolved ones can take (the solved ones stay at their budget).
    top = mixed * high + sum(p == 0.0 for p in rates) * high + sum(p == 1.0 for p in rates) * solved
    for budget in range(sum(solved if p == 1.0 else low for p in rates), top + 1):
        budgets = allocate(rates, budget, low, high, solved_draws=solved, unsolved_draws=unsolved)
        assert sum(budgets) == budget
        got = math.fsum(value(p, k) for p, k in zip(rates, budgets))
        assert got == pytest.approx(brute_force(rates, budget, low, high, solved, unsolved), rel=1e-12, abs=1e-15)


def test_allocate_closed_forms():
    # Equal pass rates: an even split, the extra draws to the lowest indices.
    assert allocate([0.3] * 4, 4 * 8 + 2, 2, 32) == [9, 9, 8, 8]
    # p = 1 and p = 0 get their fixed budgets; the mixed prompts share the rest.
    assert allocate([1.0, 0.0, 0.5, 0.5], 20, 2, 32, solved_draws=3, unsolved_draws=4) == [3, 4, 7, 6]
    # Mixed prompts at their cap: the leftover goes to the unsolved prompts evenly, then to the solved ones.
    assert allocate([0.5, 0.0, 0.0, 1.0], 4 + 4 + 4 + 2, 2, 4) == [4, 4, 4, 2]
    assert allocate([0.5, 0.0, 0.0, 1.0], 4 + 3 + 3 + 2, 2, 4) == [4, 3, 3, 2]
    assert allocate([0.5, 1.0], 8, 2, 4) == [4, 4]  # no unsolved prompt: the solved one takes what is left
    # A prompt near p = 1 is worth little (the factor (1-p)^2): it stays at its floor while p = 1/3 (the largest
    # p(1-p)^2) gets the most.
    budgets = allocate([0.95, 1 / 3, 0.6], 2 + 10 + 2, 2, 10)
    assert budgets[0] == 2 and budgets[1] > budgets[2] > 2


def test_allocate_names_the_fix_for_infeasible_input():
    with pytest.raises(ValueError, match=r"budget of 5 completions is below the floors.*= 6\. Raise the budget"):
        allocate([0.5, 0.0, 1.0], 5, 2, 8)
    with pytest.raises(ValueError, match=r"exceeds what 2 prompts can take at max_draws=4.*Raise max_draws"):
        allocate([0.5, 0.5], 9, 2, 4)
    with pytest.raises(ValueError, match=r"max_draws=3 is below a floor"):
        allocate([0.5], 3, 4, 3)
    with pytest.raises(ValueError, match=r"pass rates must lie in \[0, 1\], got nan"):
        allocate([0.5, math.nan], 4, 2, 4)


def test_allocate_is_fast_at_a_thousand_prompts():
    rng = random.Random(0)
    rates = [rng.choice([0.0, 1.0]) if rng.random() < 0.2 else rng.random() for _ in range(1024)]
    start = time.perf_counter()
    for high in (32, 1024 * 8):  # the default cap (4n) and no cap at all
        budgets = allocate(rates, 1024 * 8, 2, high)
        assert sum(budgets) == 1024 * 8
    assert time.perf_counter() - start < 1.0  # measured: ~2 ms each


@examples(60)
@given(
    rates=st.lists(
        st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0, allow_nan=False)), min_size=1, max_size=12
    ),
    low=st.integers(2, 4),
    extra=st.integers(0, 6),
    fixed=st.integers(2, 4),
    fill=st.floats(0.0, 1.0),
)
def test_allocate_properties(rates, low, extra, fixed, fill):
    high = max(low, fixed) + extra
    floors = [fixed if p in (0.0, 1.0) else low for p in rates]
    budget = sum(floors) + round(fill * (len(rates) * high - sum(floors)))
    budgets = allocate(rates, budget, low, high, solved_draws=fixed, unsolved_draws=fixed)
    assert sum(budgets) == budget
    assert all(floor <= b <= high for floor, b in zip(floors, budgets))
    mixed = [i for i, p in enumerate(rates) if 0.0 < p < 1.0]
    if any(budgets[i] > fixed for i, p in enumerate(rates) if p in (0.0, 1.0)):
        assert all(budgets[i] == high for i in mixed)  # the leftover rule: only once every mixed prompt is full
    if any(budgets[i] > fixed for i, p in enumerate(rates) if p == 1.0):
        assert all(budgets[i] == high for i, p in enumerate(rates) if p == 0.0)
    # no single draw moved between two mixed prompts raises the value (the optimum's exchange condition)
    for i, j in itertools.permutations(mixed, 2):
        if budgets[i] > low and budgets[j] < high:
            loss = value(rates[i], budgets[i]) - value(rates[i], budgets[i] - 1)
            gain = value(rates[j], budgets[j] + 1) - value(rates[j], budgets[j])
            assert gain <= loss + 1e-12
    # equal pass rates get budgets at most one apart
    for p in set(rates[i] for i in mixed):
        same = [budgets[i] for i in mixed if rates[i] == p]
        assert max(same) - min(same) <= 1


# ---------------------------------------------------------------------------------------------------------------------
# The sampler
# ---------------------------------------------------------------------------------------------------------------------


def test_knapsack_is_a_built_in_batch_level_sampler_with_its_own_checks():
    assert "knapsack" in sampler_names()
    settings = SamplerSettings(sampler="knapsack", num_generations=4)
    assert settings.rules_are_per_prompt is False
    assert settings.max_pool_size == 16
    assert "Knapsack-RL" in describe(settings) and "2509.25849" in describe(settings)
    for kwargs, message in [
        ({"min_draws": 1}, "min_draws=1: must be an integer of at least 2"),
        ({"draws_per_prompt": 6}, "so draws_per_prompt must be 4"),
        ({"train_on": "downsample"}, r"every floor must be at least 4; got \{'min_draws': 2"),
        ({"max_draws": 3}, "cannot meet"),
        ({"train_on": "some"}, "train_on='some' is not supported"),
    ]:
        with pytest.raises(ValueError, match=message):
            SamplerSettings(sampler="knapsack", num_generations=4, sampler_kwargs=kwargs).validated()
    with pytest.raises(ValueError, match="downsample='random' has no effect with sampler='knapsack'"):
        SamplerSettings(sampler="knapsack", downsample="random").validated()
    downsampled = SamplerSettings(
        sampler="knapsack",
        num_generations=4,
        downsample="random",
        sampler_kwargs={"train_on": "downsample", "min_draws": 4, "solved_draws": 4, "unsolved_draws": 4},
    )
    assert "downsampled (random) to 4" in describe(downsampled.validated())
    with pytest.raises(ValueError, match="dapo_refill=True"):
        SamplerSettings(sampler="knapsack", dapo_refill=True).validated()


def test_the_sampler_spends_the_fixed_budget_where_the_knapsack_says_and_resumes():
    settings = SamplerSettings(sampler="knapsack", num_generations=4, sampler_kwargs={"max_draws": 10})
    sampler = build_sampler(settings)
    population = [0.0, 1.0, 0.5, 0.2, 0.5, 0.9]
    first = run_population(sampler, population, seed=0, steps=1)
    assert [len(pool) for pool in first.pools] == [4] * 6  # first visits: num_generations each
    assert first.metrics["knapsack/first_visit_share"] == 1.0
    later = run_population(sampler, population, seed=1, steps=3)
    sizes = [len(pool) for pool in later.pools]
    assert sum(sizes) == 24 and sizes[0] == sizes[1] == 2  # never solved / always solved: the fixed budgets
    assert [len(result.kept) for result in later.prompts] == sizes  # train_on='all'
    assert max(sizes[2:]) > 4 and later.metrics["knapsack/unsolved_share"] == pytest.approx(1 / 6)
    # its memory of last visits and its tracker are training state, saved as JSON
    state = json.loads(json.dumps(sampler.state_dict()))
    resumed = build_sampler(settings)
    resumed.load_state_dict(state)
    keys = list(range(6))
    assert resumed.begin(6, keys).budgets == sampler.begin(6, keys).budgets


def test_simulate_runs_knapsack_by_name(capsys):
    from trl_ada.cli import main

    argv = ["simulate", "--num-generations", "4", "--pass-rates", "0.05", "0.5", "--trials", "100", "--steps", "3"]
    assert main([*argv, "--sampler", "knapsack"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1]["mean_samples"] > 4.0 > rows[0]["mean_samples"]  # the mixed prompt gets more than the hard one


def test_knapsack_trains_in_the_synchronous_trainer(tmp_path, tokenizer, arithmetic_dataset):
    from test_trainer_est_dapo import make_trainer

    from trl_ada import AdaGRPOConfig

    dataset = arithmetic_dataset.select(range(8))
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=3, per_device_train_batch_size=16, num_generations=4),
        sampler="knapsack",
        sampler_kwargs={"max_draws": 12},
    )
    trainer = make_trainer(config, tokenizer, dataset)
    trainer.train()
    for record, selection in zip(trainer.recorded, trainer.selections, strict=True):
        assert record["completion_ids"].shape[0] == 16  # static: B x n rows, whatever the budgets
        sizes = [len(result.kept) for result in selection.prompts]
        assert sum(sizes) == 16 and min(sizes) >= 2 and max(sizes) <= 12
        expected = [a for result in selection.prompts for a in result.advantages]
        assert record["advantages"].tolist() == pytest.approx(expected, abs=1e-6)
    # 4 prompts per step over 8: the third step revisits every prompt
    assert trainer.selections[-1].metrics["knapsack/first_visit_share"] == 0.0
    logged = [entry for entry in trainer.state.log_history if "ada/knapsack/first_visit_share" in entry]
    assert len(logged) == 3


def test_the_asynchronous_trainer_runs_knapsack_on_generation_batches_of_several_prompts(tmp_path):
    # Issue 32 item 11's batch: a rule over the batch (rules_are_per_prompt() False) gets several prompts per batch.
    pytest.importorskip("trl.experimental.async_grpo.async_rollout_worker")
    from accelerate.state import PartialState

    from trl_ada import AdaAsyncGRPOConfig
    from trl_ada.async_grpo.async_grpo_config import MIN_PROMPTS_PER_GENERATION_BATCH
    from trl_ada.async_grpo.async_grpo_trainer import async_sampling
    from trl_ada.samplers.streaming import begin_streaming

    PartialState()
    common = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", sampler="knapsack")
    sampling = async_sampling(AdaAsyncGRPOConfig(**common))  # TRL's defaults: 8 samples per step, n = 8
    assert sampling.prompts_per_batch == MIN_PROMPTS_PER_GENERATION_BATCH
    with pytest.raises(ValueError, match="prompts_per_generation_batch=1 with sampler='knapsack'"):
        AdaAsyncGRPOConfig(**common, prompts_per_generation_batch=1)
    # The worker's one-request step draws the knapsack's budgets; after a first visit they differ within a batch.
    sampler = build_sampler(sampling.settings)
    population = [0.0, 1.0] + [0.5] * (sampling.prompts_per_batch - 2)
    rng = random.Random(0)
    for _ in range(2):
        step = begin_streaming(sampler, len(population), list(range(len(population))))
        pairs = step.to_submit()
        for prompt, draw in pairs:
            step.complete(prompt, draw, 1.0 if rng.random() < population[prompt] else 0.0)
        selection = step.finish()
    sizes = [len(pool) for pool in selection.pools]
    assert sum(sizes) == 8 * len(population) and sizes[:2] == [2, 2] and max(sizes) > 8
