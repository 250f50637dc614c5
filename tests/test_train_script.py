"""scripts/train_ada.py: the embedded default run, the real path on local directories, and bad input."""

import importlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from conftest import run_with_stack_dump
from huggingface_hub import ModelCard

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train_ada.py"
FAST = [
    "--max_steps",
    "2",
    "--logging_steps",
    "1",
    "--per_device_train_batch_size",
    "8",
    "--num_generations",
    "4",
    "--max_completion_length",
    "8",
]


def load_script():
    # scripts/train_ada.py is a thin entry over trl_ada.cli.train, which holds the job's code (also `trl-ada train`).
    return importlib.import_module("trl_ada.cli.train")


def run_main(argv):
    script = load_script()
    return script.main(*script.make_parser(argv).parse_args_and_config(argv))


@pytest.fixture
def local_model(tiny_model_dir):
    return str(tiny_model_dir)


@pytest.fixture
def math_jsonl(tmp_path):
    """A small local math dataset with LaTeX answers, in the OpenR1-Math layout (problem, solution)."""
    rows = [
        {"problem": "compute 1+1", "solution": "$2$"},
        {"problem": "compute 1/2+1/2", "solution": "$1$"},
        {"problem": "write a half", "solution": "$\\frac{1}{2}$"},
        {"problem": "compute 3*4", "solution": "$\\boxed{12}$"},
    ] * 4
    path = tmp_path / "math.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows))
    return str(path)


def test_embedded_default_run_writes_every_artifact(tmp_path):
    out = tmp_path / "embedded"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        str(SCRIPT),
        "--max_steps",
        "3",
        "--logging_steps",
        "1",
        "--heldout_size",
        "16",
        "--arithmetic_train_size",
        "400",
        "--output_dir",
        str(out),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "metrics.json", "metrics.csv"):
        assert (out / name).is_file(), name
    for plot in ("reward", "samples_per_prompt", "zero_variance_share"):
        assert (out / "plots" / f"{plot}.png").stat().st_size > 1000
    card = ModelCard.load(out / "README.md")
    assert "reinforce-ada" in card.data.tags
    history = json.loads((out / "metrics.json").read_text())
    steps = [e for e in history if "loss" in e]
    assert len(steps) == 3
    mean_samples = sum(e["ada/samples_per_prompt/mean"] for e in steps) / 3
    assert f"| completions drawn per prompt (mean) | {mean_samples:.4g} |" in card.text
    assert "eval_heldout_accuracy_start" in card.text and "eval_heldout_accuracy`" in card.text
    assert "| `sampler` | seq_balance |" in card.text
    # What the task was, and where to load the model from (not the absolute path of this machine).
    text = " ".join(card.text.split())
    assert "on trl-ada's embedded arithmetic task (400 fresh problems of graded difficulty from" in text
    assert "rewarded by `exact_match_reward`." in text and "Sampler `seq_balance` (Reinforce-Ada-Seq)" in text
    assert 'pipeline("text-generation", model="embedded")' in text and str(tmp_path) not in card.content


def test_real_path_on_local_directories(tmp_path, local_model, math_jsonl):
    trainer = run_main(
        [
            "--model_name_or_path",
            local_model,
            "--dataset_name",
            math_jsonl,
            "--reward_funcs",
            "math_verify",
            "--output_dir",
            str(tmp_path / "out"),
            "--use_cpu",
            "--bf16",
            "false",
            *FAST,
            "--sampler",
            "seq_balance",
            "--round_size",
            "4",
            "--max_rounds",
            "2",
            "--report_to",
            "none",
        ]
    )
    assert trainer.state.global_step == 2
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert set(trainer.train_dataset.column_names) >= {"prompt", "solution"}
    assert trainer.train_dataset[0]["prompt"].startswith("compute")  # no chat template: plain-text prompts


