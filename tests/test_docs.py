"""What the README, docs/, recipes/README.md and configs/ tell a user to run must exist and be consistent.

Each test reads the documentation as text and checks it against the repository, setup.py or the installed TRL: every
repository path they name exists, the `trl-ada` subcommands and pip extras they name exist, the accelerate config
named for installed-package users ships with TRL (and equals the repository's copy), the Python floor matches
setup.py, process counts divide the round size they are shown with, documented helper commands parse, and every
recipe variant gets its own output directory.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_install import setup_py_arguments

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "recipes" / "README.md"]
# Pages of the documentation site that docs/hooks/repository_pages.py generates from files elsewhere in the repository.
GENERATED_PAGES = {ROOT / "docs" / "benchmarks.md": ROOT / "BENCHMARKS.md", ROOT / "docs" / "recipes.md": DOCS[-1]}
TOP_DIRS = ("scripts/", "configs/", "constraints/", "docs/", "recipes/", "tests/", "benchmarks/", ".ci/", "trl_ada/")
TOP_DIRS += ("hub_cards/",)
# Paths of other repositories that the docs name as such (recipes/README.md cites the authors' verl scripts).
OTHER_REPOSITORIES = {"scripts/run_reinforce_ada.sh", "scripts/run_grpo.sh", "scripts/prepare_data.sh"}
TRL_GPU_CONFIGS = ("single_gpu", "multi_gpu", "zero2", "zero3", "fsdp2")  # configs/accelerate/ copies of TRL's


def section(text: str, heading: str) -> str:
    """The body of the markdown section titled `heading` (up to the next heading of the same or a higher level; a
    `# comment` line inside a code block is no heading)."""
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, flags=re.MULTILINE)
    assert match, f"no section {heading!r}"
    level = len(match.group(1))
    rest = text[match.end() :]
    in_code, offset = False, 0
    for line in rest.splitlines(keepends=True):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and re.match(rf"#{{1,{level}}} ", line):
            return rest[:offset]
        offset += len(line)
    return rest


def code_blocks(text: str, language: str = "[a-z]*") -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def shell_commands(text: str) -> list[str]:
    """The commands of the documentation's code blocks, continuation lines joined, comments dropped."""
    commands = []
    for block in code_blocks(text):
        for command in block.replace("\\\n", " ").splitlines():
            command = re.sub(r"(^|\s)#.*$", "", command).strip()
            if command:
                commands.append(command)
    return commands


def python_floor(python_requires: str) -> str:
    (floor,) = re.findall(r">=\s*(\d+\.\d+)", python_requires)
    return floor


def trl_accelerate_configs() -> Path:
    return Path(importlib.util.find_spec("trl").origin).parent / "accelerate_configs"


def test_every_repository_path_the_docs_name_exists():
    missing = []
    prefixes = "|".join(re.escape(d) for d in TOP_DIRS)
    pattern = rf"(?<![\w./-])((?:{prefixes})[\w./@:+{{}},-]*)"
    for doc in DOCS:
        for token in set(re.findall(pattern, doc.read_text())):
            path = token.split("::")[0].rstrip(".,:;)")
            braces = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", path)  # paper_scale.{txt,json}
            paths = [braces[1] + alt + braces[3] for alt in braces[2].split(",")] if braces else [path]
            for path in paths:
                if path not in OTHER_REPOSITORIES and not (ROOT / path).exists():
                    missing.append(f"{doc.relative_to(ROOT)}: {token}")
    assert not missing, missing


