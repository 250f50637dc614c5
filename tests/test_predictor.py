"""The learned pass-rate predictor (`pass_rate_predictor="learned"`): predictions, training, state, consumers."""

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from trl_ada.reporting.plots import write_training_plots
from trl_ada.samplers import PromptKey, SamplerSettings, build_sampler
from trl_ada.samplers.predictor import (
    PREDICTOR_DIR,
    PREDICTOR_FILE,
    LearnedPassRatePredictor,
    calibration,
    prompt_text,
)
from trl_ada.tasks.arithmetic import make_problems

# The per-level temperature-1 pass rates of the shipped tiny model (its build_report.json, final.t1), rounded.
LEVEL_RATES = (0.63, 0.61, 0.51, 0.05, 0.14, 0.02)


def fresh_prompts(count, seed):
    seen, out = set(), []
    for problem in make_problems(4 * count, seed=seed):
        if problem["prompt"] not in seen:
            seen.add(problem["prompt"])
            out.append(problem)
    return out[:count]


def bernoulli(problems, draws, rng):
    return [sum(rng.random() < LEVEL_RATES[p["level"]] for _ in range(draws)) for p in problems]


def keys_of(problems):
    return [PromptKey(p["prompt"], p["prompt"]) for p in problems]


def trained(num_prompts=1024, batch=64, draws=8, seed=0, **kwargs):
    predictor = LearnedPassRatePredictor(**kwargs)
    problems, rng = fresh_prompts(num_prompts, seed), random.Random(seed)
    for start in range(0, len(problems), batch):
        chunk = problems[start : start + batch]
        predictor.update(keys_of(chunk), [draws] * len(chunk), bernoulli(chunk, draws, rng))
    return predictor


# -- predictions ---------------------------------------------------------------------------------------------------


def test_an_untrained_predictor_reads_the_prior_mean():
    assert LearnedPassRatePredictor(prior_alpha=1.0, prior_beta=3.0).estimate(["anything"]) == [pytest.approx(0.25)]


def test_features_use_a_stable_hash_not_pythons_salted_one():
    code = "from trl_ada.samplers.predictor import LearnedPassRatePredictor as P;print(P().features(' 47* 85=')[:5])"
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {str(LearnedPassRatePredictor().features(" 47* 85=")[:5]) + "\n"}
    # pinned: a saved predictor is only valid while the hashing stays the same
    assert LearnedPassRatePredictor().features(" 47* 85=")[:2] == [(145305, pytest.approx(1 / 6)), (161405, 1 / 3)]


def test_it_learns_first_visit_pass_rates_from_prompts_that_look_alike():
    # Prompts never seen before, after training on 1,024 other fresh prompts. The level oracle (each prompt's true
    # Bernoulli rate) is the least expected log-loss any predictor can reach; the running mean is the best constant.
    # The learned predictor must close at least half of the gap between them.
    predictor = trained()
    held = fresh_prompts(2048, seed=1)[-512:]
    rng = random.Random(7)
    hits = bernoulli(held, 8, rng)
    totals = [8] * len(held)
    learned = calibration(predictor.estimate(keys_of(held)), totals, hits)["log_loss"]
    mean = sum(hits) / sum(totals)
    constant = calibration([mean] * len(held), totals, hits)["log_loss"]
    oracle = calibration([LEVEL_RATES[p["level"]] for p in held], totals, hits)["log_loss"]
    assert learned < (oracle + constant) / 2, (learned, oracle, constant)
    # and hard levels read lower than easy ones
    by_level = {}
    for p, estimate in zip(held, predictor.estimate(keys_of(held))):
        by_level.setdefault(p["level"], []).append(estimate)
    means = {level: sum(v) / len(v) for level, v in by_level.items()}
    assert min(means[0], means[1], means[2]) > max(means[3], means[4], means[5])


