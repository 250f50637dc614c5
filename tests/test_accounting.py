"""Where the draws go (issue 33 item 1): the `draws/*` accounting of a step, with and without DAPO's refills."""

import math

import pytest

from trl_ada.samplers import SamplerSettings, build_sampler
from trl_ada.samplers.accounting import BANDS, PromptDraws, band_of, draw_metrics, draw_rates
from trl_ada.samplers.dapo import BatchFiller


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


def test_rates_over_many_small_reports_reduce_to_the_metrics_of_all_their_draws():
    # The asynchronous worker reports each batch (or group) on its own; TRL's async trainer reduces a window of
    # (numerator, denominator) pairs as sums. That must give the shares of the window's draws taken together, which a
    # mean of per-report shares would not (here: 2 useful of 4 draws, then 0 of 32: 2/36, not the mean 0.25).
    reduce_metric = pytest.importorskip("trl.experimental.async_grpo.async_grpo_trainer")._reduce_metric
    reports = [
        [PromptDraws(0.5, 4, useful=True, trained=4)],
        [PromptDraws(0.0, 32, useful=False, trained=0)],
        [PromptDraws(1.0, 8, useful=False, trained=0), PromptDraws(0.25, 16, useful=True, trained=4)],
    ]
    window: dict[str, list] = {}
    for report in reports:
        for name, rate in draw_rates(report).items():
            window.setdefault(name, []).append(rate)
    reduced = {name: reduce_metric(name, values) for name, values in window.items()}
    everything = draw_metrics([prompt for report in reports for prompt in report])
    for name, value in everything.items():
        expected = value / len(reports) if name == "draws/drawn" else value  # draws per report
        assert reduced[name] == pytest.approx(expected), name
    assert reduced["draws/useful_share"] == pytest.approx(20 / 60)
    # Bands never drawn in the window: no share, and no useful share to read.
    assert reduced["draws/high/share"] == 0 and math.isnan(reduced["draws/high/useful_share"])
    assert all(len(values) == len(reports) for values in window.values())  # every key in every report


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
