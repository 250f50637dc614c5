"""Tool calling through the sampling rounds: shared checks, and a two-process run.

Imported by tests/test_tools.py for `recording` and the row checks; launched by it under `accelerate launch --multi_gpu
--num_processes 2` (gloo on CPU) to train seq_balance with TRL's tool loop on two processes and write, per rank, whether
every kept row it trained on carries its own tool mask and reward, and a fingerprint of the final weights.

A row's tool mask and reward are recomputed from its completion ids alone: the model's turns end at `<|im_end|>`, and
what TRL appended after a tool-calling turn runs up to the next `<|im_start|>assistant\\n` and must be the response of
`add` to that row's own call.
"""

import hashlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from conftest import shut_down_distributed, tiny_args  # noqa: E402

from trl_ada import AdaGRPOConfig, AdaGRPOTrainer  # noqa: E402
from trl_ada.testing.tiny_agents import add, answer_reward, get_tool_model, make_tool_dataset  # noqa: E402

TOOL_ARGS = dict(max_completion_length=40, max_tool_calling_iterations=2)
"""One tool round trip is ~25 completion tokens; the tiny model calls once, a cap keeps a stray loop short."""


def expected_tool_mask(completion_ids: list[int], tokenizer) -> list[int]:
    """0 on what TRL appended after a model turn (from after `<|im_end|>` through the next assistant header), else 1."""
    header = tokenizer.convert_tokens_to_ids("assistant\n")
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    mask, in_tool, previous = [], False, None
    for token in completion_ids:
        mask.append(0 if in_tool else 1)
        if in_tool and previous == start and token == header:
            in_tool = False
        elif not in_tool and token == tokenizer.eos_token_id:
            in_tool = True
        previous = token
    return mask


def tool_responses_line_up(completion_ids: list[int], tokenizer) -> bool:
    """Each tool block in the completion answers the call in the model turn right before it (same row)."""
    text = tokenizer.decode(completion_ids)
    calls = re.findall(r'"arguments": \{"a": (\d), "b": (\d)\}\}\n</tool_call><\|im_end\|>', text)
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text)
    return len(calls) >= len(responses) and responses == [str(add(int(a), int(b))) for a, b in calls[: len(responses)]]


def expected_reward(prompt: list[dict], completion_ids: list[int], tokenizer) -> float:
    """`answer_reward` recomputed from the row's own tokens: its last model turn must be the sum its prompt asks."""
    a, b = re.fullmatch(r"What is (\d)\+(\d)\?", prompt[-1]["content"]).groups()
    last_turn = tokenizer.decode(completion_ids).split("<|im_start|>assistant\n")[-1]
    return 1.0 if last_turn.removesuffix("<|im_end|>").strip() == str(int(a) + int(b)) else 0.0


def recording(trainer_class):
    class Recording(trainer_class):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            self.__dict__.setdefault("recorded", []).append(
                {key: output[key].detach().clone() for key in ("completion_ids", "completion_mask", "advantages")}
                | {"tool_mask": None if output.get("tool_mask") is None else output["tool_mask"].detach().clone()}
            )
            return output

        def _generate(self, prompts):
            kept = getattr(self, "_ada_pending", None) is not None
            output = super()._generate(prompts)
            if kept:  # the kept rows handed to TRL's loss: check each against its own completion
                _, completion_ids, tool_mask, _, _, _, _, _ = output
                tokenizer = self.processing_class
                start = self.accelerator.process_index * len(completion_ids)
                rewards = self._ada_pending.rewards[start : start + len(completion_ids), 0].tolist()
                self.__dict__.setdefault("handed_over", []).append(
                    {
                        "rows": len(completion_ids),
                        "masks_line_up": tool_mask == [expected_tool_mask(ids, tokenizer) for ids in completion_ids],
                        "responses_line_up": all(tool_responses_line_up(ids, tokenizer) for ids in completion_ids),
                        "rewards_line_up": rewards
                        == [expected_reward(p, ids, tokenizer) for p, ids in zip(prompts, completion_ids)],
                        "rows_with_tool_output": sum(0 in mask for mask in tool_mask),
                    }
                )
            return output

        def _log_selection(self, selection):
            self.__dict__.setdefault("pool_sizes", []).append([len(pool) for pool in selection.pools])
            super()._log_selection(selection)

    return Recording


def weights_fingerprint(model) -> str:
    digest = hashlib.sha256()
    for name, parameter in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def train_seq_balance(output_dir: Path, **overrides):
    model, tokenizer = get_tool_model()
    config = AdaGRPOConfig(
        **tiny_args(output_dir, **{**dict(max_steps=3, per_device_train_batch_size=16), **TOOL_ARGS, **overrides}),
        sampler="seq_balance",
        round_size=4,
        max_rounds=4,
    )
    trainer = recording(AdaGRPOTrainer)(
        model,
        [answer_reward],
        args=config,
        train_dataset=make_tool_dataset(64),
        processing_class=tokenizer,
        tools=[add],
    )
    initial = weights_fingerprint(trainer.model)
    trainer.train()
    return trainer, initial


def main() -> None:
    out_dir = Path(sys.argv[1])
    # No PartialState before the trainer: the first one fixes the distributed setup for the whole process.
    trainer, initial = train_seq_balance(out_dir / "tools", per_device_train_batch_size=8)
    report = {
        "num_processes": trainer.accelerator.num_processes,
        "process_index": trainer.accelerator.process_index,
        "handed_over": trainer.handed_over,
        "pool_sizes": trainer.pool_sizes,
        "call_frequency": [
            e["tools/call_frequency"] for e in trainer.state.log_history if "tools/call_frequency" in e
        ],
        "moved": [e["ada/kept_rows_moved"] for e in trainer.state.log_history if "ada/kept_rows_moved" in e],
        "initial_weights": initial,
        "final_weights": weights_fingerprint(trainer.accelerator.unwrap_model(trainer.model)),
    }
    (out_dir / f"rank{report['process_index']}.json").write_text(json.dumps(report))
    del trainer
    shut_down_distributed()


if __name__ == "__main__":
    main()
