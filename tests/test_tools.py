"""Tool calling (TRL's `tools=`) through the sampling rounds, with a tiny offline model that calls `add` in some draws.

Each round calls TRL's own `_generate`, which runs TRL's tool loop: a completion that calls the tool gets the tool's
response appended (tool_mask 0 there) and a final turn. Every kept row handed to TRL's loss must still carry its own
tool mask, tool response and reward.
"""

import importlib.util
import inspect
from pathlib import Path

import pytest
import torch
import transformers
from conftest import launch_two_processes, tiny_args
from packaging.version import Version
from tools_run import (
    TOOL_ARGS,
    expected_reward,
    expected_tool_mask,
    recording,
    tool_responses_line_up,
    train_seq_balance,
)
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import add_response_schema, is_chat_template_prefix_preserving, parse_response

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer
from trl_ada.testing.tiny_agents import add, answer_reward, build_tool_tokenizer, get_tool_model, make_tool_dataset

pytestmark = pytest.mark.skipif(
    Version(transformers.__version__) < Version("5.13") and importlib.util.find_spec("jmespath") is None,
    reason="GRPOTrainer's tools need transformers>=5.13 or jmespath (TRL's own requirement)",
)

SCRIPT = Path(__file__).parent / "tools_run.py"


@pytest.fixture(scope="module", autouse=True)
def cached_tool_model():
    """Builds the tiny tool model once per machine (~15 s), so each test (and each launched process) just loads it."""
    get_tool_model()


def test_tokenizer_renders_and_parses_tool_calls():
    tokenizer = build_tool_tokenizer()
    assert is_chat_template_prefix_preserving(tokenizer)  # TRL's tool loop relies on it
    add_response_schema(tokenizer)  # recognises the template text: no ValueError
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3+4?"}], tools=[add], add_generation_prompt=True, return_dict=False
    )
    assert len(prompt) < 40  # the tool system prompt is one token
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
    ids = tokenizer(call)["input_ids"]
    assert tokenizer.decode(ids) == call and len(ids) == 10
    # TRL 1.16 passes the tools to the parser; earlier releases take none.
    tools = {"tools": [add]} if "tools" in inspect.signature(parse_response).parameters else {}
    parsed = parse_response(tokenizer, ids, prefix=prompt, **tools)
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}]
    assert parse_response(tokenizer, tokenizer("7<|im_end|>")["input_ids"], prefix=prompt, **tools) == {
        "role": "assistant",
        "content": "7",
    }


def test_answer_reward_reads_the_final_turn():
    called = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "add"}}]},
        {"role": "tool", "name": "add", "content": "7"},
        {"role": "assistant", "content": "7"},
    ]
    cut_off = called[:2]
    direct = [{"role": "assistant", "content": "6"}]
    assert answer_reward([called, cut_off, direct], answer=["7", "7", "7"]) == [1.0, 0.0, 0.0]


def train(trainer_class, config):
    model, tokenizer = get_tool_model()
    trainer = recording(trainer_class)(
        model,
        [answer_reward],
        args=config,
        train_dataset=make_tool_dataset(64),
        processing_class=tokenizer,
        tools=[add],
    )
    trainer.train()
    return trainer


def test_grpo_trainer_runs_the_tool_loop_on_some_draws(tmp_path):
    trainer = train(GRPOTrainer, GRPOConfig(**tiny_args(tmp_path, max_steps=2, **TOOL_ARGS)))
    frequencies = [
        entry["tools/call_frequency"] for entry in trainer.state.log_history if "tools/call_frequency" in entry
    ]
    assert len(frequencies) == 2 and all(0 < f < 1 for f in frequencies), frequencies
    tokenizer = trainer.processing_class
    for record in trainer.recorded:
        assert (record["tool_mask"] == 0).any() and (record["tool_mask"] == 0).sum(1).eq(0).any()
        for ids, mask, tool_mask in zip(record["completion_ids"], record["completion_mask"], record["tool_mask"]):
            ids = ids[mask.bool()].tolist()
            assert tool_mask[: len(ids)].tolist() == expected_tool_mask(ids, tokenizer)
            assert tool_responses_line_up(ids, tokenizer)


