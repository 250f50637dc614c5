"""A tiny tool-calling agent that runs on CPU: a calculator tool, a chat tokenizer TRL can parse tool calls with, and
a small Qwen2 taught (in code, in seconds) to call the tool in some of its sampled answers and not in others. A test
and benchmark fixture (see [`trl_ada.testing`]), not part of the training API.

Nothing is downloaded. The pieces plug into TRL's tool loop::

    model, tokenizer = get_tool_model()  # built once (seconds), then loaded from the cache
    trainer = GRPOTrainer(model, reward_funcs=[answer_reward], args=GRPOConfig(..., max_completion_length=40),
                          train_dataset=make_tool_dataset(64), processing_class=tokenizer, tools=[add])

The task is "What is a+b?" with digits a, b and a+b below 10. The warm-started model calls ``add`` in about half
its answers and then copies the tool's result; otherwise it answers directly, wrong half the time, so calling the tool
pays and GRPO has a reason to call it more. A call, the tool response and the final answer take about 25 completion
tokens, so ``max_completion_length=40`` leaves room for one round trip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import AddedToken
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2ForCausalLM
from trl.chat_template_utils import qwen2_5_chat_template

from ..tiny import (
    _byte_level_alphabet,
    build_tiny_model,
    char_level_tokenizer,
    default_cache_dir,
    right_padded,
    save_folder_atomically,
    sft_step,
)

logger = logging.getLogger(__name__)

TINY_TOOLS_VERSION = "tiny-tools-v1"
"""Prefix of the cached model's folder; bump it when the recipe changes."""

