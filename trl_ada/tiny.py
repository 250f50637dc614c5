"""A tiny character-level causal LM that runs (and learns) on CPU: the model of ``trl-ada train``'s embedded run
(``trl_ada/cli/train.py``, no model or dataset given), of the CPU benchmarks and of the tests.

Nothing here downloads anything: the tokenizer and the model are built in code, and a warm-started copy that already
half-knows the arithmetic task of [`trl_ada.tasks.arithmetic`] ships inside the package ([`TINY_ARITH_ASSETS`]). Both
load with the plain Auto classes (``AutoModelForCausalLM.from_pretrained(TINY_ARITH_ASSETS)``, likewise
``AutoTokenizer``), so they also stand in for a hub model. The warm start is [`build_warm_started`]; rebuild the
shipped copy with ``python scripts/build_tiny_model.py`` (its held-out accuracies are in its ``build_report.json``).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

logger = logging.getLogger(__name__)

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>")
"""Special tokens, in id order: ``<pad>`` is 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3."""

CHARACTERS: str = (
    "0123456789" + "+-*=()/.,^\\{}[]_:" + " " + "abcdefghijklmnopqrstuvwxyz" + "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
"""Every character the tokenizer knows; each is one token. Anything else becomes ``<unk>``."""

MODEL_MAX_LENGTH = 512

TINY_ARITH_VERSION = "tiny-arith-v1"
"""Name of the warm-started arithmetic model (cache sub-folder); bump it when the recipe changes."""

TINY_ARITH_ASSETS: Path = Path(__file__).resolve().parent / "assets" / "tiny-arith"
"""Where the shipped warm-started model lives inside the package."""

CACHE_ENV_VAR = "TRL_ADA_CACHE"
"""Environment variable that overrides the cache root (default ``~/.cache/trl_ada``)."""


def _byte_level_alphabet() -> dict[str, str]:
    """GPT-2's byte-to-unicode map (used by ``ByteLevel``), restricted to single-byte characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1)]
    printable += range(ord("\u00ae"), ord("\u00ff") + 1)
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[chr(byte)] = chr(byte)
        else:
            mapping[chr(byte)] = chr(256 + extra)
            extra += 1
    return mapping


