"""Tests of the arithmetic task: problem generation, split, reward and evaluation."""

from __future__ import annotations

import re
from collections import Counter

import pytest
import torch

from trl_ada.tasks.arithmetic import (
    LEVELS,
    PROMPT_WIDTH,
    accuracy_by_level,
    exact_match_reward,
    extract_answer,
    format_accuracy,
    held_out_problems,
    is_held_out,
    make_dataset,
    make_problems,
)

PROMPT_RE = re.compile(r"^ *(\d+)([+*]) *(\d+)=$")


def _parse(prompt: str) -> tuple[int, str, int]:
    match = PROMPT_RE.match(prompt)
    assert match is not None, prompt
    return int(match.group(1)), match.group(2), int(match.group(3))


def test_levels():
    assert len(LEVELS) == 6
    assert len(set(LEVELS)) == 6


def test_problems_deterministic_per_seed():
    assert make_problems(120, seed=3) == make_problems(120, seed=3)
    assert make_problems(120, seed=3) != make_problems(120, seed=4)
    assert held_out_problems(60, seed=3) == held_out_problems(60, seed=3)


@pytest.mark.parametrize("num", [0, 1, 6, 100, 601])
def test_problems_balanced_over_levels(num):
    problems = make_problems(num, seed=0)
    assert len(problems) == num
    counts = Counter(problem["level"] for problem in problems)
    if num >= len(LEVELS):
        assert set(counts) == set(range(len(LEVELS)))
    assert max(counts.values(), default=0) - min((counts[i] for i in range(len(LEVELS))), default=0) <= 1


def test_problems_subset_of_levels():
    problems = make_problems(40, seed=1, levels=[3, 5])
    assert Counter(problem["level"] for problem in problems) == {3: 20, 5: 20}
    with pytest.raises(ValueError, match="level"):
        make_problems(10, seed=0, levels=[6])
    with pytest.raises(ValueError, match="empty"):
        make_problems(10, seed=0, levels=[])


def test_answers_correct_and_levels_respected():
    for problem in make_problems(1200, seed=7) + held_out_problems(600, seed=7):
        a, op, b = _parse(problem["prompt"])
        assert problem["answer"] == str(a + b if op == "+" else a * b)
        level = problem["level"]
        if level == 0:
            assert op == "+" and a < 10 and b < 10
        elif level == 1:
            assert op == "+" and 10 <= a < 100 and 10 <= b < 100
            assert a % 10 + b % 10 < 10 and a // 10 + b // 10 < 10
        elif level == 2:
            assert op == "+" and 10 <= a < 100 and 10 <= b < 100
            assert a % 10 + b % 10 >= 10 or a // 10 + b // 10 >= 10
        elif level == 3:
            assert op == "+" and 100 <= a < 1000 and 100 <= b < 1000
        elif level == 4:
            assert op == "*" and 10 <= a < 100 and 2 <= b < 10
        else:
            assert op == "*" and 10 <= a < 100 and 10 <= b < 100


def test_prompts_fixed_width_right_aligned():
    problems = make_problems(600, seed=0)
    assert {len(problem["prompt"]) for problem in problems} == {PROMPT_WIDTH}
    for problem in problems:
        left, right = problem["prompt"][:-1].split("+" if "+" in problem["prompt"] else "*")
        assert len(left) == len(right) == 3
        assert left == left.strip().rjust(3) and right == right.strip().rjust(3)


def test_held_out_disjoint_from_training():
    for seed in (0, 1, 2):
        train = {problem["prompt"] for problem in make_problems(6000, seed=seed)}
        held_out = {problem["prompt"] for problem in held_out_problems(600, seed=seed)}
        assert train.isdisjoint(held_out)
        assert all(is_held_out(prompt) for prompt in held_out)
        assert not any(is_held_out(prompt) for prompt in train)
    # The hash rule holds out roughly 10% of each level's problem set.
    all_1d = [f"{a:>3}+{b:>3}=" for a in range(10) for b in range(10)]
    assert 3 <= sum(map(is_held_out, all_1d)) <= 25


def test_make_dataset():
    dataset = make_dataset(30, seed=0)
    assert dataset.column_names == ["prompt", "answer", "level"]
    assert len(dataset) == 30
    assert dataset[0] == make_problems(30, seed=0)[0]


def test_reward_right_wrong_garbage_whitespace():
    completions = ["12", " 12 ", "12<eos>", "12<eos>junk", "12\n34", "13", "012", "12 3", "", "abc", "<eos>12", "\t12"]
    expected = [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert exact_match_reward(completions, answer=["12"] * len(completions), level=[0] * 12) == expected
    # Conversational completions (a list of messages) are read from the last message.
    assert exact_match_reward([[{"role": "assistant", "content": "7"}]], answer=["7"]) == [1.0]
    assert extract_answer(" 9801<eos><pad>") == "9801"
    with pytest.raises(ValueError):
        exact_match_reward(["1"], answer=["1", "2"])


class _OracleModel(torch.nn.Module):
    """Stand-in for a causal LM: 'generates' the right answer for even-indexed rows, garbage for the others."""

    def __init__(self, tokenizer, problems):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.tokenizer = tokenizer
        self.answers = {problem["prompt"]: problem["answer"] for problem in problems}

    def generate(self, input_ids, attention_mask, **kwargs):
        rows = []
        for i, ids in enumerate(input_ids.tolist()):
            prompt = self.tokenizer.decode(ids, skip_special_tokens=True)
            text = self.answers[prompt] if i % 2 == 0 else "x"
            rows.append(ids + self.tokenizer(text + "<eos>", add_special_tokens=False).input_ids)
        width = max(map(len, rows))
        return torch.tensor([row + [self.tokenizer.pad_token_id] * (width - len(row)) for row in rows])


def test_accuracy_by_level_counts_per_level():
    from trl_ada.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    problems = make_problems(12, seed=0)
    model = _OracleModel(tokenizer, problems)
    result = accuracy_by_level(model, tokenizer, problems, temperature=1.0, num_samples=2, batch_size=4)
    # With num_samples=2, each problem appears twice in a row: once right (even row), once wrong.
    assert result["overall"] == pytest.approx(0.5)
    assert result["num_completions"] == 24
    assert set(result["per_level"]) == set(range(6))
    assert all(value == pytest.approx(0.5) for value in result["per_level"].values())
    assert format_accuracy(result).startswith("overall 0.500 | add_1d 0.500")
