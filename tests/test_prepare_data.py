"""trl_ada.data (loading, validation, prompt format, sampling) and scripts/prepare_data.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_MODEL_KWARGS, write_jsonl
from datasets import Dataset, DatasetDict

from trl_ada.data import (
    DEFAULT_INSTRUCTION,
    DEFAULT_SYSTEM_PROMPT,
    TransformersGenerator,
    load_prompt_dataset,
    make_prompt,
    to_prompt_format,
    tokenize_prompts,
    validate_prompt_dataset,
)
from trl_ada.tiny import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "prepare_data.py"
TINY = TINY_MODEL_KWARGS

ROWS = [
    {"problem": "what is 1+1", "answer": "2", "solution": "worked: \\boxed{2}"},
    {"problem": "what is 2+3", "answer": "5", "solution": "worked"},
    {"problem": "half of 1", "answer": "\\frac{1}{2}", "solution": "worked"},
]


def load_script():
    spec = importlib.util.spec_from_file_location("prepare_data_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def prepare_data():
    # The code of `trl-ada prepare-data`; scripts/prepare_data.py is a thin entry over it (tested below).
    return importlib.import_module("trl_ada.cli.prepare_data")


# ---------------------------------------------------------------------------------------------------------------------
# load_prompt_dataset
# ---------------------------------------------------------------------------------------------------------------------


def test_load_jsonl_json_parquet_csv(tmp_path):
    dataset = Dataset.from_list(ROWS)
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    (tmp_path / "d.json").write_text(json.dumps(ROWS))  # a JSON array, not JSON lines
    dataset.to_parquet(str(tmp_path / "d.parquet"))
    dataset.to_csv(str(tmp_path / "d.csv"), index=False)
    for name in ["d.jsonl", "d.json", "d.parquet", "d.csv"]:
        loaded = load_prompt_dataset(tmp_path / name)
        assert loaded.column_names == ["problem", "answer", "solution"], name
        assert loaded["answer"] == ["2", "5", "\\frac{1}{2}"], name
    # A file is whatever split you name.
    assert len(load_prompt_dataset(str(tmp_path / "d.jsonl"), split="test")) == 3


def test_load_save_to_disk_dataset_and_dataset_dict(tmp_path):
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "single"))
    assert len(load_prompt_dataset(tmp_path / "single")) == 3
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:1])}).save_to_disk(
        str(tmp_path / "dict")
    )
    assert len(load_prompt_dataset(tmp_path / "dict", split="test")) == 1
    with pytest.raises(ValueError, match=r"no split 'validation'.*\['test', 'train'\]"):
        load_prompt_dataset(tmp_path / "dict", split="validation")


def test_load_directory_of_files_with_split_names(tmp_path):
    folder = tmp_path / "files"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS)
    write_jsonl(folder / "test.jsonl", ROWS[:2])
    assert len(load_prompt_dataset(folder)) == 3
    assert len(load_prompt_dataset(folder, split="test")) == 2


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_prompt_dataset(tmp_path / "missing.parquet")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="Cannot tell the format"):
        load_prompt_dataset(tmp_path / "notes.txt")
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(ValueError, match="neither a save_to_disk dataset nor any"):
        load_prompt_dataset(tmp_path / "empty_dir")


# ---------------------------------------------------------------------------------------------------------------------
# to_prompt_format / make_prompt
# ---------------------------------------------------------------------------------------------------------------------


def test_to_prompt_format_conversational_like_trl_examples():
    dataset = to_prompt_format(Dataset.from_list(ROWS), solution_column="answer", system_prompt="Be careful.")
    assert dataset[0]["prompt"] == [
        {"role": "system", "content": "Be careful."},
        {"role": "user", "content": "what is 1+1"},
    ]
    # The answer column replaces OpenR1's worked 'solution' column: math_verify_reward reads 'solution'.
    assert dataset["solution"] == ["2", "5", "\\frac{1}{2}"]
    assert "answer" not in dataset.column_names


def test_to_prompt_format_text_instruction_and_keep_columns():
    dataset = Dataset.from_list([{**row, "source": "x", "uuid": str(i)} for i, row in enumerate(ROWS)])
    out = to_prompt_format(dataset, conversational=False, instruction="Box it.", keep_columns=["source"])
    assert out[1]["prompt"] == "what is 2+3 Box it."
    assert sorted(out.column_names) == ["prompt", "solution", "source"]
    assert out["solution"][0] == "worked: \\boxed{2}"  # solution_column='solution' is kept as it is
    assert make_prompt("p", system_prompt="S", conversational=False) == "S\np"


def test_to_prompt_format_missing_columns():
    with pytest.raises(ValueError, match=r"needs column\(s\) \['question'\].*--problem_column"):
        to_prompt_format(Dataset.from_list(ROWS), problem_column="question")


# ---------------------------------------------------------------------------------------------------------------------
# validate_prompt_dataset
# ---------------------------------------------------------------------------------------------------------------------


def test_validate_accepts_a_good_dataset(tokenizer):
    dataset = to_prompt_format(Dataset.from_list(ROWS), solution_column="answer", conversational=False)
    validate_prompt_dataset(dataset, ["solution"], tokenizer=tokenizer, max_prompt_length=64)


def test_validate_missing_column_names_what_exists_and_the_fix():
    dataset = Dataset.from_list([{"prompt": "p", "answer": "1"}])
    with pytest.raises(ValueError) as info:
        validate_prompt_dataset(dataset, ["solution"])
    message = str(info.value)
    assert "missing column(s) ['solution']" in message
    assert "['prompt', 'answer']" in message
    assert "rename 'answer' to 'solution'" in message
    with pytest.raises(ValueError, match="to_prompt_format"):
        validate_prompt_dataset(Dataset.from_list(ROWS), ["solution"])


def test_validate_empty_dataset():
    empty = Dataset.from_dict({"prompt": [], "solution": []})
    with pytest.raises(ValueError, match=r"empty \(0 rows\).*--dataset_train_split"):
        validate_prompt_dataset(empty, ["solution"])


def test_validate_too_long_prompt_names_row_length_and_flag(tokenizer):
    prompts = ["short", "x" * 40, "medium prompt", "y" * 55]
    dataset = Dataset.from_dict({"prompt": prompts, "solution": ["1"] * 4})
    with pytest.raises(ValueError) as info:
        validate_prompt_dataset(dataset, ["solution"], tokenizer=tokenizer, max_prompt_length=20)
    message = str(info.value)
    assert "2 of 4 prompts are longer than max_prompt_length=20" in message
    assert "row 1 with 40 tokens" in message and "row 3 with 55 tokens" in message
    assert "Raise --max_prompt_length to at least 55" in message


def test_conversational_prompts_need_a_chat_template(tokenizer):
    dataset = to_prompt_format(Dataset.from_list(ROWS), solution_column="answer")
    with pytest.raises(ValueError, match="no chat template.*--prompt_format text"):
        validate_prompt_dataset(dataset, ["solution"], tokenizer=tokenizer, max_prompt_length=10)


def test_tokenize_prompts_text_and_chat(tokenizer):
    assert tokenize_prompts(tokenizer, ["1+2="]) == [tokenizer("1+2=")["input_ids"]]
    chat_tokenizer = build_char_tokenizer()
    chat_tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}:{% endfor %}"
    ids = tokenize_prompts(chat_tokenizer, [[{"role": "user", "content": "ab"}]])
    assert chat_tokenizer.decode(ids[0]) == "ab:"


# ---------------------------------------------------------------------------------------------------------------------
# TransformersGenerator
# ---------------------------------------------------------------------------------------------------------------------


def test_transformers_generator_shapes_and_seed(tiny_model_dir):
    generator = TransformersGenerator.from_pretrained(
        str(tiny_model_dir), max_new_tokens=5, batch_size=5, seed=3, progress=False
    )
    prompts = ["1+1=", "what is 22+33", "7*8="]
    first = generator(prompts, 3)
    assert [len(texts) for texts in first] == [3, 3, 3]
    assert all(isinstance(text, str) and "<pad>" not in text for texts in first for text in texts)
    assert generator(prompts, 3) == first  # reseeded on every call


# ---------------------------------------------------------------------------------------------------------------------
# scripts/prepare_data.py
# ---------------------------------------------------------------------------------------------------------------------

# Problems with how many of 16 samples a fake model gets right (answers are positive integers).
CORRECT_OF_16 = {"p zero": 0, "p one": 1, "p two": 2, "p six": 6, "p seven": 7, "p all": 16, "p three": 3}


def band_rows():
    rows = [{"problem": problem, "answer": str(10 + i)} for i, problem in enumerate(CORRECT_OF_16)]
    rows += [
        {"problem": "  p   one ", "answer": "11"},  # duplicate of "p one" up to whitespace
        {"problem": "p two", "answer": "12"},  # exact duplicate
        {"problem": "p bad", "answer": ""},  # unverifiable references
        {"problem": "p bad 2", "answer": "}{"},
    ]
    return rows


class FakeGenerator:
    """Deterministic completions: the first CORRECT_OF_16[problem] samples state the right answer."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, prompts, num_samples):
        self.calls.append((list(prompts), num_samples))
        out = []
        for prompt in prompts:
            correct = CORRECT_OF_16[prompt]
            right = f"so the answer is \\boxed{{{self.answers[prompt]}}}"
            out.append([right] * correct + ["\\boxed{0}"] * (num_samples - correct))
        return out


