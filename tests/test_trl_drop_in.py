"""Drop-in with environment-owned data (issue 21, item 17): TRL's own GRPO tests, retargeted at `AdaGRPOTrainer`.

TRL 1.16's `tests/test_grpo_trainer.py` builds `GRPOTrainer` with an `environment_factory` and no `train_dataset` (the
environment owns the data and returns the prompt from `reset()`): `test_environment_owned_data_requires_max_steps`,
`test_multiple_environments_without_dataset_raises` and `test_environment_owned_reward_coexists_with_reward_funcs`.
Each is repeated here with a tiny model built in code, for `GRPOTrainer` and for `AdaGRPOTrainer` with a plain
`GRPOConfig`, `sampler="uniform"` and `sampler="seq_balance"`: plain GRPO accepts exactly what `GRPOTrainer` accepts
and raises exactly its errors; a pooling sampler gets TRL's errors first, then trl-ada's, which names the fix.
"""

import importlib.util
import logging
from unittest import mock

import envs
import pytest
import torch
import transformers
from conftest import TINY_MODEL_KWARGS, tiny_args
from packaging.version import Version
from test_environments import chat_tokenizer
from trl import GRPOConfig, GRPOTrainer

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.testing.tiny_agents import build_tool_tokenizer
from trl_ada.tiny import build_tiny_model

pytestmark = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.2"),
    reason="GRPOTrainer's environment_factory needs transformers>=5.2 (TRL's own requirement)",
)

needs_tools = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.13") or importlib.util.find_spec("jmespath") is None,
    reason="an environment with tools needs transformers>=5.13 and jmespath here (TRL's tool parsing)",
)

PLAIN = ["GRPOTrainer", "ada-GRPOConfig", "ada-uniform"]
"""Plain GRPO: TRL's trainer, and AdaGRPOTrainer with a plain GRPOConfig or with sampler='uniform'."""
ALL = [*PLAIN, "ada-seq_balance"]


def trainer_and_config(kind: str, output_dir, **args):
    """The trainer class and its config for `kind` (one of `ALL`), with TRL's test's arguments `args`."""
    if kind == "GRPOTrainer":
        return GRPOTrainer, GRPOConfig(**args, output_dir=str(output_dir))
    if kind == "ada-GRPOConfig":
        return AdaGRPOTrainer, GRPOConfig(**args, output_dir=str(output_dir))
    return AdaGRPOTrainer, AdaGRPOConfig(**args, output_dir=str(output_dir), sampler=kind.removeprefix("ada-"))