def test_a_returning_prompt_combines_the_prediction_with_its_decayed_counts():
    predictor = trained(num_prompts=256)
    key = PromptKey("id-1", " 47* 85=")
    m = predictor.predict([key])[0]
    s = predictor.prior_strength
    assert predictor.estimate([key]) == [pytest.approx(m)]  # first visit: the prediction itself
    predictor.update([key], [8], [6])
    m = predictor.predict([key])[0]  # the model moved too; the counts are (N, K) = (8, 6)
    assert predictor.estimate([key]) == [pytest.approx((6 + s * m) / (8 + s))]
    assert predictor.beta_parameters([key]) == [pytest.approx((6 + s * m, 2 + s * (1 - m)))]
    predictor.update([key], [4], [0])
    m = predictor.predict([key])[0]
    n, k = 0.9 * 8 + 4, 0.9 * 6
    assert predictor.estimate([key]) == [pytest.approx((k + s * m) / (n + s))]


def test_estimates_stay_strictly_inside_0_1_after_extreme_outcomes():
    predictor = LearnedPassRatePredictor(learning_rate=5.0)
    for step in range(50):
        keys = [f"always wrong {step} {i}" for i in range(16)]
        predictor.update(keys, [32] * 16, [0] * 16)
    estimates = predictor.predict(["always wrong again"])
    assert 0.0 < estimates[0] < 1e-4


def test_a_key_without_text_is_read_as_its_own_text():
    predictor = trained(num_prompts=128)
    assert predictor.predict([" 47* 85="]) == predictor.predict([PromptKey("some-id", " 47* 85=")])
    assert str(PromptKey("some-id", "text")) == "some-id" and type(str(PromptKey("a", "b"))) is str


def test_prompt_text_reads_strings_and_conversations():
    assert prompt_text(" 1+ 2=") == " 1+ 2="
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is 2+2?"}]},
    ]
    assert prompt_text(conversation) == "system: Be brief.\nuser: What is 2+2?"


def test_calibration_is_the_per_draw_log_loss_and_brier_score():
    result = calibration([0.2, 0.5], [4, 2], [1, 2])
    log_loss = -(math.log(0.2) + 3 * math.log(0.8) + 2 * math.log(0.5)) / 6
    brier = (0.8**2 + 3 * 0.2**2 + 2 * 0.5**2) / 6
    assert result == {"log_loss": pytest.approx(log_loss), "brier": pytest.approx(brier)}
    assert calibration([0.5], [0], [0]) == {}


def test_update_is_deterministic_and_order_is_the_keys_order():
    a, b = trained(num_prompts=256), trained(num_prompts=256)
    assert a.state_dict() == b.state_dict()


# -- state -----------------------------------------------------------------------------------------------------------


def est_settings(**overrides):
    return SamplerSettings(
        sampler="est",
        num_generations=4,
        pass_rate_predictor="learned",
        **{"scale_rewards": "none", "seed": 0, **overrides},
    )


def run_est_step(sampler, problems, rng):
    keys = keys_of(problems)
    step = sampler.begin(len(keys), keys)
    requests = step.requests()
    rewards = [float(rng.random() < LEVEL_RATES[problems[i]["level"]]) for i, count in requests for _ in range(count)]
    step.observe(requests, rewards)
    return step.budgets, step.estimates, step.finish()


def test_est_state_round_trips_through_json_with_identical_next_budgets():
    problems = fresh_prompts(512, seed=0)
    sampler = build_sampler(est_settings())
    rng = random.Random(0)
    for start in range(0, 256, 32):
        run_est_step(sampler, problems[start : start + 32], rng)
    saved = json.loads(json.dumps(sampler.state_dict()))
    assert saved["estimator"]["model"]["indices"] and saved["estimator"]["counts"]["counts"]
    resumed = build_sampler(est_settings())
    resumed.load_state_dict(saved)
    # the next batch mixes fresh prompts with returning ones
    batch = problems[256:272] + problems[:16]
    budgets, estimates, selection = run_est_step(sampler, batch, random.Random(1))
    budgets_resumed, estimates_resumed, selection_resumed = run_est_step(resumed, batch, random.Random(1))
    assert estimates == estimates_resumed and budgets == budgets_resumed
    assert selection.prompts == selection_resumed.prompts
    assert sampler.state_dict() == resumed.state_dict()
    assert len(set(budgets)) > 1  # the learned predictor spreads first-visit budgets


