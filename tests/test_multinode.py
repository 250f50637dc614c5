"""Two machines without a second machine: two `accelerate launch` commands, `--num_machines 2`, one process each.

Both launchers run here, on 127.0.0.1, as machine ranks 0 and 1 (gloo on CPU), exactly as one would type them on two
nodes. Each machine gets its own directory, standing for its own disk (no shared filesystem), so the test can see
which machine wrote what. Checked: accelerate's view of each process, that every sampling decision of `seq_balance`
agrees across machines, static shapes, that training finishes, and that the model and checkpoints are written by the
global main process only (`save_on_each_node=False`, TrainingArguments' default).
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "multinode_run.py"
# The pair takes about 35 s on 2 idle cores; the limit leaves room for a loaded machine. A hang (a rank stuck in a
# collective, or waiting at the rendezvous for a machine that never comes) fails the test at this limit.
TIMEOUT_S = 360
FAILED_PEER_GRACE_S = 30
# Inherited from a parent launcher, these would confuse torchrun's workers.
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def free_port() -> int:
    # Both machines must be given the same port: `--main_process_port 0` would let each launcher pick its own.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_command(machine_rank: int, port: int, machine_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",  # with ACCELERATE_USE_CPU: gloo processes (`--cpu` would start a single process)
        "--num_machines",
        "2",
        "--num_processes",
        "2",  # in total, over both machines: one process per machine
        "--machine_rank",
        str(machine_rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        str(SCRIPT),
        str(machine_dir),
        str(machine_rank),
    ]


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc), children before their own children."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                # /proc/PID/stat: "pid (comm) state ppid ..."; comm may hold spaces, so split after its ")".
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def run_two_machines(out_dir: Path, port: int) -> list[subprocess.CompletedProcess]:
    """Start both launchers together; wait for both; kill both (with their workers) on a timeout."""
    env = {key: value for key, value in os.environ.items() if key not in DISTRIBUTED_ENV}
    env.update(ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
    procs, logs = [], []
    for rank in (0, 1):
        machine_dir = out_dir / f"machine{rank}"
        machine_dir.mkdir(parents=True)
        log = open(out_dir / f"machine{rank}.log", "w+")  # a file, not a pipe: a full pipe would block the launcher
        logs.append(log)
        procs.append(
            subprocess.Popen(
                launch_command(rank, port, machine_dir),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so a kill also reaches torchrun's worker
            )
        )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline and any(proc.poll() is None for proc in procs):
            if any(proc.poll() not in (None, 0) for proc in procs):
                # One machine failed (e.g. machine 0 could not bind the port): the other may wait at the rendezvous
                # for ever. Give it a moment to report its own error, then stop it.
                deadline = min(deadline, time.monotonic() + FAILED_PEER_GRACE_S)
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                # torchrun starts its worker in a session of its own: kill the whole tree, not just the group.
                for pid in [*descendants(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.wait()
    results = []
    for proc, log in zip(procs, logs, strict=True):
        log.seek(0)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, log.read(), ""))
        log.close()
    return results


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory):
    start = time.monotonic()
    for attempt in range(2):
        out_dir = tmp_path_factory.mktemp(f"two_machines_{attempt}")
        port = free_port()
        results = run_two_machines(out_dir, port)
        log0 = results[0].stdout.lower()
        # Another program may take the free port before machine 0 binds it: then try once more with a new one.
        if not any(sign in log0 for sign in ("another process is utilizing it", "address already in use")):
            break
    elapsed = time.monotonic() - start
    for rank, result in enumerate(results):
        assert result.returncode == 0, (
            f"machine {rank} exited with {result.returncode} after {elapsed:.0f} s "
            f"(negative: killed at the {TIMEOUT_S} s limit)\n" + result.stdout[-6000:]
        )
    dirs = [out_dir / f"machine{rank}" for rank in (0, 1)]
    reports = [json.loads((machine_dir / "report.json").read_text()) for machine_dir in dirs]
    return {"port": port, "dirs": dirs, "reports": reports}


def test_each_machine_runs_one_process_of_two(two_machines):
    for machine_rank, report in enumerate(two_machines["reports"]):
        state, env = report["state"], report["env"]
        assert state["num_processes"] == 2
        assert state["process_index"] == machine_rank  # torchrun: global rank = machine rank x processes per machine
        assert state["local_process_index"] == 0  # one process per machine
        assert state["is_local_main_process"] is True  # every machine has its local main process ...
        assert state["is_main_process"] is (machine_rank == 0)  # ... and only machine 0 the global one
        assert (state["distributed_type"], state["backend"]) == ("DistributedType.MULTI_CPU", "gloo")
        # What `accelerate launch --num_machines 2` handed torchrun, as its worker sees it.
        assert env["GROUP_RANK"] == str(machine_rank)  # torchrun's node rank = --machine_rank
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["GROUP_WORLD_SIZE"]) == ("2", "1", "2")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(two_machines["port"]))
        assert report["args"]["world_size"] == 2 and report["args"]["process_index"] == machine_rank
        # Both processes joined one process group: each saw the other's (process index, --machine_rank).
        assert report["gathered"] == [[0, 0], [1, 1]]


def test_machines_agree_on_every_selection(two_machines):
    machine0, machine1 = two_machines["reports"]
    assert len(machine0["selections"]) == 3  # one generation batch per step (steps_per_generation = 1), 3 steps
    assert machine0["selections"] == machine1["selections"]  # kept indices, advantages, pools, active prompts


def test_static_shapes_across_machines(two_machines):
    for report in two_machines["reports"]:
        assert report["local_rows"] == [4, 4, 4]  # per_device_train_batch_size rows on each machine, every step
        for selection in report["selections"]:
            # 2 machines x 4 rows = 2 prompts of n=4; pools hold whole rounds of 4, at most 3 rounds
            assert [len(kept) for kept in selection["kept"]] == [4, 4]
            assert all(len(pool) in (4, 8, 12) for pool in selection["pools"])
            assert all(max(kept) < len(pool) for kept, pool in zip(selection["kept"], selection["pools"], strict=True))


def test_training_finishes_on_both_machines(two_machines):
    machine0, machine1 = two_machines["reports"]
    for report in (machine0, machine1):
        assert report["global_step"] == 3 and report["train_loss_finite"]
        assert len(report["losses"]) == 3
    assert machine0["losses"] == machine1["losses"]  # the logged loss is reduced over both machines


def test_model_and_checkpoints_written_once_by_the_global_main_process(two_machines):
    dir0, dir1 = two_machines["dirs"]
    args0, args1 = (report["args"] for report in two_machines["reports"])
    # TrainingArguments' default: save only where process_index == 0, not on each node's local main process.
    assert args0["save_on_each_node"] is False and args1["save_on_each_node"] is False
    assert (args0["should_save"], args1["should_save"]) == (True, False)

    for checkpoint in ("checkpoint-2", "checkpoint-3"):
        names = {path.name for path in (dir0 / "train" / checkpoint).iterdir()}
        expected = {
            "model.safetensors",
            "optimizer.pt",
            "scheduler.pt",
            "trainer_state.json",
            "ada_sampler_state.json",
        }
        assert expected <= names
        assert "rng_state_0.pth" in names and "rng_state_1.pth" not in names
    assert (dir0 / "final" / "model.safetensors").is_file()
    assert (dir0 / "train" / "README.md").is_file()  # the model card, written with every checkpoint

    # Machine 1 writes nothing but its own RNG state into each checkpoint (every rank saves rng_state_<rank>.pth).
    written = sorted(path.relative_to(dir1).as_posix() for path in dir1.rglob("*") if path.is_file())
    assert written == [
        "report.json",
        "train/checkpoint-2/rng_state_1.pth",
        "train/checkpoint-3/rng_state_1.pth",
    ]
