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
    for scenario in ("balance", "routing", "rollout", "est", "dapo", "sparse"):
        assert [report[scenario]["num_processes"] for report in two_process_reports] == [2, 2]
        assert [report[scenario]["process_index"] for report in two_process_reports] == [0, 1]


@pytest.mark.parametrize("scenario", ["balance", "routing", "rollout", "est", "dapo", "sparse"])
def test_ranks_agree_on_every_selection(two_process_reports, scenario):
    rank0, rank1 = (report[scenario] for report in two_process_reports)
    assert rank0["selections"] and rank0["selections"] == rank1["selections"]


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


# ---------------------------------------------------------------------------------------------------------------------
# vLLM server mode on two processes (tests/server_mode_run.py, against tests/fake_vllm_server.py)
# ---------------------------------------------------------------------------------------------------------------------

SERVER_MODE_SCRIPT = Path(__file__).parent / "server_mode_run.py"


@pytest.fixture(scope="module")
def server_mode_reports(tmp_path_factory, tokenizer):
    from fake_vllm_server import FakeVLLMServer

    out_dir = tmp_path_factory.mktemp("server_mode")
    digit_ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    servers = [
        FakeVLLMServer(digit_ids=digit_ids, eos_id=tokenizer.eos_token_id, seconds_per_token=0.005, **dies)
        for dies in ({}, {"dies_at_request": 2})
    ]
    try:
        (out_dir / "server_url").write_text(servers[0].base_url)
        (out_dir / "dying_server_url").write_text(servers[1].base_url)
        reports = launch_two_processes(SERVER_MODE_SCRIPT, out_dir, timeout=300)
    finally:
        for server in servers:
            server.close()
    return reports, servers[1].base_url


def test_continuous_schedule_broadcasts_no_sampler_state_and_the_ranks_agree(server_mode_reports):
    # Issue 32, item 22: the main process broadcast the whole sampler state (generator, tracker, a learned predictor's
    # weights) after every generation batch; now every process runs the sampling step on the scoring batches it scores.
    import server_mode_run

    runs = [report["continuous"] for report in server_mode_reports[0]]
    for run in runs:
        assert run["error"] is None, run.get("traceback")
    main, follower = runs
    assert main["tracked_prompts"] >= server_mode_run.TRACKED_PROMPTS and main["state_bytes"] > 500_000
    # Per batch: the scoring batches' (prompt, draw) pairs and the end, a few kB, whatever the tracker holds.
    assert len(main["broadcast_bytes"]) == 2 and max(main["broadcast_bytes"]) < 20_000, main["broadcast_bytes"]
    assert main["selections"] and main["selections"] == follower["selections"]
    assert main["state_digest"] == follower["state_digest"]
    assert main["tracked_prompts"] == follower["tracked_prompts"]


def test_a_reward_failing_on_the_main_process_ends_the_step_on_every_process(server_mode_reports):
    # Issue 21, item 4: the main process's reward raises inside a scoring batch while the other process sits in that
    # batch's reward gather. Both must raise the error; a hang fails the launch's timeout instead of hanging CI.
    main, follower = (report["reward_failure"] for report in server_mode_reports[0])
    expected = (
        "Reward function 'fails_on_the_main_process' raised during scoring batch 1 of training step 1: ValueError: "
        "the main process's verifier is down"
    )
    assert main["error"] is not None and main["error"].startswith(f"RuntimeError: {expected}"), main
    assert follower["error"] is not None, follower
    assert follower["error"].startswith(
        f"RuntimeError: The main process's continuous sampling failed: RuntimeError: {expected}"
    ), follower


def test_a_lost_server_in_a_sampling_round_raises_the_same_error_on_every_process(server_mode_reports):
    # Issue 32, item 22: the main process's request was abandoned (the server's engine died) while the other process
    # waited for its completions in TRL's broadcast; that process then failed on gloo's "Connection closed by peer".
    reports, dying_url = server_mode_reports
    main, follower = (report["lost_server"] for report in reports)
    assert main["error"] is not None and follower["error"] is not None, (main, follower)
    assert main["error"].startswith(
        f"VLLMServerError: The vLLM server at {dying_url} stopped answering during sampling round 2 of training "
        "step 1 (VLLMServerUnresponsive: "
    ), main["error"]
    assert "start the run again" in main["error"]
    assert follower["error"] == main["error"], follower.get("traceback")