def test_a_resume_keeps_the_runs_learning_rate(caplog):
    # The checkpoint was trained at 0.1; the resumed run asks for 0.5: the user's setting wins (issue 32, item 21).
    problems = fresh_prompts(64, seed=0)
    sampler = build_sampler(est_settings(pass_rate_predictor_learning_rate=0.1))
    run_est_step(sampler, problems[:32], random.Random(0))
    saved = json.loads(json.dumps(sampler.state_dict()))
    resumed = build_sampler(est_settings(pass_rate_predictor_learning_rate=0.5))
    with caplog.at_level("INFO", logger="trl_ada.samplers.predictor"):
        resumed.load_state_dict(saved)
    assert resumed.estimator.learning_rate == 0.5
    assert "learning rate 0.5" in caplog.text and "trained with 0.1" in caplog.text
    keys = keys_of(problems)
    assert resumed.estimator.predict(keys) == sampler.estimator.predict(keys)  # everything else is the checkpoint's
    # the next update steps at 0.5: as a predictor built at 0.5 from the same state
    expected = LearnedPassRatePredictor(learning_rate=0.5, prior_alpha=1.0, prior_beta=1.0)
    expected.load_model_state(saved["estimator"]["model"], keep_learning_rate=True)
    batch = keys_of(problems[32:])
    resumed.estimator.update(batch, [4] * 32, [1] * 32)
    expected.update(batch, [4] * 32, [1] * 32)
    assert resumed.estimator.predict(keys) == expected.predict(keys) != sampler.estimator.predict(keys)


def test_est_logs_the_calibration_of_the_estimates_its_budgets_came_from():
    sampler = build_sampler(est_settings())
    problems = fresh_prompts(64, seed=0)
    keys = keys_of(problems)
    before = sampler.estimator.estimate(keys)
    _, _, selection = run_est_step(sampler, problems, random.Random(0))
    totals = [len(pool) for pool in selection.pools]
    positives = [sum(r > 0.5 for r in pool) for pool in selection.pools]
    expected = calibration(before, totals, positives)
    assert selection.metrics["pass_rate_predictor/log_loss"] == pytest.approx(expected["log_loss"])
    assert selection.metrics["pass_rate_predictor/brier"] == pytest.approx(expected["brier"])
    assert selection.metrics["pass_rate_predictor/first_visit_share"] == 1.0
    # the default tracker is scored the same way (its unseen prompts read 0.5)
    tracker_selection = run_est_step(
        build_sampler(SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="est")),
        problems,
        random.Random(0),
    )[2]
    assert tracker_selection.metrics["pass_rate_predictor/brier"] > 0.0


def test_save_pretrained_warm_starts_another_predictor(tmp_path):
    predictor = trained(num_prompts=256)
    predictor.save_pretrained(tmp_path / PREDICTOR_DIR)
    assert (tmp_path / PREDICTOR_DIR / PREDICTOR_FILE).is_file()
    keys = keys_of(fresh_prompts(600, seed=3)[-64:])
    for directory in (tmp_path, tmp_path / PREDICTOR_DIR):  # the model directory or the predictor folder
        warm = LearnedPassRatePredictor.from_pretrained(directory)
        assert warm.predict(keys) == predictor.predict(keys)
        assert warm.counts.counts == {}  # per-prompt counts are training state, not the model
    # through the settings: a local path is a warm start, with this run's learning rate
    settings = SamplerSettings(
        num_generations=4,
        scale_rewards="none",
        seed=0,
        sampler="est",
        pass_rate_predictor=str(tmp_path),
        pass_rate_predictor_learning_rate=0.3,
    )
    estimator = build_sampler(settings).estimator
    assert estimator.predict(keys) == predictor.predict(keys) and estimator.learning_rate == 0.3