def char_level_tokenizer(
    vocab: dict[str, int], *, character_pattern: str, unknown: str, model_max_length: int, **special_tokens: str
) -> PreTrainedTokenizerFast:
    """A left-padding word-level tokenizer over GPT-2's byte-level alphabet with one token per character: every match
    of ``character_pattern`` is its own pre-token, mapped to the byte-level alphabet (``" "`` -> ``"Ġ"``), and
    decoding maps back and joins with nothing in between. ``unknown`` is the vocabulary's fallback token;
    ``special_tokens`` (``pad_token=...``) go to ``PreTrainedTokenizerFast``."""
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unknown))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(character_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        **special_tokens,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Builds the character-level tokenizer: one token per character of [`CHARACTERS`], plus special tokens.

    No BOS is added and no chat template is set (prompts are plain text); ``tok.decode(tok(s).input_ids) == s`` for
    every string over [`CHARACTERS`] (other characters map to ``<unk>``). The vocabulary is in GPT-2's byte-level
    alphabet (the space token is ``"Ġ"``) because transformers 5 loads a tokenizer saved beside a ``Qwen2ForCausalLM``
    as ``Qwen2Tokenizer``, which rebuilds a byte-level pipeline: both pipelines then give the same ids and text.
    """
    alphabet = _byte_level_alphabet()
    tokens = [*SPECIAL_TOKENS, *(alphabet[char] for char in CHARACTERS)]
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise RuntimeError("Duplicate characters in the vocabulary.")
    special = dict(zip(("pad_token", "eos_token", "bos_token", "unk_token"), SPECIAL_TOKENS, strict=True))
    return char_level_tokenizer(
        vocab, character_pattern=".", unknown="<unk>", model_max_length=MODEL_MAX_LENGTH, **special
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 128,
    num_hidden_layers: int = 4,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 256,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """Builds a small randomly initialised ``Qwen2ForCausalLM`` for ``tokenizer`` (deterministic for ``seed``; tied
    embeddings). The default (~0.6M parameters, head size 32) is the smallest shape vLLM's CPU attention accepts;
    ``hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1`` is faster, for unit tests."""
    if hidden_size % num_attention_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be divisible by num_attention_heads ({num_attention_heads})."
        )
    if num_attention_heads % num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({num_attention_heads}) must be divisible by num_key_value_heads "
            f"({num_key_value_heads})."
        )
    special_ids = {f"{token}_token_id": getattr(tokenizer, f"{token}_token_id") for token in ("pad", "eos", "bos")}
    config = Qwen2Config(
        tie_word_embeddings=True,
        max_position_embeddings=MODEL_MAX_LENGTH,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        **special_ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    for key, token_id in special_ids.items():
        setattr(model.generation_config, key, token_id)
    return model


def save_tiny(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """Saves ``model`` (safetensors) and ``tokenizer`` to ``path`` so the Auto classes can load them."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # Batched calls leave padding switched on in the backend; keep it out of the saved tokenizer.json.
        backend.no_padding()
        backend.no_truncation()
    tokenizer.save_pretrained(path)
    return path


def load_tiny(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """Loads a model and tokenizer saved by [`save_tiny`] with ``AutoModelForCausalLM``/``AutoTokenizer``."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def corrupt_answer(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: half the time off by ±1..10, a quarter two adjacent digits swapped, a quarter one
    digit changed (single-digit answers are always shifted). Never equal to ``answer``, never negative, no leading
    zero."""
    value = int(answer)
    kind = rng.random()
    if kind >= 0.5 and len(answer) >= 2:
        digits = list(answer)
        if kind < 0.75:
            positions = [i for i in range(len(digits) - 1) if digits[i] != digits[i + 1] and (i or digits[1] != "0")]
            if positions:
                i = rng.choice(positions)
                digits[i], digits[i + 1] = digits[i + 1], digits[i]
                return "".join(digits)
        else:
            i = rng.randrange(len(digits))
            choices = [d for d in "0123456789" if d != digits[i] and (i or d != "0")]
            digits[i] = rng.choice(choices)
            return "".join(digits)
    while True:
        wrong = value + rng.choice([-1, 1]) * rng.randint(1, 10)
        if wrong >= 0 and wrong != value:
            return str(wrong)


def sft_step(model: Any, optimizer: Any, scheduler: Any, input_ids: Any, attention_mask: Any, labels: Any) -> Any:
    """One plain-torch SFT step on a batch (gradients clipped to norm 1, then optimizer and scheduler step); the loss."""
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def right_padded(
    sequences: Sequence[list[int]], labels: Sequence[list[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)`` of token sequences and their labels right-padded to the longest (labels
    with -100), so no real token's position depends on padding."""
    width = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    padded_labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, (sequence, label_row) in enumerate(zip(sequences, labels, strict=True)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention_mask[row, : len(sequence)] = 1
        padded_labels[row, : len(label_row)] = torch.tensor(label_row)
    return input_ids, attention_mask, padded_labels


def _sft_dataset(num_problems: int, *, seed: int, noise: float) -> Any:
    """Prompt-completion SFT data on training problems; a share ``noise`` of answers replaced by wrong ones."""
    from datasets import Dataset

    from .tasks.arithmetic import make_problems

    problems = make_problems(num_problems, seed=seed)
    rng = random.Random(f"noise-{seed}")
    completions = [
        corrupt_answer(problem["answer"], rng) if noise > 0 and rng.random() < noise else problem["answer"]
        for problem in problems
    ]
    return Dataset.from_dict({"prompt": [problem["prompt"] for problem in problems], "completion": completions})


def _run_sft(model: Any, tokenizer: Any, dataset: Any, **options: Any) -> None:
    """Completion-only SFT on CPU with TRL's ``SFTTrainer`` (the eos token is appended to every completion);
    ``options`` are the phase's own ``SFTConfig`` arguments (``max_steps``, ``seed``, the optimizer's, ...)."""
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        **options,
        weight_decay=0.0,
        completion_only_loss=True,
        max_length=32,
        logging_steps=max(options["max_steps"] // 5, 1),
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        bf16=False,
        fp16=False,
        dataloader_num_workers=0,
        data_seed=options["seed"],
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()


def build_warm_started(
    *,
    seed: int = 0,
    clean_steps: int = 1200,
    noisy_steps: int = 400,
    batch_size: int = 128,
    noise: float = 0.3,
    clean_problems: int | None = None,
    eval_problems: int = 600,
    eval_samples: int = 1,
    model_kwargs: dict[str, Any] | None = None,
) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast, dict[str, Any]]:
    """Builds the warm-started arithmetic model from scratch on CPU (deterministic for ``seed``).

    Phase 1: ``clean_steps`` steps of SFT with TRL's ``SFTTrainer`` on ``batch_size`` clean training problems each
    (AdamW lr 2e-3, cosine, completion-only loss); with ``clean_problems`` only that many distinct problems are drawn
    and cycled (faster, but a measurably weaker model). Phase 2 (``noisy_steps=0`` skips it): SFT on fresh problems
    where a share ``noise`` of answers is a plausible wrong one ([`corrupt_answer`]; lr 5e-4 constant after 30
    warm-up steps), so the skill is there but sampling at temperature 1 is noisy and GRPO has something to sharpen.
    After each phase the held-out accuracy at temperature 1 on ``eval_problems`` problems (0 skips it),
    ``eval_samples`` samples each, is logged. ``model_kwargs`` go to [`build_tiny_model`].

    Returns:
        ``(model, tokenizer, report)``; ``report`` holds the per-phase held-out accuracies and timings.
    """
    from transformers import set_seed

    from .tasks.arithmetic import accuracy_by_level, format_accuracy, held_out_problems

    set_seed(seed)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=seed, **(model_kwargs or {}))
    logger.info("Built tiny model: %d parameters", sum(p.numel() for p in model.parameters()))
    report: dict[str, Any] = {"seed": seed, "phases": {}}
    evaluation = held_out_problems(eval_problems, seed=seed) if eval_problems else []

    # Each phase: its name, steps, share of wrong answers and optimizer schedule (SFTConfig's options).
    clean = {"learning_rate": 2e-3, "lr_scheduler_type": "cosine", "warmup_steps": max(clean_steps // 30, 1)}
    phases = [("clean", clean_steps, 0.0, clean)]
    if noisy_steps:
        noisy = {"learning_rate": 5e-4, "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 30}
        phases.append(("noisy", noisy_steps, noise, noisy))
    with tempfile.TemporaryDirectory(prefix="trl_ada_sft_") as tmp:
        for index, (name, steps, phase_noise, schedule) in enumerate(phases):
            start = time.perf_counter()
            num = clean_problems if (name == "clean" and clean_problems) else steps * batch_size
            dataset = _sft_dataset(num, seed=seed * 1000 + index, noise=phase_noise)
            options = {"max_steps": steps, "per_device_train_batch_size": batch_size, "seed": seed, **schedule}
            _run_sft(model, tokenizer, dataset, output_dir=os.path.join(tmp, name), **options)
            elapsed = time.perf_counter() - start
            phase: dict[str, Any] = {"steps": steps, "seconds": elapsed}
            if evaluation:
                result = accuracy_by_level(
                    model, tokenizer, evaluation, temperature=1.0, num_samples=eval_samples, seed=seed
                )
                phase["held_out_t1"] = result
                logger.info(
                    "After %s SFT (%d steps, %.0f s): held-out T=1 %s", name, steps, elapsed, format_accuracy(result)
                )
            else:
                logger.info("After %s SFT (%d steps, %.0f s)", name, steps, elapsed)
            report["phases"][name] = phase
    model.config.use_cache = True  # the trainers switch it off for training
    model.eval()
    return model, tokenizer, report


def default_cache_dir(version: str = TINY_ARITH_VERSION) -> Path:
    """``$TRL_ADA_CACHE/<version>`` if the variable is set, else ``~/.cache/trl_ada/<version>`` (default: the
    arithmetic model's ``tiny-arith-v1``; the code task caches its model beside it)."""
    root = os.environ.get(CACHE_ENV_VAR)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "trl_ada"
    return base / version


def _is_saved_model(path: Path) -> bool:
    return all((path / name).is_file() for name in ("config.json", "model.safetensors", "tokenizer.json"))


def save_folder_atomically(
    path: Path, write: Callable[[Path], Any], *, is_complete: Callable[[Path], bool] = _is_saved_model
) -> None:
    """Writes the folder ``path`` with ``write(folder)`` into a temporary folder beside it, then renames that, so a
    concurrent or interrupted build never leaves a partial cache; a complete copy that another build renamed there
    first is kept (``is_complete`` says what complete is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    write(tmp)
    try:
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not is_complete(path):
            raise


def get_warm_started_model(cache_dir: str | os.PathLike[str] | None = None, *, seed: int = 0) -> tuple[Any, Any]:
    """Loads the warm-started model from ``cache_dir`` (default [`default_cache_dir`]), building and caching it
    first if it is not there (a few minutes on CPU)."""
    path = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if not _is_saved_model(path):
        logger.info("No warm-started model in %s; building it (SFT on CPU, a few minutes).", path)
        model, tokenizer, _ = build_warm_started(seed=seed)
        save_folder_atomically(path, lambda folder: save_tiny(model, tokenizer, folder))
    return load_tiny(path)


def load_tiny_arith_model(*, cache_dir: str | os.PathLike[str] | None = None) -> tuple[Any, Any]:
    """The warm-started arithmetic model and its tokenizer: the copy shipped in the package ([`TINY_ARITH_ASSETS`]),
    else [`get_warm_started_model`] (built once, then cached)."""
    if _is_saved_model(TINY_ARITH_ASSETS):
        return load_tiny(TINY_ARITH_ASSETS)
    logger.warning("Shipped tiny model not found at %s; falling back to the cache.", TINY_ARITH_ASSETS)
    return get_warm_started_model(cache_dir)
