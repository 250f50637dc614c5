"""`environment_factory` (TRL's environments) through the sampling rounds.

Every draw of a prompt must get an episode of its own (a fresh `reset`, as GRPOTrainer gives every generation), be
scored against that episode (environment-owned `get_reward` and reward functions reading `environments`), and keep its
prompt (with the episode's observation) through the pool, the downsampling and TRL's batch; TRL's batch building must
not reset environments again for the kept rows.
"""

import math
from pathlib import Path

import envs
import pytest
import torch
import transformers
from conftest import TINY_MODEL_KWARGS, launch_two_processes, tiny_args
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.tiny import build_char_tokenizer, build_tiny_model

SCRIPT = Path(__file__).parent / "environments_run.py"

pytestmark = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.2"),
    reason="GRPOTrainer's environment_factory needs transformers>=5.2 (TRL's own requirement)",
)


def chat_tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = envs.CHAT_TEMPLATE
    return tokenizer


def recording(trainer_class):
    class Recording(trainer_class):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.__dict__.setdefault("recorded", []).append(
                {key: output[key].detach().clone() for key in ("prompt_ids", "completion_ids", "advantages")}
            )
            return output

        def _generate(self, prompts):
            kept = getattr(self, "_ada_pending", None) is not None
            output = super()._generate(prompts)
            if kept:
                self.__dict__.setdefault("handed_over", []).append(kept_row_check(self, output))
            return output

        def _log_selection(self, selection):
            self.__dict__.setdefault("selections", []).append(selection)
            super()._log_selection(selection)

    return Recording


def kept_row_check(trainer, output) -> dict:
    """Each kept row's rewards against the ones its own prompt (observation included) and completion call for."""
    prompt_ids, completion_ids = output[0], output[1]
    # The kept rewards are every process's (TRL gathers them); this process trains on its own slice.
    start = trainer.accelerator.process_index * len(completion_ids)
    rewards = trainer._ada_pending.rewards[start : start + len(completion_ids)].tolist()
    mismatches = 0
    for ids, ids_c, row in zip(prompt_ids, completion_ids, rewards, strict=True):
        prompt = trainer.processing_class.decode(ids)
        expected = envs.expected_rewards(prompt, trainer.processing_class.decode(ids_c, skip_special_tokens=True))
        for name, value in zip(trainer.reward_func_names, row, strict=True):
            if name in expected:
                mismatches += not math.isclose(value, expected[name], abs_tol=1e-6)
            else:  # another environment's reward abstains on this row
                mismatches += not math.isnan(value)
    return {"rows": len(completion_ids), "mismatches": mismatches}