def test_a_hub_id_is_downloaded_and_the_settings_keep_it(tmp_path, monkeypatch):
    from trl_ada.predictor_hub import resolve_pass_rate_predictor

    predictor = trained(num_prompts=256)
    predictor.save_pretrained(tmp_path / "snapshot" / PREDICTOR_DIR)
    calls = []

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):  # no network
        calls.append((repo_id, allow_patterns))
        if repo_id != "someone/tiny-ada":
            raise OSError("404 Client Error")
        return str(tmp_path / "snapshot")

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    settings = SamplerSettings(
        num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor="someone/tiny-ada"
    ).validated()
    sampler = build_sampler(settings, predictor_source=resolve_pass_rate_predictor(settings))
    assert calls == [("someone/tiny-ada", [f"{PREDICTOR_DIR}/*", PREDICTOR_FILE])]
    assert sampler.settings.pass_rate_predictor == "someone/tiny-ada"  # the model card shows what the user gave
    keys = keys_of(fresh_prompts(64, seed=5))
    assert sampler.estimator.predict(keys) == predictor.predict(keys)
    assert (
        resolve_pass_rate_predictor(
            SamplerSettings(
                num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor="learned"
            )
        )
        is None
    )
    with pytest.raises(ValueError, match="'someone/missing'.*404"):
        resolve_pass_rate_predictor(
            SamplerSettings(
                num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor="someone/missing"
            )
        )


def test_bad_predictor_sources_fail_at_construction(tmp_path):
    with pytest.raises(ValueError, match="without a learned predictor"):
        SamplerSettings(
            num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor=str(tmp_path)
        ).validated()
    with pytest.raises(ValueError, match="neither 'tracker', 'learned'"):
        SamplerSettings(
            num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor="./no such/dir/here"
        ).validated()
    (tmp_path / PREDICTOR_FILE).write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="not a learned pass-rate predictor"):
        build_sampler(
            SamplerSettings(
                num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor=str(tmp_path)
            )
        )
    # a Hub id passes validation (it is downloaded by the trainer) but cannot be built from pure settings
    settings = SamplerSettings(
        num_generations=4, scale_rewards="none", seed=0, sampler="est", pass_rate_predictor="someone/a-model"
    ).validated()
    with pytest.raises(ValueError, match="Hub repo id is downloaded by AdaGRPOTrainer"):
        build_sampler(settings)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampler="uniform", pass_rate_predictor="learned"), "pass_rate_predictor='learned' has no effect"),
        (dict(sampler="seq_balance", pass_rate_predictor="learned"), "round_policy='fixed'"),
        (dict(sampler="est", pass_rate_predictor_learning_rate=0.5), "pass_rate_predictor_learning_rate=0.5"),
        (dict(sampler="est", pass_rate_predictor="learned", pass_rate_predictor_learning_rate=0.0), "positive"),
        (dict(sampler="est", pass_rate_predictor="learned", pass_rate_predictor_learning_rate=math.nan), "finite"),
    ],
)
def test_predictor_knobs_follow_the_knob_rules(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplerSettings(**{"num_generations": 4, "scale_rewards": "none", "seed": 0, **kwargs}).validated()


def test_an_estimator_object_is_checked_at_construction():
    class NotJson(LearnedPassRatePredictor):
        def state_dict(self):
            return {"weights": {1, 2}}

    with pytest.raises(ValueError, match="ada_sampler_state.json.*not JSON-serialisable"):
        build_sampler(SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="est"), NotJson())
    with pytest.raises(TypeError, match="PassRateEstimator"):
        build_sampler(SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="est"), object())
    with pytest.raises(ValueError, match="Give one"):
        build_sampler(est_settings(), LearnedPassRatePredictor())
    with pytest.raises(ValueError, match="round_policy='fixed'"):
        build_sampler(
            SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="seq_pos"),
            LearnedPassRatePredictor(),
        )


# -- the round policies of seq_* ----------------------------------------------------------------------------------


def seq_settings(policy, **overrides):
    return SamplerSettings(
        sampler="seq_pos",
        num_generations=4,
        round_size=8,
        max_rounds=4,
        round_policy=policy,
        pass_rate_predictor="learned",
        **{"scale_rewards": "none", "seed": 0, **overrides},
    )


