"""`sampler="dapo_gated"` (issue 33 item 3): DAPO whose refill passes over prompts predicted to come back unmixed."""

import math

import pytest

from trl_ada.experimental.dapo_gated import mixed_chance
from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.dapo import BatchExhaustedError, RefillWalk, fill_update, refill_gate


def settings(**options):
    return SamplerSettings(sampler="dapo_gated", num_generations=4, seed=0, sampler_kwargs=options or None).validated()


@pytest.mark.parametrize(("alpha", "beta", "draws"), [(1.0, 1.0, 2), (0.3, 2.7, 4), (2.0, 5.0, 3), (0.5, 0.5, 1)])
def test_mixed_chance_is_the_beta_binomial_chance_of_both_outcomes(alpha, beta, draws):
    # Beta-binomial pmf of 0 and `draws` successes, summed exactly from the Beta function.
    def log_beta(a, b):
        return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    none = math.exp(log_beta(alpha, beta + draws) - log_beta(alpha, beta))
    every = math.exp(log_beta(alpha + draws, beta) - log_beta(alpha, beta))
    assert mixed_chance(alpha, beta, draws) == pytest.approx(1.0 - none - every, rel=1e-12)
    assert mixed_chance(1.0, 1.0, 2) == pytest.approx(1 / 3)  # 2 E[p (1 - p)] under the uniform


def visit(sampler, keys, pools):
    """One batch of the sampler on `keys`, each drawing its pool exactly."""
    step = sampler.begin(len(keys), keys)
    requests = step.requests()
    step.observe(requests, [r for pool in pools for r in pool])
    return step.finish()


def test_a_prompt_wrong_at_every_visit_is_passed_over_and_a_mixed_or_new_one_is_not():
    sampler = build_sampler(settings())
    mixed = [[1.0, 0.0, 0.0, 0.0]] * 3
    for _ in range(4):
        visit(sampler, ["hopeless", "solved", "a", "b", "c"], [[0.0] * 4, [1.0] * 4, *mixed])
    # Measured: 3 of 5 groups mixed. The prior sits at the mean pass rate, 15 / 40, so an all-right prompt takes more
    # visits than an all-wrong one to be judged (four here; the next test shows one all-wrong visit can be enough).
    assert sampler.mixed_share == pytest.approx(0.6)
    assert sampler.refill_passes_over("hopeless") and sampler.refill_passes_over("solved")
    assert not sampler.refill_passes_over("a")
    assert not sampler.refill_passes_over("never drawn")
    plain = build_sampler(settings(min_mixed_chance_ratio=0.0))
    for _ in range(2):
        visit(plain, ["hopeless", "a"], [[0.0] * 4, [1.0, 0.0, 0.0, 0.0]])
    assert not plain.refill_passes_over("hopeless")  # ratio 0: DAPO's refill


def test_one_all_wrong_visit_on_a_hard_set_is_evidence_but_not_on_an_easy_one():
    hard, easy = build_sampler(settings()), build_sampler(settings())
    visit(hard, ["x", *"abcdefg"], [[0.0] * 4, *[[1.0, 0.0, 0.0, 0.0]] * 7])  # mean pass rate 7 / 32
    visit(easy, ["x", *"abcdefg"], [[0.0] * 4, *[[1.0, 1.0, 1.0, 0.0]] * 7])  # mean pass rate 21 / 32
    assert hard.refill_passes_over("x")
    assert not easy.refill_passes_over("x")


