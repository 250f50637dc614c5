"""Correctness of `benchmarks/generation_cost.py` (the engine model and its schedules); no timing asserts."""

import ast
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
    sampler = build_sampler(SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=n))
    result = bench.run_rounds(sampler, prompts, setup, random.Random(0), "uniform")
    assert result.completions == 16 * n and result.rows_trained == 16 * n and result.generate_calls == 1


class _Spy:
    """Wraps a continuous step and records every pair it handed out and every pair completed."""

    def __init__(self, step):
        self.inner, self.submitted, self.completed = step, [], []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def to_submit(self):
        pairs = self.inner.to_submit()
        self.submitted.extend(pairs)
        return pairs

    def complete(self, prompt, draw, reward, masked=False):
        self.completed.append((prompt, draw))
        return self.inner.complete(prompt, draw, reward, masked)


def _spying(monkeypatch):
    spies = []
    real = bench.make_continuous_step

    def spying(sampler, num_prompts, keys):
        step, impl = real(sampler, num_prompts, keys)
        spies.append(_Spy(step))
        return spies[-1], impl

    monkeypatch.setattr(bench, "make_continuous_step", spying)
    return spies


@pytest.mark.parametrize("name", ["seq_balance/continuous_k8", "seq_balance/continuous_predictive"])
def test_continuous_draws_every_submitted_draw_to_the_end_and_scores_it_once(monkeypatch, name):
    spies = _spying(monkeypatch)
    schedule = next(s for s in bench.schedules() if s.name == name)
    # Wrong answers 1.5x longer: results come back out of submission order.
    setup = _small_setup(prompts=32, wrong_length_factor=1.5)
    prompts = bench.sample_population(32, setup.workload, seed=1)
    (result,) = bench.run_schedule(schedule, prompts, setup, seed=2, steps=1)
    (spy,) = spies
    assert sorted(spy.completed) == sorted(set(spy.submitted)) == sorted(spy.submitted)
    assert spy.completed != sorted(spy.completed)  # out of order
    # Nothing is aborted: every decoded token belongs to a draw that enters a pool.
    assert result.tokens_aborted == 0 and result.tokens_decoded == result.tokens_finished
    assert result.completions == len(spy.completed) and result.rows_trained == 32 * 4
    assert "trl_ada.samplers.streaming.ContinuousStep" in result.continuous_impl


def test_continuous_and_rounds_rows_of_the_schedules_table_are_the_same_estimator():
    # Like for like: every continuous schedule has rounds with the same sampler settings in the table.
    by_name = {s.name: s for s in bench.schedules()}
    for name, schedule in by_name.items():
        if schedule.mode != "continuous":
            continue
        same = [s for s in by_name.values() if s.mode == "rounds" and s.settings == schedule.settings]
        assert same, name


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


# ---- the CPU calibration's components (benchmarks/calibrate_cpu_vllm.py) ------------------------------------------

MEASURED = bench.Workload(
    prompts=((0.0, 7), (0.25, 8), (1.0, 9)), lengths_correct=(3, 4), lengths_wrong=(5, 16), max_response_tokens=16
)


def test_measured_workload_draws_prompts_and_lengths_from_the_measurements():
    prompts = bench.sample_population(200, MEASURED, seed=0, stage="end")
    assert {(p.pass_rate, p.prompt_tokens) for p in prompts} == set(MEASURED.prompts)
    rng = random.Random(1)
    for prompt in prompts[:50]:
        for _ in range(10):
            reward, length = bench.draw_completion(prompt, MEASURED, rng)
            assert length in (MEASURED.lengths_correct if reward == 1.0 else MEASURED.lengths_wrong)
            assert prompt.pass_rate != 0.0 or reward == 0.0
            assert prompt.pass_rate != 1.0 or reward == 1.0
    assert bench.measured_population([(0.5, 0)]) == [bench.Prompt(0.5, 1, 0.0)]