def test_peft_lora_run(tmp_path, local_model, math_jsonl):
    trainer = run_main(
        [
            "--model_name_or_path",
            local_model,
            "--dataset_name",
            math_jsonl,
            "--output_dir",
            str(tmp_path / "lora"),
            "--use_cpu",
            "--bf16",
            "false",
            *FAST,
            "--use_peft",
            "--lora_r",
            "4",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
            "--report_to",
            "none",
        ]
    )
    assert (tmp_path / "lora" / "adapter_config.json").is_file()
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)


def test_yaml_config_run(tmp_path, local_model, math_jsonl):
    config = tmp_path / "recipe.yaml"
    config.write_text(
        f"model_name_or_path: {local_model}\ndataset_name: {math_jsonl}\nreward_funcs: [math_verify]\n"
        f"output_dir: {tmp_path / 'yaml'}\nuse_cpu: true\nbf16: false\nmax_steps: 1\nper_device_train_batch_size: 8\n"
        "num_generations: 4\nmax_completion_length: 8\nsampler: seq_pos\nround_size: 4\nmax_rounds: 2\nreport_to: none\n"
    )
    trainer = run_main(["--config", str(config)])
    assert trainer.args.sampler == "seq_pos" and trainer.state.global_step == 1


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        ([{"question": "compute 1+1", "solution": "$2$"}], [], "question"),  # missing columns: names what exists
        ([], [], "empty"),
        ([{"problem": "compute 1+1" * 40, "solution": "$2$"}], ["--max_prompt_length", "16"], "--max_prompt_length"),
        ([{"problem": "compute 1+1", "solution": "$2$"}], ["--reward_funcs", "no_such_reward"], "Known names"),
    ],
    ids=["missing-column", "empty", "too-long", "unknown-reward"],
)
def test_bad_input_fails_before_training(tmp_path, local_model, rows, extra, message, monkeypatch):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    if not rows:
        path = tmp_path / "empty.parquet"
        import datasets

        datasets.Dataset.from_dict({"problem": [], "solution": []}).to_parquet(str(path))
    script = load_script()
    monkeypatch.setattr(script, "AdaGRPOTrainer", None)  # any attempt to build the trainer would fail differently
    argv = [
        "--model_name_or_path",
        local_model,
        "--dataset_name",
        str(path),
        "--output_dir",
        str(tmp_path / "o"),
        "--use_cpu",
        "--bf16",
        "false",
        *FAST,
        *extra,
    ]
    with pytest.raises(ValueError, match=message):
        script.main(*script.make_parser(argv).parse_args_and_config(argv))


