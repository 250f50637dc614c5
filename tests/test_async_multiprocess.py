"""
`AdaAsyncGRPOTrainer` on two CPU processes (gloo): a failure the main process finds while it waits for samples (its
rollout worker failed, or the server it generates from stopped answering) is raised on EVERY process, with the same
message, at the same time, and the run ends (`tests/async_multiprocess_run.py` runs the scenarios).

Before, only the main process raised; the other waited for its batch in accelerate's dispatcher until the main process
exited, then failed with gloo's "Connection closed by peer" (or was killed by torchrun), never saying why. Here that
reads as a wrong type on rank 1, or as a hang (the launch's timeout, with every process's stack).
"""

import json
from pathlib import Path

import pytest
from conftest import launch_two_processes

pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_grpo.packing", reason="TRL's async trainer trains on CPU from 1.16")

from async_multiprocess_run import SERVER_STOP_STEP, SERVER_TIMEOUT_S  # noqa: E402

from trl_ada.checkpoints import latest_complete_checkpoint  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "async_multiprocess_run.py"
SAME_TIME_S = 5.0
"""Both processes raise from the same broadcast; what separates them is each one's scheduling on two shared cores."""


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("async_two_processes")
    reports = launch_two_processes(SCRIPT, out_dir, timeout=300)
    assert [report["reward"]["process_index"] for report in reports] == [0, 1]
    assert [report["reward"]["num_processes"] for report in reports] == [2, 2]
    return reports


def _errors(reports: list[dict], scenario: str, expected_type: str) -> list[dict]:
    errors = [report[scenario]["error"] for report in reports]
    for rank, error in enumerate(errors):
        assert error is not None, f"rank {rank} trained to the end"
        assert error["type"] == expected_type, f"rank {rank}: {json.dumps(reports[rank][scenario], indent=1)}"
    assert errors[0]["message"] == errors[1]["message"]
    assert abs(errors[0]["time"] - errors[1]["time"]) < SAME_TIME_S, [error["time"] for error in errors]
    return errors


def test_a_reward_function_raising_in_the_worker_stops_every_process_naming_it(reports):
    errors = _errors(reports, "reward", "RolloutWorkerError")
    assert (
        "stopped during training step 1: RuntimeError: Reward function 'exploding_reward' raised"
        in (errors[0]["message"])
    )
    assert "ValueError: the grader crashed." in errors[0]["message"]
    assert [report["reward"]["global_step"] for report in reports] == [0, 0]


def test_a_server_that_stops_answering_between_weight_syncs_stops_every_process_with_the_checkpoint(reports):
    errors = _errors(reports, "server", "VLLMServerError")
    run = reports[0]["server"]
    step = run["global_step"]
    assert step >= SERVER_STOP_STEP and [report["server"]["global_step"] for report in reports] == [step, step]
    message = errors[0]["message"]
    assert f"stopped answering during generation of training step {step + 1} (VLLMServerUnresponsive: " in message
    checkpoint = latest_complete_checkpoint(run["output_dir"])
    assert checkpoint is not None and checkpoint.endswith(f"checkpoint-{step}")
    assert message.endswith(
        f"resume from the latest complete checkpoint, {checkpoint}: `trainer.train(resume_from_checkpoint=True)` "
        "(`--resume_from_checkpoint true` with scripts/train_ada.py)."
    )
    # The worker gives up once requests have failed for vllm_server_timeout, then the trainer's next check (5 s).
    for error in errors:
        raised_after = error["time"] - run["server_stop"]
        assert SERVER_TIMEOUT_S <= raised_after < SERVER_TIMEOUT_S + 25, raised_after
