"""Sharded training on two CPU processes (gloo): FSDP2 (and DeepSpeed ZeRO-2/3 where deepspeed is installed) must make
the same sampling decisions, log the same losses and end at the same weights as DDP.

Each backend runs tests/sharded_run.py from its config in configs/accelerate/, as a user would launch it. accelerate
1.15 does not shard on CPU by itself (see `test_accelerate_alone_runs_an_fsdp_config_on_cpu_as_ddp`); sharded_run.py
patches that one decision for the test, and every check below first asserts that the run really was sharded.

Tolerances (float32, two processes, AdamW with lr 1e-3 for full fine-tuning and 1e-2 for LoRA):

- Sampler decisions and the completions of every round: exact. Every rank generates its share with its own RNG from
  weights that differ from DDP's by at most ~1e-6 (below); a sampled token changes only if a uniform draw lands that
  close to a boundary of the cumulative distribution.
- Losses: 1e-6 absolute. The runs are on-policy (importance ratio exactly 1), so the policy term is a function of the
  (exactly equal) advantages; the KL term (beta 0.04) sees the weight differences below, scaled by beta.
- Grad norms: 1e-5 relative. Sharded backends sum squares per shard and all-reduce them, in another order than DDP's
  per-tensor norms: torch's pairwise summation keeps that within about log2(80k) = 17 float32 ulps (2e-6).
- Final weights: lr / 100 absolute. Gradient averaging over two ranks is exact in float32 (a + b is commutative and
  halving is exact), so the runs part only by the grad-norm ulps above (gradient clipping, then later forwards).
  AdamW divides each gradient by its running RMS, which amplifies those ulps on elements whose gradient is ~0 (the
  key-projection biases: softmax is invariant to them, so their gradient is pure rounding noise) up to a fraction of
  lr; measured here at most 4.4e-7 (FSDP2), 4.7e-8 (ZeRO-2) and 1.4e-6 (ZeRO-3), 99% of elements equal or within
  1e-8. A sharding fault (an unreduced or doubly reduced gradient, a stale or misplaced shard, a skipped update) moves
  weights by O(lr) per step: 100 times the tolerance.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
ROOT = TESTS.parent
SCRIPT = TESTS / "sharded_run.py"
CONFIGS = ROOT / "configs" / "accelerate"

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed (not in constraints/; `pip install deepspeed` keeps torch)"
)

CONFIG_FILES = {
    "ddp": "cpu_two_processes.yaml",
    "fsdp2": "fsdp2_cpu_two_processes.yaml",
    "zero2": "zero2_cpu_two_processes.yaml",
    "zero3": "zero3_cpu_two_processes.yaml",
}
SHARDED = ["fsdp2", pytest.param("zero2", marks=needs_deepspeed), pytest.param("zero3", marks=needs_deepspeed)]
SCENARIOS = ["full", "lora"]
LEARNING_RATE = {"full": 1e-3, "lora": 1e-2}  # as in sharded_run.SCENARIOS


def launch(backend: str, out_dir: Path, *script_args: str, timeout: int = 420) -> None:
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / CONFIG_FILES[backend]),
        "--main_process_port",
        "0",
        str(SCRIPT),
        *script_args,
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        # The launched script imports trl_ada from this checkout, whatever is installed.
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    if backend.startswith("zero"):
        env["DS_ACCELERATOR"] = "cpu"
    # A deadlock in a collective shows up as a timeout here instead of a hung test suite.
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from conftest import TINY_MODEL_KWARGS

    from trl_ada.tiny import build_char_tokenizer, build_tiny_model, save_tiny

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_char_tokenizer()
    save_tiny(build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS), tokenizer, path)
    return path


def run_backend(backend: str, tmp_path_factory, model_dir: Path) -> dict:
    out_dir = tmp_path_factory.mktemp(backend)
    launch(backend, out_dir, str(out_dir), str(model_dir))
    ranks = [json.loads((out_dir / f"rank{rank}.json").read_text()) for rank in range(2)]
    weights = {name: torch.load(out_dir / f"{name}_weights.pt") for name in SCENARIOS}
    return {"backend": backend, "ranks": ranks, "weights": weights}


@pytest.fixture(scope="module")
def ddp(tmp_path_factory, model_dir):
    return run_backend("ddp", tmp_path_factory, model_dir)


@pytest.fixture(scope="module", params=SHARDED)
def sharded(request, tmp_path_factory, model_dir):
    return run_backend(request.param, tmp_path_factory, model_dir)


@pytest.fixture(scope="module")
def initial_weights(model_dir):
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def test_accelerate_alone_runs_an_fsdp_config_on_cpu_as_ddp(tmp_path):
    """Why sharded_run.py patches accelerate: unpatched, the FSDP2 config gives a plain MULTI_CPU (DDP) state and drops
    the FSDP plugin. When this fails, accelerate shards on CPU by itself and `allow_fsdp_on_cpu` can go."""
    launch("fsdp2", tmp_path, "--probe", str(tmp_path), timeout=180)
    for rank in range(2):
        state = json.loads((tmp_path / f"probe_rank{rank}.json").read_text())
        assert state == {"distributed_type": "MULTI_CPU", "num_processes": 2, "fsdp_plugin": False}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_ddp_baseline_is_two_process_ddp(ddp, scenario):
    for rank, report in enumerate(ddp["ranks"]):
        run = report[scenario]
        assert (run["num_processes"], run["process_index"]) == (2, rank)
        assert run["sharding"]["distributed_type"] == "MULTI_CPU"
        assert run["sharding"]["wrapped_type"] == "DistributedDataParallel"
        assert run["sharding"]["num_dtensor_params"] == 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_run_was_really_sharded(sharded, scenario):
    runs = [report[scenario] for report in sharded["ranks"]]
    assert [(run["num_processes"], run["process_index"]) for run in runs] == [(2, 0), (2, 1)]
    infos = [run["sharding"] for run in runs]
    for info in infos:
        assert info["backend"] == "gloo"
    if sharded["backend"] == "fsdp2":
        for run, info in zip(runs, infos, strict=True):
            assert info["distributed_type"] == "FSDP" and info["fsdp_version"] == 2
            assert info["is_fsdp_module"] and info["fsdp_submodules"] >= 3  # the decoder layers, then the root
            # Every parameter is a DTensor and each rank holds only its shard: the two shards make up the model.
            assert info["num_dtensor_params"] == info["num_params"]
            assert info["local_numel"] < info["full_numel"]
            # TRL generated every round with the sharded module itself (per-layer all-gathers inside `generate`).
            assert run["generated_with_fsdp_module"] and all(run["generated_with_fsdp_module"])
        assert sum(info["local_numel"] for info in infos) == infos[0]["full_numel"]
        if scenario == "full":  # beta > 0: TRL's reference model, sharded by TRL's `prepare_fsdp`
            assert all(info["ref_is_fsdp_module"] and info["ref_num_dtensor_params"] > 0 for info in infos)
    else:
        stage = int(sharded["backend"][-1])
        for info in infos:
            assert info["distributed_type"] == "DEEPSPEED" and info["zero_stage"] == stage
            assert info["wrapped_type"] == "DeepSpeedEngine"
            assert info["optimizer"] == ("DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer")
            if scenario == "full":
                assert info["ref_model"] == "DeepSpeedEngine"  # TRL's `prepare_deepspeed`
        if stage == 3:  # the parameters themselves are partitioned: each rank holds half
            assert all(0 < info["ds_partitioned_numel"] < info["ds_full_numel"] for info in infos)
            assert sum(info["ds_partitioned_numel"] for info in infos) == infos[0]["ds_full_numel"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_same_sampler_decisions_as_ddp(ddp, sharded, scenario):
    for ddp_report, sharded_report in zip(ddp["ranks"], sharded["ranks"], strict=True):
        expected, actual = ddp_report[scenario], sharded_report[scenario]
        assert expected["selections"] and actual["selections"] == expected["selections"]
        # The same tokens in every round on every rank, so seq_balance saw the same rewards.
        assert actual["round_completions"] == expected["round_completions"]
    # Several rounds were drawn for some prompt, so the comparison covers the adaptive part, not just round one.
    selections = ddp["ranks"][0][scenario]["selections"]
    assert any(len(selection["active_after_round"]) > 1 for selection in selections)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_same_losses_as_ddp(ddp, sharded, scenario):
    expected = ddp["ranks"][0][scenario]["logs"]
    assert [entry["step"] for entry in expected] == [1, 2, 3]
    assert any(abs(entry["loss"]) > 1e-3 for entry in expected)  # the comparison is not of zeros
    for report in sharded["ranks"]:
        actual = report[scenario]["logs"]
        assert [entry["step"] for entry in actual] == [1, 2, 3]
        for got, want in zip(actual, expected, strict=True):
            assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
            assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)
            assert got["reward"] == want["reward"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_same_final_weights_as_ddp(ddp, sharded, initial_weights, scenario):
    expected, actual = ddp["weights"][scenario], sharded["weights"][scenario]
    assert sorted(actual) == sorted(expected)
    tolerance = LEARNING_RATE[scenario] / 100
    trained = ddp["ranks"][0][scenario]["sharding"]["trainable"]
    assert trained
    for name, weight in expected.items():
        assert actual[name].shape == weight.shape, name
        difference = (actual[name] - weight).abs().max().item()
        assert difference <= tolerance, f"{name}: {difference:.3g} > {tolerance:.3g}"
        base_name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if name not in trained:  # LoRA's frozen base weights: untouched, bit for bit, by either backend
            assert torch.equal(weight, initial_weights[base_name]) and torch.equal(actual[name], weight), name
    # Training moved the weights far more than the tolerance, so the comparison could fail.
    moved = max(
        (
            (expected[name] - initial_weights[name]).abs().max().item()
            if name in initial_weights
            else expected[name].abs().max().item()  # LoRA's B matrices start at zero
        )
        for name in trained
        if name in initial_weights or ".lora_B." in name
    )
    assert moved > 10 * tolerance


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_zero3_gathers_the_parameters_once_per_step_not_once_per_round(sharded, scenario):
    # TRL gathers every ZeRO-3 parameter for each generate call; the rounds of one step share one gather
    # (`trl_ada.generation.weight_sync.one_parameter_gather_per_step`). ZeRO-2 and FSDP2 make no such gather.
    expected = 1 if sharded["backend"] == "zero3" else 0
    for report in sharded["ranks"]:
        batches = report[scenario]["batch_generation"]
        assert any(batch["rounds"] > 1 for batch in batches)  # else once per round would look the same
        assert [batch["zero3_gathers"] for batch in batches] == [expected] * len(batches)
