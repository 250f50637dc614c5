"""Where the draws go (issue 33 item 1): the `draws/*` accounting of a step, with and without DAPO's refills."""

import math

import pytest

from trl_ada.samplers import BatchFiller, SamplerSettings, build_sampler
from trl_ada.samplers.accounting import BANDS, PromptDraws, band_of, draw_metrics


def finish(settings, pools):
    """One round drawing each pool exactly, then `finish()`."""
    step = build_sampler(settings).begin(len(pools))
    requests = step.requests()
    assert [count for _, count in requests] == [len(pool) for pool in pools]
    step.observe(requests, [r for pool in pools for r in pool])
    return step.finish()


@pytest.mark.parametrize(
    ("pass_rate", "band"),
    [(0.0, "none_right"), (1e-9, "low"), (0.25, "low"), (0.2500001, "mid"), (0.7499, "mid"), (0.75, "high"),
     (0.999, "high"), (1.0, "all_right"), (math.nan, "unscored")],
)  # fmt: skip
def test_bands_split_at_their_edges(pass_rate, band):
    assert band_of(pass_rate) == band


def test_the_metrics_count_draws_per_band_and_their_useful_share():
    metrics = draw_metrics(
        [
            PromptDraws(0.0, 32, useful=False, trained=0),  # a hopeless prompt hunted to the cap
            PromptDraws(0.5, 8, useful=True, trained=4),
            PromptDraws(0.125, 16, useful=True, trained=4),
            PromptDraws(0.1, 8, useful=False, trained=0),  # mixed, but not in the update (an untaken refill)
        ]
    )
    assert metrics["draws/drawn"] == 64
    assert metrics["draws/useful_share"] == pytest.approx(24 / 64)
    assert metrics["draws/trained_share"] == pytest.approx(8 / 64)
    assert metrics["draws/none_right/share"] == pytest.approx(0.5) and metrics["draws/none_right/useful_share"] == 0
    assert metrics["draws/low/share"] == pytest.approx(24 / 64)
    assert metrics["draws/low/useful_share"] == pytest.approx(16 / 24)
    assert metrics["draws/mid/useful_share"] == 1.0
    assert not any(f"draws/{band}/share" in metrics for band in ("high", "all_right", "unscored"))
    assert set(BANDS) >= {key.split("/")[1] for key in metrics if key.count("/") == 2}


def test_grpo_counts_a_constant_groups_draws_as_spent_without_use():
    settings = SamplerSettings(sampler="uniform", num_generations=4)
    selection = finish(settings, [[1.0, 0.0, 0.0, 0.0], [0.0] * 4, [1.0] * 4])
    metrics = selection.metrics
    assert metrics["draws/drawn"] == 12
    assert metrics["draws/useful_share"] == pytest.approx(4 / 12) == metrics["draws/trained_share"]
    assert metrics["draws/none_right/share"] == metrics["draws/all_right/share"] == pytest.approx(4 / 12)
    assert metrics["draws/low/useful_share"] == 1.0


def test_a_sequential_pool_is_useful_draws_but_only_its_kept_group_is_trained():
    settings = SamplerSettings(sampler="seq_balance", num_generations=4, round_size=8, max_rounds=1)
    pools = [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 8]
    metrics = finish(settings, pools).metrics
    assert metrics["draws/useful_share"] == pytest.approx(8 / 16)
    assert metrics["draws/trained_share"] == pytest.approx(4 / 16)
    assert metrics["draws/none_right/useful_share"] == 0.0


def test_with_refills_the_filler_accounts_every_batch_and_only_the_taken_groups_are_useful():
    settings = SamplerSettings(sampler="dapo", num_generations=2)
    first = finish(settings, [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    assert not any(key.startswith("draws/") for key in first.metrics)  # the filler accounts the update
    filler = BatchFiller(num_prompts=2)
    filler.add(first)
    filler.add(finish(settings, [[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    assert filler.take(keep_partial=False) == [(0, 0), (1, 0)]
    metrics = filler.metrics()
    assert metrics["draws/drawn"] == 12
    # The two taken groups; the second batch's second mixed group was drawn and not used.
    assert metrics["draws/useful_share"] == pytest.approx(4 / 12) == metrics["draws/trained_share"]
    assert metrics["draws/mid/share"] == pytest.approx(6 / 12)
    assert metrics["draws/mid/useful_share"] == pytest.approx(4 / 6)
