"""The installed package: `pip install` of the built wheel (not editable) runs the main job without the repository,
ships what that job needs, and leaves a user's torch/TRL stack alone.

Each test builds the wheel from a copy of this checkout and installs it into a fresh virtualenv that sees the packages
of the environment running the tests (a virtualenv or not; see `make_venv`), so nothing large is downloaded.
"""

import email.parser
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import run_with_stack_dump
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

# The user's stack: installing trl-ada must change none of these.
USER_STACK = ("torch", "trl", "transformers", "accelerate", "peft", "datasets")
# ... and must not pin any of these to one version.
NOT_PINNED = (*USER_STACK, "huggingface-hub")

EMBEDDED_RUN = ["--max_steps", "2", "--heldout_size", "8", "--arithmetic_train_size", "64"]


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus PYTHONPATH (the checkout must not leak in), one thread per process."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def run(command: list[str], cwd: Path, timeout: int = 300, **extra_env: str) -> subprocess.CompletedProcess:
    # A timeout ends the whole process group with each process's stack in the error (`run_with_stack_dump`).
    return run_with_stack_dump(command, env=clean_env(**extra_env), timeout=timeout, cwd=cwd)


def copy_checkout(dest: Path) -> Path:
    """The files of this checkout that git tracks or would track (no build/, *.egg-info, virtualenvs, outputs):
    building from a clean copy leaves the checkout untouched and ships no stale build/ leftovers."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the work tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = copy_checkout(tmp / "src")
    out = tmp / "dist"
    # Without build isolation when this environment has setuptools (no download); otherwise pip fetches it.
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    result = run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(out), str(source)], cwd=tmp)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (built,) = out.glob("trl_ada-*.whl")
    return built


def make_venv(path: Path) -> Path:
    """A fresh virtualenv over the packages of the environment running the tests; its `python -m pip` is that
    environment's pip, installing into the virtualenv.

    Not `--system-site-packages`: from inside a virtualenv (as the README's commands run) that sees the *base*
    interpreter's packages, not the running virtualenv's (no torch, no TRL). A `.pth` file adds the running
    interpreter's own site directories instead, after the new virtualenv's, with `site.addsitedir` so their `.pth`
    files are processed as `--system-site-packages` would; the same whether the tests run in a virtualenv or not."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    (Path(purelib) / "_outer_environment.pth").write_text(
        "".join(f"import site; site.addsitedir({directory!r})\n" for directory in site.getsitepackages())
    )
    return python


def test_throwaway_virtualenv_sees_the_packages_of_the_environment_running_the_tests(tmp_path):
    # From a virtualenv (the README's set-up), `--system-site-packages` saw the base interpreter's packages: no torch.
    python = make_venv(tmp_path / "venv")
    probe = "import importlib.util as u, json, sys; print(json.dumps([sys.prefix, u.find_spec('trl').origin]))"
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    prefix, trl_origin = json.loads(result.stdout)
    assert Path(prefix) == tmp_path / "venv"  # pip installs into the throwaway virtualenv...
    assert trl_origin == importlib.util.find_spec("trl").origin  # ... over this environment's TRL


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A virtualenv with the wheel installed (`pip install --no-deps`: its dependencies come from the main
    environment). Returns the virtualenv's bin/ folder."""
    venv = tmp_path_factory.mktemp("installed") / "venv"
    python = make_venv(venv)
    result = run([str(python), "-m", "pip", "install", "--no-deps", str(wheel)], cwd=venv.parent)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return python.parent


def wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


@pytest.mark.slow
def test_wheel_ships_the_card_template_the_tiny_model_and_the_recipes(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "trl_ada/train.py" not in names and "trl_ada/cli/__init__.py" in names and "trl_ada/cli/train.py" in names
    assert "trl_ada/cli/prepare_data.py" in names and "trl_ada/cli/evaluate.py" in names  # prepare-data / evaluate
    assert "trl_ada/hub_cards/reinforce_ada_model_card.md" in names
    for asset in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert f"trl_ada/assets/tiny-arith/{asset}" in names, asset
    recipes = {p.relative_to(ROOT / "recipes").as_posix() for p in (ROOT / "recipes").rglob("*.yaml")}
    assert recipes >= {"qwen2.5-math-1.5b/seq_balance.yaml", "models/qwen2.5-math-7b.yaml"}
    assert {f"trl_ada/recipes/{r}" for r in recipes} | {"trl_ada/recipes/README.md"} <= names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "recipes/", "hub_cards/"))]
    entry_points = zipfile.ZipFile(wheel).read("trl_ada-0.1.0.dist-info/entry_points.txt").decode()
    assert "trl-ada = trl_ada.cli:main" in entry_points


