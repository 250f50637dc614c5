"""Shared fixtures: a tiny Qwen2 and character tokenizer built in code (no hub), and toy verifiable rewards."""

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_MODEL_KWARGS = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)


def starts_low_digit(completions, **kwargs):
    """Toy verifiable reward: 1 when the completion starts with a digit below 5 (a random model passes ~20%)."""
    return [1.0 if c[:1].isdigit() and int(c[:1]) < 5 else 0.0 for c in completions]


def starts_with_one(completions, **kwargs):
    """A rare success for a random model (about one completion in forty), so GRPO groups are mostly all-wrong."""
    return [1.0 if c[:1] == "1" else 0.0 for c in completions]


def length_or_none(completions, level, **kwargs):
    """A second reward that uses a dataset column and abstains (None) on level-0 prompts."""
    return [None if lvl == 0 else min(len(c), 6) / 6 for c, lvl in zip(completions, level)]


@pytest.fixture(scope="session")
def tokenizer():
    from trl_ada.tiny import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture
def tiny_model(tokenizer):
    from trl_ada.tiny import build_tiny_model

    return build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS)


@pytest.fixture(scope="session")
def arithmetic_dataset():
    from trl_ada.tasks.arithmetic import make_dataset

    return make_dataset(96, seed=0)


def tiny_args(output_dir, **overrides):
    """Fast CPU settings shared by trainer tests."""
    args = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=6,
        max_steps=3,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
    )
    args.update(overrides)
    return args


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """The tiny model and tokenizer saved to a local directory, as a hub checkpoint would be (Auto classes load it)."""
    from trl_ada.tiny import build_tiny_model, save_tiny

    path = tmp_path_factory.mktemp("tiny-model")
    save_tiny(build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS), tokenizer, path)
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
