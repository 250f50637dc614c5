"""scripts/train_ada.py: the embedded default run, the real path on local directories, and bad input."""

import importlib.util
import json
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
    spec = importlib.util.spec_from_file_location("train_ada", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_ada"] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


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