def test_load_constants_reads_the_measured_workload_and_cpu_step_costs(tmp_path):
    path = tmp_path / "cpu.json"
    path.write_text(
        json.dumps(
            {
                "workload": {"prompts": [[0.5, 7], [0.0, 9]], "lengths_correct": [3], "lengths_wrong": [4, 16]},
                "step_costs": {"continuous_driver": "serial", "draw_request_s": 0.002, "round_s": 0.03},
                "step_prompts": [[1, 2]],  # extra keys are the calibration's own records
            }
        )
    )
    setup = bench.load_constants(path)
    assert setup.workload.prompts == ((0.5, 7), (0.0, 9)) and setup.workload.lengths_wrong == (4, 16)
    assert setup.step_costs.continuous_driver == "serial" and setup.step_costs.draw_request_s == 0.002
    hash(setup.workload)  # tuples, not lists


def test_round_overheads_add_exactly_to_the_engine_time():
    costs = bench.StepCosts(
        actor_update_s_per_row=0.0,
        old_logprob_s_per_row=0.0,
        generate_call_s=0.0,
        reward_call_s=0.0,
        reward_s_per_completion=0.0,
        rescore_kept_rows=False,
    )
    plain = bench.Setup(cost=LINEAR, limits=ROOMY, step_costs=costs, workload=MEASURED, engines=1, batch_prompts=16)
    extra = bench.replace(
        plain,
        step_costs=bench.replace(
            costs,
            sampling_step_s=0.5,
            generate_request_s=0.01,
            request_s_per_completion=1e-3,
            round_s=0.02,
            round_s_per_row=2e-3,
        ),
    )
    schedule = next(s for s in bench.schedules() if s.name == "seq_balance/fixed")
    prompts = bench.sample_population(16, MEASURED, seed=0)
    (base,) = bench.run_schedule(schedule, prompts, plain, seed=1, steps=1)
    (more,) = bench.run_schedule(schedule, prompts, extra, seed=1, steps=1)
    assert (more.completions, more.generate_calls) == (base.completions, base.generate_calls)
    calls, completions = base.generate_calls, base.completions
    assert more.generation_s == pytest.approx(base.generation_s + 0.01 * calls + 1e-3 * completions, rel=1e-12)
    assert more.trainer_s == pytest.approx(0.02 * calls + 2e-3 * completions, rel=1e-12)
    assert base.trainer_s == 0.0 and more.sync_s == 0.5
    assert more.step_s == pytest.approx(base.step_s + 0.5 + more.trainer_s + 0.01 * calls + 1e-3 * completions)


def _serial_setup(**step_costs):
    costs = bench.StepCosts(
        actor_update_s_per_row=0.0,
        old_logprob_s_per_row=0.0,
        generate_call_s=0.0,
        reward_call_s=0.0,
        reward_s_per_completion=0.0,
        rescore_kept_rows=False,
        continuous_driver="serial",
        **step_costs,
    )
    return bench.Setup(cost=LINEAR, limits=ROOMY, step_costs=costs, workload=MEASURED, engines=1, batch_prompts=16)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_serial_driver_closed_form_one_draw_at_a_time(scale):
    # One prompt that always passes never meets seq_balance's negative quota: it runs to the cap of 4 draws, one in
    # flight at a time, each: queue + latency + engine (prefill, then decode; times `scale`) + its scoring batch.
    setup = _serial_setup(
        draw_request_s=0.003,
        draw_latency_s=0.01,
        scoring_batch_s=0.02,
        scoring_batch_s_per_row=0.005,
        continuous_engine_scale=scale,
    )
    setup = bench.replace(setup, workload=bench.replace(MEASURED, lengths_correct=(6,)))
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=1, max_rounds=4
    )
    schedule = bench.Schedule("serial", settings, mode="continuous")
    prompt = bench.measured_population([(1.0, 10)])
    (result,) = bench.run_schedule(schedule, prompt, setup, seed=0, steps=1)
    a, b, c, d = LINEAR.a, LINEAR.b, LINEAR.c, LINEAR.d
    first = 6 * (a + b) + c * (6 * 10 + 15) + d * 10  # the prompt is prefilled once (cached afterwards)
    cached = 6 * (a + b) + c * (6 * 10 + 15)
    per_draw = 0.003 + 0.01 + 0.02 + 0.005
    assert result.generation_s == pytest.approx(4 * per_draw + scale * (first + 3 * cached), rel=1e-9)
    assert result.completions == 4 and result.rows_trained == 4 and result.aborted_draws == 0