@pytest.fixture(scope="module")
def shipped_config_run(tmp_path_factory):
    """`accelerate launch --config_file configs/accelerate/cpu_two_processes.yaml scripts/train_ada.py ...`, once for
    the two tests below: tests/exit_run.py runs the script, with these flags, and watches its exit on each process."""
    out = tmp_path_factory.mktemp("two")
    command = [
        "accelerate",
        "launch",
        "--config_file",
        str(ROOT / "configs/accelerate/cpu_two_processes.yaml"),
        "--main_process_port",
        "0",
        str(Path(__file__).parent / "exit_run.py"),
        str(out),
        "--max_steps",
        "2",
        "--heldout_size",
        "0",
        "--arithmetic_train_size",
        "200",
        "--per_device_train_batch_size",
        "16",
        "--output_dir",
        str(out / "run"),
    ]
    # A hang (at exit, say) fails with every process's stack instead of a bare timeout.
    result = run_with_stack_dump(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    return out


@pytest.mark.slow
def test_accelerate_launch_with_the_shipped_two_process_config(shipped_config_run):
    out = shipped_config_run
    assert (out / "run" / "README.md").is_file() and (out / "run" / "model.safetensors").is_file()
    assert all((out / f"rank{rank}.json").is_file() for rank in range(2))  # the config started two processes


@pytest.mark.slow
def test_the_two_process_job_frees_its_ddp_model_before_destroying_the_process_group(shipped_config_run):
    # A DDP reducer still alive when `destroy_process_group` runs is freed at interpreter exit, where it can deadlock
    # with gloo's worker thread: `accelerate launch -m trl_ada.cli.train` hung at exit in about one CPU run in seven. The
    # exit path now drops the trainer and the accelerator's references first; tests/exit_run.py counts the live DDP
    # modules at the moment the group is destroyed, on each process.
    reports = [json.loads((shipped_config_run / f"rank{rank}.json").read_text()) for rank in range(2)]
    for report in reports:
        assert report["status"] == 0
        assert report["live_ddp_modules"] == [0], report


# ---------------------------------------------------------------------------------------------------------------------
# Embedded run: checkpoints, resume, what reaches stdout
# ---------------------------------------------------------------------------------------------------------------------

EMBEDDED_FAST = [*FAST, "--heldout_size", "0", "--arithmetic_train_size", "200"]


@pytest.fixture
def restore_torch_threads():
    """The embedded run sets torch to one thread for the whole process; give later tests their threads back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def parse(argv):
    return load_script().make_parser(argv).parse_args_and_config(argv)


def test_save_steps_implies_saving_on_the_embedded_run(tmp_path):
    _, training_args, _, _ = parse(["--save_steps", "3"])
    assert training_args.save_strategy == "steps" and training_args.save_steps == 3
    _, training_args, _, _ = parse(["--save_steps", "3", "--save_strategy", "no"])  # an explicit strategy wins
    assert training_args.save_strategy == "no"
    _, training_args, _, _ = parse([])
    assert training_args.save_strategy == "no"  # the embedded default still saves nothing
    config = tmp_path / "embedded.yaml"
    config.write_text("save_steps: 4\nmax_steps: 8\n")
    _, training_args, _, _ = parse(["--config", str(config)])
    assert training_args.save_strategy == "steps" and training_args.save_steps == 4
    assert training_args.num_generations == 4 and training_args.sampler == "seq_balance"  # embedded defaults


def test_embedded_run_saves_checkpoints_and_resumes_from_the_latest(tmp_path, restore_torch_threads):
    out = tmp_path / "embedded"
    run_main([*EMBEDDED_FAST, "--save_steps", "1", "--output_dir", str(out)])
    assert (out / "checkpoint-1").is_dir() and (out / "checkpoint-2").is_dir()

    # Mark the latest checkpoint's state: a run that resumed from it carries the mark in its log history.
    state_path = out / "checkpoint-2" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    state["log_history"].append({"step": 2, "resumed_from": "checkpoint-2"})
    state_path.write_text(json.dumps(state))

    argv = [*EMBEDDED_FAST, "--output_dir", str(out), "--max_steps", "3", "--resume_from_checkpoint", "true"]
    trainer = run_main(argv)
    assert trainer.state.global_step == 3
    assert {"step": 2, "resumed_from": "checkpoint-2"} in trainer.state.log_history


@pytest.mark.parametrize("value", ["true", "True", "1"])
def test_resume_without_a_checkpoint_fails_before_the_model_loads(tmp_path, monkeypatch, value):
    script = load_script()

    def no_model_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the checkpoint was checked")

    monkeypatch.setattr(script, "load_model_and_data", no_model_loading)
    out = tmp_path / "no-checkpoints"
    out.mkdir()
    argv = [*EMBEDDED_FAST, "--output_dir", str(out), "--resume_from_checkpoint", value]
    with pytest.raises(ValueError, match=rf"latest complete checkpoint-N directory in output_dir='{out}'"):
        script.main(*script.make_parser(argv).parse_args_and_config(argv))
    argv = [*EMBEDDED_FAST, "--output_dir", str(out), "--resume_from_checkpoint", str(tmp_path / "checkpoint-9")]
    with pytest.raises(ValueError, match="checkpoint-9' is not a directory"):
        script.main(*script.make_parser(argv).parse_args_and_config(argv))


def test_resume_value_is_passed_on(tmp_path):
    script = load_script()
    (tmp_path / "checkpoint-5").mkdir()
    assert script.resolve_resume_from_checkpoint(str(tmp_path / "checkpoint-5"), "unused") == str(
        tmp_path / "checkpoint-5"
    )
    with pytest.raises(ValueError, match="there is none"):  # a save cut short is no checkpoint to resume from
        script.resolve_resume_from_checkpoint("true", str(tmp_path))
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text("{}")
    assert script.resolve_resume_from_checkpoint("true", str(tmp_path)) is True  # the trainer picks the latest
    assert script.resolve_resume_from_checkpoint(None, str(tmp_path)) is None
    assert script.resolve_resume_from_checkpoint("false", str(tmp_path)) is None


@pytest.mark.parametrize("disable_tqdm", ["false", "true"], ids=["progress-bar", "no-bar"])
def test_embedded_run_keeps_metric_dicts_off_stdout_and_logs_a_summary(
    tmp_path, capfd, caplog, restore_torch_threads, disable_tqdm
):
    caplog.set_level(logging.DEBUG, logger="train_ada")
    out = tmp_path / "quiet"
    argv = [*FAST, "--heldout_size", "8", "--arithmetic_train_size", "200", "--output_dir", str(out)]
    trainer = run_main([*argv, "--disable_tqdm", disable_tqdm])
    captured = capfd.readouterr()
    assert "'loss'" not in captured.out
    assert not [line for line in captured.out.splitlines() if line.lstrip().startswith("{'")]
    if disable_tqdm == "false":
        assert "2/2" in captured.err  # the progress bar stays
    assert len([e for e in trainer.state.log_history if "loss" in e]) == 2  # the metrics are still logged
    assert json.loads((out / "metrics.json").read_text())

    messages = [r.getMessage() for r in caplog.records if r.name == "train_ada"]
    assert any("'loss'" in message for message in messages)  # each metrics dict went to logging at DEBUG
    summary = "\n".join(messages)
    mean_samples = sum(e["ada/samples_per_prompt/mean"] for e in trainer.state.log_history if "loss" in e) / 2
    assert "held-out pass rate (8 problems, temperature 1)" in summary
    assert f"completions drawn per prompt: {mean_samples:.1f} on average" in summary
    assert "of the first 4 draws (what GRPO would train on)" in summary and "of the kept update groups" in summary
    assert "training wall time:" in summary
    assert f"model card: {out / 'README.md'}" in summary


@pytest.mark.parametrize(
    ("fsdp", "zero_stage", "sharded"),
    [(False, None, False), (True, None, True), (False, 2, False), (False, 3, True)],
    ids=["ddp", "fsdp", "zero2", "zero3"],
)
def test_heldout_check_knows_when_parameters_are_sharded(fsdp, zero_stage, sharded):
    # The held-out check generates on the main process only, which would hang with sharded parameters; it is skipped
    # exactly then.
    from types import SimpleNamespace

    from trl_ada.cli.train import sharded_parameters

    plugin = None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)
    trainer = SimpleNamespace(
        is_fsdp_enabled=fsdp,
        is_deepspeed_enabled=zero_stage is not None,
        accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
    )
    assert sharded_parameters(trainer) is sharded


def test_embedded_run_skips_the_heldout_check_when_parameters_are_sharded(
    tmp_path, caplog, monkeypatch, restore_torch_threads
):
    # Sharded parameters make every forward a collective the other processes would never join: the main-process-only
    # held-out check must not run (here it would raise), and the run says so.
    script = load_script()
    monkeypatch.setattr(script, "sharded_parameters", lambda trainer: True)

    def must_not_run(*args, **kwargs):
        raise AssertionError("held-out check ran with sharded parameters")

    monkeypatch.setattr(script, "heldout_accuracy", must_not_run)
    caplog.set_level(logging.WARNING, logger="train_ada")
    trainer = run_main([*FAST, "--max_steps", "1", "--heldout_size", "8", "--output_dir", str(tmp_path / "sharded")])
    assert trainer.state.global_step == 1
    assert any("Skipping the held-out accuracy check" in r.getMessage() for r in caplog.records)
    assert not any("eval_heldout_accuracy" in entry for entry in trainer.state.log_history)


# ---------------------------------------------------------------------------------------------------------------------
# The command line: reward modules of the working directory, --help, short errors, warnings, a run too short to log
# ---------------------------------------------------------------------------------------------------------------------


def test_dotted_reward_funcs_import_from_the_working_directory(tmp_path, monkeypatch):
    # `trl-ada train` is a console script: sys.path[0] is its bin/ folder, not the working directory. `trl grpo` puts
    # the working directory on sys.path for a dotted reward path; so does trl-ada.
    (tmp_path / "myrewards_cwd.py").write_text(
        "def my_reward(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "myrewards_cwd", raising=False)
    script_args, *_ = parse(["--reward_funcs", "myrewards_cwd.my_reward", "exact_match"])
    first, second = load_script().resolve_reward_funcs(script_args, "exact_match")
    assert first.__module__ == "myrewards_cwd" and first.__name__ == "my_reward"
    assert second.__name__ == "exact_match_reward"
    monkeypatch.delitem(sys.modules, "myrewards_cwd", raising=False)


@pytest.fixture
def help_cache(tmp_path, monkeypatch):
    """`trl-ada train --help`'s cache in a fresh folder (not the user's), at a fixed width."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "100")
    return tmp_path / "cache" / "trl-ada"