def train(trainer_class, config, factory, dataset):
    envs.reset_counters()
    tokenizer = chat_tokenizer()
    trainer = recording(trainer_class)(
        build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
        [envs.target_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=factory,
    )
    trainer.train()
    trainer.resets, trainer.scored = list(envs.RESETS), len(envs.SCORED)
    return trainer


@pytest.mark.parametrize("routed", [False, True], ids=["single", "multi"])
def test_uniform_with_environments_reproduces_grpo_trainer(tmp_path, routed):
    factory = {"low": envs.Low, "high": envs.High} if routed else envs.Low
    dataset = envs.dataset(64, routed=routed)
    common = tiny_args(tmp_path, max_steps=3)
    grpo = train(GRPOTrainer, GRPOConfig(**common), factory, dataset)
    ada = train(AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"), factory, dataset)
    assert len(grpo.recorded) == len(ada.recorded) == 3
    for expected, actual in zip(grpo.recorded, ada.recorded):
        for key in ("prompt_ids", "completion_ids", "advantages"):
            assert torch.equal(expected[key], actual[key]), key
    # The same episodes, in the same order: one reset per generated completion, none more.
    assert ada.resets == grpo.resets and len(ada.resets) == ada.scored == 3 * 8
    assert any(record["advantages"].abs().sum() > 0 for record in ada.recorded)
    losses = [[entry["loss"] for entry in t.state.log_history if "loss" in entry] for t in (grpo, ada)]
    assert losses[0] == losses[1]
    for (name, expected), actual in zip(grpo.model.named_parameters(), ada.model.parameters()):
        assert torch.equal(actual, expected), name


@pytest.mark.parametrize("routed", [False, True], ids=["single", "multi"])
def test_seq_balance_gives_every_draw_its_own_episode_and_keeps_it_with_its_row(tmp_path, routed):
    factory = {"low": envs.Low, "high": envs.High} if routed else envs.Low
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=3, per_device_train_batch_size=16),
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    trainer = train(AdaGRPOTrainer, config, factory, envs.dataset(64, routed=routed))
    drawn = sum(len(pool) for selection in trainer.selections for pool in selection.pools)
    assert any(len(pool) > 4 for selection in trainer.selections for pool in selection.pools)
    # One episode per completion generated (padding rows included), and none for TRL's batch of kept rows.
    assert len(trainer.resets) == trainer.scored >= drawn
    assert len({target for _, target in trainer.resets}) > 1  # episodes differ between draws
    if routed:
        assert {name for name, _ in trainer.resets} == {"Low", "High"}
    assert len(trainer.handed_over) == 3
    for batch in trainer.handed_over:
        assert batch == {"rows": 16, "mismatches": 0}
    # The model card says how the completions were produced.
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    names = "`High`, `Low`" if routed else "`Low`"
    assert f"Each completion was an agent rollout: environment episodes ({names}), one fresh `reset`" in card


def test_an_environment_factory_without_a_train_dataset_is_rejected_for_pooling_samplers(tmp_path):
    # GRPOTrainer accepts environment-owned data (its own checks run first, see tests/test_trl_drop_in.py); a sampler
    # that pools the draws of one row cannot, and says so while the trainer is built, before anything trains.
    tokenizer = chat_tokenizer()
    with pytest.raises(ValueError, match="sampler='seq_balance' needs a train_dataset with environment_factory"):
        AdaGRPOTrainer(
            build_tiny_model(tokenizer, seed=0, **TINY_MODEL_KWARGS),
            [envs.target_reward],
            args=AdaGRPOConfig(**tiny_args(tmp_path)),
            processing_class=tokenizer,
            environment_factory=envs.Low,
        )


@pytest.mark.slow
def test_environments_on_two_processes(tmp_path):
    reports = launch_two_processes(SCRIPT, tmp_path, timeout=420)
    assert reports[0]["selections"] == reports[1]["selections"]  # one decision, made on every process
    for report in reports:
        assert report["handed_over"] == [{"rows": 8, "mismatches": 0}] * 3
        assert report["resets"] == report["scored"] > 0  # none for the kept rows, on either process
        assert report["drew_more_than_n"]
        assert set(report["environments"]) == {"Low", "High"}
        assert max(report["moved"]) > 0  # some kept rows (and their prompts) moved to the other process
    assert reports[0]["weights"] == pytest.approx(reports[1]["weights"], abs=0)


def readme_calculator():
    """The `Calculator` environment of the README's agents example, exactly as written there."""
    text = (Path(__file__).parents[1] / "docs" / "agents.md").read_text()
    block = text[
        text.index("class Calculator:") : text.index('trainer = AdaGRPOTrainer(\n    model="Qwen/Qwen3-0.6B"')
    ]
    namespace: dict = {}
    exec(block, namespace)
    return namespace["Calculator"]


@pytest.mark.skipif(Version(transformers.__version__) < Version("5.13"), reason="tools need transformers>=5.13 here")
def test_the_readme_calculator_scores_each_kept_row_by_its_own_episode(tmp_path):
    from trl_ada.testing.tiny_agents import answer_reward, get_tool_model, make_tool_dataset

    Calculator = readme_calculator()
    model, tokenizer = get_tool_model()
    config = AdaGRPOConfig(
        **tiny_args(tmp_path, max_steps=2, per_device_train_batch_size=16, max_completion_length=40),
        max_tool_calling_iterations=2,
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    checks = []

    class Checked(AdaGRPOTrainer):
        def _generate(self, prompts):
            kept = self._ada_pending is not None
            output = super()._generate(prompts)
            if kept:  # TRL's batch of kept rows: each row's environment reward must be its own episode's
                tool_masks, completion_ids = output[2], output[1]
                start = self.accelerator.process_index * len(completion_ids)
                rewards = self._ada_pending.rewards[start : start + len(completion_ids)].tolist()
                column = self.reward_func_names.index("Calculator")
                called = [0 in mask for mask in tool_masks]  # the tool's output is masked out of the loss
                checks.append(([row[column] for row in rewards], [0.1 if c else 0.0 for c in called]))
            return output

    trainer = Checked(
        model,
        [answer_reward],
        args=config,
        train_dataset=make_tool_dataset(64),
        processing_class=tokenizer,
        environment_factory=Calculator,
    )
    trainer.train()
    assert len(checks) == 2
    for actual, expected in checks:
        assert actual == pytest.approx(expected)
        assert 0 < sum(expected) < 0.1 * len(expected)  # some kept episodes called the tool, some did not