@pytest.mark.parametrize("policy", ["fixed", "predictive"])
def test_serial_driver_scores_every_draw_back_once(monkeypatch, policy):
    spies = _spying(monkeypatch)
    setup = _serial_setup(draw_request_s=1e-4, draw_latency_s=2e-3, scoring_batch_s=5e-3, scoring_batch_s_per_row=1e-3)
    settings = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler="seq_balance",
        num_generations=4,
        round_size=4,
        max_rounds=4,
        round_policy=policy,
    )
    schedule = bench.Schedule("serial", settings, mode="continuous")
    prompts = bench.measured_population([(p, 8) for p in (0.0, 0.1, 0.3, 0.5, 0.5, 0.7, 0.9, 1.0)] * 4)
    (result,) = bench.run_schedule(schedule, prompts, setup, seed=3, steps=1)
    (spy,) = spies
    assert sorted(spy.completed) == sorted(spy.submitted) and len(set(spy.completed)) == len(spy.completed)
    assert result.tokens_aborted == 0 and result.tokens_decoded == result.tokens_finished
    assert spy.inner.stats.submitted == len(spy.completed) == result.completions
    assert result.rows_trained == 32 * 4 and "serial driver" in result.continuous_impl
    # A scoring batch takes every draw back, several per prompt at times: fewer batches than draws.
    assert 4 <= result.scoring_batches < len(spy.completed)
    assert result.scoring_s == pytest.approx(result.scoring_batches * 5e-3 + len(spy.completed) * 1e-3, rel=1e-9)


@pytest.mark.parametrize("engines", [1, 4])
@pytest.mark.parametrize("policy", ["fixed", "predictive"])
def test_serial_driver_without_costs_is_as_fast_as_the_overlapped_schedule(engines, policy):
    # With no request, scoring or reward cost, trl-ada's loop differs from the overlapped schedule only in when a
    # result reaches the scheduler, not in what the engines run: the step takes as long, within the spread of the
    # draws each sees. Two model bugs broke this: the loop waited for a new completion while a draw already back could
    # be scored (x1.15 on one engine), and a burst of draws went to the engine that looked idle before any of them
    # arrived (x1.6-1.7 on four).
    settings = SamplerSettings(
        scale_rewards="none",
        seed=0,
        sampler="seq_balance",
        num_generations=4,
        round_size=4,
        max_rounds=4,
        round_policy=policy,
    )
    prompts = bench.measured_population([(p, 8) for p in (0.0, 0.1, 0.3, 0.5, 0.5, 0.7, 0.9, 1.0)] * 4)
    seconds = {}
    for driver in ("serial", "overlapped"):
        setup = bench.replace(_serial_setup(), engines=engines)
        setup = bench.replace(setup, step_costs=bench.replace(setup.step_costs, continuous_driver=driver))
        results = bench.run_schedule(bench.Schedule(driver, settings, mode="continuous"), prompts, setup, 3, 3)
        seconds[driver] = sum(r.generation_s for r in results) / len(results)
    assert seconds["serial"] == pytest.approx(seconds["overlapped"], rel=0.1)


@pytest.mark.parametrize("cap", [3, 0])
def test_serial_driver_keeps_at_most_max_in_flight_draws_on_the_engines(monkeypatch, cap):
    # trl-ada's client holds one connection per draw, at most `continuous_max_in_flight`: later draws wait on the
    # training side, so the engines never run more than that many sequences (0: no cap).
    running = []
    real = bench.Engine.start_iteration

    def spying(engine, now):
        end = real(engine, now)
        running.append(len(engine.running) + len(engine.waiting))
        return end

    monkeypatch.setattr(bench.Engine, "start_iteration", spying)
    setup = _serial_setup(continuous_max_in_flight=cap, draw_latency_s=1e-3, scoring_batch_s=2e-3)
    settings = SamplerSettings(
        scale_rewards="none", seed=0, sampler="seq_balance", num_generations=4, round_size=4, max_rounds=4
    )
    prompts = bench.measured_population([(p, 8) for p in (0.0, 0.3, 0.5, 0.9)] * 2)
    (result,) = bench.run_schedule(bench.Schedule("cap", settings, mode="continuous"), prompts, setup, 3, 1)
    assert result.rows_trained == 8 * 4
    assert (max(running) <= 3) if cap else (max(running) > 3)


