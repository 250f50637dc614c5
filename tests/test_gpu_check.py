"""`scripts/gpu_check.py` fits the GPU machine it will get: its first phase needs only small carried wheels and
transformers generation, its dry run validates every phase's config, and its plan and carried files fit one call.

The lent machine has torch, transformers, accelerate and peft, no TRL, datasets or vLLM, no network, at most 64 MiB
carried per call and 15 minutes of device time. Nothing here needs a GPU or the network: the wheel set is judged on a
fake folder, and phase 1's runs go through their own code on the CPU with a tiny model.
"""

import importlib.metadata as metadata
import importlib.util
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20


def load_gpu_check():
    if "gpu_check" not in sys.modules:
        spec = importlib.util.spec_from_file_location("gpu_check", REPO_ROOT / "scripts" / "gpu_check.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpu_check"]


def fake_wheels(folder: Path, pins: dict[str, str], sizes: dict[str, int] | None = None) -> Path:
    """A folder of empty files named as pip names the pinned wheels (sparse files where `sizes` asks for bytes)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, version in pins.items():
        path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        with open(path, "wb") as handle:
            handle.truncate((sizes or {}).get(name, 1000))
    return folder


def test_dry_run_validates_every_phase_and_the_plan_fits(tmp_path, monkeypatch, capsys):
    gpu_check = load_gpu_check()
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # main() installs a SIGTERM handler for the real run
    # The repository's own size is another test's question; this one asks whether the plan and the wheels fit.
    monkeypatch.setattr(gpu_check, "travelling_tree_bytes", lambda repo=None: 10 * MIB)
    wheels = fake_wheels(tmp_path / "wheels", gpu_check.wheel_pins())

    code = gpu_check.main(["--dry-run", "--work-dir", str(tmp_path / "work"), "--wheels-dir", str(wheels)])
    out = capsys.readouterr().out

    assert code == 0, out
    assert "dry run OK" in out
    for name, _, _ in gpu_check.PHASE1_RUNS:
        assert f"[plan] phase 1, {name} (timeout" in out
    # The paper's model (Qwen2.5-Math-1.5B) at its own shape, built on the meta device: 1.54B parameters.
    assert re.search(r"Qwen2\.5-Math-1\.5B shape, 154\d\.\dM parameters \(hidden 1536, 28 layers", out)
    assert "sampler=GRPOTrainer" in out and "sampler=uniform" in out
    assert "sampler=seq_balance" in out and "round_size=8 max_rounds=4" in out
    assert "sampler=dapo" in out and "bf16=True" in out
    assert "wheel set fits" in out and f"{len(gpu_check.CARRIED)} wheels" in out
    assert "working tree that travels: 10.0 MiB" in out
    # The vLLM phases' configs still validate, and the plan says they run only where vLLM imports.
    assert "[plan] vLLM phases (only where vLLM imports" in out and "colocate:seq_balance" in out


def test_the_plan_fits_eight_minutes_and_the_device_time():
    gpu_check = load_gpu_check()
    args = gpu_check.parse_args([])
    fits, lines = gpu_check.phase1_plan(args)
    assert fits, lines
    caps = sum(cap for _, _, cap in gpu_check.PHASE1_RUNS)
    assert gpu_check.PREFLIGHT_S + caps <= args.budget_s
    assert gpu_check.INSTALL_S + args.budget_s + 10 <= gpu_check.PHASE1_S == 480
    assert gpu_check.MACHINE_START_S + gpu_check.PHASE1_S <= gpu_check.DEVICE_TIME_S == 900
    # A budget past phase 1's 8 minutes, or timeouts past the budget, do not fit.
    assert not gpu_check.phase1_plan(gpu_check.parse_args(["--budget-s", "600"]))[0]
    assert not gpu_check.phase1_plan(gpu_check.parse_args(["--budget-s", "300"]))[0]


def test_the_wheel_set_is_judged_on_a_fake_folder(tmp_path):
    gpu_check = load_gpu_check()
    pins = gpu_check.wheel_pins()

    good = gpu_check.wheel_set(fake_wheels(tmp_path / "good", pins), pins)
    assert good["fits"] and not good["missing"] and len(good["wheels"]) == len(pins)
    assert good["total_bytes"] == 1000 * len(pins)

    missing = tmp_path / "missing"
    fake_wheels(missing, pins)
    next(missing.glob("datasets-*.whl")).unlink()
    report = gpu_check.wheel_set(missing, pins)
    assert not report["fits"] and report["missing"] == [f"datasets=={pins['datasets']}"]

    other = fake_wheels(tmp_path / "other", {**pins, "trl": "1.15.0"})
    report = gpu_check.wheel_set(other, pins)
    assert not report["fits"] and report["other_version"] == [f"trl-1.15.0-py3-none-any.whl (pinned {pins['trl']})"]

    twice = fake_wheels(tmp_path / "twice", pins)
    fake_wheels(twice, {"trl": "1.15.0"})
    report = gpu_check.wheel_set(twice, pins)
    assert not report["fits"] and report["duplicates"] == ["trl"]

    extra = fake_wheels(tmp_path / "extra", {**pins, "vllm": "0.31.0"})
    report = gpu_check.wheel_set(extra, pins)
    assert report["fits"] and report["extra"] == ["vllm-0.31.0-py3-none-any.whl"]

    # A vLLM wheel is several times what one call carries.
    heavy = fake_wheels(tmp_path / "heavy", {**pins, "vllm": "0.31.0"}, sizes={"vllm": 400 * MIB})
    report = gpu_check.wheel_set(heavy, pins)
    assert not report["fits"] and report["total_bytes"] > 64 * MIB


def test_the_tree_and_the_wheels_are_counted_together(tmp_path):
    gpu_check = load_gpu_check()
    pins = gpu_check.wheel_pins()
    wheels = gpu_check.wheel_set(fake_wheels(tmp_path / "w", pins, sizes={"trl": 3 * MIB}), pins)

    fits, lines = gpu_check.format_fit(10 * MIB, wheels)
    assert fits and "fits" in lines[-1]
    fits, lines = gpu_check.format_fit(62 * MIB, wheels)
    assert not fits and "DOES NOT FIT" in lines[-1]
    # No wheel folder here: the size is reported only for what exists, and the way to build it is named.
    fits, lines = gpu_check.format_fit(10 * MIB, None)
    assert fits and "--fetch-wheels" in lines[0]
    assert gpu_check.format_fit(None, None)[0]


def test_the_carried_files_fit_one_device_call():
    """What a device call would send from this checkout (tracked and untracked-but-not-ignored files) together with
    the carried wheels (about 2.3 MiB) fits its 64 MiB."""
    gpu_check = load_gpu_check()
    tree = gpu_check.travelling_tree_bytes()
    if tree is None:
        pytest.skip("not a git checkout")
    wheels = 2.5 * MIB
    assert tree + wheels < gpu_check.DEVICE_TREE_LIMIT, (
        f"{tree / MIB:.1f} MiB travel from this checkout, {(tree + wheels) / MIB:.1f} MiB with the wheels: over "
        f"{gpu_check.DEVICE_TREE_LIMIT // MIB} MiB, so the device call is refused"
    )


def test_the_pins_come_from_the_constraints_and_meet_datasets():
    gpu_check = load_gpu_check()
    pins = gpu_check.wheel_pins()
    assert set(pins) == set(gpu_check.CARRIED)
    constraints = gpu_check.CONSTRAINTS.read_text()
    for name in ("trl", "datasets", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime"):
        assert f"{name}=={pins[name]}" in constraints
    assert pins["trl"] == "1.16.0"
    # The versions pinned here are ones that constraints/trl-1.16.txt's datasets accepts.
    try:
        requires = [Requirement(r) for r in metadata.requires("datasets") or []]
    except metadata.PackageNotFoundError:
        pytest.skip("datasets is not installed")
    if metadata.version("datasets") != pins["datasets"]:
        pytest.skip("another datasets here than the pinned one")
    by_name = {gpu_check.canonical(r.name): r for r in requires if r.marker is None}
    for name, version in gpu_check.PINNED_HERE.items():
        assert by_name[gpu_check.canonical(name)].specifier.contains(version), (name, version)


def test_unmet_requirements_names_what_is_missing():
    gpu_check = load_gpu_check()
    assert gpu_check.unmet_requirements(("not-a-package-at-all",)) == ["not-a-package-at-all is not installed"]


def test_phase1_runs_on_the_cpu(tmp_path):
    """Phase 1's runs through their own code (model build, configs, the reward, the step timer, the comparison) on
    the CPU with a tiny model: what the GPU machine runs, but in float32."""
    gpu_check = load_gpu_check()
    args = gpu_check.parse_args(
        ["--cpu-smoke", "--timing-model", "tiny", "--prompts-per-step", "2", "--max-completion-length", "4"]
        + ["--steps", "2", "--equivalence-steps", "2"]
    )
    for name, method, _ in gpu_check.PHASE1_RUNS:
        spec = gpu_check.phase1_spec(args, tmp_path, name, method, device="cpu")
        if method == "equivalence":
            spec["shape"] = gpu_check.TINY_SHAPE
        record = gpu_check.run_worker(spec)
        assert record["status"] == "ok", record
        if method == "equivalence":
            assert record["same_completions"] == record["generation_batches"][0] == 2
            assert record["max_advantage_diff"] == 0.0 and record["advantages_nonzero"]
            assert record["max_parameter_diff"] == 0.0
        else:
            assert len(record["step_s"]) == 2 and record["parameters"] > 0
            draws = record["completions_per_prompt"]
            assert draws == [4.0, 4.0] if method == "grpo" else all(d >= 4 for d in draws)


def test_the_device_command_is_one_short_line():
    text = (REPO_ROOT / "scripts" / "gpu_check.sh").read_text()
    command = "WHEELS_DIR=.whl bash scripts/gpu_check.sh"
    assert command in text and len(command) < 2000
    assert ".whl/" in (REPO_ROOT / ".gitignore").read_text()  # carried by name, never sent by accident
    subprocess.run(["bash", "-n", str(REPO_ROOT / "scripts" / "gpu_check.sh")], check=True)