@pytest.mark.slow
def test_trl_ada_train_runs_from_the_installed_wheel_outside_the_checkout(installed, tmp_path):
    # The package, its card template and its recipes come from the virtualenv, not from this checkout.
    probe = (
        "import json, trl_ada, trl_ada.hub_cards, trl_ada.cli.train as t\n"
        "try:\n"
        "    t.resolve_config('no/such_recipe')\n"
        "    unknown = None\n"
        "except ValueError as error:\n"
        "    unknown = str(error)\n"
        "print(json.dumps({'package': trl_ada.__file__, 'cards': trl_ada.hub_cards.__file__,\n"
        "    'recipe': t.resolve_config('qwen2.5-math-1.5b/seq_balance'),\n"
        "    'recipe_yaml': t.resolve_config('models/qwen2.5-math-7b.yaml'), 'unknown': unknown}))\n"
    )
    result = run([str(installed / "python"), "-c", probe], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    site = installed.parent / "lib"
    for key in ("package", "cards", "recipe", "recipe_yaml"):
        assert Path(found[key]).resolve().is_relative_to(site.resolve()), (key, found[key])
        assert not Path(found[key]).resolve().is_relative_to(ROOT), (key, found[key])
    assert found["recipe"].endswith("trl_ada/recipes/qwen2.5-math-1.5b/seq_balance.yaml")
    assert "qwen2.5-math-1.5b/seq_balance" in found["unknown"]  # a wrong name lists the shipped recipes

    out = tmp_path / "out"
    result = run([str(installed / "trl-ada"), "train", *EMBEDDED_RUN, "--output_dir", str(out)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "metrics.json"):
        assert (out / name).is_file(), name
    card = (out / "README.md").read_text()
    assert "reinforce-ada" in card and "| `sampler` | seq_balance |" in card  # trl-ada's template, filled in
    assert "held-out pass rate (8 problems" in result.stderr  # the run summary
    assert "FutureWarning" not in result.stderr  # transformers' deprecations of what TRL itself sets
    # The data preparation and evaluation the recipes need ship as commands of the installed package.
    for command in ("prepare-data", "evaluate"):
        result = run([str(installed / "trl-ada"), command, "--help"], cwd=tmp_path)
        assert result.returncode == 0 and result.stdout.startswith(f"usage: trl-ada {command} "), result.stderr


@pytest.mark.slow
def test_installed_train_runs_under_accelerate_launch_on_two_processes(installed, tmp_path):
    # `accelerate launch -m trl_ada.cli.train ...`: the documented multi-process form for the installed package. Two CPU
    # processes as configs/accelerate/cpu_two_processes.yaml sets them up, without that file.
    out = tmp_path / "two"
    command = [
        str(installed / "python"),
        "-m",
        "accelerate.commands.accelerate_cli",  # the virtualenv's `accelerate`: it sees the installed trl_ada
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        "0",
        "-m",
        "trl_ada.cli.train",
        "--max_steps",
        "1",
        "--heldout_size",
        "0",
        "--arithmetic_train_size",
        "64",
        "--per_device_train_batch_size",
        "16",
        "--output_dir",
        str(out),
    ]
    result = run(command, cwd=tmp_path, ACCELERATE_USE_CPU="true")
    assert result.returncode == 0, result.stderr[-5000:]
    assert (out / "README.md").is_file() and (out / "model.safetensors").is_file()
    assert result.stderr.count("Loading weights: 100%") == 2  # one model per process


@pytest.mark.slow
def test_installing_the_wheel_over_a_supported_stack_changes_none_of_it(wheel, tmp_path):
    # The environment running this test already holds a supported stack (the main suite: TRL 1.16 and the newest
    # releases; `.ci/trl_stage.sh 1.14`: the oldest TRL at every lower bound of setup.py). pip's resolution for the
    # wheel must install trl-ada alone, upgrading or downgrading none of the user's packages. A dry run changes nothing.
    report = tmp_path / "report.json"
    result = run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), str(wheel)],
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    to_install = {
        canonical(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "trl-ada" in to_install  # the wheel itself was resolved
    assert not {name: version for name, version in to_install.items() if name in USER_STACK}


@pytest.mark.slow
def test_wheel_pins_none_of_the_user_stack_and_leaves_torch_to_trl(wheel):
    # Fails while setup.py pins exact versions: pip would then replace a user's working torch/TRL stack.
    requirements = [Requirement(line) for line in wheel_metadata(wheel).get_all("Requires-Dist") or []]
    base = [r for r in requirements if r.marker is None or "extra" not in str(r.marker)]
    pinned = [
        str(r)
        for r in base
        if canonical(r.name) in NOT_PINNED and any(s.operator in ("==", "===") for s in r.specifier)
    ]
    assert not pinned, f"exact pins on the user's stack: {pinned}"
    assert "torch" not in {canonical(r.name) for r in base}, "torch comes through trl; trl-ada must not require it"


# ---------------------------------------------------------------------------------------------------------------------
# In the checkout (fast): recipe names for --config, and `trl-ada` staying import-light
# ---------------------------------------------------------------------------------------------------------------------


def test_config_takes_a_path_or_the_name_of_a_shipped_recipe(tmp_path, monkeypatch):
    from trl_ada.cli.train import resolve_config, shipped_recipes, with_config_resolved

    recipe = str((ROOT / "recipes" / "qwen2.5-math-1.5b" / "seq_balance.yaml").resolve())
    assert resolve_config("qwen2.5-math-1.5b/seq_balance") == recipe  # in a checkout: recipes/ of the repository
    assert resolve_config("qwen2.5-math-1.5b/seq_balance.yaml") == recipe
    assert {"qwen2.5-math-1.5b/seq_balance", "models/qwen2.5-math-7b"} <= set(shipped_recipes())
    own = tmp_path / "qwen2.5-math-1.5b" / "seq_balance.yaml"  # an existing file wins over a shipped recipe
    own.parent.mkdir()
    own.write_text("max_steps: 1\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config("qwen2.5-math-1.5b/seq_balance.yaml") == "qwen2.5-math-1.5b/seq_balance.yaml"
    assert resolve_config("qwen2.5-math-1.5b/seq_balance") == recipe  # no such file here: the shipped one
    for wrong in ("no_such_recipe", "../setup.py", "../setup"):
        with pytest.raises(
            ValueError, match="neither a file nor a recipe shipped with trl-ada.*models/qwen2.5-math-7b"
        ):
            resolve_config(wrong)
    argv = ["--max_steps", "3", "--config=models/qwen2.5-math-7b", "--output_dir", "o"]
    resolved = str((ROOT / "recipes" / "models" / "qwen2.5-math-7b.yaml").resolve())
    assert with_config_resolved(argv) == ["--max_steps", "3", "--config", resolved, "--output_dir", "o"]
    assert with_config_resolved(["--max_steps", "3"]) == ["--max_steps", "3"]


def test_trl_ada_train_names_the_shipped_recipes_for_an_unknown_config(capsys):
    from trl_ada.cli import main

    assert main(["train", "--config", "qwen2.5-math-1.5b/seq_balanced"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("trl-ada train: error: --config 'qwen2.5-math-1.5b/seq_balanced' is neither")
    assert "qwen2.5-math-1.5b/seq_balance," in error


def test_trl_ada_cli_imports_neither_torch_nor_trl():
    code = (
        "import sys, trl_ada.cli\n"
        "heavy = {'torch', 'trl', 'transformers', 'accelerate', 'datasets'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Python floor and the GPU constraints (fast, offline; `.ci/gpu_resolve_check.sh` runs pip's resolver on the GPU file)
# ---------------------------------------------------------------------------------------------------------------------


def constraint_pins(path: Path) -> dict[str, str]:
    import re

    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
            pins[canonical(name)] = version
    return pins


def setup_py_arguments(monkeypatch) -> dict:
    """setup.py's keyword arguments to `setup()`, captured without building anything."""
    import runpy

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    return captured


def test_python_floor_is_one_every_tested_package_installed_here_accepts(monkeypatch):
    # setup.py's python_requires (and the README's "Python 3.11+") must not promise a Python the tested stacks cannot
    # install on: every package pinned in constraints/ and installed here must accept the floor. With ">=3.10" this
    # fails in the main environment (trl 1.16, transformers 5.24, numpy 2.4.6, matplotlib 3.11.2 need >=3.11) and in
    # `.ci/trl_stage.sh 1.14` (numpy 2.4.6).
    import importlib.metadata
    import re

    from packaging.specifiers import SpecifierSet

    (floor,) = re.findall(r">=\s*(\d+\.\d+)", setup_py_arguments(monkeypatch)["python_requires"])
    pinned = set().union(*(constraint_pins(path) for path in (ROOT / "constraints").glob("*.txt")))
    refused, checked = {}, 0
    for name in sorted(pinned):
        try:
            requires = importlib.metadata.metadata(name).get("Requires-Python")
        except importlib.metadata.PackageNotFoundError:
            continue
        checked += 1
        if requires and not SpecifierSet(requires).contains(floor, prereleases=True):
            refused[name] = requires
    assert checked >= 10  # trl, torch, transformers, numpy, ... are installed wherever this runs
    assert not refused, f"python_requires floor {floor} is refused by {refused}"


def test_dev_extra_is_pinned_in_every_stack_that_installs_it_and_has_what_the_tool_tests_need(monkeypatch):
    # `.ci/run` and `.ci/trl_stage.sh` install `-e ".[dev]"` under these files. jmespath: TRL's tool-call parsing on
    # transformers < 5.13 and tests/test_trl_drop_in.py's environments with tools, which skip without it.
    dev = [Requirement(r) for r in setup_py_arguments(monkeypatch)["extras_require"]["dev"]]
    assert "jmespath" in {canonical(r.name) for r in dev}
    for stack in ("trl-1.14.txt", "trl-1.15.txt", "trl-1.16.txt"):
        pins = constraint_pins(ROOT / "constraints" / stack)
        for requirement in dev:
            assert canonical(requirement.name) in pins, (stack, requirement.name)
            assert requirement.specifier.contains(pins[canonical(requirement.name)]), (stack, str(requirement))


def test_gpu_constraints_are_the_main_stack_within_setup_pys_ranges_and_trls_extras(monkeypatch):
    # constraints/trl-1.16-gpu.txt (README, "GPU install") is constraints/trl-1.16.txt with what vLLM needs; every pin
    # lies inside setup.py's ranges and inside the installed TRL's `vllm` and `deepspeed` extras.
    import importlib.metadata

    gpu = constraint_pins(ROOT / "constraints" / "trl-1.16-gpu.txt")
    main = constraint_pins(ROOT / "constraints" / "trl-1.16.txt")
    changed = {name for name in gpu.keys() & main.keys() if gpu[name] != main[name]}
    assert changed == {"transformers", "huggingface-hub", "numpy"}, changed  # the file's header says why each
    assert gpu.keys() - main.keys() == {"vllm", "deepspeed"}
    # The `dev` tools (aiohttp: the main suite runs the asynchronous rollout loop; vLLM brings its own on GPUs).
    assert main.keys() - gpu.keys() <= {"pytest", "ruff", "hypothesis", "sortedcontainers", "aiohttp", "jmespath"}

    arguments = setup_py_arguments(monkeypatch)
    requirements = [Requirement(r) for r in arguments["install_requires"]]
    requirements += [Requirement(r) for extra in ("vllm", "deepspeed") for r in arguments["extras_require"][extra]]
    for requirement in requirements:
        if canonical(requirement.name) in gpu:
            assert requirement.specifier.contains(gpu[canonical(requirement.name)]), (str(requirement), gpu)

    if importlib.metadata.version("trl") != gpu["trl"]:
        pytest.skip(f"the installed TRL is {importlib.metadata.version('trl')}, the GPU stack's is {gpu['trl']}")
    extras = [Requirement(r) for r in importlib.metadata.requires("trl")]
    for extra in ("vllm", "deepspeed"):
        names = set()
        for requirement in extras:
            if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
                if canonical(requirement.name) in gpu:
                    names.add(canonical(requirement.name))
                    assert requirement.specifier.contains(gpu[canonical(requirement.name)]), (extra, str(requirement))
        assert extra in names, (extra, names)  # the extra's own package is pinned


def test_every_extra_the_install_asks_for_is_declared_under_that_name(monkeypatch):
    # pip matches an extra by the name a requirement writes and warns at install when the package declares it under
    # another spelling (math-verify's `antlr4-13-2` extra asks latex2sympy2_extended for `antlr4_13_2`, declared as
    # `antlr4-13-2`). Walk what installing trl-ada requests, through the installed distributions' metadata.
    import importlib.metadata

    pending = [Requirement(r) for r in setup_py_arguments(monkeypatch)["install_requires"]]
    seen: set[tuple[str, frozenset[str]]] = set()
    undeclared = []
    while pending:
        requirement = pending.pop()
        key = (canonical(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            distribution = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        declared = set(distribution.metadata.get_all("Provides-Extra") or [])
        undeclared += [f"{requirement.name}[{extra}]" for extra in requirement.extras if extra not in declared]
        for text in distribution.requires or []:
            dependency = Requirement(text)
            active = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
            if dependency.marker is None or any(dependency.marker.evaluate(env) for env in active):
                pending.append(dependency)
    assert not undeclared, undeclared
    assert ("trl", frozenset()) in seen  # the walk reached the dependencies