def test_without_prefix_caching_every_draw_prefills_its_prompt():
    cluster = bench.Cluster(LINEAR, ROOMY, 1)
    no_cache = bench.replace(ROOMY, prefix_caching=False)
    requests = [_request(cluster, prompt=0, draw=d, prompt_tokens=10, length=3) for d in range(4)]
    cached, uncached = bench.Cluster(LINEAR, ROOMY, 1), bench.Cluster(LINEAR, no_cache, 1)
    cached.generate([bench.replace(r) for r in requests])
    uncached.generate([bench.replace(r) for r in requests])
    assert cached.prefill_tokens == 10 and uncached.prefill_tokens == 40


def test_the_modelled_loop_uses_trl_adas_default_cap():
    from trl_ada import AdaGRPOConfig

    assert bench.TRL_ADA_MAX_IN_FLIGHT == AdaGRPOConfig.__dataclass_fields__["continuous_max_in_flight"].default


# ---- the asynchronous schedule (TRL's AsyncGRPOTrainer, trl-ada's AdaAsyncGRPOTrainer) ----------------------------

FIXED_LENGTH = bench.Workload(prompts=((0.5, 8),), lengths_correct=(10,), lengths_wrong=(10,), max_response_tokens=16)
NO_STEP_COSTS = bench.StepCosts(actor_update_s_per_row=0.0, old_logprob_s_per_row=0.0)


def _uniform(n=4):
    return bench.AsyncSchedule(
        f"grpo_n{n}", SamplerSettings(scale_rewards="none", seed=0, sampler="uniform", num_generations=n)
    )


def _async_config(**overrides):
    values = {
        "engines": 2,
        "trainer_gpus": 8,
        "limits": bench.EngineLimits(max_num_seqs=8, max_num_batched_tokens=10**6, kv_capacity_tokens=10**9),
        "weight_sync_s": 0.0,
        "score_call_s": 0.0,
        "score_s_per_completion": 0.0,
        "warmup_steps": 3,
        "timed_steps": 5,
        **overrides,
    }
    return bench.AsyncConfig(**values)


@pytest.mark.parametrize("sync_s", [0.0, 0.01])
def test_async_with_no_training_cost_steps_at_the_engines_generation_rate(sync_s):
    # Iterations of a constant 1 ms, every completion 10 tokens, 8 sequences per engine: two engines finish 16 draws
    # per 10 ms, so a step's 8 prompts x 4 samples take 20 ms when the trainer costs nothing; a weight sync pauses the
    # engines and adds its time (less the iteration running when it starts, which finishes meanwhile). 32 draws in
    # flight keep both engines full (the cap, not max_staleness, sets how many: no sample is stale).
    setup = bench.Setup(cost=bench.LinearCost(a=1e-3), step_costs=NO_STEP_COSTS, workload=FIXED_LENGTH, engines=2)
    setup = bench.replace(setup, batch_prompts=8)
    prompts = bench.sample_population(8, FIXED_LENGTH, seed=0)
    config = _async_config(max_inflight=32, max_staleness=10, weight_sync_s=sync_s)
    result = bench.run_async(_uniform(), prompts, setup, config, seed=1)
    generation = 32 * 10 * 1e-3 / (2 * 8)
    assert result.step_s == pytest.approx(generation + sync_s, abs=1e-3 + 1e-9)
    assert result.engine_busy == pytest.approx(generation / result.step_s, rel=0.02)
    assert result.trainer_wait == pytest.approx(1.0 - sync_s / result.step_s, rel=0.02)
    assert result.stale_dropped_per_step == 0 and result.draws_per_step == pytest.approx(32, rel=0.05)


