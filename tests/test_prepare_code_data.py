"""`trl-ada prepare-data` on code datasets: test columns in both formats, deduplication, rows without tests, reference
solutions run against their own tests in the sandbox, and the pass-rate band scored by the sandboxed code reward."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from conftest import write_jsonl

from trl_ada.cli import prepare_data
from trl_ada.rewards.code import CodeExecutionReward
from trl_ada.rewards.sandbox import INSTALL_HINT, SandboxLimits

CI = os.environ.get("CI", "").lower() == "true"
HAVE_BWRAP = shutil.which("bwrap") is not None
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP and not CI, reason=f"bubblewrap is not installed: {INSTALL_HINT}")

LIMITS = SandboxLimits(wall_time_s=5, cpu_time_s=3, memory_bytes=512 << 20, max_processes=16, output_bytes=1 << 16)
REWARD = CodeExecutionReward(limits=LIMITS, concurrency=2, check_sandbox=False)
"""The reward of these tests (``--reward test_prepare_code_data.REWARD``): two sandboxes at a time."""
REWARD_PATH = f"{__name__}.REWARD"

pytestmark = [
    pytest.mark.usefixtures("wall_clock_guard", "no_sandbox_outlives_the_tests"),
    pytest.mark.wall_clock_limit(120),
]


def stdio(*pairs: tuple[str, str]) -> str:
    """An open-r1 ``verification_info`` value (as its JSON string) with these stdin/stdout cases."""
    cases = [{"type": "stdin_stdout", "input": i, "output": o} for i, o in pairs]
    return json.dumps({"language": "python", "test_cases": cases})


SUM = "a, b = map(int, input().split())\nprint(a + b)"
DOUBLE_WRONG = "print(int(input()) * 3)"
ADD = "def add(a, b):\n    return a + b"
SQUARE_STUB = 'def square(x):\n    """The square of x."""\n'
SQUARE_BODY = "    return x * x\n"

# One row per case, both test formats in one file (a row has either verification_info or tests).
MIXED_ROWS = [
    {"problem": "Print the sum of two integers.", "solution": SUM,
     "verification_info": stdio(("1 2\n", "3\n"), ("5 5\n", "10\n"))},
    {"problem": "  Print the sum   of two integers. ", "solution": SUM,  # duplicate up to whitespace
     "verification_info": stdio(("1 2\n", "3\n"))},
    {"problem": "Print twice the integer.", "solution": DOUBLE_WRONG,  # wrong reference: wrong_answer
     "verification_info": stdio(("2\n", "4\n"), ("0\n", "0\n"))},
    {"problem": "Write add(a, b).", "solution": f"```python\n{ADD}\n```",  # a reference written as a completion
     "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]},
    {"problem": "Write sub(a, b).", "solution": "def sub(a, b):\n    return a + b",  # wrong: wrong_answer
     "tests": ["assert sub(3, 1) == 2", "assert sub(1, 1) == 0"]},
    {"problem": "A problem with no tests.", "solution": SUM},
    {"problem": "A problem with an empty test list.", "solution": ADD, "tests": []},
    {"problem": "Write mul(a, b).", "solution": "def mul(a, b) return a * b",  # syntax_error
     "tests": ["assert mul(2, 3) == 6"]},
    {"problem": SQUARE_STUB, "solution": SQUARE_BODY, "entry_point": "square",  # HumanEval: a body after the stub
     "tests": ["def check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4"]},
]  # fmt: skip
KEPT = ["Print the sum of two integers.", "Write add(a, b).", SQUARE_STUB]


def run(tmp_path, rows, *extra, generator=None, tokenizer=None, name="in.jsonl"):
    source = write_jsonl(tmp_path / name, rows)
    argv = ["--dataset_name", str(source), "--output", str(tmp_path / "out.jsonl"), *extra]
    args = prepare_data.build_parser().parse_args(argv)
    return prepare_data.prepare(args, generator=generator, tokenizer=tokenizer)


def read_rows(tmp_path):
    return [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]


class NoSampling:
    def __call__(self, prompts, num_samples):
        raise AssertionError("completions were sampled before the inputs were checked")


# ---------------------------------------------------------------------------------------------------------------------
# Stages 1-2 (no model)
# ---------------------------------------------------------------------------------------------------------------------


@needs_bwrap
def test_code_stages_on_both_formats(tmp_path):
    plain = ["--prompt_format", "text", "--system_prompt", "", "--instruction", ""]
    report = run(tmp_path, MIXED_ROWS, "--reward", REWARD_PATH, *plain)
    assert report["task"] == "code"
    assert report["counts"] == {
        "input": 9,
        "after_deduplication": 8,
        "after_test_check": 6,
        "after_reference_check": 3,
        "after_length_filter": 3,
        "output": 3,
    }
    assert report["removed"] == {"duplicates": 1, "no_tests": 2, "failing_reference": 3, "too_long": 0}
    assert report["reference_outcomes"] == {"passed": 3, "wrong_answer": 2, "syntax_error": 1}
    assert report["examples"]["failing_reference"] == [
        {"problem": "Print twice the integer.", "outcome": "wrong_answer"},
        {"problem": "Write sub(a, b).", "outcome": "wrong_answer"},
        {"problem": "Write mul(a, b).", "outcome": "syntax_error"},
    ]
    assert [row["problem"] for row in report["examples"]["no_tests"]] == [
        "A problem with no tests.",
        "A problem with an empty test list.",
    ]
    assert report["test_columns"] == {
        "verification_info": "verification_info",
        "tests": "tests",
        "entry_point": "entry_point",
    }

    rows = read_rows(tmp_path)
    assert [row["problem"] for row in rows] == KEPT
    assert [row["prompt"] for row in rows] == KEPT  # text prompts, no system prompt or instruction
    assert set(rows[0]) == {"prompt", "solution", "problem", "verification_info", "tests", "entry_point"}
    assert rows[0]["solution"] == SUM and rows[0]["tests"] is None
    assert json.loads(rows[0]["verification_info"])["test_cases"][1]["output"] == "10\n"
    assert rows[1]["tests"] == ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]
    assert rows[2]["solution"] == SQUARE_BODY and rows[2]["entry_point"] == "square"  # the reference as written
    on_disk = json.loads((tmp_path / "out.report.json").read_text())
    assert on_disk["removed"] == report["removed"] and on_disk["reward"] == REWARD_PATH


@needs_bwrap
def test_named_columns_dict_verification_info_and_code_defaults(tmp_path):
    """MBPP-style `test_list` + `code`, found by flag and by auto-detection; a dict verification_info; the code
    prompt defaults; the default reward by column auto-detection."""
    mbpp = [
        {"text": "Write add(a, b).", "code": ADD, "test_list": ["assert add(2, 2) == 4"]},
        {"text": "Write neg(a).", "code": "def neg(a):\n    return a", "test_list": ["assert neg(1) == -1"]},
    ]
    report = run(tmp_path, mbpp, "--problem_column", "text", "--test_column", "test_list", "--reward", REWARD_PATH)
    assert report["test_columns"] == {"test_list": "tests"} and report["answer_column"] == "code"
    assert report["removed"]["failing_reference"] == 1
    (row,) = read_rows(tmp_path)
    assert row["tests"] == ["assert add(2, 2) == 4"] and row["solution"] == ADD and "test_list" not in row
    assert row["prompt"] == [  # conversational (no model), the code system prompt and instruction
        {"role": "system", "content": prepare_data.DEFAULT_CODE_SYSTEM_PROMPT},
        {"role": "user", "content": f"Write add(a, b). {prepare_data.DEFAULT_CODE_INSTRUCTION}"},
    ]

    info = {"language": "python", "test_cases": [{"type": "stdin_stdout", "input": "4 5\n", "output": "9\n"}]}
    report = run(tmp_path, [{"problem": "Sum.", "solution": SUM, "verification_info": info}], name="dict.jsonl")
    assert report["task"] == "code" and report["reward"] == "code_execution"  # auto: a verification_info column
    assert report["counts"]["output"] == 1 and read_rows(tmp_path)[0]["verification_info"] == info


@needs_bwrap
def test_no_reference_column_skips_the_check_and_test_format_detection(tmp_path):
    rows = [
        {"problem": "Sum.", "cases": stdio(("1 1\n", "2\n"))},
        {"problem": "Nothing.", "cases": None},
    ]
    report = run(tmp_path, rows, "--test_column", "cases", "--reward", REWARD_PATH)
    assert report["test_columns"] == {"cases": "verification_info"}  # read from the JSON object value
    assert report["removed"] == {"duplicates": 0, "no_tests": 1, "failing_reference": 0, "too_long": 0}
    assert report["reference_outcomes"] is None
    (row,) = read_rows(tmp_path)
    assert row["solution"] is None and json.loads(row["verification_info"])["test_cases"][0]["output"] == "2\n"


@needs_bwrap
def test_humaneval_shaped_rows_and_reference_chunks(tmp_path, monkeypatch):
    """HumanEval's columns: the stub is the `prompt`, `canonical_solution` a body, `test` a check(candidate) after a
    METADATA line; references run in several reward calls (chunks) and keep their rows' order."""
    monkeypatch.setattr(prepare_data, "_REFERENCE_CHUNK", 2)
    test = "METADATA = {{'author': 'x'}}\n\ndef check(candidate):\n    assert candidate(2) == {}\n"
    rows = [
        {"prompt": f'def f{i}(x):\n    """Return x + {i}."""\n', "entry_point": f"f{i}", "test": test.format(2 + i),
         "canonical_solution": f"    return x + {i if i != 2 else 0}\n"}  # row 2's reference is wrong
        for i in range(5)
    ]  # fmt: skip
    argv = ["--problem_column", "prompt", "--test_column", "test", "--reward", REWARD_PATH, "--prompt_format", "text"]
    report = run(tmp_path, rows, *argv, "--system_prompt", "", "--instruction", "")
    assert report["answer_column"] == "canonical_solution"
    assert report["test_columns"] == {"test": "tests", "entry_point": "entry_point"}
    assert report["reference_outcomes"] == {"passed": 4, "wrong_answer": 1}
    out = read_rows(tmp_path)
    assert [row["entry_point"] for row in out] == ["f0", "f1", "f3", "f4"]
    assert out[2]["prompt"] == rows[3]["prompt"] and out[2]["tests"] == rows[3]["test"]
    assert out[2]["solution"] == rows[3]["canonical_solution"]