@pytest.mark.parametrize("policy", ["predictive", "tracked"])
def test_seq_round_policies_take_their_first_round_prior_from_the_predictor(policy):
    sampler = build_sampler(seq_settings(policy))
    easy = [PromptKey(f"easy {i}", f"  {i % 10}+  {i // 10 % 10}=") for i in range(64)]
    hard = [PromptKey(f"hard {i}", f"{100 + 7 * i}+{999 - 3 * i}=") for i in range(64)]
    for _ in range(5):  # the easy shape always succeeds, the hard one never
        step = sampler.begin(128, easy + hard)
        requests = step.requests()
        rewards = [float(index < 64) for index, count in requests for _ in range(count)]
        step.observe(requests, rewards)
        while requests := step.requests():
            step.observe(requests, [float(index < 64) for index, count in requests for _ in range(count)])
        step.finish()
    new_easy, new_hard = PromptKey("new easy", "  7+  1="), PromptKey("new hard", "123+456=")
    step = sampler.begin(2, [new_easy, new_hard])
    sizes = dict(step.requests())
    # seq_pos needs one positive: a likely-easy prompt asks only for its update group, a hard one for more
    assert sizes[0] == 4 and sizes[1] > 4
    if policy == "predictive":
        assert sampler.estimator.counts is None  # the prediction alone: no per-prompt memory
    else:
        assert len(sampler.estimator.counts.counts) == 128
    # the default tracker's predictive policy still asks round_size first
    plain = build_sampler(
        SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="seq_pos", round_policy="predictive")
    )
    assert dict(plain.begin(2, [new_easy, new_hard]).requests()) == {0: 8, 1: 8}


def test_seq_predictor_state_round_trips():
    sampler = build_sampler(seq_settings("tracked"))
    keys = keys_of(fresh_prompts(32, seed=0))
    step = sampler.begin(32, keys)
    requests = step.requests()
    step.observe(requests, [float(i % 3 == 0) for i, count in requests for _ in range(count)])
    while requests := step.requests():
        step.observe(requests, [1.0] * sum(count for _, count in requests))
    step.finish()
    resumed = build_sampler(seq_settings("tracked"))
    resumed.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert resumed.begin(32, keys).priors == sampler.begin(32, keys).priors


# -- trainer (tiny model, CPU) ----------------------------------------------------------------------------------