@pytest.mark.parametrize("old_logprob_pass", [False, True])
def test_async_with_instant_engines_steps_at_training_plus_weight_sync(old_logprob_pass):
    costs = bench.StepCosts(actor_update_s_per_row=0.01, old_logprob_s_per_row=0.005)
    setup = bench.Setup(cost=bench.LinearCost(a=0.0), step_costs=costs, workload=FIXED_LENGTH, engines=2)
    setup = bench.replace(setup, batch_prompts=8)
    prompts = bench.sample_population(8, FIXED_LENGTH, seed=0)
    config = _async_config(trainer_gpus=4, weight_sync_s=0.3, old_logprob_pass=old_logprob_pass)
    result = bench.run_async(_uniform(), prompts, setup, config, seed=1)
    per_row = (0.015 if old_logprob_pass else 0.01) * 8 / 4  # the paper's 8 GPUs' per-row cost on 4
    assert result.train_s == pytest.approx(32 * per_row, rel=1e-12)
    assert result.step_s == pytest.approx(32 * per_row + 0.3, rel=1e-9)
    assert result.trainer_wait == pytest.approx(0.0, abs=1e-9) and result.engine_busy == 0.0


@pytest.mark.parametrize("scale", [1.0, 8.0])  # generation-light and generation-heavy
def test_async_uniform_n4_is_never_slower_than_synchronous_under_the_same_constants(scale):
    setup = _small_setup(cost=bench.RooflineCost(iteration_scale=scale), prompts=16)
    prompts = bench.sample_population(16, setup.workload, seed=5)
    schedule = next(s for s in bench.schedules() if s.name == "grpo_n4")
    sync = bench.run_schedule(schedule, prompts, setup, seed=6, steps=2)
    sync_step = sum(r.step_s for r in sync) / len(sync)
    costs = setup.step_costs
    config = bench.AsyncConfig(  # the synchronous model's engines, limits, sync and scoring; a trainer as fast
        engines=setup.engines,
        trainer_gpus=8,
        paper_gpus=8,
        limits=setup.limits,
        weight_sync_s=costs.generate_call_s,
        score_s_per_completion=costs.reward_s_per_completion,
        queue_maxsize=16 * 4 * 2,
        warmup_steps=4,
        timed_steps=4,
    )
    result = bench.run_async(_uniform(), prompts, setup, config, seed=6)
    assert result.step_s <= sync_step
    assert result.step_s >= result.train_s + result.sync_s - 1e-9  # the trainer's own work bounds it below


def _keyed(prompts):
    # One fixed (reward, length) per (prompt, draw), whatever order the draws are made in.
    def outcome(index, draw):
        rng = random.Random(f"{index}/{draw}")
        return (1.0 if rng.random() < prompts[index].pass_rate else 0.0), rng.randint(5, 60)

    return outcome


