"""`trl-ada train` reports every problem of a command line at once, each with the flag that fixes it, before any model
is loaded."""

import json

import pytest
import transformers

from trl_ada.cli import main as trl_ada_main


@pytest.fixture
def no_model_loading(monkeypatch):
    """Any model load, the trainer's or the embedded run's, fails the test."""
    import trl_ada.cli.train as script
    import trl_ada.tiny

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before the command line was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr(trl_ada.tiny, "load_tiny_arith_model", loaded)
    monkeypatch.setattr(script, "AdaGRPOTrainer", loaded)


@pytest.fixture
def no_bf16_gpu(monkeypatch):
    """A machine without a GPU that computes in bf16, whatever this one has."""
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: False)


def train(argv, capsys) -> tuple[int, list[str]]:
    """`trl-ada train ARGV`'s exit status and the lines of stderr from its error on (not `datasets`' progress bars)."""
    try:
        code = trl_ada_main(["train", *argv])
    except SystemExit as exit:  # argparse stops the parse at its first mistake
        code = exit.code
    lines = capsys.readouterr().err.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("trl-ada train: error: ")), 0)
    return code, lines[start:]


def problem_lines(error: list[str]) -> list[str]:
    """The listed problems of a multi-problem error (the lines after its header)."""
    return [line.removeprefix("  - ") for line in error[1:] if line.startswith("  - ")]


def test_every_problem_of_a_command_line_is_reported_at_once_with_its_flag(
    tmp_path, capsys, tiny_model_dir, no_model_loading, no_bf16_gpu
):
    # A new user's first command: their own dataset (question/answer columns), bf16 asked for on a machine that cannot
    # compute in it, and completions as long as the model's whole context.
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(8)))
    context = transformers.AutoTokenizer.from_pretrained(tiny_model_dir).model_max_length
    argv = ["--model_name_or_path", str(tiny_model_dir), "--dataset_name", str(data), "--output_dir", str(tmp_path)]
    code, error = train([*argv, "--bf16", "true", "--max_completion_length", str(context)], capsys)

    assert code == 2
    assert error[0] == "trl-ada train: error: 3 problems with this command line; fix them all, then run again:", error
    problems = problem_lines(error)
    assert len(problems) == 3 and len(error) == 4, error
    bf16, length, columns = problems
    assert bf16.startswith("--bf16: ") and "--bf16 false" in bf16
    assert f"max_completion_length={context} leaves no room" in length and "--max_completion_length" in length
    # The column problem names the flags that fix it, set to the dataset's own columns.
    assert "--prompt_column question --solution_column answer" in columns
    assert "['question', 'answer']" in columns
    assert "Traceback" not in "\n".join(error)


def test_mistyped_values_unknown_flags_and_settings_are_reported_together(tmp_path, capsys, no_model_loading):
    (tmp_path / "empty").mkdir()
    argv = [
        "--max_steps",
        "ten",
        "--no_such_flag",
        "1",
        "--max_completion_length",
        "0",
        "--resume_from_checkpoint",
        "true",
        "--output_dir",
        str(tmp_path / "empty"),
    ]
    code, error = train(argv, capsys)

    assert code == 2
    problems = problem_lines(error)
    assert len(problems) == 4, error
    value, unknown, resume, length = problems
    assert value == "argument --max_steps/--max-steps: invalid int value: 'ten'"
    assert unknown.startswith("unrecognized arguments: --no_such_flag 1")
    assert resume.startswith("--resume_from_checkpoint true resumes from the latest complete checkpoint")
    assert length.startswith("--max_completion_length 0: ")


def test_a_mistyped_value_is_listed_beside_the_mistake_that_stops_the_parse(capsys):
    code, error = train(["--max_steps", "ten", "--lr_scheduler_type", "no_such_schedule"], capsys)
    assert code == 2
    problems = problem_lines(error)
    assert len(problems) == 2, error
    assert problems[0] == "argument --max_steps/--max-steps: invalid int value: 'ten'"
    assert "--lr_scheduler_type" in problems[1] and "no_such_schedule" in problems[1]
    assert error[-1] == "(`trl-ada train --help` lists every flag.)"


@pytest.mark.parametrize(
    ("columns", "fix"),
    [
        (["question", "solution"], "--prompt_column question, or"),
        (["problem", "final_answer"], "--solution_column final_answer, or"),
        (["x", "y"], "--prompt_column COLUMN --solution_column COLUMN, or"),
    ],
)
def test_a_dataset_without_the_prompt_and_answer_columns_names_their_flags(columns, fix):
    from trl_ada.cli.train import column_flags_problem

    problem = column_flags_problem(columns, "problem", "solution")
    assert f"Name its own with {fix} give it a 'prompt' column." in problem
    assert column_flags_problem(["problem", "solution"], "problem", "solution") is None
