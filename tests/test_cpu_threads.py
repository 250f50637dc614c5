"""On CPU, a trainer picks torch's thread count for a small model unless the user chose one: the README's quick start,
which sets none, must not run on torch's one-thread-per-core default (`benchmarks/cpu_threads.py` measures why)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL_KWARGS, starts_low_digit, tiny_args

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.runtime import cpu_threads
from trl_ada.runtime.cpu_threads import SMALL_MODEL_PARAMETERS, THREAD_ENV_VARS, cpu_training_threads
from trl_ada.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


def test_a_small_model_gets_one_thread_and_a_large_one_at_most_the_cpus_it_may_use():
    assert cpu_training_threads(600_000, current=2, available=2) == 1
    assert cpu_training_threads(SMALL_MODEL_PARAMETERS - 1, current=64, available=64) == 1
    assert cpu_training_threads(SMALL_MODEL_PARAMETERS, current=64, available=4) == 4  # a cgroup quota of 4 CPUs
    assert cpu_training_threads(10**9, current=8, available=64) == 8  # never more than torch would use


@pytest.fixture
def torch_default_threads(monkeypatch):
    """torch at a default count of 2 threads (as on a 2-core machine), whatever this machine and earlier tests set;
    the count is restored afterwards."""
    before = torch.get_num_threads()
    for name in THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr(cpu_threads, "THREADS_AT_IMPORT", 2)
    monkeypatch.setattr(cpu_threads, "_applied", None)
    monkeypatch.setattr(torch, "get_num_interop_threads", lambda: 2)
    yield
    torch.set_num_threads(before)


def make_trainer(tmp_path, tokenizer, arithmetic_dataset, **overrides):
    return AdaGRPOTrainer(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        [starts_low_digit],
        args=AdaGRPOConfig(**tiny_args(tmp_path, **overrides)),
        train_dataset=arithmetic_dataset,
        processing_class=tokenizer,
    )


def test_a_small_model_trains_on_one_cpu_thread_by_default(
    tmp_path, tokenizer, arithmetic_dataset, torch_default_threads
):
    assert not cpu_threads.user_set_threads()
    make_trainer(tmp_path, tokenizer, arithmetic_dataset)
    assert torch.get_num_threads() == 1


def test_a_later_larger_model_gets_torchs_count_back(monkeypatch, torch_default_threads):
    # The count set for a small model is trl-ada's, not the user's: a large model trained next in the process gets
    # torch's count (capped at the CPUs this process may use).
    monkeypatch.setattr("trl_ada.rewards.code.available_cpus", lambda: 8)
    cpu = torch.device("cpu")
    assert cpu_threads.apply_cpu_thread_default(torch.nn.Linear(10, 10), cpu) == 1
    assert torch.get_num_threads() == 1 and not cpu_threads.user_set_threads()
    large = torch.nn.Linear(1, SMALL_MODEL_PARAMETERS, bias=False, device="meta")
    assert cpu_threads.apply_cpu_thread_default(large, cpu) == 2
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("how", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "torch.set_num_threads"])
def test_a_thread_count_the_user_chose_is_kept(
    tmp_path, monkeypatch, tokenizer, arithmetic_dataset, torch_default_threads, how
):
    if how == "torch.set_num_threads":
        torch.set_num_threads(3)
        expected = 3
    else:
        monkeypatch.setenv(how, "2")
        expected = 2
    assert cpu_threads.user_set_threads()
    make_trainer(tmp_path, tokenizer, arithmetic_dataset)
    assert torch.get_num_threads() == expected


def test_a_count_set_before_trl_ada_was_imported_is_kept_too(monkeypatch, torch_default_threads):
    # torch.set_num_threads(3) before `import trl_ada`: the import saw 3, but torch's own default (its inter-op pool's
    # count, which set_num_threads leaves alone) is 2.
    torch.set_num_threads(3)
    monkeypatch.setattr(cpu_threads, "THREADS_AT_IMPORT", 3)
    assert cpu_threads.user_set_threads()


def test_the_thread_count_is_left_alone_off_the_cpu():
    model = torch.nn.Linear(2, 2)
    assert cpu_threads.apply_cpu_thread_default(model, torch.device("meta")) is None


def test_a_fresh_process_trains_on_one_thread_without_being_told(tmp_path):
    # The README's quick start in short: no thread count set, torch's default detected as such on this machine.
    script = textwrap.dedent(f"""
        import torch
        from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
        from trl_ada.tasks.arithmetic import exact_match_reward, make_dataset
        from trl_ada.tiny import load_tiny_arith_model

        before = torch.get_num_threads()
        model, tokenizer = load_tiny_arith_model()
        args = AdaGRPOConfig(output_dir={str(tmp_path)!r}, use_cpu=True, bf16=False, per_device_train_batch_size=8,
                             num_generations=4, max_steps=1, report_to="none")
        AdaGRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=exact_match_reward, args=args,
                       train_dataset=make_dataset(16, seed=0))
        print(before, torch.get_num_threads())
    """)
    env = {key: value for key, value in os.environ.items() if key not in THREAD_ENV_VARS}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = map(int, result.stdout.split()[-2:])
    assert after == 1, (before, after)