@pytest.mark.parametrize(
    ("name", "continuous"),
    [
        ("seq_balance/fixed", "seq_balance/continuous_k8"),
        ("seq_balance/predictive", "seq_balance/continuous_predictive"),
    ],
)
def test_async_seq_balance_draws_the_continuous_schedules_pools(name, continuous):
    # Same draws per (prompt, draw): the previous worker's step-sized batches (the dataset cycled, so each is the
    # population) draw exactly the continuous schedule's pools, though its draws interleave across batches and weight
    # versions; the worker's batches of one prompt draw, prompt by prompt, the same pools as those.
    setup = _small_setup(prompts=24)
    prompts = bench.sample_population(24, setup.workload, seed=7)
    outcome = _keyed(prompts)
    by_name = {s.name: s for s in bench.schedules()}
    by_async = {s.name: s for s in bench.async_schedules()}
    schedule, batched = by_async[name], by_async[name + bench.BATCH_RELEASE_SUFFIX]
    assert schedule.settings == batched.settings == by_name[continuous].settings and schedule.pooled
    assert (schedule.release, batched.release) == ("worker", "batch")
    sync = bench.run_continuous(
        by_name[continuous], build_sampler(schedule.settings), prompts, setup, random.Random(0), outcome
    )
    config = _async_config(limits=setup.limits, warmup_steps=1, timed_steps=3, queue_maxsize=4 * 24 * 4)
    results = {
        one.release: bench.run_async(one, prompts, setup, config, seed=8, outcome=lambda unit, i, d: outcome(i, d))
        for one in (schedule, batched)
    }
    assert (results["worker"].prompts_per_batch, results["batch"].prompts_per_batch) == (1, 24)
    assert results["batch"].draws_per_kept_prompt == pytest.approx(sync.completions / 24, rel=1e-12)
    assert results["batch"].mixed_share == pytest.approx(sync.mixed_share, rel=1e-12)
    pools = {}
    for release, result in results.items():
        pools[release] = {}
        for row, size, mixed in result.released_pools:
            assert pools[release].setdefault(row, (size, mixed)) == (size, mixed)  # a row's pool, every time
    assert len(pools["batch"]) == 24 and pools["worker"] == pools["batch"]
    assert bench.make_async_step(build_sampler(schedule.settings), [0, 1])[1].endswith("ContinuousStep")


@pytest.mark.parametrize("name", ["seq_balance/fixed", "seq_balance/predictive"])
def test_async_per_prompt_release_queues_each_pool_as_soon_as_it_is_done(name):
    # Every rule of seq_balance is per prompt (no batch reward scale, linear objective), so trl-ada's worker makes
    # each prompt a generation batch of its own: its kept samples are queued when ITS pool is done, never waiting for
    # another prompt's. The previous worker's step-sized batches wait for their slowest pool, so their samples are
    # older when trained and more of them are dropped as too stale, on the same seeds.
    setup = _small_setup(prompts=24)
    prompts = bench.sample_population(24, setup.workload, seed=7)
    config = _async_config(limits=setup.limits, warmup_steps=2, timed_steps=4, queue_maxsize=4 * 24 * 4)
    by_async = {s.name: s for s in bench.async_schedules()}
    schedule, batched = by_async[name], by_async[name + bench.BATCH_RELEASE_SUFFIX]
    assert schedule.settings.rules_are_per_prompt
    worker = bench.run_async(schedule, prompts, setup, config, seed=8)
    previous = bench.run_async(batched, prompts, setup, config, seed=8)
    assert (worker.prompts_per_batch, previous.prompts_per_batch) == (1, 24)
    assert worker.release_waits and max(worker.release_waits) == 0.0 == worker.release_wait_s
    assert max(previous.release_waits) > 0.0 and previous.release_wait_s > 0.0
    assert worker.staleness_mean < previous.staleness_mean
    assert worker.stale_dropped_per_step < previous.stale_dropped_per_step


def test_async_batch_rules_keep_step_sized_generation_batches():
    # A rule over the batch (scale_rewards="batch") keeps one optimizer step's prompts per generation batch, as the
    # worker's async_sampling does; release="batch" forces it where the rules are per prompt.
    settings = bench._seq("seq_balance", round_size=8, max_rounds=4)
    per_prompt = bench.AsyncSchedule("per_prompt", settings)
    assert per_prompt.prompts_per_batch(4 * 24) == 1
    assert bench.AsyncSchedule("forced", settings, "batch").prompts_per_batch(4 * 24) == 24
    batch_scale = bench.AsyncSchedule("batch_scale", bench.replace(settings, scale_rewards="batch"))
    assert not batch_scale.settings.rules_are_per_prompt
    assert batch_scale.prompts_per_batch(4 * 24) == 24
    with pytest.raises(ValueError, match="release="):
        bench.AsyncSchedule("unknown", settings, "prompt")