def run_prepare(prepare_data, tmp_path, tokenizer, *extra, generator=None):
    source = write_jsonl(tmp_path / "in.jsonl", band_rows())
    argv = [
        "--dataset_name", str(source), "--output", str(tmp_path / "out.parquet"), "--prompt_format", "text",
        "--system_prompt", "", "--instruction", "", "--model_name_or_path", "unused", *extra,
    ]  # fmt: skip
    args = prepare_data.build_parser().parse_args(argv)
    return prepare_data.prepare(args, generator=generator, tokenizer=tokenizer)


def test_prepare_paper_band(prepare_data, tmp_path, tokenizer):
    answers = {row["problem"]: row["answer"] for row in band_rows()[: len(CORRECT_OF_16)]}
    generator = FakeGenerator(answers)
    report = run_prepare(prepare_data, tmp_path, tokenizer, "--pass_rate_band", "0", "0.375", generator=generator)

    # (0, 0.375] of 16 = 1..6 correct.
    out = Dataset.from_parquet(str(tmp_path / "out.parquet"))
    assert sorted(out["problem"]) == ["p one", "p six", "p three", "p two"]
    assert sorted(out["num_correct"]) == [1, 2, 3, 6]
    assert set(out.column_names) == {"prompt", "solution", "problem", "num_correct", "pass_rate"}
    assert out["prompt"] == out["problem"]  # text format, no system prompt or instruction

    assert report["counts"] == {
        "input": 11,
        "after_deduplication": 9,
        "after_reference_check": 7,
        "after_length_filter": 7,
        "after_difficulty_filter": 4,
        "output": 4,
    }
    assert report["removed"] == {
        "duplicates": 2,
        "unverifiable_reference": 2,
        "too_long": 0,
        "too_hard": 1,
        "too_easy": 2,
        "unscorable": 0,
    }
    histogram = report["pass_rate_histogram"]
    assert sum(histogram.values()) == 7 and histogram["0"] == 1 and histogram["16"] == 1 and histogram["6"] == 1
    assert report["band"] == "(0, 0.375]"
    assert report["examples"]["unverifiable_reference"] == ["", "}{"]
    on_disk = json.loads((tmp_path / "out.report.json").read_text())
    assert on_disk["counts"] == report["counts"] and on_disk["removed"] == report["removed"]
    # Only the 7 surviving prompts were sampled, 16 times each.
    assert len(generator.calls) == 1 and len(generator.calls[0][0]) == 7 and generator.calls[0][1] == 16