def test_uniform_with_tools_reproduces_grpo_trainer(tmp_path):
    common = tiny_args(tmp_path, max_steps=3, **TOOL_ARGS)
    grpo = train(GRPOTrainer, GRPOConfig(**common))
    ada = train(AdaGRPOTrainer, AdaGRPOConfig(**common, sampler="uniform"))
    assert len(grpo.recorded) == len(ada.recorded) == 3
    for expected, actual in zip(grpo.recorded, ada.recorded):
        for key in ("completion_ids", "completion_mask", "advantages", "tool_mask"):
            assert torch.equal(expected[key], actual[key]), key
        assert (actual["tool_mask"] == 0).any()  # the tool was called and its response masked out of the loss
    assert any(record["advantages"].abs().sum() > 0 for record in ada.recorded)
    losses = [[entry["loss"] for entry in t.state.log_history if "loss" in entry] for t in (grpo, ada)]
    assert losses[0] == losses[1]
    for (name, expected), actual in zip(grpo.model.named_parameters(), ada.model.parameters()):
        assert torch.equal(actual, expected), name


def test_seq_balance_with_tools_keeps_tool_masks_and_rewards_with_their_rows(tmp_path):
    trainer, initial = train_seq_balance(tmp_path)
    # The rounds drew more than n for some prompt (else this would test a plain GRPO batch) ...
    assert any(size > 4 for sizes in trainer.pool_sizes for size in sizes), trainer.pool_sizes
    # ... and every row handed to TRL's loss carries its own tool mask, tool response and reward.
    assert len(trainer.handed_over) == 3
    for batch in trainer.handed_over:
        assert batch["rows"] == 16
        assert batch["masks_line_up"] and batch["responses_line_up"] and batch["rewards_line_up"], batch
    # Both kinds of row were trained on: some called the tool, some answered directly.
    assert all(0 < batch["rows_with_tool_output"] < 16 for batch in trainer.handed_over)
    for record in trainer.recorded:
        assert (record["tool_mask"] == 0).any()


def test_expected_reward_matches_answer_reward():
    # The test oracle agrees with the product reward on a called, a direct and a wrong completion.
    tokenizer = build_tool_tokenizer()
    add_response_schema(tokenizer)
    prompt = [{"role": "user", "content": "What is 3+4?"}]
    suffix = "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call><|im_end|>'
    for text, reward in ((call + suffix + "7<|im_end|>", 1.0), ("7<|im_end|>", 1.0), ("8<|im_end|>", 0.0)):
        assert expected_reward(prompt, tokenizer(text)["input_ids"], tokenizer) == reward


@pytest.mark.slow
def test_seq_balance_with_tools_on_two_processes(tmp_path):
    reports = launch_two_processes(SCRIPT, tmp_path, timeout=300)
    assert [(r["num_processes"], r["process_index"]) for r in reports] == [(2, 0), (2, 1)]
    for report in reports:
        assert len(report["handed_over"]) == 3
        for batch in report["handed_over"]:
            assert batch["rows"] == 8
            assert batch["masks_line_up"] and batch["responses_line_up"] and batch["rewards_line_up"], batch
        assert any(batch["rows_with_tool_output"] > 0 for batch in report["handed_over"])
        assert any(size > 4 for sizes in report["pool_sizes"] for size in sizes)
        assert any(0 < f < 1 for f in report["call_frequency"])
    # Both processes trained, in step: the weights moved, and to the same place.
    assert reports[0]["final_weights"] == reports[1]["final_weights"] != reports[0]["initial_weights"]
    assert reports[0]["pool_sizes"] == reports[1]["pool_sizes"]
    # Some kept rows changed process, so the line-up covers rows routed between processes.
    assert any(moved > 0 for moved in reports[0]["moved"]), reports[0]["moved"]