@pytest.mark.parametrize("max_staleness", [1, 2])
def test_async_trains_no_sample_older_than_max_staleness(max_staleness):
    # Instant engines and a slow trainer: the worker runs steps ahead (a buffer of 4 steps), so samples age past the
    # bound; those are dropped where the trainer pulls them, and every trained one is at most max_staleness old.
    costs = bench.StepCosts(actor_update_s_per_row=0.01, old_logprob_s_per_row=0.0)
    setup = bench.Setup(cost=bench.LinearCost(a=0.0), step_costs=costs, workload=FIXED_LENGTH, engines=2)
    setup = bench.replace(setup, batch_prompts=8)
    prompts = bench.sample_population(8, FIXED_LENGTH, seed=0)
    for schedule in (_uniform(), next(s for s in bench.async_schedules() if s.name == "seq_balance/fixed")):
        config = _async_config(max_staleness=max_staleness, queue_maxsize=4 * 32, weight_sync_s=0.1)
        result = bench.run_async(schedule, prompts, setup, config, seed=1)
        assert result.trained_staleness and max(result.trained_staleness) == max_staleness == result.staleness_max
        assert result.stale_dropped_per_step > 0
        assert result.max_inflight == max_staleness * 32  # TRL's inference: max(max_staleness, 1) x samples_per_step


def test_async_dapo_drops_constant_groups_and_draws_on():
    setup = _small_setup(prompts=16)
    prompts = bench.sample_population(16, setup.workload, seed=9)
    schedule = next(s for s in bench.async_schedules() if s.name == "dapo_n4")
    config = _async_config(limits=setup.limits, warmup_steps=2, timed_steps=3, queue_maxsize=128)
    result = bench.run_async(schedule, prompts, setup, config, seed=10)
    assert result.mixed_share == 1.0 and result.draws_per_kept_prompt > 4.0
    uniform = bench.run_async(_uniform(), prompts, setup, config, seed=10)
    assert uniform.draws_per_kept_prompt == 4.0 and uniform.mixed_share < 1.0


def _trl_source(name):
    # TRL's own files, read without importing TRL (torch): the defaults the model claims to copy.
    spec = importlib.util.find_spec("trl")
    return (Path(spec.origin).parent / "experimental" / "async_grpo" / name).read_text()


def test_async_defaults_are_trls():
    tree = ast.parse(_trl_source("async_grpo_config.py"))
    config_class = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "AsyncGRPOConfig")
    defaults = {}
    for node in config_class.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.value, ast.Call):
            for keyword in node.value.keywords:
                if keyword.arg == "default":
                    defaults[node.target.id] = ast.literal_eval(keyword.value)
    config = bench.AsyncConfig()
    assert config.max_staleness == defaults["max_staleness"]
    assert config.queue_maxsize == defaults["queue_maxsize"]
    assert config.weight_sync_steps == defaults["weight_sync_steps"]
    assert config.max_inflight == defaults["max_inflight_tasks"] == -1
    # The inference `run_async` applies for -1, and the score queue's bound.
    assert "max(self.args.max_staleness, 1) * samples_per_step" in _trl_source("async_grpo_trainer.py")
    assert f"score_queue_maxsize: int = {config.score_queue_maxsize}," in _trl_source("async_rollout_worker.py")
    assert all(key in bench.SOURCES for key in bench.ASYNC_SOURCE_KEYS)


def test_quick_async_run_prints_the_projection_and_writes_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench, "ASYNC_QUICK_SPLITS", ("2+6", "8+8"))
    chosen = [s for s in bench.async_schedules() if s.name in ("grpo_n4", "seq_balance/fixed")]
    monkeypatch.setattr(bench, "async_schedules", lambda: chosen)
    out = tmp_path / "async.json"
    assert bench.main(["--quick", "--async-only", "--json", str(out)]) == 0
    data = json.loads(out.read_text())["async"]
    assert set(data["splits"]) == {"2+6", "8+8"}
    for split in ("2+6", "8+8"):
        assert set(data[split]) == {"grpo_n4", "seq_balance/fixed"}
        assert data[split]["grpo_n4"]["mean"]["step_s"] > 0
    text = capsys.readouterr().out
    assert "PROJECTION" in text and "SYNCHRONOUS GRPO-n4" in text and "async_max_staleness" in text