def test_prepare_hard_set_and_band_ends(prepare_data, tmp_path, tokenizer):
    answers = {row["problem"]: row["answer"] for row in band_rows()[: len(CORRECT_OF_16)]}
    run_prepare(prepare_data, tmp_path, tokenizer, "--correct_range", "1", "2", generator=FakeGenerator(answers))
    assert sorted(Dataset.from_parquet(str(tmp_path / "out.parquet"))["num_correct"]) == [1, 2]

    report = run_prepare(
        prepare_data, tmp_path, tokenizer, "--pass_rate_band", "0", "0.375", "--band_ends", "[)",
        generator=FakeGenerator(answers),
    )  # fmt: skip
    assert sorted(Dataset.from_parquet(str(tmp_path / "out.parquet"))["num_correct"]) == [0, 1, 2, 3]
    assert report["band"] == "[0, 0.375)"


def test_prepare_without_band_samples_nothing(prepare_data, tmp_path, tokenizer):
    report = run_prepare(prepare_data, tmp_path, tokenizer, generator=FakeGenerator({}))
    assert report["counts"]["output"] == 7 and report["pass_rate_histogram"] is None
    assert "after_difficulty_filter" not in report["counts"]


def test_prepare_max_prompt_length(prepare_data, tmp_path, tokenizer):
    report = run_prepare(prepare_data, tmp_path, tokenizer, "--max_prompt_length", "5")
    assert report["removed"]["too_long"] == 3  # "p zero", "p seven", "p three" are longer than 5 characters
    kept = Dataset.from_parquet(str(tmp_path / "out.parquet"))["problem"]
    assert sorted(kept) == ["p all", "p one", "p six", "p two"]


