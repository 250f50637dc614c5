"""A model name that is neither a directory nor a Hub id fails in one line, before anything else: in `trl-ada train`
(ahead of the bf16 check that used to hide it), `trl-ada evaluate` and `AdaGRPOTrainer(model=...)`. A well-formed Hub
id is not refused (no network here: the check never asks the Hub)."""

import logging

import pytest
from conftest import starts_low_digit, tiny_args

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.runtime.model_path import model_name_error

MISSING = ["no/such/dir", "./no-such-dir", "/no/such/dir", "~/models/x"]


@pytest.mark.parametrize("name", MISSING)
def test_a_missing_directory_that_is_no_hub_id_is_named_in_one_line(name):
    error = model_name_error(name)
    assert error is not None and "\n" not in error
    assert f"no directory {name}, and it is not a Hub id" in error


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-Math-1.5B", "gpt2", "org/name.v2"])
def test_a_well_formed_hub_id_is_let_through(name):
    assert model_name_error(name) is None


def test_an_existing_directory_is_let_through_and_a_file_is_named(tmp_path):
    assert model_name_error(str(tmp_path)) is None
    weights = tmp_path / "weights" / "model.safetensors"
    weights.parent.mkdir()
    weights.write_bytes(b"")
    assert "a file, not a model directory, and it is not a Hub id" in model_name_error(str(weights))


def test_the_trainer_refuses_a_missing_model_directory_before_loading_anything(tmp_path, monkeypatch):
    import transformers

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_loading)
    with pytest.raises(ValueError) as caught:
        AdaGRPOTrainer(model="no/such/dir", reward_funcs=[starts_low_digit], args=AdaGRPOConfig(**tiny_args(tmp_path)))
    assert str(caught.value).startswith("model 'no/such/dir': no directory no/such/dir, and it is not a Hub id")
    assert caught.value.__cause__ is None and caught.value.__context__ is None  # no chained tracebacks


@pytest.mark.parametrize(
    "flags",
    [
        ["--model_name_or_path", "no/such/dir"],
        ["--model_name_or_path=no/such/dir"],
        ["--model-name-or-path", "no/such/dir"],
    ],
)
def test_trl_ada_train_names_a_missing_model_in_one_line(tmp_path, capsys, flags):
    from trl_ada.cli import main as trl_ada_main

    # No --use_cpu and no data file: the model's problem is listed beside the others, in one line of its own.
    code = trl_ada_main(["train", *flags, "--dataset_name", str(tmp_path / "data.jsonl")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert (
        "  - --model_name_or_path 'no/such/dir': no directory no/such/dir, and it is not a Hub id ('org/name'). Pass "
        "a directory saved with save_pretrained, or the id of a model on the Hub." in error
    )


def test_trl_ada_train_reads_the_model_of_a_config_file(tmp_path, capsys):
    from trl_ada.cli.train import cli_main

    config = tmp_path / "run.yaml"
    config.write_text("model_name_or_path: ./checkpoints/final\ndataset_name: data.jsonl\n")
    assert cli_main(["--config", str(config)], prog="trl-ada train") == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert sum("no directory ./checkpoints/final, and it is not a Hub id" in line for line in error) == 1


def test_trl_ada_train_lets_a_hub_id_through_to_the_next_check(tmp_path, capsys):
    import torch

    from trl_ada.cli.train import cli_main

    if torch.cuda.is_available():
        pytest.skip("the next check (bf16 without a GPU) needs a machine without a GPU")
    code = cli_main(["--model_name_or_path", "Qwen/Qwen2.5-0.5B", "--dataset_name", "x.jsonl"], prog="trl-ada train")
    error = capsys.readouterr().err
    assert code == 2 and "Hub id" not in error and "bf16" in error


def test_trl_ada_evaluate_names_a_missing_model_before_reading_any_dataset(tmp_path, caplog):
    from trl_ada.cli.evaluate import main

    caplog.set_level(logging.ERROR, logger="evaluate")
    missing_dataset = str(tmp_path / "not-there.jsonl")  # would fail too, but later
    argv = ["--model_name_or_path", "a/b/c", "--dataset_name", missing_dataset, "--output", str(tmp_path / "o.json")]
    assert main(argv, prog="trl-ada evaluate") == 2
    (record,) = caplog.records
    assert record.getMessage().startswith("--model_name_or_path 'a/b/c': no directory a/b/c, and it is not a Hub id")
