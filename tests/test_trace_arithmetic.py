"""Tests of the trace-arithmetic task: trace generation, injected errors, parser, reward, levels, split, asset."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from trl_ada.tasks.arithmetic import PROMPT_WIDTH, is_held_out
from trl_ada.tasks.trace_arithmetic import (
    FINAL_MARKER,
    LEVELS,
    MAX_COMPLETION_LENGTH,
    OPERAND_RANGES,
    TraceNoise,
    extract_final_answer,
    final_answer_reward,
    held_out_problems,
    make_dataset,
    make_problems,
    parse_prompt,
    parse_trace,
    write_trace,
)

ADD_STEP = re.compile(r"(\d)\+(\d)\+(\d)=(\d+)")
MUL_STEP = re.compile(r"(\d)\*(\d)\+(\d)=(\d+)")


def _digit(number: str, i: int) -> int:
    return int(number[-1 - i]) if i < len(number) else 0


def _check_row(x: str, y: str, items: list[str], op: str, faithful: bool) -> tuple[str, int]:
    """Recomputes one row of steps (a column sum of ``x`` and ``y``, or ``x`` times the digit ``y``).

    Returns the digits the written steps imply and how many steps deviate from the true procedure. With
    ``faithful`` every step must be exactly right; otherwise a step may have a wrong value or a dropped carry,
    but it must still read the right digits and take its carry from the step before (or drop it).
    """
    pattern = ADD_STEP if op == "+" else MUL_STEP
    width = max(len(x), len(y)) if op == "+" else len(x)
    assert len(items) == width, (x, op, y, items)
    carry, digits, deviations = 0, [], 0
    for i, item in enumerate(items):
        match = pattern.fullmatch(item)
        assert match is not None, item
        dx, dy, written_carry, value = (int(group) for group in match.groups())
        assert dx == _digit(x, i)
        assert dy == (_digit(y, i) if op == "+" else int(y))
        true_value = dx + dy + written_carry if op == "+" else dx * dy + written_carry
        if faithful:
            assert written_carry == carry, item
            assert value == true_value, item
        else:
            assert written_carry in (carry, 0), item
            assert 0 <= value <= (19 if op == "+" else 89), item
            deviations += (written_carry != carry) + (value != true_value)
        digits.append(str(value % 10))
        carry = value // 10
    if carry:
        digits.append(str(carry))
    return "".join(reversed(digits)).lstrip("0") or "0", deviations


def check_trace(prompt: str, completion: str, *, faithful: bool = True) -> tuple[str, int]:
    """A hand-written checker: recomputes every step of a trace from the prompt.

    Returns the answer the written steps imply and the number of deviations from the true procedure (always 0 when
    ``faithful``); asserts that the stated final answer is that implied answer.
    """
    a, op, b = parse_prompt(prompt)
    body, answer = completion.split(FINAL_MARKER)
    sections = [section.split(",") for section in body.split(":")]
    if op == "+":
        assert len(sections) == 1
        implied, deviations = _check_row(str(a), str(b), sections[0], "+", faithful)
    elif b < 10:
        assert len(sections) == 1
        implied, deviations = _check_row(str(a), str(b), sections[0], "*", faithful)
    else:
        assert len(sections) == 3, sections
        partials, deviations = [], 0
        for shift, (digit, section) in enumerate(zip(reversed(str(b)), sections[:2], strict=True)):
            assert section[-1].startswith("P=")
            row, row_deviations = _check_row(str(a), digit, section[:-1], "*", faithful)
            shifted = row + "0" * shift if row != "0" else "0"
            partial = section[-1][2:]
            if faithful:
                assert partial == shifted
            else:
                assert len(partial) == len(shifted)
                deviations += sum(p != s for p, s in zip(partial, shifted, strict=True))
            deviations += row_deviations
            partials.append(partial)
        implied, sum_deviations = _check_row(partials[0], partials[1], sections[2], "+", faithful)
        deviations += sum_deviations
    assert answer == implied, (prompt, completion)
    return implied, deviations


def test_levels_and_operand_ranges():
    assert len(LEVELS) == len(set(LEVELS)) == len(OPERAND_RANGES) == 5
    for level in range(len(LEVELS)):
        (a_lo, a_hi), op, (b_lo, b_hi) = OPERAND_RANGES[level]
        for problem in make_problems(60, seed=level, levels=[level]):
            a, prompt_op, b = parse_prompt(problem["prompt"])
            assert (prompt_op, problem["level"]) == (op, level)
            assert a_lo <= a <= a_hi and b_lo <= b <= b_hi
            assert len(problem["prompt"]) == PROMPT_WIDTH


def test_clean_traces_are_correct_for_many_problems():
    problems = make_problems(3000, seed=11) + held_out_problems(500, seed=12)
    for problem in problems:
        completion, answer = write_trace(*parse_prompt(problem["prompt"]))
        assert answer == problem["answer"]
        assert check_trace(problem["prompt"], completion) == (answer, 0)
        assert len(completion) < MAX_COMPLETION_LENGTH
    for a, op, b in [(0, "+", 0), (999, "+", 1), (100, "*", 10), (99, "*", 99), (10, "*", 2), (0, "*", 7)]:
        completion, answer = write_trace(a, op, b)
        assert int(answer) == (a + b if op == "+" else a * b)
        assert check_trace(f"{a:>3d}{op}{b:>3d}=", completion) == (answer, 0)


def test_traces_are_one_token_per_character_for_the_tiny_tokenizer():
    from trl_ada.tiny import CHARACTERS, build_char_tokenizer

    tokenizer = build_char_tokenizer()
    noise = TraceNoise(fact=0.2, carry=0.3, copy=0.2)
    for problem in make_problems(50, seed=0):
        completion, _ = write_trace(*parse_prompt(problem["prompt"]), noise=noise, rng=random.Random(1))
        assert set(completion) <= set(CHARACTERS), completion
        ids = tokenizer(completion, add_special_tokens=False).input_ids
        assert len(ids) == len(completion) and tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == completion


def test_noisy_traces_err_inside_the_procedure_and_follow_their_own_steps():
    noise = TraceNoise(fact=0.1, carry=0.2, copy=0.1)
    rng = random.Random(5)
    wrong_by_level: Counter[int] = Counter()
    problems = make_problems(2500, seed=3)
    for problem in problems:
        completion, answer = write_trace(*parse_prompt(problem["prompt"]), noise=noise, rng=rng)
        implied, deviations = check_trace(problem["prompt"], completion, faithful=False)
        assert implied == answer
        if answer != problem["answer"]:
            assert deviations > 0, completion
            wrong_by_level[problem["level"]] += 1
    per_level = len(problems) // len(LEVELS)
    rates = [wrong_by_level[level] / per_level for level in range(len(LEVELS))]
    # Every level gets errors, and the longest procedure (two rows and a sum) gets the most.
    assert all(0.05 < rate < 0.9 for rate in rates), rates
    assert rates[-1] == max(rates), rates


def test_misconceptions_are_a_fixed_wrong_value_for_a_fixed_share_of_facts():
    noise = TraceNoise(hard_share=0.2, hard_rate=1.0)  # no other noise: every deviation is a misconception
    rng = random.Random(0)
    written: dict[tuple[int, str, int, int], set[int]] = {}
    for problem in make_problems(1500, seed=4):
        completion, answer = write_trace(*parse_prompt(problem["prompt"]), noise=noise, rng=rng)
        assert check_trace(problem["prompt"], completion, faithful=False)[0] == answer
        for section in parse_trace(completion).sections:
            for step in section:
                written.setdefault((step.x, step.op, step.y, step.carry), set()).add(step.value)
    assert all(len(values) == 1 for values in written.values())  # the same value every time
    wrong = [
        fact
        for fact, (value,) in written.items()
        if value != (fact[0] + fact[2] if fact[1] == "+" else fact[0] * fact[2]) + fact[3]
    ]
    assert 0.1 < len(wrong) / len(written) < 0.3, (len(wrong), len(written))
    with pytest.raises(ValueError, match="hard_rate"):
        TraceNoise(hard_rate=1.5)


def test_noise_is_deterministic_for_an_rng_and_off_at_zero():
    noise = TraceNoise(fact=0.2, carry=0.3, copy=0.2)
    problems = make_problems(200, seed=1)
    first = [write_trace(*parse_prompt(p["prompt"]), noise=noise, rng=random.Random(9)) for p in problems]
    second = [write_trace(*parse_prompt(p["prompt"]), noise=noise, rng=random.Random(9)) for p in problems]
    assert first == second
    zero = TraceNoise()
    for problem in problems:
        args = parse_prompt(problem["prompt"])
        assert write_trace(*args, noise=zero, rng=random.Random(0)) == write_trace(*args)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="rng"):
        write_trace(12, "+", 34, noise=TraceNoise(fact=0.1))
    with pytest.raises(ValueError, match="operator"):
        write_trace(12, "-", 34)
    with pytest.raises(ValueError, match="fact"):
        TraceNoise(fact=0.7)
    with pytest.raises(ValueError, match="carry"):
        TraceNoise(carry=-0.1)
    with pytest.raises(ValueError, match="level"):
        make_problems(10, seed=0, levels=[len(LEVELS)])
    with pytest.raises(ValueError, match="empty"):
        make_problems(10, seed=0, levels=[])


def test_reward_checks_only_the_final_answer():
    right, answer = write_trace(47, "*", 85)
    wrong_trace = right.replace("7*5+0=35", "7*5+0=36")
    assert wrong_trace != right
    cases = {
        right: 1.0,
        right + "<eos>junk": 1.0,
        right + "\nmore": 1.0,
        wrong_trace: 1.0,  # only the answer counts
        right.replace(FINAL_MARKER + answer, FINAL_MARKER + "3996"): 0.0,  # right trace, wrong answer
        right.replace(FINAL_MARKER + answer, FINAL_MARKER + "0" + answer): 0.0,  # leading zero: malformed
        right.replace(FINAL_MARKER + answer, FINAL_MARKER + answer + "x"): 0.0,  # malformed
        right.replace(FINAL_MARKER + answer, FINAL_MARKER): 0.0,  # empty answer
        right.replace(FINAL_MARKER, ":"): 0.0,  # missing marker
        answer: 0.0,  # a bare answer without the marker
        "": 0.0,
        right.split("<eos>")[0][:20] + "<eos>" + FINAL_MARKER + answer: 0.0,  # marker after eos
    }
    rewards = final_answer_reward(list(cases), [answer] * len(cases), level=[4] * len(cases))
    assert rewards == list(cases.values())
    assert final_answer_reward([[{"role": "assistant", "content": right}]], [answer]) == [1.0]
    with pytest.raises(ValueError, match="answers"):
        final_answer_reward([right], [answer, answer])


def test_extract_final_answer_and_parse_trace():
    completion, answer = write_trace(47, "*", 85)
    assert extract_final_answer(completion) == answer == "3995"
    assert extract_final_answer("1+2+0=3:A= 3 ") == "3"
    assert extract_final_answer("1+2+0=3:A=0") == "0"
    assert extract_final_answer("1+2+0=3") is None
    parsed = parse_trace(completion + "<eos>")
    assert parsed.answer == "3995"
    assert parsed.partials == ("235", "3760", None)
    assert [len(section) for section in parsed.sections] == [2, 2, 4]
    first = parsed.sections[0][0]
    assert (first.x, first.op, first.y, first.carry, first.value) == (7, "*", 5, 0, 35)
    assert parse_trace("1+2+0=3:A=").answer is None
    with pytest.raises(ValueError, match="marker"):
        parse_trace("7+5+0=12")
    with pytest.raises(ValueError, match="step"):
        parse_trace("7+5=12:A=12")
    with pytest.raises(ValueError, match="partial"):
        parse_trace("7*5+0=35,P=3x:A=35")


def test_problems_deterministic_and_balanced():
    assert make_problems(100, seed=3) == make_problems(100, seed=3)
    assert make_problems(100, seed=3) != make_problems(100, seed=4)
    assert held_out_problems(50, seed=2) == held_out_problems(50, seed=2)
    counts = Counter(problem["level"] for problem in make_problems(503, seed=0))
    assert sorted(counts) == list(range(len(LEVELS)))
    assert max(counts.values()) - min(counts.values()) <= 1
    assert Counter(p["level"] for p in make_problems(40, seed=1, levels=[1, 4])) == {1: 20, 4: 20}
    dataset = make_dataset(30, seed=0)
    assert dataset.column_names == ["prompt", "answer", "level"]
    assert list(dataset["prompt"]) == [p["prompt"] for p in make_problems(30, seed=0)]


def test_train_and_held_out_never_share_a_problem():
    train = {p["prompt"] for seed in range(3) for p in make_problems(4000, seed=seed)}
    held_out = {p["prompt"] for seed in range(3) for p in held_out_problems(1000, seed=seed)}
    assert train.isdisjoint(held_out)
    assert not any(is_held_out(prompt) for prompt in train)
    assert all(is_held_out(prompt) for prompt in held_out)
    # The held-out split covers every level.
    assert {p["level"] for p in held_out_problems(50, seed=0)} == set(range(len(LEVELS)))


def test_shipped_model_writes_a_parseable_trace():
    import torch

    from trl_ada.tasks.trace_arithmetic import load_tiny_trace_model

    model, tokenizer = load_tiny_trace_model()
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    prompts = [problem["prompt"] for problem in held_out_problems(len(LEVELS), seed=0)]
    encoded = tokenizer(prompts, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        output = model.generate(
            **encoded,
            max_new_tokens=MAX_COMPLETION_LENGTH,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=False)
    for prompt, text in zip(prompts, texts, strict=True):
        parsed = parse_trace(text.replace(tokenizer.pad_token, ""), eos_token=tokenizer.eos_token)
        assert parsed.answer is not None, (prompt, text)
        _, op, b = parse_prompt(prompt)
        assert len(parsed.sections) == (3 if op == "*" and b >= 10 else 1), (prompt, text)


def test_grpo_smoke_on_the_shipped_trace_model(tmp_path):
    import math

    from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
    from trl_ada.tasks.trace_arithmetic import load_tiny_trace_model

    model, tokenizer = load_tiny_trace_model()
    args = AdaGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=16,
        num_generations=4,
        sampler="seq_balance",
        max_completion_length=MAX_COMPLETION_LENGTH,
        learning_rate=3e-5,
        max_steps=2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
    )
    trainer = AdaGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=final_answer_reward,
        args=args,
        train_dataset=make_dataset(64, seed=0),
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    assert all(math.isfinite(entry["loss"]) for entry in logs)
    # The warm-started model solves some of its prompts and fails others: rewards carry signal.
    assert 0.0 < sum(entry["reward"] for entry in logs) / len(logs) < 1.0


# ---------------------------------------------------------------------------------------------------------------------
# The prompt sets of recipes/trace-arithmetic/build_data.sh (committed) and the benchmark's --task trace
# ---------------------------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
TRACE_DATA = ROOT / "benchmarks" / "results" / "trace-arithmetic" / "data"
RECIPE = ROOT / "recipes" / "trace-arithmetic" / "build_data.sh"
PAPER_MIX = {"[0, 0]": 984, "(0, 0.2]": 3082, "(0.2, 0.5]": 870, "(0.5, 1]": 63}
"""The paper's training mix (prompts per pass-rate band), which the recipe's mix sets are scaled from."""


def _read_jsonl(path: Path) -> list[dict]:
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _band(label: str):
    """The `PassRateBand` a ``band`` label such as ``"(0, 0.375]"`` names."""
    from trl_ada.reporting.metrics import PassRateBand

    match = re.fullmatch(r"([\[(])([0-9.]+), ([0-9.]+)([\])])", label)
    assert match is not None, label
    opening, low, high, closing = match.groups()
    return PassRateBand.from_ends(float(low), float(high), ends=opening + closing)


@pytest.mark.parametrize("name", ["paper", "mix"])
def test_prompt_sets_split_and_bands(name):
    train = _read_jsonl(TRACE_DATA / f"train_{name}.jsonl")
    heldout = _read_jsonl(TRACE_DATA / f"heldout_{name}.jsonl")
    assert train and heldout
    train_prompts = [row["prompt"] for row in train]
    heldout_prompts = [row["prompt"] for row in heldout]
    assert len(set(train_prompts)) == len(train) and len(set(heldout_prompts)) == len(heldout)
    # Never a shared problem: each set comes from its own split of the task.
    assert set(train_prompts).isdisjoint(heldout_prompts)
    assert not any(is_held_out(prompt) for prompt in train_prompts)
    assert all(is_held_out(prompt) for prompt in heldout_prompts)
    for row in [*train, *heldout]:
        a, op, b = parse_prompt(row["prompt"])
        assert row["answer"] == str(a + b if op == "+" else a * b)
        assert row["pass_rate"] == row["num_correct"] / 16
        # Every prompt lies in the band it claims.
        assert _band(row["band"]).contains(row["num_correct"], 16), row
    for rows in (train, heldout):
        counts = Counter(row["band"] for row in rows)
        if name == "paper":  # the paper's filter, solved at least once and at most 6 of 16, read in three bands
            assert set(counts) <= {"(0, 0.125]", "(0.125, 0.25]", "(0.25, 0.375]"} and len(counts) > 1
            assert all(1 <= row["num_correct"] <= 6 for row in rows)
        else:  # the paper's mix, unsolved prompts included, scaled by largest remainder
            weights = sum(PAPER_MIX.values())
            assert all(abs(counts[band] - len(rows) * w / weights) < 1 for band, w in PAPER_MIX.items())
            assert counts["[0, 0]"] > 0


def test_recipe_reward_resolves_to_the_trace_tasks_reward():
    from trl_ada.rewards.reward_registry import get_reward_funcs

    names = re.findall(r"--reward (\S+)", RECIPE.read_text())
    assert names
    assert all(get_reward_funcs([name]) == [final_answer_reward] for name in names)
    # The sets record the same reward and the task's completion length in their build reports.
    report = json.loads((TRACE_DATA / "train_scored.report.json").read_text())
    assert get_reward_funcs([report["reward"]]) == [final_answer_reward]
    assert report["settings"]["max_new_tokens"] == MAX_COMPLETION_LENGTH


@pytest.fixture(scope="module")
def bench():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "benchmark_learning_trace", ROOT / "scripts" / "benchmark_learning.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_benchmark_trace_task_needs_a_finite_set(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--task", "trace", "--methods", "grpo_n4", "--out", "unused"])
    assert "--train_data" in capsys.readouterr().err


def _run_trace_benchmark(bench, tmp_path, steps, model_dir=None):
    """One `run_finite` of the benchmark's trace task: 8 training prompts, the 6 easiest held-out ones (band "easy")."""
    import torch

    scored = sorted(_read_jsonl(TRACE_DATA / "heldout_scored.jsonl"), key=lambda row: -row["pass_rate"])
    heldout = [{**row, "band": "easy"} for row in scored[:6]]
    train = _read_jsonl(TRACE_DATA / "train_paper.jsonl")[:8]
    for path, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (tmp_path / path).write_text("".join(json.dumps(row) + "\n" for row in rows))
    threads = torch.get_num_threads()
    try:
        return bench.run_finite(
            "grpo_n4",
            0,
            steps,
            1,
            1e-4,
            tmp_path,
            train_data=tmp_path / "train.jsonl",
            heldout_data=tmp_path / "heldout.jsonl",
            eval_samples=2,
            prompts_per_step=4,
            task="trace",
            model_dir=model_dir,
        )
    finally:
        torch.set_num_threads(threads)