def test_prepare_argument_errors(prepare_data, tmp_path):
    parser = prepare_data.build_parser()
    base = ["--dataset_name", "x.jsonl", "--output", str(tmp_path / "o.parquet")]
    with pytest.raises(ValueError, match="need --model_name_or_path"):
        prepare_data.check_args(parser.parse_args([*base, "--correct_range", "1", "2"]))
    with pytest.raises(ValueError, match="--output must end in"):
        prepare_data.check_args(parser.parse_args(["--dataset_name", "x", "--output", str(tmp_path / "o.txt")]))
    with pytest.raises(ValueError, match="Unknown reward function"):
        prepare_data.check_args(parser.parse_args([*base, "--reward", "nope"]))
    with pytest.raises(ValueError, match="correct range"):
        prepare_data.check_args(parser.parse_args([*base, "--model_name_or_path", "m", "--correct_range", "3", "2"]))
    with pytest.raises(SystemExit):  # the two band flags are mutually exclusive
        parser.parse_args([*base, "--correct_range", "1", "2", "--pass_rate_band", "0", "1"])


def test_prepare_missing_columns_message(prepare_data, tmp_path, tokenizer):
    source = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "1"}])
    args = prepare_data.build_parser().parse_args(
        ["--dataset_name", str(source), "--output", str(tmp_path / "o.jsonl")]
    )
    with pytest.raises(ValueError, match=r"no column\(s\) \['problem'\].*--problem_column"):
        prepare_data.prepare(args)


def test_prepare_cli_end_to_end_on_tiny_model(tmp_path, tiny_model_dir):
    """The real script, as a subprocess, sampling from a tiny local model (random: pass rates are ~0)."""
    source = write_jsonl(tmp_path / "in.jsonl", band_rows())
    output = tmp_path / "out.jsonl"
    command = [
        sys.executable, str(SCRIPT), "--dataset_name", str(source), "--output", str(output),
        "--model_name_or_path", str(tiny_model_dir), "--num_samples", "4", "--max_new_tokens", "6",
        "--pass_rate_band", "0", "1", "--band_ends", "[]", "--max_prompt_length", "200", "--use_vllm",
    ]  # fmt: skip
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Wrote" in result.stdout
    if importlib.util.find_spec("vllm") is None:
        assert "vLLM is not installed; sampling with transformers" in result.stderr
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    report = json.loads((tmp_path / "out.report.json").read_text())
    assert len(rows) == report["counts"]["output"] == 7  # band [0, 1] keeps every scored prompt
    assert report["prompt_format"] == "text"  # the tiny tokenizer has no chat template
    assert sum(report["pass_rate_histogram"].values()) == 7
    assert all(0 <= row["num_correct"] <= 4 for row in rows)
    # The authors' system prompt and instruction are the defaults.
    assert rows[0]["prompt"].startswith(DEFAULT_SYSTEM_PROMPT + "\n") and rows[0]["prompt"].endswith(
        DEFAULT_INSTRUCTION
    )


class NoSampling:
    """A generator that fails the test when called: nothing may be sampled before the reward is checked."""

    def __call__(self, prompts, num_samples):
        raise AssertionError("completions were sampled before the reward/column pairing was checked")