PAD_TOKEN = "<|endoftext|>"
END_OF_TURN = "<|im_end|>"
START_OF_TURN = "<|im_start|>"
TOOL_MARKERS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""One token each (as in Qwen's vocabulary), so the model opens a tool call with a single decision."""

MERGES: tuple[str, ...] = ("assistant\n", "user\n", '{"name": "add", "arguments": {"a": ', ', "b": ', "}}")
"""Multi-character tokens for the fixed parts of turns and of an ``add`` call (what BPE merges would give), so a tool
call is 10 tokens and a whole tool round trip about 25: the tiny model learns it in seconds."""

CHAT_CHARACTERS: str = "".join(chr(code) for code in range(32, 127)) + "\n"
"""Printable ASCII and the newline: every character the chat template, the JSON and the task need."""

MODEL_MAX_LENGTH = 512

DEFAULT_MODEL_KWARGS: dict[str, int] = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first integer.
        b: The second integer.

    Returns:
        The sum of a and b.
    """
    return a + b


def build_tool_tokenizer(tools: Sequence[Callable[..., Any]] = (add,)) -> PreTrainedTokenizerFast:
    """Builds a character-level chat tokenizer with TRL's Qwen2.5 chat template, ready for TRL's tool loop.

    Like [`trl_ada.tiny.build_char_tokenizer`], one token per character (here printable ASCII and ``"\\n"``). On top
    of that ``<|im_start|>`` and ``<|im_end|>`` (EOS: generation stops at the end of an assistant turn) are special
    tokens, ``<|endoftext|>`` pads, [`TOOL_MARKERS`] and [`MERGES`] are added tokens, and so is the system prompt the
    template writes for ``tools`` (so prompts stay ~40 tokens). ``chat_template`` is the exact text of TRL's
    ``qwen2_5.jinja``: ``add_response_schema`` matches on it to pick the parser for ``<tool_call>`` blocks.
    """
    alphabet = _byte_level_alphabet()
    specials = [PAD_TOKEN, END_OF_TURN, START_OF_TURN]
    tokens = [*specials, *(alphabet[char] for char in CHAT_CHARACTERS)]
    # `[\s\S]`, not `.`: Oniguruma's dot skips "\n", which must be a token of its own.
    tokenizer = char_level_tokenizer(
        {token: i for i, token in enumerate(tokens)},
        character_pattern=r"[\s\S]",
        unknown=PAD_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        pad_token=PAD_TOKEN,
        eos_token=END_OF_TURN,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [START_OF_TURN]})
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in (*TOOL_MARKERS, *MERGES)])
    tokenizer.chat_template = qwen2_5_chat_template
    if tools:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}], tools=list(tools), tokenize=False, add_generation_prompt=True
        )
        system_prompt = rendered.split(f"{START_OF_TURN}system\n", 1)[1].split(END_OF_TURN, 1)[0]
        # Added tokens match leftmost-longest, so this one wins over the tool markers it contains.
        tokenizer.add_tokens([AddedToken(system_prompt, special=False, normalized=False)])
    return tokenizer


def question(a: int, b: int) -> str:
    """The user's message for ``a + b``."""
    return f"What is {a}+{b}?"


def draw_sum(rng: random.Random) -> tuple[int, int]:
    """Two digits whose sum is a digit too: copying a one-token result is what a 2-layer model learns in seconds."""
    a = rng.randrange(10)
    return a, rng.randrange(10 - a)


def make_tool_dataset(num_rows: int, *, seed: int = 0) -> Any:
    """A conversational dataset of ``num_rows`` sums drawn by [`draw_sum`]: ``prompt`` (one user message) and
    ``answer`` (the sum, as text)."""
    from datasets import Dataset

    rng = random.Random(seed)
    pairs = [draw_sum(rng) for _ in range(num_rows)]
    prompts = [[{"role": "user", "content": question(a, b)}] for a, b in pairs]
    return Dataset.from_dict({"prompt": prompts, "answer": [str(a + b) for a, b in pairs]})


def final_answer(completion: list[dict[str, Any]]) -> str:
    """The text of the last assistant turn of a conversational completion (after any tool calls), stripped."""
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return str(message.get("content") or "").strip()
    return ""


def answer_reward(completions: list[list[dict[str, Any]]], answer: list[str], **kwargs: Any) -> list[float]:
    """1.0 when the final assistant turn is exactly the right sum, else 0.0 (a turn that only calls the tool, or was
    cut off before answering, scores 0)."""
    return [1.0 if final_answer(completion) == expected else 0.0 for completion, expected in zip(completions, answer)]


def _wrong_sum(value: int, rng: random.Random) -> str:
    while True:
        wrong = value + rng.choice([-3, -2, -1, 1, 2, 3])
        if 0 <= wrong <= 9:
            return str(wrong)


def tool_example(
    tokenizer: PreTrainedTokenizerFast, a: int, b: int, *, call_tool: bool, reply: str
) -> tuple[list[int], list[int]]:
    """One supervised example as TRL's tool loop would see it: ``(input_ids, loss_mask)``.

    Rendered with the chat template, so the tool call, the tool response and the turn markers are exactly what TRL
    generates and appends; the loss covers each assistant turn up to and including ``<|im_end|>``.
    """
    prompt = [{"role": "user", "content": question(a, b)}]
    prompt_text = tokenizer.apply_chat_template(prompt, tools=[add], tokenize=False, add_generation_prompt=True)
    if call_tool:
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        turns = [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "add", "content": str(add(a, b))},
            {"role": "assistant", "content": reply},
        ]
    else:
        turns = [{"role": "assistant", "content": reply}]
    full_text = tokenizer.apply_chat_template(prompt + turns, tools=[add], tokenize=False)
    if not full_text.startswith(prompt_text):
        raise RuntimeError("The chat template does not render the prompt as a prefix of the conversation.")
    # The template ends every turn with "<|im_end|>\n"; the model stops at "<|im_end|>".
    completion_text = full_text[len(prompt_text) :].removesuffix("\n")
    # Model turns end at "<|im_end|>"; what follows up to the next "<|im_start|>assistant\n" is the tool's block.
    input_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    loss_mask = [0] * len(input_ids)
    header = f"{START_OF_TURN}assistant\n"
    pieces = completion_text.split(header)
    for index, piece in enumerate(pieces):
        model_part, _, tool_part = piece.partition(END_OF_TURN)
        model_part += END_OF_TURN
        if index < len(pieces) - 1:
            tool_part += header
        for text, trained in ((model_part, 1), (tool_part, 0)):
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            input_ids += ids
            loss_mask += [trained] * len(ids)
    return input_ids, loss_mask