def test_every_trl_ada_subcommand_the_docs_name_exists():
    result = subprocess.run(
        [sys.executable, "-c", "from trl_ada.cli import main; main(['--help'])"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (choices,) = re.findall(r"\{([a-z,-]+)\}", result.stdout)[:1]
    named = {m for doc in DOCS for m in re.findall(r"`trl-ada ([a-z][a-z-]*)", doc.read_text())}
    assert named and named <= set(choices.split(",")), (named, choices)


def test_every_pip_extra_and_constraints_file_the_docs_install_exists(monkeypatch):
    extras = set(setup_py_arguments(monkeypatch)["extras_require"])
    installs = [c for doc in DOCS for c in shell_commands(doc.read_text()) if "pip install" in c]
    named_extras = {e for c in installs for group in re.findall(r"\.\[([\w,-]+)\]", c) for e in group.split(",")}
    assert {"vllm", "deepspeed", "dev"} <= named_extras  # the README documents the GPU install's extras
    assert named_extras <= extras, named_extras - extras
    for constraints in {m for c in installs for m in re.findall(r"-c (\S+)", c)}:
        assert (ROOT / constraints).is_file(), constraints


def test_gpu_install_is_one_command_with_the_gpu_constraints():
    commands = shell_commands(
        section((ROOT / "docs" / "installation.md").read_text(), "GPU install: vLLM and DeepSpeed")
    )
    installs = [c for c in commands if c.startswith("pip install")]
    assert installs == ['pip install -c constraints/trl-1.16-gpu.txt -e ".[vllm,deepspeed]"'], commands
    # The very command .ci/gpu_resolve_check.sh resolves in CI.
    check = (ROOT / ".ci" / "gpu_resolve_check.sh").read_text()
    assert 'CONSTRAINTS="${1:-constraints/trl-1.16-gpu.txt}"' in check and "EXTRAS:-vllm,deepspeed}" in check
    # .ci/run starts it in the background with the stage venvs' set-up (.ci/build_stage_venvs.sh) and waits for it.
    run = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/build_stage_venvs.sh" in run and 'wait "$setup_pid"' in run
    assert "bash .ci/gpu_resolve_check.sh" in (ROOT / ".ci" / "build_stage_venvs.sh").read_text()


def test_readme_python_floor_is_setup_pys(monkeypatch):
    floor = python_floor(setup_py_arguments(monkeypatch)["python_requires"])
    setup_section = section(README.read_text(), "Set-up")
    stated = re.findall(r"Python (\d+\.\d+)\+", setup_section)
    assert stated == [floor], (stated, floor)


def test_installed_package_users_get_an_accelerate_config_that_exists():
    # "Add to an existing TRL project" is for users without the repository: its --config_file must be a file they
    # have, the configs TRL ships in its package, not configs/accelerate/ (not in the wheel).
    text = section((ROOT / "docs" / "installation.md").read_text(), "Add to an existing TRL project")
    commands = shell_commands(text)
    config_files = [c for c in commands if "--config_file" in c]
    assert config_files, commands
    script = "\n".join(c for c in commands if c.startswith("TRL_CONFIGS=")) + "\n"
    for command in config_files:
        (config,) = re.findall(r"--config_file (\S+)", command)
        assert "configs/accelerate" not in config, command
        # `python` in the README's command is the environment's: the interpreter running the tests, first on PATH (as
        # in an activated virtualenv, even when the tests are started by the venv's interpreter's path).
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        resolved = subprocess.run(
            ["bash", "-c", script + f"printf '%s' {config}"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PATH": path},
        ).stdout
        assert Path(resolved).is_file(), (command, resolved)
        assert Path(resolved).parent == trl_accelerate_configs()


@pytest.mark.parametrize("name", TRL_GPU_CONFIGS)
def test_repository_gpu_configs_are_the_installed_trls_own(name):
    # configs/accelerate/<name>.yaml says "Copied unchanged from TRL": the settings must equal the installed TRL's file
    # (comments aside), so pointing installed-package users at TRL's copy runs the same configuration.
    ours = yaml.safe_load((ROOT / "configs" / "accelerate" / f"{name}.yaml").read_text())
    trls = yaml.safe_load((trl_accelerate_configs() / f"{name}.yaml").read_text())
    assert ours == trls


def test_config_headers_tell_num_processes_only_where_it_is_used():
    for path in sorted((ROOT / "configs" / "accelerate").glob("*.yaml")):
        text = path.read_text()
        header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
        if yaml.safe_load(text)["distributed_type"] == "NO":  # accelerate's simple launcher: always one process
            assert "Set num_processes" not in header, path.name
            assert "one process" in header.lower(), path.name


@pytest.mark.slow
def test_trls_single_gpu_config_starts_one_process_whatever_num_processes_says(tmp_path):
    # TRL's single_gpu.yaml says num_processes: 8 with distributed_type "NO": accelerate starts one process. Run as the
    # README tells installed-package users (TRL's config, `-m trl_ada.cli.train`), from outside the checkout.
    config = trl_accelerate_configs() / "single_gpu.yaml"
    assert yaml.safe_load(config.read_text())["num_processes"] == 8
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--config_file", str(config)]
    command += ["-m", "trl_ada.cli.train", "--max_steps", "1", "--heldout_size", "0", "--arithmetic_train_size", "64"]
    command += ["--output_dir", str(tmp_path / "out")]
    result = subprocess.run(
        command, cwd=tmp_path, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("Loading weights: 100%") == 1  # one process, one model
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_process_counts_shown_with_a_round_size_divide_it():
    # docs/vllm.md advises a process count that divides round_size (no padding blocks); its examples must follow it.
    for doc in DOCS:
        for command in shell_commands(doc.read_text()):
            processes = re.findall(r"--num_processes (\d+)", command)
            round_size = re.findall(r"--round_size (\d+)", command)
            if processes and round_size:
                assert int(round_size[0]) % int(processes[0]) == 0, (doc.name, command)


def test_documented_vllm_helper_commands_parse():
    spec = importlib.util.spec_from_file_location("_vllm_server_run", ROOT / "scripts" / "_vllm_server_run.py")
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    text = (ROOT / "docs" / "vllm.md").read_text()
    commands = [c for c in shell_commands(text) if "scripts/_vllm_server_run.py" in c]
    commands += re.findall(r"`((?:python )?scripts/_vllm_server_run\.py[^`]*)`", text)
    full = [c for c in commands if "--" in c and "..." not in c]
    assert any("--sleep-mode" in c for c in full), commands  # the sleep-mode run on a GPU is spelled out
    for command in full:
        argv = shlex.split(command.split("scripts/_vllm_server_run.py", 1)[1])
        helper.parse_args(argv)  # SystemExit (argparse) on a missing required flag


def test_recipe_method_flags_give_each_method_its_own_output_dir():
    # The base files' output_dir is their GRPO-n4 folder: method flags without --output_dir overwrite that run.
    table = section((ROOT / "recipes" / "README.md").read_text(), "Methods")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`--" in line]
    assert len(rows) >= 5, rows
    for row in rows:
        flags = row.split("|")[2]
        assert "--output_dir" in flags, row
    for command in shell_commands((ROOT / "recipes" / "README.md").read_text()):
        if "--config recipes/models/" in command and "--sampler" in command:
            assert "--output_dir" in command, command


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file (lower case, punctuation dropped, spaces to dashes)."""
    anchors = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)  # no headings in code
    for heading in re.findall(r"^#+ (.+?)\s*$", text, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def test_every_link_to_a_section_finds_it():
    broken = []
    for doc in DOCS:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
            path = (doc.parent / target).resolve() if target else doc
            path = GENERATED_PAGES.get(path, path)
            if not path.is_file() or anchor not in heading_anchors(path):
                broken.append(f"{doc.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, broken


def test_every_python_block_of_the_docs_compiles():
    for doc in DOCS:
        for block in code_blocks(doc.read_text(), "python"):
            compile(block, str(doc), "exec")  # SyntaxError names the page


def test_every_page_of_the_site_is_in_its_navigation_and_has_runnable_code():
    # mkdocs.yml's nav lists every page of docs/ (the generated ones included); each page shows code to run.
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(items):
        for item in items:
            (target,) = item.values()
            yield from pages(target) if isinstance(target, list) else [target]

    listed = set(pages(nav))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    generated = {p.relative_to(ROOT / "docs").as_posix() for p in GENERATED_PAGES}
    assert listed == on_disk | generated, listed ^ (on_disk | generated)
    for page in sorted(on_disk - {"development.md"}):
        if not page.startswith("reference/"):
            assert code_blocks((ROOT / "docs" / page).read_text()), f"docs/{page} shows no code"


def test_the_simulate_pages_output_is_what_the_command_prints():
    # docs/simulate.md's first example, run as shown (Bernoulli rewards, seed 42: no model, deterministic).
    text = (ROOT / "docs" / "simulate.md").read_text()
    block = code_blocks(text, "console")[0]
    command, *shown = block.strip().splitlines()
    argv = shlex.split(command.removeprefix("$ "))
    assert argv[:2] == ["trl-ada", "simulate"], argv
    result = subprocess.run(
        [sys.executable, "-m", "trl_ada.cli", *argv[1:]], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == shown


def test_the_readme_quick_start_trains_on_cpu(tmp_path, monkeypatch):
    # The README's 15-line quick start as written, with 2 steps instead of 50 (the only change).
    import torch

    (block,) = code_blocks(section(README.read_text(), "Quick start"), "python")
    assert len(block.splitlines()) <= 16, block
    assert block.count("max_steps=50") == 1
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as examples/quickstart.py does: a 0.6 M-parameter model loses on shared cores
    namespace = {"__name__": "__main__"}
    try:
        exec(compile(block.replace("max_steps=50", "max_steps=2"), str(README), "exec"), namespace)
    finally:
        torch.set_num_threads(threads)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 2 and trainer.args.sampler == "seq_balance"
    assert any("ada/samples_per_prompt/mean" in entry for entry in trainer.state.log_history)


def test_which_sampler_should_i_use_is_in_the_readme_and_the_samplers_page_and_unread_knobs_raise():
    from trl_ada import AdaGRPOConfig

    for doc in (README, ROOT / "docs" / "samplers.md"):  # the heading the recommendation lives under, in both
        assert section(doc.read_text(), "Which sampler should I use").strip(), doc
    with pytest.raises(ValueError, match="est_sample_power"):  # what the samplers page says about a knob no one reads
        AdaGRPOConfig(output_dir="unused", use_cpu=True, bf16=False, sampler="seq_balance", est_sample_power=0.3)


def test_docs_stage_outside_the_projects_environment_stops_before_building_and_names_the_fix(tmp_path):
    # A bare virtualenv stands for the system's Python a reader gets outside the project's one: no TRL, no trl_ada.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    docs_venv = tmp_path / "docs-venv"
    env = {**os.environ, "BASE_PYTHON": str(bare / "bin" / "python"), "DOCS_VENV": str(docs_venv)}
    result = subprocess.run(
        ["bash", str(ROOT / ".ci" / "docs_stage.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "cannot import trl and trl_ada" in result.stderr and "activate the project's virtualenv" in result.stderr
    assert not docs_venv.exists()  # nothing was built on the wrong interpreter