# ---------------------------------------------------------------------------------------------------------------------
# Stage 4: the band filter, scored by the real sandboxed reward
# ---------------------------------------------------------------------------------------------------------------------

# How many of 4 samples the stub model gets right, and a right program for each kept problem.
CORRECT_OF_4 = {"Print the sum of two integers.": 2, "Write add(a, b).": 4, SQUARE_STUB: 1}
RIGHT = {
    "Print the sum of two integers.": SUM,
    "Write add(a, b).": ADD,
    SQUARE_STUB: SQUARE_STUB + SQUARE_BODY,
}


class StubCoder:
    """Deterministic completions: the first CORRECT_OF_4[problem] samples hold a right program, the rest `pass`."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, num_samples):
        self.calls.append((list(prompts), num_samples))
        out = []
        for prompt in prompts:
            problem = prompt[-1]["content"]  # conversational prompts: the user message
            right = f"Here it is.\n```python\n{RIGHT[problem]}\n```"
            correct = CORRECT_OF_4[problem]
            out.append([right] * correct + ["```python\npass\n```"] * (num_samples - correct))
        return out


@needs_bwrap
def test_band_filter_scored_by_the_sandboxed_code_reward(tmp_path, tokenizer):
    generator = StubCoder()
    report = run(
        tmp_path, MIXED_ROWS, "--reward", REWARD_PATH, "--model_name_or_path", "unused", "--num_samples", "4",
        "--pass_rate_band", "0", "0.75", "--prompt_format", "conversational", "--system_prompt", "",
        "--instruction", "", generator=generator, tokenizer=tokenizer,
    )  # fmt: skip
    # Only the 3 prompts that survived the reference check were sampled, as chat messages.
    assert len(generator.calls) == 1 and len(generator.calls[0][0]) == 3 and generator.calls[0][1] == 4
    assert report["counts"]["after_difficulty_filter"] == 2
    assert report["removed"]["too_easy"] == 1 and report["removed"]["too_hard"] == 0
    assert report["removed"]["unscorable"] == 0
    assert report["pass_rate_histogram"] == {"0": 0, "1": 1, "2": 1, "3": 0, "4": 1}
    rows = read_rows(tmp_path)
    assert {row["problem"]: row["num_correct"] for row in rows} == {
        "Print the sum of two integers.": 2,
        SQUARE_STUB: 1,
    }
    assert [row["pass_rate"] for row in rows] == [0.5, 0.25]
    # One batch: `pass` prints nothing (stdin/stdout: wrong_answer) and defines nothing (asserts: runtime_error).
    assert REWARD.last_outcomes == {"passed": 7, "wrong_answer": 2, "runtime_error": 3}


@needs_bwrap
def test_band_filter_cli_on_a_tiny_model(tmp_path, tiny_model_dir, capsys):
    """The command end to end: a tiny random model samples, the sandbox scores (its programs fail: 0 correct)."""
    source = write_jsonl(tmp_path / "in.jsonl", MIXED_ROWS)
    output = tmp_path / "tiny.jsonl"
    argv = [
        "--dataset_name", str(source), "--output", str(output), "--model_name_or_path", str(tiny_model_dir),
        "--reward", REWARD_PATH, "--num_samples", "2", "--max_new_tokens", "6", "--pass_rate_band", "0", "1",
        "--band_ends", "[]", "--batch_size", "8",
    ]  # fmt: skip
    assert prepare_data.main(argv) == 0
    assert '"wrong_answer": 2, "syntax_error": 1' in capsys.readouterr().out  # the reference outcomes, printed
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    report = json.loads((tmp_path / "tiny.report.json").read_text())
    assert [row["problem"] for row in rows] == KEPT and report["counts"]["output"] == 3
    assert report["prompt_format"] == "text" and rows[0]["prompt"].endswith(prepare_data.DEFAULT_CODE_INSTRUCTION)
    assert report["removed"]["unscorable"] == 0 and sum(report["pass_rate_histogram"].values()) == 3
    assert all(row["num_correct"] == 0 for row in rows)  # random characters are no program that passes


# ---------------------------------------------------------------------------------------------------------------------
# Bad input fails before any sandbox or sampling
# ---------------------------------------------------------------------------------------------------------------------


def test_code_input_errors(tmp_path):
    parser = prepare_data.build_parser()
    base = ["--dataset_name", "x.jsonl", "--output", str(tmp_path / "o.jsonl")]
    with pytest.raises(ValueError, match="--task code"):
        prepare_data.check_args(parser.parse_args([*base, "--task", "math", "--reward", "code_execution"]))

    band = ["--model_name_or_path", "unused", "--pass_rate_band", "0", "1", "--task", "code"]
    with pytest.raises(ValueError, match=r"neither a 'verification_info' nor a 'tests' column.*--test_column"):
        run(tmp_path, [{"problem": "p", "solution": "x"}], *band, generator=NoSampling())
    with pytest.raises(ValueError, match=r"no column 'checks' \(--test_column\)"):
        run(
            tmp_path, [{"problem": "p", "tests": "assert 1"}], *band, "--test_column", "checks", generator=NoSampling()
        )
    with pytest.raises(ValueError, match=r"no column\(s\) \['answer_code'\].*--solution_column"):
        run(tmp_path, [{"problem": "p", "tests": "assert 1"}], *band, "--solution_column", "answer_code")
    with pytest.raises(ValueError, match="--test_format"):
        run(tmp_path, [{"problem": "p", "cases": None}], *band, "--test_column", "cases")
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "out.jsonl").exists()


def test_resolve_task():
    parser = prepare_data.build_parser()

    def task(*extra, columns=()):
        args = parser.parse_args(["--dataset_name", "x", "--output", "o.jsonl", *extra])
        return prepare_data.resolve_task(args, columns)

    assert task(columns=["problem", "answer"]) == "math"
    assert task(columns=["problem", "tests"]) == "code"
    assert task(columns=["problem", "verification_info"]) == "code"
    assert task("--test_column", "test_list", columns=["text", "test_list"]) == "code"
    assert task("--reward", "code_execution", columns=["problem"]) == "code"
    assert task("--reward", "math_verify", columns=["problem", "tests"]) == "math"  # an explicit reward decides
    assert task("--task", "math", columns=["tests"]) == "math"


UNBUILT = CodeExecutionReward(limits=LIMITS, concurrency=1, check_sandbox=False)
"""A reward whose sandbox is not built yet (built on first use, so it sees a patched ``shutil.which``)."""


def test_missing_bubblewrap_names_the_install_command_before_sampling(tmp_path, monkeypatch, caplog):
    import trl_ada.rewards.sandbox

    real_which = shutil.which
    monkeypatch.setattr(
        trl_ada.rewards.sandbox.shutil, "which", lambda name, **kw: None if name == "bwrap" else real_which(name, **kw)
    )
    band = ["--model_name_or_path", "unused", "--pass_rate_band", "0", "1", "--reward", f"{__name__}.UNBUILT"]
    with pytest.raises(RuntimeError, match="apt-get install bubblewrap"):
        run(tmp_path, MIXED_ROWS, *band, generator=NoSampling())
    assert UNBUILT._sandbox is None and not (tmp_path / "out.jsonl").exists()
    # The command reports it as an input error (exit status 2), not a traceback.
    argv = [
        "--dataset_name",
        str(tmp_path / "in.jsonl"),
        "--output",
        str(tmp_path / "out.jsonl"),
        "--reward",
        band[-1],
    ]
    assert prepare_data.main(argv) == 2
    assert "apt-get install bubblewrap" in caplog.text
