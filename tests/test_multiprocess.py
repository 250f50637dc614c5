"""Two CPU processes (gloo): every rank must make the same sampling decisions and no round may hang."""

from pathlib import Path

import pytest
from conftest import launch_two_processes

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "multiprocess_run.py"


@pytest.fixture(scope="module")
def two_process_reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("two_processes")
    return launch_two_processes(SCRIPT, out_dir, timeout=420)


def test_two_processes_ran(two_process_reports):
    for scenario in ("balance", "routing", "rollout", "est", "dapo", "tracked", "pool", "spo", "sparse"):
        assert [report[scenario]["num_processes"] for report in two_process_reports] == [2, 2]
        assert [report[scenario]["process_index"] for report in two_process_reports] == [0, 1]


@pytest.mark.parametrize(
    "scenario", ["balance", "routing", "rollout", "est", "dapo", "tracked", "pool", "spo", "sparse"]
)
def test_ranks_agree_on_every_selection(two_process_reports, scenario):
    rank0, rank1 = (report[scenario] for report in two_process_reports)
    assert rank0["selections"] and rank0["selections"] == rank1["selections"]


def test_tracked_baselines_give_unmixed_groups_with_history_a_signal_on_both_processes(two_process_reports):
    # An unmixed kept group with non-zero advantages exists only under a baseline read from the prompt's history.
    rank0 = two_process_reports[0]["tracked"]
    unmixed_with_signal = [
        advantages
        for selection in rank0["selections"]
        for pool, kept, advantages in zip(selection["pools"], selection["kept"], selection["advantages"])
        if len({pool[i] for i in kept}) == 1 and any(a != 0.0 for a in advantages)
    ]
    assert unmixed_with_signal


def test_the_whole_pool_trains_split_evenly_over_processes_and_micro_batches(two_process_reports):
    from trl_ada.samplers import PromptResult
    from trl_ada.samplers.base import fit_trained_rows

    rank0, rank1 = (report["pool"] for report in two_process_reports)
    assert rank0["rows_line_up"] == rank1["rows_line_up"] == [True] * len(rank0["local_rows"])
    outgrew = False
    for step, selection in enumerate(rank0["selections"]):
        pools = selection["pools"]
        assert [len(kept) for kept in selection["kept"]] == [len(pool) for pool in pools]  # every draw kept
        outgrew |= any(len(pool) > 4 for pool in pools)
        results = [
            PromptResult(tuple(kept), 0.0, None, 1.0, 0.5, tuple(advantages), True, 1.0)
            for kept, advantages in zip(selection["kept"], selection["advantages"], strict=True)
        ]
        # lcm(num_generations 4, 2 processes x steps_per_generation 2) = 4: fewer than 4 draws left out
        fitted, left_out = fit_trained_rows(results, 4, 4)
        assert left_out < 4 and sum(len(pool) for pool in pools) - left_out == 2 * rank0["local_rows"][step]
        assert rank0["local_rows"][step] == rank1["local_rows"][step] and rank0["local_rows"][step] % 2 == 0
        trained = rank0["trained_advantages"][step] + rank1["trained_advantages"][step]
        # The step factor over both processes' rows (TRL's default loss divides by tokens): sum c / sum share x c.
        tokens = rank0["trained_tokens"][step] + rank1["trained_tokens"][step]
        shares = rank0["draw_shares"][step]
        assert shares == rank1["draw_shares"][step] and len(shares) == len(tokens) == len(trained)
        factor = sum(tokens) / sum(s * c for s, c in zip(shares, tokens, strict=True))
        expected = [factor * a for result in fitted for a in result.advantages]
        assert trained == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert outgrew  # some pool was larger than its group of 4, so the rows differed from TRL's batch


def test_spo_draws_the_same_prompts_by_priority_on_both_processes(two_process_reports):
    rank0, rank1 = (report["spo"] for report in two_process_reports)
    assert rank0["baseline_history"] == rank1["baseline_history"] and rank0["baseline_history"]["counts"]
    for local0, local1 in zip(rank0["drawn_prompts"], rank1["drawn_prompts"], strict=True):
        # TRL's layout: the generation batch's 4 prompts, each twice in a row, 4 rows to each process.
        rows = local0 + local1
        prompts = rows[::2]
        assert rows[1::2] == prompts and len(set(prompts)) == 4


def test_balance_run_keeps_static_shapes(two_process_reports):
    for report in two_process_reports:
        run = report["balance"]
        assert run["local_rows"] == [4] * len(run["local_rows"])  # per_device_train_batch_size rows per rank
        for selection in run["selections"]:
            # 2 ranks x 4 rows = 8 rows = 2 prompts of n=4 each
            assert [len(kept) for kept in selection["kept"]] == [4, 4]


def test_round_with_fewer_rows_than_processes_does_not_hang(two_process_reports):
    run = two_process_reports[0]["sparse"]
    for selection in run["selections"]:
        # one prompt, never retired: 1 completion per round on 2 processes, for all 3 rounds
        assert [len(pool) for pool in selection["pools"]] == [3]
        assert selection["active_after_round"] == [1, 1, 0]


def test_est_and_dapo_keep_static_shapes_on_two_processes(two_process_reports):
    for report in two_process_reports:
        assert report["est"]["local_rows"] == [8, 8, 8]
        for selection in report["est"]["selections"]:
            assert sum(len(kept) for kept in selection["kept"]) == 16  # 2 ranks x 8 rows, variable groups
        assert report["dapo"]["local_rows"] == [4, 4]


def test_kept_rows_move_to_the_process_that_trains_them(two_process_reports):
    # Pools stay on the process that generated them; the kept rows are routed at the end of the step. Some rows must
    # really have moved (else this checks nothing), and on both processes every trained row is the completion whose
    # reward (a fingerprint of its text, scored where it was generated) the loss receives.
    for report in two_process_reports:
        run = report["routing"]
        assert any(moved > 0 for moved in run["moved"]), run["moved"]
        assert run["rows_line_up"] == [True] * len(run["local_rows"])


def test_resume_without_shared_storage_fails_on_every_process_with_one_message(two_process_reports):
    # Only the main process's directory has the checkpoint's model; the main process picks the checkpoint for all and
    # every process must see it. Before, process 1 failed alone and process 0 went on into a collective.
    reports = [report["local_disks"] for report in two_process_reports]
    assert [report["main_has_checkpoint"] for report in reports] == [True, False]
    for report in reports:
        assert "Process(es) [1] of 2 cannot read the complete checkpoint 'disk/checkpoint-1'" in report["error"]
        assert "shares" in report["error"]


def test_rollout_func_rows_keep_their_masks_fields_and_rewards_on_every_process(two_process_reports):
    for report in two_process_reports:
        run = report["rollout"]
        assert run["rollout_rows_line_up"] == [True] * len(run["local_rows"])
        assert run["local_rows"] == [6] * len(run["local_rows"])
    # Some kept rows changed process, so the check covers rows routed between processes.
    assert any(moved > 0 for moved in two_process_reports[0]["rollout"]["moved"])