def test_benchmark_trace_run_trains_and_evaluates_on_traces(bench, tmp_path):
    result = _run_trace_benchmark(bench, tmp_path, steps=1)
    assert [point["step"] for point in result["curve"]] == [0, 1]
    # The held-out is scored on the final answer after the trace: the model's easiest prompts are mostly solved
    # (the one-shot task's exact match would score every trace 0).
    assert result["start_heldout"] > 0.5
    assert set(result["curve"][-1]["bands"]) == {"easy"}
    assert result["completions_per_step"] == [16]


def test_benchmark_model_option_starts_from_the_given_model(bench, tmp_path):
    from trl_ada.tiny import TINY_ARITH_ASSETS

    result = _run_trace_benchmark(bench, tmp_path, steps=0, model_dir=TINY_ARITH_ASSETS)
    # The trace model solves these prompts more often than not (the test above); the one-shot model never writes the
    # trace's answer marker, so starting from it scores 0.
    assert result["start_heldout"] == 0.0


def test_benchmark_model_option_is_checked_before_any_run(bench, tmp_path, capsys):
    data = str(TRACE_DATA / "train_paper.jsonl")
    with pytest.raises(SystemExit):
        bench.main(["--task", "trace", "--model", str(tmp_path), "--out", str(tmp_path / "o")])
    assert "--model need --train_data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(
            ["--task", "trace", "--train_data", data, "--heldout_data", data, "--model", str(tmp_path)]
            + ["--methods", "grpo_n4", "--out", str(tmp_path / "o")]
        )
    assert "holds no model" in capsys.readouterr().err
    assert not (tmp_path / "o" / "runs").exists()