def test_the_walk_steps_past_passed_over_prompts_and_the_state_survives_a_checkpoint():
    sampler = build_sampler(settings())
    rows = [{"prompt": name} for name in ("hopeless", "a", "b", "c", "d", "e")]
    for _ in range(2):
        visit(sampler, ["hopeless", "a", "b"], [[0.0] * 4, [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    walk = RefillWalk(rows, lambda epoch: list(range(len(rows))), lambda row: row["prompt"])
    drawn = []

    def sample(batch):
        drawn.append([row["prompt"] for row in batch])
        return visit(sampler, [row["prompt"] for row in batch], [[1.0, 0.0, 1.0, 0.0]] * len(batch))

    first = visit(sampler, ["c", "d"], [[0.0] * 4, [0.0] * 4])
    filler = fill_update(first, ["c", "d"], sample, walk, max_refills=2, keep_partial=True,
                         passes_over=refill_gate(sampler))  # fmt: skip
    assert drawn == [["a", "b"]]  # "hopeless" stepped past, "c" and "d" already in the step
    assert filler.metrics()["dapo/filled_share"] == 1.0
    restored = build_sampler(settings())
    restored.load_state_dict(sampler.state_dict())
    for key in ("hopeless", "a", "c", "new"):
        assert restored.predicted_mixed_chance(key) == sampler.predicted_mixed_chance(key)
    assert restored.mixed_share == sampler.mixed_share


@pytest.mark.parametrize("bad", [{"min_mixed_chance_ratio": 1.5}, {"min_mixed_chance_ratio": -0.1},
                                 {"prior_draws": 0}, {"prior_draws": math.inf}, {"ratio": 0.5}])  # fmt: skip
def test_bad_options_are_refused_naming_the_knob(bad):
    with pytest.raises(ValueError, match=next(iter(bad)) if "ratio" != next(iter(bad)) else "does not take"):
        settings(**bad)


def test_the_gate_changes_only_which_refill_prompts_are_drawn():
    # The same step under DAPO and under a gate that has learned h0..h3 are hopeless: the loader's batch, every prompt
    # drawn by both, and the update are DAPO's; the gated refill draws DAPO's walk without the prompts it passes over.
    pools = {"h": [0.0] * 4, "s": [1.0] * 4, "m": [1.0, 0.0, 0.0, 1.0], "x": [0.0] * 4}
    rows = [{"prompt": name} for name in ("m0", "h0", "h1", "m1", "s0", "h2", "m2", "m3", "h3", "m4", "m5")]
    dapo_settings = SamplerSettings(sampler="dapo", num_generations=4, seed=0).validated()
    runs = {}
    for name, sampler in (("dapo", build_sampler(dapo_settings)), ("gated", hopeless_history())):
        drawn, results = [], {}

        def sample(batch, sampler=sampler, drawn=drawn, results=results):
            keys = [row["prompt"] for row in batch]
            drawn.extend(keys)
            selection = visit(sampler, keys, [pools[key[0]] for key in keys])
            results.update(zip(keys, zip(selection.prompts, selection.pools, strict=True), strict=True))
            return selection

        first_keys = ["x0", "x1", "x2"]
        first = sample([{"prompt": key} for key in first_keys])
        walk = RefillWalk(rows, lambda epoch: list(range(len(rows))), lambda row: row["prompt"])
        filler = fill_update(first, first_keys, sample, walk, max_refills=10, keep_partial=False,
                             passes_over=refill_gate(sampler))  # fmt: skip
        batches = [first_keys, *[drawn[i : i + 3] for i in range(3, len(drawn), 3)]]  # every refill batch is full
        update = [batches[batch][prompt] for batch, prompt in filler.taken]
        runs[name] = drawn, results, update, filler.passed_over
    dapo_drawn, dapo_results, dapo_update, dapo_passed = runs["dapo"]
    gated_drawn, gated_results, gated_update, gated_passed = runs["gated"]
    assert dapo_passed == 0 and gated_passed > 0  # the gate acted
    hopeless = {"h0", "h1", "h2", "h3"}
    assert hopeless & set(dapo_drawn) and not hopeless & set(gated_drawn)
    # Both draw the loader's batch, then the walk in its order; the gated refill skips what its gate passes over.
    walk_order = [row["prompt"] for row in rows]
    assert dapo_drawn == ["x0", "x1", "x2", *walk_order[: len(dapo_drawn) - 3]]
    let_through = [key for key in walk_order if key not in hopeless]
    assert gated_drawn == ["x0", "x1", "x2", *let_through[: len(gated_drawn) - 3]]
    assert len(gated_drawn) < len(dapo_drawn)  # fewer completions for the same update
    for key in set(gated_drawn) & set(dapo_drawn):
        assert gated_results[key] == dapo_results[key], key
    assert gated_update == dapo_update == ["m0", "m1", "m2"]
    assert [gated_results[key] for key in gated_update] == [dapo_results[key] for key in dapo_update]


def test_the_fitted_prior_recovers_the_spread_of_the_prompts_pass_rates():
    import random

    from trl_ada.experimental.dapo_gated import FITTED_WEIGHT_BOUNDS, fitted_prior

    rng = random.Random(0)
    counts = []
    for _ in range(20_000):
        p = rng.betavariate(0.5, 2.0)  # mean 0.2, weight alpha + beta = 2.5
        draws = rng.choice([4, 8, 12])
        counts.append((float(draws), float(sum(rng.random() < p for _ in range(draws)))))
    alpha, beta = fitted_prior(counts)
    # The moment fit's relative error at 20,000 prompts is a few percent; 15% leaves room for the seed.
    assert alpha / (alpha + beta) == pytest.approx(0.2, abs=0.01)
    assert alpha + beta == pytest.approx(2.5, rel=0.15)
    # Every prompt at the same rate: no spread beyond the binomial noise (the estimate of Var(p) = 0 is noise of
    # about 0.001 here), so a heavy prior, at most the bound: one visit then says little about a prompt.
    same = [(8.0, float(sum(rng.random() < 0.3 for _ in range(8)))) for _ in range(5_000)]
    assert 50 < sum(fitted_prior(same)) <= FITTED_WEIGHT_BOUNDS[1]
    assert sum(fitted_prior([(8.0, 3.0)] * 10)) == FITTED_WEIGHT_BOUNDS[1]  # no measured spread at all
    with pytest.raises(ValueError, match="at least one prompt"):
        fitted_prior([(0.0, 0.0)])
    # The sampler uses it when asked.
    sampler = build_sampler(settings(prior="fitted"))
    visit(sampler, ["x", "a", "b", "c"], [[0.0] * 4, [1.0, 0.0, 0.0, 0.0], [1.0] * 4, [0.0, 1.0, 1.0, 0.0]])
    fitted = fitted_prior(sampler.history.counts.values())
    assert sum(sampler.prior_parameters()) == pytest.approx(sum(fitted))
    with pytest.raises(ValueError, match="prior"):
        settings(prior="flat")


def test_pass_rate_decay_is_accepted_and_discounts_the_gates_history(tmp_path):
    from trl_ada import AdaGRPOConfig

    config = AdaGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        bf16=False,
        num_generations=4,
        sampler="dapo_gated",
        pass_rate_decay=0.5,
    )
    sampler = build_sampler(config.sampler_settings())
    assert sampler.history.decay == 0.5
    for _ in range(2):
        visit(sampler, ["x", "a"], [[0.0] * 4, [1.0, 0.0, 0.0, 0.0]])
    # N <- 0.5 N + 4 at the second visit: (6, 0) and (6, 1.5), not 0.9's (7.6, 0) and (7.6, 1.9).
    assert sampler.history.counts == {"x": (6.0, 0.0), "a": (6.0, 1.5)}
    # The value is checked where it is read now, not waved through.
    with pytest.raises(ValueError, match="pass_rate_decay must lie in"):
        SamplerSettings(sampler="dapo_gated", pass_rate_decay=0.0).validated()


def hopeless_history():
    """A gate that passes over `h0`..`h3` (wrong at every draw of two visits, beside always-mixed prompts)."""
    sampler = build_sampler(settings())
    keys = ["h0", "h1", "h2", "h3", "m0", "m1", "m2", "m3"]
    for _ in range(2):
        visit(sampler, keys, [[0.0] * 4] * 4 + [[1.0, 0.0, 1.0, 0.0]] * 4)
    assert all(sampler.refill_passes_over(key) for key in keys[:4])
    return sampler


def test_a_gate_that_passes_over_every_remaining_prompt_does_not_starve_the_refill():
    sampler = hopeless_history()
    rows = [{"prompt": name} for name in ("c", "d", "h0", "h1", "h2", "h3")]
    walk = RefillWalk(rows, lambda epoch: list(range(len(rows))), lambda row: row["prompt"])
    drawn = []

    def learned(batch):  # the policy has since learned the hopeless prompts: they come back mixed
        drawn.append([row["prompt"] for row in batch])
        return visit(sampler, drawn[-1], [[1.0, 0.0, 0.0, 0.0]] * len(batch))

    first = visit(sampler, ["c", "d"], [[0.0] * 4, [1.0] * 4])
    filler = fill_update(first, ["c", "d"], learned, walk, max_refills=10, keep_partial=False,
                         passes_over=refill_gate(sampler))  # fmt: skip
    # A whole walk passed over all four: the refill batch is drawn from them as DAPO would (before: none drawn, and
    # "found only 0 of 2 after 0 extra generation batches. Raise dapo_max_refills").
    assert drawn == [["h0", "h1"]]
    assert filler.metrics()["dapo/filled_share"] == 1.0 and filler.passed_over == 4


def test_a_refill_that_runs_out_of_prompts_says_so_rather_than_to_raise_the_cap():
    sampler = hopeless_history()
    rows = [{"prompt": name} for name in ("c", "d", "h0", "h1", "h2", "h3")]
    walk = RefillWalk(rows, lambda epoch: list(range(len(rows))), lambda row: row["prompt"])
    drawn = []

    def unmixed(batch):
        drawn.append([row["prompt"] for row in batch])
        return visit(sampler, drawn[-1], [[0.0] * 4] * len(batch))

    first = visit(sampler, ["c", "d"], [[0.0] * 4, [1.0] * 4])
    with pytest.raises(BatchExhaustedError, match=r"after 2 extra .* every prompt of the dataset \(6\)") as error:
        fill_update(first, ["c", "d"], unmixed, walk, max_refills=10, keep_partial=False,
                    passes_over=refill_gate(sampler))  # fmt: skip
    assert "Raise dapo_max_refills" not in str(error.value)
    assert sorted(prompt for batch in drawn for prompt in batch) == ["h0", "h1", "h2", "h3"]