@pytest.fixture(autouse=True)
def silence_trls_experimental_warning(monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # as TRL's own tests do


def build(kind: str, output_dir, factory, reward_funcs=None, **args):
    trainer_class, config = trainer_and_config(kind, output_dir, report_to="none", use_cpu=True, **args)
    # An environment with tools needs a chat template TRL can parse tool calls from.
    tokenizer = build_tool_tokenizer(()) if factory is OwnsItsReward else chat_tokenizer()
    return trainer_class(
        model=build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        reward_funcs=reward_funcs or [envs.target_reward],
        args=config,
        processing_class=tokenizer,
        environment_factory=factory,
    )


def trl_error(output_dir, factory, **args) -> str:
    """What GRPOTrainer itself raises for these arguments."""
    with pytest.raises(ValueError) as error:
        build("GRPOTrainer", output_dir, factory, **args)
    return str(error.value)


class GuessTheWord:
    """Owns the data: `reset()` returns the prompt, whatever the (placeholder) row."""

    def reset(self, **kwargs):
        return "Guess the 5-letter word."


class EnvA:
    def reset(self, **kwargs): ...


class EnvB:
    def reset(self, **kwargs): ...


class OwnsItsReward:
    """TRL's test's environment: a tool and an environment-owned reward."""

    def reset(self, **kwargs):
        self._solved = False

    def guess(self, word: str) -> str:
        """
        Submit a guess.

        Args:
            word: The guessed word.

        Returns:
            Feedback about the guess.
        """
        return "nope"

    def get_reward(self) -> float:
        return 1.0 if self._solved else 0.0


def format_reward(completions, **kwargs):
    return [0.0 for _ in completions]


@pytest.mark.parametrize("kind", ALL)
def test_environment_owned_data_requires_max_steps(tmp_path, kind):
    expected = trl_error(tmp_path, GuessTheWord)  # max_steps unset
    assert "max_steps" in expected
    with pytest.raises(ValueError) as error:
        build(kind, tmp_path, GuessTheWord)
    assert str(error.value) == expected  # TRL's own error, also before trl-ada's for a pooling sampler


@pytest.mark.parametrize("kind", ALL)
def test_multiple_environments_without_dataset_raises(tmp_path, kind):
    factory = {"a": EnvA, "b": EnvB}
    expected = trl_error(tmp_path, factory, max_steps=1)
    assert "requires a `train_dataset`" in expected
    with pytest.raises(ValueError) as error:
        build(kind, tmp_path, factory, max_steps=1)
    assert str(error.value) == expected


@needs_tools
@pytest.mark.parametrize("kind", PLAIN)
def test_environment_owned_reward_coexists_with_reward_funcs(tmp_path, kind):
    trainer = build(
        kind,
        tmp_path,
        OwnsItsReward,
        reward_funcs=format_reward,
        per_device_train_batch_size=3,
        num_generations=3,
        max_steps=5,
        reward_weights=[0.5],
    )
    # TRL's test's assertions: the environment-owned reward is appended after the trainer-owned one, with weight 1.
    assert trainer.reward_func_names == ["format_reward", "OwnsItsReward"]
    assert trainer.reward_weights.tolist() == [0.5, 1.0]
    assert len(trainer.reward_funcs) == 2
    tool_names = [tool.__name__ for tool in trainer.tools]
    assert "guess" in tool_names and "get_reward" not in tool_names
    if kind != "GRPOTrainer":
        assert trainer.args.sampler == "uniform"


@needs_tools
def test_a_plain_grpo_config_with_environment_owned_data_trains_uniform_with_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trl_ada.trainer"):
        trainer = build("ada-GRPOConfig", tmp_path, OwnsItsReward, reward_funcs=format_reward, max_steps=1)
    assert trainer.args.sampler == "uniform"
    assert any("training with sampler='uniform'" in r.getMessage() for r in caplog.records)


@needs_tools
def test_a_pooling_sampler_rejects_environment_owned_data_after_trls_checks_before_grpo_set_up(tmp_path):
    # TRL accepts these arguments (see the test above); seq_balance cannot pool draws of a row whose environment may
    # invent a task per episode. The rejection comes after TRL's validation, at the end of `Trainer.__init__` (its
    # `on_init_end` callbacks), before GRPOTrainer sets up its reference model, vLLM or metrics.
    built = []
    trainer_init = transformers.Trainer.__init__

    def recording_init(self, *args, **kwargs):
        built.append(self)
        trainer_init(self, *args, **kwargs)

    with mock.patch.object(transformers.Trainer, "__init__", recording_init), pytest.raises(ValueError) as error:
        build(
            "ada-seq_balance",
            tmp_path,
            OwnsItsReward,
            reward_funcs=format_reward,
            per_device_train_batch_size=3,
            num_generations=3,
            max_steps=5,
        )
    message = str(error.value)
    assert "sampler='seq_balance' needs a train_dataset with environment_factory" in message
    assert "Pass such a train_dataset, or use sampler='uniform'" in message  # the fix
    assert any(entry.name == "on_init_end" for entry in error.traceback)
    (trainer,) = built
    assert not hasattr(trainer, "beta") and not hasattr(trainer, "_metrics")  # GRPOTrainer's own set-up never ran


def test_the_rejection_keeps_the_dataset_requirement_for_every_pooling_sampler(tmp_path):
    for sampler in ("seq_pos", "est", "dapo"):
        with pytest.raises(ValueError, match=f"sampler='{sampler}' needs a train_dataset"):
            build(f"ada-{sampler}", tmp_path, GuessTheWord, max_steps=1)


def test_uniform_on_environment_owned_data_reproduces_grpo_trainer(tmp_path):
    # TRL's `test_train_with_environment_owned_data`: no dataset, reset() supplies the prompt (here with a target of
    # its own, so rewards vary), max_steps sets the length. trl-ada's uniform must train exactly as GRPOTrainer.
    common = {
        k: v for k, v in tiny_args(tmp_path, max_steps=2).items() if k not in ("output_dir", "report_to", "use_cpu")
    }
    runs = []
    for kind in ("GRPOTrainer", "ada-uniform"):
        envs.reset_counters()
        trainer = build(kind, tmp_path / kind, envs.Low, **common)
        trainer.train()
        runs.append((trainer, list(envs.RESETS)))
    (grpo, grpo_resets), (ada, ada_resets) = runs
    assert ada_resets == grpo_resets and len(ada_resets) == 2 * 8  # one episode per completion, as in GRPOTrainer
    losses = [[entry["loss"] for entry in t.state.log_history if "loss" in entry] for t in (grpo, ada)]
    assert losses[0] == losses[1] and len(losses[0]) == 2
    for (name, expected), actual in zip(grpo.model.named_parameters(), ada.model.parameters(), strict=True):
        assert torch.equal(actual, expected), name
    initial = build_tiny_model(chat_tokenizer(), seed=0, **TINY_MODEL_KWARGS)
    assert any(not torch.equal(p, q) for p, q in zip(ada.model.parameters(), initial.parameters(), strict=True))