def train_help(capsys) -> str:
    from trl_ada.cli import main as trl_ada_main

    assert trl_ada_main(["train", "--help"]) == 0
    return capsys.readouterr().out


def test_train_help_lists_config_and_a_bad_value_is_reported_in_a_few_lines(capsys, help_cache):
    from trl_ada.cli import main as trl_ada_main

    help_text = train_help(capsys)
    assert "--config FILE_OR_RECIPE" in help_text and "qwen2.5-math-1.5b/seq_balance" in help_text
    assert "--reward_model_name_or_path" in help_text and "--test_split_size" in help_text

    assert trl_ada_main(["train", "--sampler", "seq_balence"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) <= 3, error  # was ~240 lines of usage before the message
    # samplers are plug-ins (any registered name or import path), so the registry, not argparse, names the choices
    assert error[-1].startswith("trl-ada train: error: sampler='seq_balence' is not supported. Choose one of")
    assert "'seq_balance'" in error[-1]

    # A knob AdaGRPOConfig rejects: one line with its fix, no traceback.
    assert trl_ada_main(["train", "--num_generations", "3", "--per_device_train_batch_size", "8"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["trl-ada train: error: generation_batch_size (8) must be divisible by num_generations (3)."]


HELP_GROUP_TITLE = re.compile(r"^(\S[^\n]*):$", re.MULTILINE)


def flag_help(help_text: str, flag: str) -> str:
    """The help of `flag`, on one line: from its own line to the next flag's or group's."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"  {flag} ") or line == f"  {flag}")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("  -") or not lines[i].startswith(" "))
    return " ".join(" ".join(lines[start:end]).split())


def test_train_help_groups_the_flags_trl_ada_first_and_shows_trls_defaults(capsys, help_cache):
    from trl import DatasetMixtureConfig, GRPOConfig, ModelConfig, TrlParser

    from trl_ada.config import AdaGRPOConfig

    script = load_script()
    help_text = train_help(capsys)
    titles = HELP_GROUP_TITLE.findall(help_text)
    # The old help was one "options" group of ~1,460 lines, --sampler at line 1,112 and --config last.
    assert titles[:5] == [
        "options",
        "trl-ada: Reinforce-Ada sampling",
        "script, model and data",
        "TRL's GRPOConfig",
        "transformers' TrainingArguments (defaults as GRPOConfig sets them)",
    ]
    ada, rest = help_text.split("trl-ada: Reinforce-Ada sampling:\n", 1)[1].split("script, model and data:\n", 1)
    assert [line.split()[0] for line in ada.splitlines() if line.startswith("  --")][0] == "--sampler"
    before_trl = rest.split("TRL's GRPOConfig:\n", 1)[0]
    assert "  --config FILE_OR_RECIPE" in before_trl and "  --model_name_or_path " in before_trl

    # TRL's defaults, and the embedded run's where it has its own (lr 1e-4 and 8 tokens were shown as the defaults).
    assert f"(default: {GRPOConfig.learning_rate}; embedded run: 0.0001)" in flag_help(help_text, "--learning_rate")
    assert f"(default: {GRPOConfig.max_completion_length}; embedded run: 8)" in flag_help(
        help_text, "--max_completion_length"
    )
    assert "embedded run: True unless a GPU is available" in flag_help(help_text, "--use_cpu")
    for name, embedded in script.embedded_defaults().items():
        default = AdaGRPOConfig.__dataclass_fields__[name].default
        default = getattr(default, "value", default)  # an enum's value, as the help shows it
        if name != "use_cpu" and embedded != default:
            assert f"(default: {default}; embedded run: {embedded})" in flag_help(help_text, f"--{name}"), name

    # Nothing lost: every option string of the ungrouped parser (the old help) is still listed.
    plain = TrlParser((script.AdaScriptArguments, AdaGRPOConfig, ModelConfig, DatasetMixtureConfig))
    options = {option for action in plain._actions for option in action.option_strings} | {"--config"}
    listed = set(re.findall(r"(?<![\w-])(--?[\w-]+)", help_text))
    assert options - listed == set()


def test_train_help_is_answered_from_the_cache_without_importing_torch(capsys, help_cache):
    built = train_help(capsys)  # builds the text (this process has imported torch already) and caches it
    (cached,) = help_cache.glob("train-help-*.txt")
    code = (
        "import sys; from trl_ada.cli import main; code = main(['train', '--help']); "
        "sys.stderr.write(f'{code} torch imported: {\"torch\" in sys.modules}')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stderr == "0 torch imported: False" and run.stdout == built
    # An installation that changed (here: another TRL version) builds the text again.
    key = cached.read_text().split("\n", 1)[0]
    with mock.patch("trl_ada.cli.version", lambda name: "0.0.0"):
        from trl_ada.cli import train_help_cache

        assert train_help_cache()[1] != key


def test_missing_prepared_data_names_trl_ada_prepare_data_before_loading_anything(tmp_path, capsys, monkeypatch):
    from trl_ada.cli import main as trl_ada_main

    monkeypatch.chdir(tmp_path)
    script = load_script()
    monkeypatch.setattr(script, "AdaGRPOTrainer", None)  # no training may start
    # On CPU: the recipe's bf16 would stop the run first here (a GPU run gets straight to the data).
    code = trl_ada_main(["train", "--config", "qwen2.5-math-1.5b/seq_balance", "--bf16", "false", "--use_cpu", "true"])
    error = capsys.readouterr().err
    assert code == 2
    assert error.startswith("trl-ada train: error: No such dataset file or directory: data/openr1_qwen2.5-math-1.5b")
    assert "trl-ada prepare-data" in error and "--output data/openr1_qwen2.5-math-1.5b.parquet" in error
    assert "Traceback" not in error


def _gradient_checkpointing_warnings(records) -> list[str]:
    return [
        str(r.message) for r in records if issubclass(r.category, FutureWarning) and "checkpointing" in str(r.message)
    ]


def test_cli_silences_the_gradient_checkpointing_deprecations_the_user_cannot_act_on(tmp_path, restore_torch_threads):
    import warnings

    script = load_script()
    argv = [*EMBEDDED_FAST, "--max_steps", "1", "--output_dir", str(tmp_path / "quiet")]
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        assert script.cli_main(argv, prog="trl-ada train") == 0
    assert (tmp_path / "quiet" / "README.md").is_file()
    assert _gradient_checkpointing_warnings(records) == []
    # TRL's own default is not the user's to rename, outside the command line too (AdaGRPOConfig filters it) ...
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        parse(argv)
    assert _gradient_checkpointing_warnings(records) == []
    # ... but a user who set `gradient_checkpointing` to another value can rename it: that warning stays.
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        script.silence_unactionable_warnings(["--gradient_checkpointing", "false"])
        parse(["--gradient_checkpointing", "false"])
    assert any("`gradient_checkpointing` is deprecated" in m for m in _gradient_checkpointing_warnings(records))


def test_a_run_shorter_than_logging_steps_logs_its_last_step(tmp_path, caplog, restore_torch_threads):
    # The embedded default logs every 5 steps; a 3-step run used to log nothing, and its card said "statistic over 0
    # training steps" with every value n/a, no plots, and a summary of n/a.
    caplog.set_level(logging.INFO, logger="train_ada")
    out = tmp_path / "short"
    argv = ["--max_steps", "3", "--heldout_size", "0", "--arithmetic_train_size", "64"]
    trainer = run_main([*argv, "--per_device_train_batch_size", "16", "--output_dir", str(out)])
    assert trainer.args.logging_steps == 5
    (logged,) = [e for e in trainer.state.log_history if "loss" in e]
    assert logged["step"] == 3 and logged["ada/samples_per_prompt/mean"] >= 4
    card = (out / "README.md").read_text()
    assert "statistic over 3 training steps" in card
    assert f"| completions drawn per prompt (mean) | {logged['ada/samples_per_prompt/mean']:.4g} |" in card
    for plot in ("reward", "samples_per_prompt", "zero_variance_share"):
        assert (out / "plots" / f"{plot}.png").is_file()
    summary = "\n".join(r.getMessage() for r in caplog.records if r.name == "train_ada")
    assert f"completions drawn per prompt: {logged['ada/samples_per_prompt/mean']:.1f} on average" in summary


def test_run_summary_says_when_nothing_was_logged(caplog):
    from types import SimpleNamespace

    args = SimpleNamespace(
        num_generations=4, temperature=1.0, output_dir="out", push_to_hub=False, logging_strategy="no"
    )
    trainer = SimpleNamespace(args=args, state=SimpleNamespace(log_history=[], global_step=3))
    caplog.set_level(logging.INFO, logger="train_ada")
    load_script().log_run_summary(trainer, 1.0, None)
    summary = "\n".join(r.getMessage() for r in caplog.records)
    assert "no training step was logged (logging_strategy=no)" in summary and "n/a" not in summary


# ---------------------------------------------------------------------------------------------------------------------
# Every flag of `trl grpo`: reward models, dataset mixtures, streaming, test splits
# ---------------------------------------------------------------------------------------------------------------------


def test_every_flag_of_trl_grpo_is_a_flag_of_trl_ada_train():
    from trl.scripts.grpo import make_parser as trl_grpo_parser

    def dests(parser):
        return {action.dest for action in parser._actions}

    missing = dests(trl_grpo_parser()) - dests(load_script().make_parser([]))
    assert not missing


def test_dataset_mixture_with_a_seeded_test_split_trains_and_evaluates(tmp_path, local_model):
    rows = [{"problem": f"compute {i}+1", "solution": f"${i + 1}$"} for i in range(12)]
    write = lambda name, part: (tmp_path / name).write_text("\n".join(json.dumps(r) for r in part))  # noqa: E731
    write("a.jsonl", rows[:8])
    write("b.jsonl", rows[8:])
    config = tmp_path / "mixture.yaml"
    config.write_text(
        f"model_name_or_path: {local_model}\n"
        f"datasets:\n  - path: json\n    data_files: {tmp_path / 'a.jsonl'}\n"
        f"  - path: json\n    data_files: {tmp_path / 'b.jsonl'}\n"
        "test_split_size: 0.25\neval_strategy: steps\neval_steps: 1\nper_device_eval_batch_size: 4\n"
        f"output_dir: {tmp_path / 'mix'}\nuse_cpu: true\nbf16: false\nreport_to: none\n"
    )
    argv = ["--config", str(config), *FAST, "--max_steps", "1"]
    trainer = run_main(argv)
    assert len(trainer.train_dataset) == 9 and len(trainer.eval_dataset) == 3  # both files, split 0.25
    assert {row["prompt"] for row in trainer.train_dataset} | {row["prompt"] for row in trainer.eval_dataset} == {
        row["problem"] for row in rows
    }
    assert any("eval_loss" in entry for entry in trainer.state.log_history)
    again = load_script().prepare_run(*parse(argv))  # seeded: the same split on every process and every run
    assert again.eval_dataset["prompt"] == trainer.eval_dataset["prompt"]


def test_streamed_dataset_trains(tmp_path, local_model, math_jsonl):
    from datasets import IterableDataset

    argv = ["--model_name_or_path", local_model, "--dataset_name", math_jsonl, "--output_dir", str(tmp_path / "s")]
    argv += ["--use_cpu", "--bf16", "false", *FAST, "--max_steps", "1", "--report_to", "none"]
    trainer = run_main([*argv, "--streaming"])
    assert isinstance(trainer.train_dataset, IterableDataset) and trainer.state.global_step == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--streaming", "--max_steps", "-1"], "pass --max_steps N with --streaming"),
        (["--dataset_streaming", "--test_split_size", "0.2"], "drop --streaming/--dataset_streaming, or"),
        (["--eval_strategy", "steps"], "Hold part of it out with --test_split_size"),
        (["--reward_model_name_or_path", "./no-such-reward-model"], "is not a directory"),
    ],
    ids=["stream-without-max-steps", "split-a-stream", "eval-without-split", "missing-reward-model"],
)
def test_mixture_and_reward_model_mistakes_fail_before_loading(tmp_path, local_model, math_jsonl, extra, message):
    script = load_script()
    argv = ["--model_name_or_path", local_model, "--dataset_name", math_jsonl, "--output_dir", str(tmp_path / "o")]
    argv += ["--use_cpu", "--bf16", "false", *FAST, *extra]
    with pytest.raises(ValueError, match=message):
        script.prepare_run(*parse(argv))


@pytest.fixture
def local_reward_model(tmp_path, local_model):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tmp_path / "reward-model"
    AutoModelForSequenceClassification.from_pretrained(local_model, num_labels=1).save_pretrained(path)
    AutoTokenizer.from_pretrained(local_model).save_pretrained(path)
    return str(path)


def test_reward_model_from_a_local_directory(tmp_path, local_model, math_jsonl, local_reward_model):
    from transformers import PreTrainedModel

    argv = ["--model_name_or_path", local_model, "--dataset_name", math_jsonl, "--output_dir", str(tmp_path / "rm")]
    argv += ["--use_cpu", "--bf16", "false", *FAST, "--max_steps", "1", "--report_to", "none"]
    trainer = run_main([*argv, "--reward_model_name_or_path", local_reward_model])
    # As in `trl grpo`: the reward model alone when no --reward_funcs is given, loaded by TRL.
    (reward_model,) = trainer.reward_funcs
    assert isinstance(reward_model, PreTrainedModel) and trainer.state.global_step == 1
    script_args, *_ = parse(
        [*argv, "--reward_model_name_or_path", local_reward_model, "--reward_funcs", "math_verify"]
    )
    funcs = load_script().resolve_reward_funcs(script_args, "math_verify")
    assert funcs[0] == local_reward_model and funcs[1].__name__ == "math_verify_reward"
