"""Remembered baselines, in pure Python: `baseline="tracked"` (SPO's: each prompt's pass rate from its earlier steps)
and `"predicted"` (the learned predictor's estimate); `normalize_advantages` (SPO's batch normalisation)."""

import json
import math

import pytest

from trl_ada import AdaGRPOConfig
from trl_ada.samplers import PromptKey, SamplerSettings, build_sampler
from trl_ada.samplers.base import describe, draw_memories
from trl_ada.samplers.dapo import BatchFiller
from trl_ada.samplers.predictor import LearnedPassRatePredictor


def tracked(**overrides):
    values = dict(sampler="uniform", num_generations=4, baseline="tracked", scale_rewards="none")
    return build_sampler(SamplerSettings(**(values | overrides)))


def step(sampler, keys, rewards):
    """One generation batch of `keys`, each prompt drawn once with its list of `rewards`."""
    current = sampler.begin(len(keys), keys)
    requests = current.requests()
    assert requests == [(index, len(r)) for index, r in enumerate(rewards)]
    current.observe(requests, [reward for group in rewards for reward in group])
    return current.finish()


def beta_mean(positives, total, alpha=1.0, beta=1.0):
    return (positives + alpha) / (total + alpha + beta)


def test_an_unmixed_group_on_a_prompt_with_history_gets_minus_its_remembered_pass_rate():
    sampler = tracked()
    first = step(sampler, ["a", "b"], [[1, 0, 0, 0], [0, 0, 0, 0]])
    # First visits fall back to the pool: "a" is GRPO's group, "b" (all wrong, no history) has no signal.
    assert first.prompts[0].advantages == (0.75, -0.25, -0.25, -0.25)
    assert not first.prompts[1].has_signal and first.prompts[1].advantages == (0.0,) * 4
    assert first.metrics["baseline/tracked_share"] == 0.0

    second = step(sampler, ["a", "b", "c"], [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    # Read before this step's draws are added: "a" had 1 of 4, "b" 0 of 4, under the Beta(1, 1) prior.
    p_a, p_b = beta_mean(1, 4), beta_mean(0, 4)
    assert second.prompts[0].has_signal and second.prompts[0].advantages == pytest.approx((-p_a,) * 4)
    assert second.prompts[1].has_signal and second.prompts[1].advantages == pytest.approx((-p_b,) * 4)
    assert second.prompts[2].baseline == 0.5  # "c" is new: its pool's mean
    assert second.metrics["baseline/tracked_share"] == pytest.approx(2 / 3)

    # The history decays (pass_rate_decay 0.9) and then adds the step: "a" is now 0.9 * (4, 1) + (4, 0).
    third = step(sampler, ["a"], [[1, 1, 1, 1]])
    assert third.prompts[0].advantages == pytest.approx((1 - beta_mean(0.9, 7.6),) * 4)


def test_a_group_equal_to_its_remembered_baseline_has_no_signal():
    # With a tolerance wide enough to cover the gap, the group is constant around its baseline: nothing to learn.
    sampler = tracked(zero_variance_tolerance=0.5)
    step(sampler, ["a"], [[0, 0, 0, 0]])
    again = step(sampler, ["a"], [[0, 0, 0, 0]])
    assert again.prompts[0].baseline == pytest.approx(beta_mean(0, 4))
    assert not again.prompts[0].has_signal and again.prompts[0].advantages == (0.0,) * 4


def test_dapo_keeps_an_unmixed_group_whose_history_gives_it_a_signal():
    sampler = tracked(sampler="dapo", num_generations=2)
    step(sampler, ["a", "b"], [[1, 0], [1, 0]])
    later = step(sampler, ["a", "z"], [[0, 0], [0, 0]])
    # "a" has history (1 of 2), "z" is new: DAPO's filter keeps only the groups with a signal.
    assert [prompt.has_signal for prompt in later.prompts] == [True, False]
    filler = BatchFiller(num_prompts=1)
    filler.add(later)
    assert filler.is_full and filler.take(keep_partial=False) == [(0, 0)]
    assert filler.update_results(sampler.settings)[0].advantages == pytest.approx((-beta_mean(1, 2),) * 2)


def test_the_history_survives_a_checkpoint_and_is_json():
    sampler = tracked()
    step(sampler, ["a", "b"], [[1, 0, 0, 0], [1, 1, 1, 0]])
    state = json.loads(json.dumps(sampler.state_dict()))
    resumed = tracked()
    resumed.load_state_dict(state)
    rewards = [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert step(resumed, ["a", "b"], rewards).prompts == step(sampler, ["a", "b"], rewards).prompts


def test_a_tracked_baseline_needs_prompt_keys():
    current = tracked().begin(1)
    current.observe(current.requests(), [1, 0, 0, 0])
    with pytest.raises(ValueError, match="prompt_keys"):
        current.finish()


def test_other_baselines_keep_no_history():
    sampler = build_sampler(SamplerSettings(sampler="uniform", num_generations=4))
    assert sampler.baseline_history is None and "baseline_history" not in sampler.state_dict()
    step(sampler, ["a"], [[1, 0, 0, 0]])
    assert "baseline/tracked_share" not in step(sampler, ["a"], [[0, 0, 0, 0]]).metrics


def test_group_and_batch_scaling_are_refused_with_the_fix(tmp_path):
    for scale in ("group", "batch"):
        with pytest.raises(ValueError, match="needs scale_rewards='none'"):
            AdaGRPOConfig(
                output_dir=str(tmp_path), use_cpu=True, report_to="none", baseline="tracked", scale_rewards=scale
            )
    config = AdaGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        sampler="dapo",
        baseline="tracked",
        scale_rewards="none",
        pass_rate_decay=0.5,
    )
    assert config.sampler_settings().reads("pass_rate_decay")


def test_the_history_knobs_are_unread_without_a_tracked_baseline():
    with pytest.raises(ValueError, match="baseline='tracked'"):
        build_sampler(SamplerSettings(sampler="uniform", pass_rate_prior_alpha=2.0))


def test_the_card_names_the_tracked_baseline():
    text = describe(tracked(sampler="dapo").settings)
    assert "mean reward from its earlier steps" in text


def test_normalize_advantages_is_spos_batch_normalisation():
    sampler = tracked(normalize_advantages=True)
    step(sampler, ["a", "b"], [[1, 0, 0, 0], [1, 1, 1, 0]])
    later = step(sampler, ["a", "b", "new"], [[0, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    p_a, p_b = beta_mean(1, 4), beta_mean(3, 4)
    centred = [-p_a] * 4 + [1 - p_b] * 3 + [-p_b]  # "new" has no signal and is left out
    mean = sum(centred) / 8
    spread = math.sqrt(sum((c - mean) ** 2 for c in centred) / 7)
    assert abs(mean) > 0.1  # the centring matters here
    normalised = [(c - mean) / (spread + 1e-4) for c in centred]
    assert later.prompts[0].advantages + later.prompts[1].advantages == pytest.approx(tuple(normalised))
    assert later.prompts[2].advantages == (0.0,) * 4
    assert not sampler.settings.rules_are_per_prompt  # a batch-level rule: a streaming worker must wait for the batch


def test_normalize_advantages_centres_an_update_whose_rows_agree_to_zero():
    sampler = tracked(normalize_advantages=True)
    step(sampler, ["a"], [[1, 0, 0, 0]])
    assert step(sampler, ["a"], [[0, 0, 0, 0]]).prompts[0].advantages == (0.0,) * 4


def test_normalize_advantages_refuses_a_second_scaling():
    with pytest.raises(ValueError, match="scale_rewards='none'"):
        tracked(normalize_advantages=True, scale_rewards="batch")


# -- baseline="predicted": the learned predictor speaks for first visits too ------------------------------------------


def predicted(**overrides):
    values = dict(pass_rate_predictor="learned", baseline="predicted")
    return tracked(**(values | overrides))


def test_a_predicted_baseline_is_the_predictors_estimate_before_the_step_first_visits_included():
    sampler = predicted(sampler="dapo")
    assert sampler.estimator is None and isinstance(sampler.baseline_history, LearnedPassRatePredictor)
    shadow = LearnedPassRatePredictor()  # the same predictor, fed the same draws by hand
    keys = [PromptKey("a", " 12+ 34="), PromptKey("b", " 99* 97=")]
    for rewards in ([[1, 0, 0, 0], [0, 0, 0, 0]], [[1, 1, 0, 0], [0, 0, 0, 0]]):
        expected = shadow.estimate(keys)
        selection = step(sampler, keys, rewards)
        # Every prompt is scored against the prediction, so an all-wrong first visit carries a signal too.
        assert [prompt.baseline for prompt in selection.prompts] == pytest.approx(expected)
        assert all(prompt.has_signal for prompt in selection.prompts)
        assert selection.prompts[1].advantages == pytest.approx((-expected[1],) * 4)
        assert selection.metrics["baseline/tracked_share"] == 1.0
        shadow.update(keys, [4, 4], [sum(group) for group in rewards])
    assert shadow.estimate(keys)[1] < 0.5  # it learned that "b" fails


def test_a_predicted_baseline_reads_the_predictor_its_settings_name_not_an_estimator_object():
    settings = SamplerSettings(
        sampler="uniform", num_generations=4, baseline="predicted", pass_rate_predictor="learned", scale_rewards="none"
    )
    with pytest.raises(ValueError, match="baseline='predicted' reads the predictor that pass_rate_predictor names"):
        build_sampler(settings, LearnedPassRatePredictor())
    sampler = build_sampler(settings)
    # Held once: a resumed asynchronous worker leaves the rows it already counted out of every memory.
    assert sampler.estimator is None and draw_memories(sampler) == (sampler.baseline_history,)


def test_a_saved_predictor_warm_starts_the_baseline(tmp_path):
    saved = LearnedPassRatePredictor()
    keys = [PromptKey("a", " 12+ 34="), PromptKey("b", " 99* 97=")]
    saved.update(keys, [8, 8], [8, 0])
    saved.save_pretrained(tmp_path)
    settings = SamplerSettings(
        sampler="dapo",
        num_generations=4,
        baseline="predicted",
        pass_rate_predictor=str(tmp_path),
        scale_rewards="none",
    )
    from_directory = build_sampler(settings)
    from_hub_snapshot = build_sampler(settings, predictor_source=str(tmp_path))
    for sampler in (from_directory, from_hub_snapshot):
        assert sampler.baseline_history.predict(keys) == saved.predict(keys)


def test_est_keeps_its_own_predictor_apart_from_the_baselines():
    sampler = predicted(sampler="est", est_max_samples=8)
    assert isinstance(sampler.estimator, LearnedPassRatePredictor)
    assert sampler.baseline_history is not sampler.estimator
    state = json.loads(json.dumps(sampler.state_dict()))
    assert "estimator" in state and "baseline_history" in state


def test_a_predicted_baseline_needs_a_learned_predictor():
    with pytest.raises(ValueError, match="pass_rate_predictor='learned'"):
        tracked(baseline="predicted")


@pytest.mark.parametrize("sampler_name", ["seq_pos", "seq_balance"])
def test_the_round_samplers_hand_their_keys_to_a_remembered_baseline(sampler_name):
    # seq_pos and seq_balance begin their steps themselves; the keys must reach the baseline's history there too.
    sampler = tracked(sampler=sampler_name, num_generations=2, round_size=2, max_rounds=1)
    first = step(sampler, ["a"], [[1, 0]])
    assert first.prompts[0].baseline == 0.5
    later = step(sampler, ["a"], [[0, 0]])
    assert later.prompts[0].baseline == pytest.approx(beta_mean(1, 2))