def test_prepare_reward_reading_a_missing_column_fails_before_sampling(prepare_data, tmp_path, tokenizer, monkeypatch):
    import trl_ada.data

    monkeypatch.setattr(trl_ada.data, "generator_from_args", NoSampling())
    # exact_match reads 'answer'; this dataset's reference is in 'solution', written out as 'solution' only.
    source = write_jsonl(
        tmp_path / "in.jsonl", [{"problem": "1+1", "solution": "2"}, {"problem": "2+2", "solution": "4"}]
    )
    base = [
        "--dataset_name", str(source), "--output", str(tmp_path / "out.jsonl"), "--prompt_format", "text",
        "--model_name_or_path", "unused", "--pass_rate_band", "0", "1", "--band_ends", "[]",
    ]  # fmt: skip
    args = prepare_data.build_parser().parse_args([*base, "--reward", "exact_match"])
    with pytest.raises(ValueError, match=r"reads column\(s\) \['answer'\].*--answer_column"):
        prepare_data.prepare(args, generator=NoSampling(), tokenizer=tokenizer)
    assert not (tmp_path / "out.jsonl").exists()

    # A reward reading another dataset column needs it kept (conftest.length_or_none reads 'level').
    levelled = write_jsonl(tmp_path / "levelled.jsonl", [{"problem": "1+1", "solution": "2", "level": 1}])
    argv = [*base, "--dataset_name", str(levelled), "--reward", "conftest.length_or_none"]
    with pytest.raises(ValueError, match=r"\['level'\].*--keep_columns"):
        prepare_data.prepare(prepare_data.build_parser().parse_args(argv), generator=NoSampling(), tokenizer=tokenizer)


def test_prepare_exact_match_end_to_end_on_the_shipped_tiny_model(prepare_data, tmp_path):
    """exact_match reads 'answer': the output keeps the reference there, and sampling the warm-started tiny
    arithmetic model scores real completions."""
    from trl_ada.tasks.arithmetic import make_problems
    from trl_ada.tiny import TINY_ARITH_ASSETS

    problems = make_problems(6, seed=0, levels=[0])
    source = write_jsonl(
        tmp_path / "arith.jsonl", [{"problem": p["prompt"], "answer": str(p["answer"])} for p in problems]
    )
    output = tmp_path / "arith_out.jsonl"
    argv = [
        "--dataset_name", str(source), "--output", str(output), "--model_name_or_path", str(TINY_ARITH_ASSETS),
        "--reward", "exact_match", "--prompt_format", "text", "--system_prompt", "", "--instruction", "",
        "--num_samples", "4", "--max_new_tokens", "6", "--pass_rate_band", "0", "1", "--band_ends", "[]",
    ]  # fmt: skip
    assert prepare_data.main(argv) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    report = json.loads((tmp_path / "arith_out.report.json").read_text())
    assert len(rows) == report["counts"]["output"] == len({p["prompt"] for p in problems})
    assert all(row["answer"] == row["solution"] for row in rows)
    assert sorted(row["answer"] for row in rows) == sorted(str(p["answer"]) for p in problems)
    assert sum(row["num_correct"] for row in rows) > 0  # the shipped model solves most 1-digit sums


# ---------------------------------------------------------------------------------------------------------------------
# `trl-ada prepare-data`: the script's command in the installed package; the missing-file error names it
# ---------------------------------------------------------------------------------------------------------------------


def option_strings(parser):
    return [action.option_strings for action in parser._actions]


def test_trl_ada_prepare_data_is_the_script_with_the_same_flags(tmp_path, capsys):
    from trl_ada.cli import main as trl_ada_main
    from trl_ada.cli.prepare_data import build_parser

    assert option_strings(load_script().build_parser()) == option_strings(build_parser())
    source = write_jsonl(tmp_path / "in.jsonl", [*ROWS, ROWS[0]])  # one duplicate
    output = tmp_path / "out.jsonl"
    argv = ["--dataset_name", str(source), "--output", str(output), "--answer_column", "answer"]
    assert trl_ada_main(["prepare-data", *argv]) == 0
    assert f"Wrote {output}" in capsys.readouterr().out
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["solution"] for row in rows] == ["2", "5", "\\frac{1}{2}"]  # deduplicated, reference as solution
    with pytest.raises(SystemExit):
        trl_ada_main(["prepare-data", "--help"])
    assert capsys.readouterr().out.startswith("usage: trl-ada prepare-data ")


def test_a_missing_dataset_file_names_trl_ada_prepare_data(tmp_path):
    missing = tmp_path / "data" / "openr1_qwen2.5-math-1.5b.parquet"
    with pytest.raises(FileNotFoundError, match=rf"No such dataset file.*trl-ada prepare-data.*--output {missing}`"):
        load_prompt_dataset(missing)