def test_est_with_the_learned_predictor_trains_saves_and_resumes(tmp_path, tokenizer, arithmetic_dataset):
    from conftest import tiny_args
    from test_trainer_est_dapo import make_trainer

    from trl_ada import AdaGRPOConfig

    common = dict(max_steps=4, per_device_train_batch_size=32, save_strategy="steps", save_steps=2)
    settings = dict(sampler="est", est_max_samples=12, pass_rate_predictor="learned")

    def decisions(trainer):
        return [[len(pool) for pool in s.pools] for s in trainer.selections]

    full = make_trainer(
        AdaGRPOConfig(**tiny_args(tmp_path / "full", **common), **settings), tokenizer, arithmetic_dataset
    )
    full.train()
    logged = [e for e in full.state.log_history if "ada/pass_rate_predictor/log_loss" in e]
    assert len(logged) == 4 and all(0.0 < e["ada/pass_rate_predictor/brier"] < 1.0 for e in logged)
    state = json.loads((tmp_path / "full" / "checkpoint-2" / "ada_sampler_state.json").read_text())
    assert state["sampler"]["estimator"]["model"]["updates"] == 2
    # the predictor is saved with the model, in every checkpoint and by save_model
    assert (tmp_path / "full" / "checkpoint-2" / PREDICTOR_DIR / PREDICTOR_FILE).is_file()
    full.save_model(str(tmp_path / "model"))
    assert (tmp_path / "model" / PREDICTOR_DIR / PREDICTOR_FILE).is_file()
    assert "pass_rate_predictor/predictor.json" in pushed_files(full)
    written = dict(
        (path.stem, title) for title, path in write_training_plots(full.state.log_history, tmp_path / "out")
    )
    assert "pass_rate_predictor" in written and (tmp_path / "out" / "plots" / "pass_rate_predictor.png").is_file()

    resumed = make_trainer(
        AdaGRPOConfig(**tiny_args(tmp_path / "full", **common), **settings), tokenizer, arithmetic_dataset
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    assert decisions(resumed) == decisions(full)[2:]
    assert resumed.ada_sampler.state_dict() == full.ada_sampler.state_dict()

    # warm start: another run reads the saved predictor from the model directory
    warm = make_trainer(
        AdaGRPOConfig(
            **tiny_args(tmp_path / "warm", max_steps=1, per_device_train_batch_size=32),
            sampler="est",
            est_max_samples=12,
            pass_rate_predictor=str(tmp_path / "model"),
        ),
        tokenizer,
        arithmetic_dataset,
    )
    keys = [PromptKey("k", p) for p in arithmetic_dataset["prompt"][:8]]
    assert warm.ada_sampler.estimator.predict(keys) == full.ada_sampler.estimator.predict(keys)


def pushed_files(trainer):
    """What `trainer.push_to_hub()` uploads, with the Hub API replaced (no network)."""
    import transformers.trainer

    uploads = []

    class FakeApi:
        def create_repo(self, repo_id, **kwargs):
            return mock.Mock(repo_id=f"someone/{repo_id}")

        def upload_folder(self, repo_id, folder_path, ignore_patterns=(), **kwargs):
            uploads.extend(p.relative_to(folder_path).as_posix() for p in Path(folder_path).rglob("*") if p.is_file())
            return "https://example.invalid/commit"

    if not hasattr(transformers.trainer, "hf_api"):
        pytest.skip("transformers < 5.10.1 imports the Hub functions by name")
    trainer.args.hub_model_id = "tiny-ada"
    with mock.patch("transformers.trainer.hf_api", return_value=FakeApi()):
        trainer.push_to_hub(blocking=True)
    return uploads


def test_the_config_rejects_a_predictor_directory_without_one(tmp_path):
    from conftest import tiny_args

    from trl_ada import AdaGRPOConfig

    with pytest.raises(ValueError, match="without a learned predictor"):
        AdaGRPOConfig(**tiny_args(tmp_path), sampler="est", pass_rate_predictor=str(tmp_path))


@pytest.mark.slow
def test_two_processes_make_identical_predictions_and_budgets(tmp_path):
    from conftest import launch_two_processes

    reports = launch_two_processes(Path(__file__).parent / "predictor_run.py", tmp_path, timeout=420)
    assert [r["num_processes"] for r in reports] == [2, 2]
    rank0, rank1 = reports
    assert rank0["steps"] and rank0["steps"] == rank1["steps"]
    assert rank0["state"] == rank1["state"]
    assert any(len(set(step["budgets"])) > 1 for step in rank0["steps"])


def test_the_quality_benchmark_runs_and_ranks_the_predictors(tmp_path):
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "predictor_quality.py"
    spec = importlib.util.spec_from_file_location("predictor_quality_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["--outcomes", "level", "--prompts", "768", "--batch-size", "64", "--skip", "4", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    summary = json.loads((tmp_path / "predictor_quality_level.json").read_text())["summary"]
    loss = {name: row["log_loss_after_4"] for name, row in summary.items()}
    assert loss["tracker"] == pytest.approx(math.log(2))  # 0.5 for every draw
    assert loss["level_oracle"] < loss["learned"] < loss["batch_mean"] < loss["tracker"]


def test_the_model_card_names_the_predictor():
    from trl_ada.reporting.card import sampler_rows

    rows = dict(sampler_rows(est_settings(pass_rate_predictor_learning_rate=0.3).validated()))
    assert rows["pass_rate_predictor"] == "learned" and rows["pass_rate_predictor_learning_rate"] == 0.3
    assert (
        dict(
            sampler_rows(SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="est").validated())
        )["pass_rate_predictor"]
        == "tracker"
    )
    assert "pass_rate_predictor" not in dict(
        sampler_rows(
            SamplerSettings(num_generations=4, scale_rewards="none", seed=0, sampler="seq_balance").validated()
        )
    )
