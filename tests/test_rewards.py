"""Math-Verify reward, the reward registry, and the recipe YAML files (which name reward functions and config keys)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import yaml

from trl_ada.rewards import (
    REWARD_FUNCS,
    get_reward_funcs,
    last_boxed,
    math_verify_reward,
    normalize_reference,
    reference_verifies,
    required_reward_columns,
    score_completions,
)
from trl_ada.rewards import math as rewards  # its module state (the warn-once flag)
from trl_ada.tasks.arithmetic import exact_match_reward

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
RECIPE_FILES = sorted(RECIPES.rglob("*.yaml"))


def chat(text):
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------------------------------------------------
# math_verify_reward
# ---------------------------------------------------------------------------------------------------------------------


def test_right_and_wrong_string_completions():
    completions = [
        r"The answer is \boxed{\frac{1}{2}}.",
        r"So \boxed{0.5}",
        r"I get \boxed{\frac{1}{3}}",
        r"First \boxed{7}, but after checking, the final answer is \boxed{12}",
    ]
    solution = [r"\frac{1}{2}", r"\frac{1}{2}", r"\frac{1}{2}", "12"]
    assert math_verify_reward(completions, solution) == [1.0, 1.0, 0.0, 1.0]


def test_only_the_last_boxed_answer_counts():
    # Math-Verify alone would read both boxes as the set {7, 12}; the authors (and we) score the last one.
    assert math_verify_reward([r"\boxed{7} and \boxed{12}", r"\boxed{12} and \boxed{7}"], ["12", "12"]) == [1.0, 0.0]
    assert last_boxed(r"a \boxed{\frac{1}{2}} b \boxed {3} c") == r"\boxed{3}"
    assert last_boxed(r"\boxed{1} then a truncated \boxed{2") == r"\boxed{1}"
    assert last_boxed("nothing boxed") is None


def test_conversational_completions_match_string_ones():
    texts = [r"\boxed{12}", r"\boxed{13}", "no boxed answer at all"]
    solution = ["12", "12", "12"]
    assert math_verify_reward([chat(t) for t in texts], solution) == math_verify_reward(texts, solution)
    assert math_verify_reward(texts, solution) == [1.0, 0.0, 0.0]
    # Multi-message completions: the last message carries the final answer.
    multi = [[{"role": "assistant", "content": r"\boxed{1}"}, {"role": "assistant", "content": r"\boxed{12}"}]]
    assert math_verify_reward(multi, ["12"]) == [1.0]


@pytest.mark.parametrize(
    "reference",
    ["12", r"\frac{1}{2}", "1, 2", "x^2+1", r"$\boxed{12}$", "$12$", r"\boxed{2\sqrt{3}}", r"(1, 2]"],
)
def test_bare_and_delimited_references_are_understood(reference):
    assert normalize_reference(reference) is not None
    assert reference_verifies(reference)


def test_bare_list_reference_is_boxed_not_truncated():
    # Parsed raw, math-verify reads "1, 2" as 2; the authors box the reference, and so do we.
    assert math_verify_reward([r"\boxed{1, 2}", r"\boxed{2}"], ["1, 2", "1, 2"]) == [1.0, 0.0]


@pytest.mark.parametrize("completion", ["no idea", r"\boxed{", "}{", "", None, r"\boxed{}", 12, "$$"])
def test_unparsable_completion_scores_zero(completion):
    assert math_verify_reward([completion], ["12"]) == [0.0]


def test_unparsable_reference_gives_none_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(rewards, "_warned_unparsable_reference", False)
    with caplog.at_level(logging.WARNING, logger="trl_ada.rewards"):
        result = math_verify_reward([r"\boxed{1}", r"\boxed{1}", r"\boxed{1}", r"\boxed{1}"], ["", "}{", None, "1"])
        math_verify_reward([r"\boxed{1}"], [""])
    assert result == [None, None, None, 1.0]
    warnings = [r for r in caplog.records if "cannot parse the reference" in r.getMessage()]
    assert len(warnings) == 1
    assert "trl-ada prepare-data" in warnings[0].getMessage()


def test_reference_verification_rejects_garbage():
    assert not reference_verifies("")
    assert not reference_verifies("}{")
    assert not reference_verifies(r"\frac{")
    assert not reference_verifies(None)


def test_length_mismatch_raises():
    with pytest.raises(ValueError, match="2 completions but 1 solutions"):
        math_verify_reward(["a", "b"], ["1"])


def test_log_extra_is_forwarded():
    logged = {}
    math_verify_reward([r"\boxed{3}"], ["3"], log_extra=lambda name, values: logged.setdefault(name, values))
    assert set(logged) >= {"solution", "gold_parsed", "answer_parsed"}


def test_extra_trainer_kwargs_are_ignored():
    assert math_verify_reward(
        [r"\boxed{3}"], ["3"], prompts=["p"], completion_ids=[[1]], trainer_state=None, level=[2]
    ) == [1.0]


# ---------------------------------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------------------------------


def test_registry_names():
    assert REWARD_FUNCS["math_verify"] is math_verify_reward
    assert REWARD_FUNCS["exact_match"] is exact_match_reward
    assert {"accuracy_reward", "reasoning_accuracy_reward", "think_format_reward"} <= set(REWARD_FUNCS)


def test_trl_reward_funcs_accept_strings_and_keep_their_names():
    think = REWARD_FUNCS["think_format_reward"]
    assert think.__name__ == "think_format_reward"
    assert think(["<think>\nsteps\n</think>\nanswer", "no think"]) == [1.0, 0.0]
    assert think([chat("<think>x</think>y")]) == [1.0]
    accuracy = REWARD_FUNCS["accuracy_reward"]
    assert accuracy.__name__ == "accuracy_reward"
    assert accuracy([r"\boxed{12}", r"\boxed{11}"], solution=["12", "12"]) == [1.0, 0.0]


def test_get_reward_funcs_resolves_names_and_dotted_paths():
    funcs = get_reward_funcs(["math_verify", "exact_match", "trl_ada.tasks.arithmetic.exact_match_reward"])
    assert funcs == [math_verify_reward, exact_match_reward, exact_match_reward]
    assert get_reward_funcs("math_verify") == [math_verify_reward]


def test_get_reward_funcs_unknown_name_lists_known_ones():
    with pytest.raises(ValueError) as info:
        get_reward_funcs(["math_verify", "math_verifyy"])
    message = str(info.value)
    assert "'math_verifyy'" in message
    for name in REWARD_FUNCS:
        assert name in message


def test_get_reward_funcs_bad_inputs():
    with pytest.raises(ValueError, match="No reward function"):
        get_reward_funcs([])
    with pytest.raises(ValueError, match="Could not import"):
        get_reward_funcs(["no_such_module_xyz.reward"])
    with pytest.raises(ValueError, match="Could not import"):
        get_reward_funcs(["trl_ada.rewards.no_such_function"])


def test_required_reward_columns():
    assert required_reward_columns([math_verify_reward]) == ["solution"]
    assert required_reward_columns([exact_match_reward]) == ["answer"]
    assert required_reward_columns(get_reward_funcs(["math_verify", "think_format_reward"])) == ["solution"]


def test_score_completions_groups_rewards_per_prompt():
    prompts = ["p0", [{"role": "user", "content": "p1"}]]
    completions = [[r"\boxed{1}", r"\boxed{2}", "x"], [r"\boxed{5}", r"\boxed{5}", r"\boxed{4}"]]
    seen = []

    def spy(completions, solution, prompts, **kwargs):
        seen.append(completions)
        return math_verify_reward(completions, solution)

    scores = score_completions(spy, prompts, completions, {"solution": ["1", "5"]}, chunk_size=4)
    assert scores == [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    flat = [c for chunk in seen for c in chunk]
    assert flat[0] == r"\boxed{1}"  # text prompt -> string completion
    assert flat[3] == chat(r"\boxed{5}")  # conversational prompt -> message list, as TRL passes it
    assert len(seen) == 2  # chunked


# ---------------------------------------------------------------------------------------------------------------------
# Recipes: every YAML parses like scripts/train_ada.py parses it and builds a valid AdaGRPOConfig
# ---------------------------------------------------------------------------------------------------------------------


def _recipe_parser():
    from trl import ModelConfig, ScriptArguments, TrlParser

    from trl_ada.config import AdaGRPOConfig

    @dataclasses.dataclass
    class RecipeScriptArguments(ScriptArguments):
        reward_funcs: list[str] = dataclasses.field(default_factory=lambda: ["math_verify"])

    return TrlParser((RecipeScriptArguments, AdaGRPOConfig, ModelConfig))


def test_recipes_exist():
    names = {str(path.relative_to(RECIPES)) for path in RECIPE_FILES}
    methods = ["grpo_n4", "grpo_n8", "grpo_n16", "dapo", "seq_pos", "seq_balance", "est"]
    assert {f"qwen2.5-math-1.5b/{m}.yaml" for m in methods} <= names
    assert {
        f"models/{m}.yaml" for m in ["qwen2.5-math-7b", "llama-3.2-3b-instruct", "qwen3-4b-instruct-2507"]
    } <= names
    assert (RECIPES / "README.md").is_file()


@pytest.mark.parametrize("path", RECIPE_FILES, ids=lambda p: str(p.relative_to(RECIPES)))
def test_recipe_builds_a_valid_config(path, tmp_path, monkeypatch):
    raw = yaml.safe_load(path.read_text())
    for key in raw.get("env", {}):
        monkeypatch.setenv(key, "")  # TrlParser sets the YAML's env block; monkeypatch restores it afterwards
    # bf16 needs an accelerator; the override is for this CPU test only.
    argv = ["--config", str(path), "--output_dir", str(tmp_path), "--bf16", "false"]
    script_args, config, model_args = _recipe_parser().parse_args_and_config(argv)

    assert get_reward_funcs(script_args.reward_funcs)
    assert model_args.model_name_or_path == raw["model_name_or_path"]
    assert script_args.dataset_name == raw["dataset_name"]
    for key, value in raw.items():
        if key != "env" and hasattr(config, key) and key not in ("output_dir", "bf16"):
            assert getattr(config, key) == value or key in ("report_to",), key
    # The paper's shared hyperparameters (Section 4.1).
    assert config.learning_rate == 1e-6
    assert config.lr_scheduler_type == "constant_with_warmup" and config.warmup_steps == 10
    assert (config.epsilon, config.epsilon_high) == (0.2, 0.28)
    assert config.beta == 0.0 and config.entropy_coef == 1e-4
    assert config.max_steps == 600 and config.temperature == 1.0 and config.max_completion_length == 4096
    assert config.use_vllm
    # 512 prompts per optimizer step on 8 processes.
    rows = config.per_device_train_batch_size * config.gradient_accumulation_steps * 8
    assert rows % config.num_generations == 0 and rows // config.num_generations == 512
    # The sampler settings validate (config.__post_init__ already ran them) and match the method.
    settings = config.sampler_settings()
    method = path.stem
    expected = {"seq_pos": (1, None), "seq_balance": (2, 2)}
    if method in expected:
        assert config.sampler == method and config.num_generations == 4 and config.round_size == 8
        assert config.max_rounds == 4 and config.scale_rewards == "none"
        assert (settings.positive_quota, raw.get("negative_quota")) == expected[method]
    elif method.startswith("grpo") or path.parent.name == "models":
        assert config.sampler == "uniform"
    else:
        assert config.sampler == method


METHOD_FLAGS = {  # recipes/README.md, "Methods": base file (GRPO-n4) -> method
    "dapo": ["--sampler", "dapo"],
    "seq_pos": ["--sampler", "seq_pos", "--positive_quota", "1", "--scale_rewards", "none"],
    "seq_balance": [
        "--sampler", "seq_balance", "--positive_quota", "2", "--negative_quota", "2", "--scale_rewards", "none",
    ],
    "est": ["--sampler", "est", "--num_generations", "8", "--scale_rewards", "none"],
}  # fmt: skip


@pytest.mark.parametrize("method", sorted(METHOD_FLAGS))
def test_recipe_method_flags_on_a_base_file_match_the_full_recipe(method, tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "")

    def build(path, *flags):
        argv = ["--config", str(path), "--output_dir", str(tmp_path), "--bf16", "false", *flags]
        return _recipe_parser().parse_args_and_config(argv)[1]

    base = RECIPES / "models" / "qwen3-4b-instruct-2507.yaml"
    gas = yaml.safe_load(base.read_text())["gradient_accumulation_steps"] * (2 if method == "est" else 1)
    switched = build(base, *METHOD_FLAGS[method], "--gradient_accumulation_steps", str(gas))
    full = build(RECIPES / "qwen2.5-math-1.5b" / f"{method}.yaml", "--positive_threshold", "0.5")
    assert dataclasses.asdict(switched.sampler_settings()) == dataclasses.asdict(full.sampler_settings())
    rows = switched.per_device_train_batch_size * switched.gradient_accumulation_steps * 8
    assert rows // switched.num_generations == 512


def test_score_completions_awaits_an_async_reward():
    """An async reward (TRL awaits those; `code_execution` is one) is awaited, not returned as a coroutine."""
    from trl_ada.rewards import score_completions

    async def length_reward(completions, **kwargs):
        return [float(len(text)) for text in completions]

    assert score_completions(length_reward, ["p", "q"], [["a", "bb"], ["ccc"]]) == [[1.0, 2.0], [3.0]]
