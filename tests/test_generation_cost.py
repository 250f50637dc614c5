"""Correctness of `benchmarks/generation_cost.py` (the engine model and its schedules); no timing asserts."""

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from trl_ada.samplers import SamplerSettings, build_sampler

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "generation_cost.py"


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("generation_cost_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


bench = _load_benchmark()

LINEAR = bench.LinearCost(a=1e-3, b=2e-4, c=1e-6, d=5e-6)
ROOMY = bench.EngineLimits(max_num_seqs=1024, max_num_batched_tokens=100_000, kv_capacity_tokens=10**9)


def _small_setup(cost=None, engines=2, prompts=24, **workload):
    return bench.Setup(
        cost=cost or bench.RooflineCost(),
        engines=engines,
        batch_prompts=prompts,
        workload=bench.Workload(mean_completion_tokens=80.0, max_response_tokens=256, **workload),
    )


def _request(cluster, prompt=0, draw=0, prompt_tokens=10, length=5):
    return cluster.new_request(prompt, draw, prompt_tokens, length, 0.0)


def test_single_request_time_is_the_closed_form():
    # Iteration 1 prefills the prompt (context P) and emits token 1; iteration k (2..L) decodes over P + k - 1.
    prompt_tokens, length = 100, 50
    engine = bench.Engine(LINEAR, ROOMY)
    cluster = bench.Cluster(LINEAR, ROOMY, 1)
    engine.submit(_request(cluster, prompt_tokens=prompt_tokens, length=length))
    elapsed = engine.run_to_completion()
    a, b, c, d = LINEAR.a, LINEAR.b, LINEAR.c, LINEAR.d
    expected = length * (a + b) + c * (length * prompt_tokens + length * (length - 1) / 2) + d * prompt_tokens
    assert elapsed == pytest.approx(expected, rel=1e-12)
    assert engine.decoded_tokens == length and engine.iterations == length


def test_roofline_single_request_is_the_closed_form():
    cost = bench.RooflineCost()
    engine = bench.Engine(cost, ROOMY)
    engine.submit(_request(bench.Cluster(cost, ROOMY, 1), prompt_tokens=20, length=7))
    expected = cost.iteration_time(1, 20, 20) + sum(cost.iteration_time(1, 20 + k, 0) for k in range(1, 7))
    assert engine.run_to_completion() == pytest.approx(expected, rel=1e-12)


def test_a_round_lasts_as_long_as_its_longest_completion():
    constant = bench.LinearCost(a=1.0)  # every iteration costs 1 s whatever the batch: time = iterations
    cluster = bench.Cluster(constant, ROOMY, 2)
    lengths = [3, 10, 7, 2, 30, 1]
    requests = [_request(cluster, prompt=i, length=n) for i, n in enumerate(lengths)]
    assert cluster.generate(requests) == pytest.approx(30.0)
    assert all(r.state == bench.FINISHED for r in requests)
    assert cluster.decoded_tokens == sum(lengths)
    # The contiguous split puts [3, 10, 7] on engine 0 and [2, 30, 1] on engine 1.
    assert [e.clock for e in cluster.engines] == [10.0, 30.0]


def test_engine_conserves_tokens_with_aborts_and_limits():
    limits = bench.EngineLimits(max_num_seqs=3, max_num_batched_tokens=64, kv_capacity_tokens=10**9)
    cluster = bench.Cluster(LINEAR, limits, 1)
    engine = cluster.engines[0]
    requests = [_request(cluster, prompt=i, prompt_tokens=20, length=10 + 5 * i) for i in range(6)]
    for request in requests:
        engine.submit(request)
    for _ in range(7):
        engine.start_iteration(engine.clock)
        engine.finish_iteration()
    engine.abort(requests[1])  # running: 7 tokens decoded
    engine.abort(requests[5])  # still waiting (max_num_seqs=3): nothing decoded
    engine.run_to_completion()
    finished = [r for r in requests if r.state == bench.FINISHED]
    aborted = [r for r in requests if r.state == bench.ABORTED]
    assert [r.generated for r in aborted] == [7, 0]
    assert engine.decoded_tokens == sum(r.length for r in finished) + sum(r.generated for r in aborted)
    assert engine.aborted_tokens == 7 and engine.context_tokens == 0 and not engine.running


def test_preemption_keeps_tokens_and_conserves_them():
    # A KV cache too small for every sequence: the newest is preempted, recomputed later, and decodes nothing twice.
    limits = bench.EngineLimits(max_num_seqs=8, max_num_batched_tokens=10_000, kv_capacity_tokens=120)
    cluster = bench.Cluster(LINEAR, limits, 1)
    engine = cluster.engines[0]
    requests = [_request(cluster, prompt=i, prompt_tokens=10, length=40) for i in range(3)]
    for request in requests:
        engine.submit(request)
    engine.run_to_completion()
    assert engine.preemptions > 0
    assert all(r.state == bench.FINISHED for r in requests)
    assert engine.decoded_tokens == 3 * 40


@pytest.mark.parametrize("name", ["grpo_n4", "seq_balance/fixed", "est"])
def test_round_schedules_conserve_tokens(name):
    schedule = next(s for s in bench.schedules() if s.name == name)
    setup = _small_setup()
    prompts = bench.sample_population(setup.batch_prompts, setup.workload, seed=3)
    for result in bench.run_schedule(schedule, prompts, setup, seed=4, steps=1):
        assert result.tokens_aborted == 0
        assert result.tokens_decoded == result.tokens_finished


@pytest.mark.parametrize("n", [4, 8, 16])
def test_uniform_draws_exactly_b_times_n(n):
    setup = _small_setup(prompts=16)
    prompts = bench.sample_population(16, setup.workload, seed=0)
    sampler = build_sampler(SamplerSettings(sampler="uniform", num_generations=n))
    result = bench.run_rounds(sampler, prompts, setup, random.Random(0), "uniform")
    assert result.completions == 16 * n and result.rows_trained == 16 * n and result.generate_calls == 1


class _Spy:
    """Wraps a continuous step and records every pair it returned for abort and every pair completed."""

    def __init__(self, step):
        self.inner, self.aborted, self.completed, self.discarded = step, set(), [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def complete(self, prompt, draw, reward, masked=False):
        assert (prompt, draw) not in self.aborted, "an aborted draw reached the sampler"
        self.completed.append((prompt, draw))
        aborts = self.inner.complete(prompt, draw, reward, masked)
        self.aborted.update(aborts)
        return aborts

    def discard(self, prompt, draw):
        self.discarded.append((prompt, draw))
        return self.inner.discard(prompt, draw)


@pytest.mark.parametrize("stand_in", [False, True])
@pytest.mark.parametrize("name", ["seq_balance/continuous_k8", "seq_balance/continuous_predictive"])
def test_continuous_aborted_draws_never_reach_the_sampler(monkeypatch, name, stand_in):
    spies = []
    real = bench.make_continuous_step

    def spying(sampler, num_prompts, keys):
        if stand_in:
            step, impl = bench.StandInContinuousStep(sampler, num_prompts, keys), "stand-in"
        else:
            step, impl = real(sampler, num_prompts, keys)
        spies.append(_Spy(step))
        return spies[-1], impl

    monkeypatch.setattr(bench, "make_continuous_step", spying)
    schedule = next(s for s in bench.schedules() if s.name == name)
    # Wrong answers 1.5x longer: results come back out of submission order, so aborts and waiting draws happen.
    setup = _small_setup(prompts=32, wrong_length_factor=1.5)
    prompts = bench.sample_population(32, setup.workload, seed=1)
    (result,) = bench.run_schedule(schedule, prompts, setup, seed=2, steps=1)
    (spy,) = spies
    assert spy.aborted, "the scenario should abort some draws"
    assert not set(spy.completed) & spy.aborted
    assert set(spy.discarded) <= spy.aborted
    # Tokens: everything decoded either finished or was cut short by an abort.
    assert result.tokens_decoded == result.tokens_finished + result.tokens_aborted
    assert result.tokens_aborted > 0 and result.completions == len(spy.completed) + len(spy.discarded)
    assert result.rows_trained == 32 * 4


def test_stand_in_selects_like_the_real_continuous_step():
    # Same draws in the same order: the stand-in and the real ContinuousStep build the same pools.
    settings = SamplerSettings(sampler="seq_balance", num_generations=4, round_size=4, max_rounds=8)
    if not hasattr(build_sampler(settings), "begin_continuous"):
        pytest.skip("trl_ada.samplers has no ContinuousStep yet")
    rng = random.Random(5)
    rewards = [[float(rng.random() < p) for _ in range(32)] for p in (0.05, 0.3, 0.5, 0.9)]
    pools = []
    for make in (lambda s: s.begin_continuous(4, list(range(4))), lambda s: bench.StandInContinuousStep(s, 4)):
        step = make(build_sampler(settings))
        pending = list(step.to_submit())
        while not step.done:
            prompt, draw = pending.pop()  # last submitted first: out of submission order
            if step.is_aborted(prompt, draw):
                step.discard(prompt, draw)
                continue
            aborted = set(step.complete(prompt, draw, rewards[prompt][draw]))
            pending = [pair for pair in pending if pair not in aborted] + list(step.to_submit())
        pools.append(step.finish().pools)
    assert pools[0] == pools[1]


def test_load_constants_is_the_cpu_calibration_hook(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(
        json.dumps(
            {
                "source": "fitted on CPU vLLM timings",
                "cost": {"model": "linear", "a": 0.01, "b": 1e-3, "c": 1e-6, "d": 2e-5},
                "limits": {"max_num_seqs": 64},
                "step_costs": {"generate_call_s": 0.0},
                "engines": 1,
            }
        )
    )
    setup = bench.load_constants(path)
    assert setup.cost == bench.LinearCost(a=0.01, b=1e-3, c=1e-6, d=2e-5)
    assert setup.limits.max_num_seqs == 64 and setup.step_costs.generate_call_s == 0.0 and setup.engines == 1


def test_quick_run_writes_json(tmp_path, capsys):
    out = tmp_path / "quick.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {row["schedule"] for row in data["table3"]} == {"seq_pos/fixed", "seq_balance/fixed", "est"}
    assert data["ratios_vs_grpo_n4"]["grpo_n4"] == pytest.approx(1.0)
    uniform = data["schedules"]["grpo_n4"]["mean"]
    assert uniform["completions"] == data["setup"]["batch_prompts"] * 4
    for rows in data["schedules"].values():
        mean = rows["mean"]
        assert mean["tokens_decoded"] == pytest.approx(mean["tokens_finished"] + mean["tokens_aborted"])
    assert "Table 3" in capsys.readouterr().out


def test_iteration_scale_multiplies_the_whole_iteration():
    base, slow = bench.RooflineCost(), bench.RooflineCost(iteration_scale=3.0)
    for shape in [(1, 20, 20), (256, 200_000, 0), (64, 10_000, 3000)]:
        assert slow.iteration_time(*shape) == pytest.approx(3.0 * base.iteration_time(*shape), rel=1e-12)


@pytest.mark.parametrize("name", ["grpo_n4", "est", "seq_balance/fixed", "seq_pos/fixed"])
def test_reward_time_follows_the_authors_calls(name):
    # One pool per reward call plus a per-completion cost; multi-round schedules rescore the kept rows once more.
    costs = bench.StepCosts(reward_call_s=0.5, reward_s_per_completion=0.01)
    setup = bench.Setup(
        cost=LINEAR,
        engines=2,
        batch_prompts=16,
        step_costs=costs,
        workload=bench.Workload(mean_completion_tokens=40.0, max_response_tokens=128),
    )
    schedule = next(s for s in bench.schedules() if s.name == name)
    prompts = bench.sample_population(16, setup.workload, seed=2)
    (result,) = bench.run_schedule(schedule, prompts, setup, seed=3, steps=1)
    calls = result.generate_calls
    expected = calls * costs.reward_call_s + result.completions * costs.reward_s_per_completion
    if name.startswith("seq_"):
        expected += costs.reward_call_s + result.rows_trained * costs.reward_s_per_completion
    assert result.reward_s == pytest.approx(expected, rel=1e-12)
    # The old-log-prob pass runs on the kept rows only, whatever the pool size.
    assert result.logprob_s == pytest.approx(result.rows_trained * costs.old_logprob_s_per_row, rel=1e-12)
    no_rescore = bench.replace(setup, step_costs=bench.replace(costs, rescore_kept_rows=False))
    (plain,) = bench.run_schedule(schedule, prompts, no_rescore, seed=3, steps=1)
    assert plain.reward_s == pytest.approx(calls * costs.reward_call_s + result.completions * 0.01, rel=1e-12)


def test_seq_pos_uses_the_authors_positive_quota():
    for schedule in bench.schedules():
        if schedule.name.startswith("seq_pos/"):
            assert schedule.settings.positive_quota == bench.SEQ_POS_QUOTA == 2
    assert all(
        s.settings.positive_quota == 1 for s in bench.schedules(seq_pos_quota=1) if s.name.startswith("seq_pos/")
    )
