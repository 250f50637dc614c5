"""scripts/train_ada.py: the embedded default run, the real path on local directories, and bad input."""

import importlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
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
    # scripts/train_ada.py is a thin entry over trl_ada.train, which holds the job's code (also `trl-ada train`).
    return importlib.import_module("trl_ada.train")


def run_main(argv):
    script = load_script()
    script_args, training_args, model_args = script.make_parser(argv).parse_args_and_config(argv)
    return script.main(script_args, training_args, model_args)


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
    script_args, training_args, model_args = script.make_parser(argv).parse_args_and_config(argv)
    with pytest.raises(ValueError, match=message):
        script.main(script_args, training_args, model_args)


@pytest.mark.slow
def test_accelerate_launch_with_the_shipped_two_process_config(tmp_path):
    out = tmp_path / "two"
    command = [
        "accelerate",
        "launch",
        "--config_file",
        str(ROOT / "configs/accelerate/cpu_two_processes.yaml"),
        "--main_process_port",
        "0",
        str(SCRIPT),
        "--max_steps",
        "2",
        "--heldout_size",
        "0",
        "--arithmetic_train_size",
        "200",
        "--per_device_train_batch_size",
        "16",
        "--output_dir",
        str(out),
    ]
    result = subprocess.run(
        command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert (out / "README.md").is_file() and (out / "model.safetensors").is_file()


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
    _, training_args, _ = parse(["--save_steps", "3"])
    assert training_args.save_strategy == "steps" and training_args.save_steps == 3
    _, training_args, _ = parse(["--save_steps", "3", "--save_strategy", "no"])  # an explicit strategy wins
    assert training_args.save_strategy == "no"
    _, training_args, _ = parse([])
    assert training_args.save_strategy == "no"  # the embedded default still saves nothing
    config = tmp_path / "embedded.yaml"
    config.write_text("save_steps: 4\nmax_steps: 8\n")
    _, training_args, _ = parse(["--config", str(config)])
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

    from trl_ada.train import sharded_parameters

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