def _sft_batch(
    tokenizer: PreTrainedTokenizerFast,
    rng: random.Random,
    size: int,
    *,
    tool_share: float,
    wrong_share: float,
    rendered: dict[tuple[int, int, bool, str], tuple[list[int], list[int]]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    examples = []
    for _ in range(size):
        a, b = draw_sum(rng)
        call_tool = rng.random() < tool_share
        wrong = not call_tool and rng.random() < wrong_share
        reply = _wrong_sum(a + b, rng) if wrong else str(a + b)
        key = (a, b, call_tool, reply)
        if key not in rendered:  # a few hundred distinct conversations: render each once
            rendered[key] = tool_example(tokenizer, a, b, call_tool=call_tool, reply=reply)
        examples.append(rendered[key])
    labels = [[token if trained else -100 for token, trained in zip(ids, mask)] for ids, mask in examples]
    return right_padded([ids for ids, _ in examples], labels, tokenizer.pad_token_id)


def build_tool_model(
    *,
    seed: int = 0,
    steps: int = 300,
    batch_size: int = 32,
    learning_rate: float = 1e-2,
    tool_share: float = 0.5,
    wrong_share: float = 0.5,
    model_kwargs: dict[str, int] | None = None,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """Builds the tiny tool-calling model from scratch on CPU (deterministic for ``seed``; seconds on 2 cores).

    ``steps`` of supervised training (AdamW peaking at ``learning_rate``, cosine, loss on the model's turns only) on
    ``batch_size`` fresh conversations each: a share ``tool_share`` call ``add`` and then answer with its result; the
    others answer directly, wrong with probability ``wrong_share``. ``model_kwargs`` go to
    [`trl_ada.tiny.build_tiny_model`] (default [`DEFAULT_MODEL_KWARGS`]). Returns ``(model, tokenizer)``, the model in
    eval mode with its generation config stopping at ``<|im_end|>``.
    """
    tokenizer = build_tool_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **(model_kwargs or DEFAULT_MODEL_KWARGS))
    rng = random.Random(f"tiny-tools-{seed}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=learning_rate, total_steps=steps, pct_start=0.05, anneal_strategy="cos"
    )
    rendered: dict[tuple[int, int, bool, str], tuple[list[int], list[int]]] = {}
    model.train()
    start = time.perf_counter()
    threads = torch.get_num_threads()
    # Matrices this small gain nothing from a second thread, and lose a lot when other processes share the cores.
    torch.set_num_threads(1)
    try:
        for step in range(steps):
            input_ids, attention, labels = _sft_batch(
                tokenizer, rng, batch_size, tool_share=tool_share, wrong_share=wrong_share, rendered=rendered
            )
            loss = sft_step(model, optimizer, scheduler, input_ids, attention, labels)
            if step % 50 == 0 or step == steps - 1:
                logger.info(
                    "tiny tool model: step %d loss %.4f (%.1f s)", step, loss.item(), time.perf_counter() - start
                )
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return model, tokenizer


def _model_dir(cache_dir: str | os.PathLike[str] | None, params: dict[str, Any]) -> Path:
    """``<cache root>/tiny-tools-v1-<hash of params>``, the root being [`trl_ada.tiny.default_cache_dir`]'s parent."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir().parent
    return root / f"{TINY_TOOLS_VERSION}-{digest}"


def get_tool_model(
    cache_dir: str | os.PathLike[str] | None = None, **build_kwargs: Any
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """The tiny tool-calling model and its tokenizer: built by [`build_tool_model`] (``build_kwargs`` passed on) the
    first time for these parameters, then loaded from the cache (under ``cache_dir`` if given). Only the weights are
    cached: loaded back beside a Qwen2 config, the tokenizer would become a ``Qwen2Tokenizer``, so it is rebuilt."""
    path = _model_dir(cache_dir, build_kwargs)
    tokenizer = build_tool_tokenizer()
    if not (path / "model.safetensors").is_file():
        logger.info("No tiny tool model in %s; building it (a few seconds on CPU).", path)
        model, _ = build_tool_model(**build_kwargs)
        save_folder_atomically(
            path,
            lambda folder: model.save_pretrained(folder, safe_serialization=True),
            is_complete=lambda folder: (folder / "model.safetensors").is_file(),
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer
