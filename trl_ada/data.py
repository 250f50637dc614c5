"""Prompt datasets for math RL: loading (hub or local files), checks that fail before training, TRL's prompt-only
format, and batched sampling of completions (transformers, or vLLM when installed) for ``trl-ada prepare-data`` and
``trl-ada evaluate``, with prompts tokenised as TRL's ``GRPOTrainer`` does, so a pass rate measured here is the one
training sees.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

Prompt = str | list[dict[str, Any]]
"""A prompt in TRL's prompt-only format: a string, or a list of chat messages."""

DEFAULT_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
"""System prompt of the paper's authors (their ``eval/gen_data.py`` and ``data_process/reformat.py``)."""

DEFAULT_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
"""Instruction the paper's authors append to every problem (after a space)."""

_FILE_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
_TOKENIZE_CHUNK = 1024


def _is_saved_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (
        (path / "dataset_info.json").is_file() and (path / "state.json").is_file()
    )


def _select_split(dataset: Any, split: str, source: str) -> Any:
    from datasets import DatasetDict

    if isinstance(dataset, DatasetDict):
        if split not in dataset:
            raise ValueError(f"{source} has no split {split!r}; it has {sorted(dataset)}. Pass one of them as split.")
        return dataset[split]
    return dataset


def load_prompt_dataset(
    name_or_path: str | os.PathLike[str], split: str = "train", config: str | None = None, *, streaming: bool = False
) -> Any:
    """Loads one ``split`` (a `datasets.Dataset`, or a `datasets.IterableDataset` when ``streaming``) of a prompt
    dataset: a directory written by ``save_to_disk``; a ``.parquet``, ``.jsonl``/``.json`` or ``.csv`` file (the file
    is the split); a directory of such files (splits inferred from names like ``train.jsonl``); or a hub dataset id
    (``config``: its configuration). A path that does not exist raises `FileNotFoundError` naming
    ``trl-ada prepare-data``, which makes the prepared files the shipped recipes read.
    """
    import datasets

    path = Path(name_or_path).expanduser()
    source = str(name_or_path)
    if path.is_dir():
        if _is_saved_to_disk(path):
            logger.info("Loading the dataset saved with save_to_disk at %s.", path)
            dataset = _select_split(datasets.load_from_disk(str(path)), split, source)
            return dataset.to_iterable_dataset() if streaming else dataset
        builders = {_FILE_BUILDERS[p.suffix.lower()] for p in path.rglob("*") if p.suffix.lower() in _FILE_BUILDERS}
        if not builders:
            raise ValueError(
                f"{source} is a directory with neither a save_to_disk dataset nor any "
                f"{'/'.join(sorted(_FILE_BUILDERS))} file. Point to a file, or save the dataset with "
                "dataset.save_to_disk(path)."
            )
        logger.info("Loading the %s files under %s.", "/".join(sorted(builders)), path)
        return datasets.load_dataset(str(path), name=config, split=split, streaming=streaming)
    if path.is_file():
        builder = _FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"Cannot tell the format of {source}: expected a file ending in {sorted(_FILE_BUILDERS)}, a directory "
                "saved with save_to_disk, or a hub dataset id."
            )
        logger.info("Loading %s as %s (split %r).", path, builder, split)
        empty = f"The dataset file {source} is empty (0 rows). Point --dataset_name to a file with rows."
        if path.stat().st_size == 0:
            raise ValueError(empty)
        try:
            return datasets.load_dataset(builder, data_files={split: str(path)}, split=split, streaming=streaming)
        except ValueError as error:
            if "corresponds to no data" in str(error):  # `datasets`' wording for a file without rows
                raise ValueError(empty) from error
            raise
    if path.suffix.lower() in _FILE_BUILDERS or source.startswith((".", "/", "~")):
        raise FileNotFoundError(
            f"No such dataset file or directory: {source}. If it is a prepared training set (the shipped recipes read "
            "data/openr1_<model>.parquet), make it with `trl-ada prepare-data` (e.g. `trl-ada prepare-data "
            "--dataset_name open-r1/OpenR1-Math-220k --dataset_config default --model_name_or_path <base model> "
            f"--use_vllm --num_samples 16 --pass_rate_band 0 0.375 --output {source}`; `trl-ada prepare-data --help` "
            "lists the flags), or point --dataset_name to an existing file, directory or hub dataset."
        )
    logger.info("Loading %s (config %r, split %r) from the hub.", source, config, split)
    return datasets.load_dataset(source, name=config, split=split, streaming=streaming)


def dataset_columns(dataset: Any) -> list[str]:
    """The column names of a `datasets.Dataset` or `datasets.IterableDataset` (a stream whose features are not
    declared, e.g. JSON lines, is read for its first row)."""
    if dataset.column_names is not None:
        return list(dataset.column_names)
    first = next(iter(dataset.take(1)), None)
    return list(first) if first is not None else []


def is_conversational_prompt(prompt: Any) -> bool:
    """Whether a prompt is a list of chat messages (TRL's conversational format) rather than a string."""
    from trl.data_utils import is_conversational

    return is_conversational({"prompt": prompt})


def make_prompt(
    problem: str, *, system_prompt: str | None = None, instruction: str | None = None, conversational: bool = True
) -> Prompt:
    """One prompt in TRL's format: ``[system?, user]`` messages, or a string (``system + "\\n" + problem``), with
    ``instruction`` appended to the problem after a space, as the paper's authors do."""
    text = problem if isinstance(problem, str) else str(problem)
    if instruction:
        text = f"{text} {instruction}"
    if conversational:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return [*messages, {"role": "user", "content": text}]
    return f"{system_prompt}\n{text}" if system_prompt else text


def wants_chat_messages(prompt_format: str, tokenizer: Any) -> bool:
    """Whether ``--prompt_format`` (``auto``, ``conversational`` or ``text``) builds chat messages; ``auto`` does when
    the tokenizer has a chat template, or when there is no tokenizer."""
    if prompt_format == "auto":
        return tokenizer is None or bool(getattr(tokenizer, "chat_template", None))
    return prompt_format == "conversational"


def to_prompt_format(
    dataset: Any,
    problem_column: str = "problem",
    solution_column: str = "solution",
    system_prompt: str | None = None,
    conversational: bool = True,
    *,
    instruction: str | None = None,
    keep_columns: Sequence[str] | None = None,
    num_proc: int | None = None,
) -> Any:
    """Maps a problem/answer dataset to TRL's prompt-only format, as TRL's GRPO examples do (``make_conversation``):
    a ``prompt`` column ([`make_prompt`] of ``problem_column``) and the reference answer as ``solution``, where
    [`trl_ada.rewards.math_verify_reward`] (and TRL's ``accuracy_reward``) read it, replacing an existing ``solution``
    column (OpenR1's worked solutions when ``solution_column="answer"``). ``keep_columns=None`` keeps every column.
    """
    from datasets import IterableDataset

    columns = dataset_columns(dataset)
    missing = [column for column in (problem_column, solution_column) if column not in columns]
    if missing:
        raise ValueError(
            f"to_prompt_format needs column(s) {missing}, but the dataset has {columns}. Pass "
            "problem_column=/solution_column= (scripts: --problem_column/--answer_column) naming the right ones."
        )
    if solution_column != "solution":
        if "solution" in columns:
            logger.info("Replacing the existing 'solution' column with %r (the reference answer).", solution_column)
            dataset = dataset.remove_columns("solution")
        dataset = dataset.rename_column(solution_column, "solution")

    def convert(example: dict[str, Any]) -> dict[str, Any]:
        return {
            "prompt": make_prompt(
                example[problem_column],
                system_prompt=system_prompt,
                instruction=instruction,
                conversational=conversational,
            )
        }

    if isinstance(dataset, IterableDataset):  # mapped lazily, row by row: no processes, no progress bar
        dataset = dataset.map(convert)
    else:
        dataset = dataset.map(convert, num_proc=num_proc, desc="Formatting prompts")
    if keep_columns is not None:
        keep = {"prompt", "solution", *keep_columns}
        dataset = dataset.remove_columns([column for column in dataset_columns(dataset) if column not in keep])
    return dataset


def _column_hint(missing: str, existing: Sequence[str]) -> str:
    if missing == "prompt" and "problem" in existing:
        return "build 'prompt' from 'problem' with trl_ada.data.to_prompt_format(dataset) or `trl-ada prepare-data`"
    close = difflib.get_close_matches(missing, existing, n=1, cutoff=0.5)
    if missing == "solution" and "answer" in existing:
        close = ["answer"]
    if close:
        return f"rename {close[0]!r} to {missing!r} (dataset.rename_column({close[0]!r}, {missing!r}))"
    return f"add a {missing!r} column to the dataset"


def tokenize_prompts(tokenizer: Any, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of prompts, exactly as TRL's ``GRPOTrainer`` builds them: the chat template with a generation prompt
    for conversational prompts (`ValueError` when the tokenizer has none), plain tokenisation for text."""
    if not prompts:
        return []
    ids: list[list[int]] = []
    conversational = is_conversational_prompt(prompts[0])
    if conversational and not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "The prompts are chat messages but the tokenizer has no chat template. Use a chat model's tokenizer, set "
            "tokenizer.chat_template, or format the prompts as plain text (to_prompt_format(..., "
            "conversational=False); scripts: --prompt_format text)."
        )
    for start in range(0, len(prompts), _TOKENIZE_CHUNK):
        chunk = list(prompts[start : start + _TOKENIZE_CHUNK])
        if conversational:
            encoded = tokenizer.apply_chat_template(
                conversation=chunk, add_generation_prompt=True, tokenize=True, return_dict=True
            )
        else:
            encoded = tokenizer(text=chunk)
        ids.extend(list(row) for row in encoded["input_ids"])
    return ids


def check_prompt_column(dataset: Any) -> None:
    """GRPOTrainer reads prompts from a `prompt` column; say so at construction rather than at the first step.
    Passes for `None` and for a dataset that does not declare its columns (a stream without features)."""
    columns = getattr(dataset, "column_names", None)
    if dataset is None or columns is None or "prompt" in columns:
        return
    raise ValueError(
        f"train_dataset has no 'prompt' column (columns: {list(columns)}). AdaGRPOTrainer, like GRPOTrainer, reads "
        "each prompt from 'prompt': rename yours, e.g. dataset.rename_column('question', 'prompt')."
    )


def validate_prompt_dataset(
    dataset: Any,
    required_columns: Iterable[str],
    *,
    tokenizer: Any = None,
    max_prompt_length: int | None = None,
    prompt_column: str = "prompt",
    length_flag: str = "--max_prompt_length",
) -> None:
    """Checks a prompt dataset before any training starts; raises a `ValueError` that names the fix.

    Checks, in order: ``prompt_column`` and the ``required_columns`` (what the reward functions read) exist; the
    dataset is not empty; and, when ``tokenizer`` and ``max_prompt_length`` are given, no prompt is longer than that
    many tokens (tokenised as the trainer does). ``length_flag`` is the flag the error message names for the limit.
    """
    existing = list(dataset.column_names)
    required = [prompt_column, *[column for column in required_columns if column != prompt_column]]
    missing = [column for column in required if column not in existing]
    if missing:
        hints = "; ".join(f"{column!r}: {_column_hint(column, existing)}" for column in missing)
        raise ValueError(
            f"The dataset is missing column(s) {missing}; it has {existing} and training needs {required} (the "
            f"prompt plus the columns the reward functions read). Fix: {hints}."
        )
    if len(dataset) == 0:
        raise ValueError(
            "The dataset is empty (0 rows). Check --dataset_name and --dataset_train_split, and, for data from "
            "`trl-ada prepare-data`, its report: a pass-rate band or filter that removes every prompt leaves nothing "
            "to train on (widen --pass_rate_band / --correct_range)."
        )
    if max_prompt_length is None or tokenizer is None:
        return
    if max_prompt_length < 1:
        raise ValueError(f"{length_flag} must be >= 1, got {max_prompt_length}.")
    prompts = dataset[prompt_column]
    lengths = [len(ids) for ids in tokenize_prompts(tokenizer, prompts)]
    too_long = [index for index, length in enumerate(lengths) if length > max_prompt_length]
    if too_long:
        longest = max(too_long, key=lengths.__getitem__)
        raise ValueError(
            f"{len(too_long)} of {len(lengths)} prompts are longer than {length_flag.lstrip('-')}="
            f"{max_prompt_length} tokens (the first is row {too_long[0]} with {lengths[too_long[0]]} tokens; the "
            f"longest is row {longest} with {lengths[longest]} tokens). Raise {length_flag} to at least "
            f"{lengths[longest]}, or drop the long prompts (trl-ada prepare-data --max_prompt_length "
            f"{max_prompt_length})."
        )


class CompletionGenerator(Protocol):
    """Anything that draws ``num_samples`` completions (decoded text) for each prompt."""

    def __call__(self, prompts: Sequence[Prompt], num_samples: int) -> list[list[str]]: ...


def is_vllm_available() -> bool:
    """Whether vLLM can be imported."""
    return importlib.util.find_spec("vllm") is not None


class TransformersGenerator:
    """Batched sampling with ``model.generate`` (left padding), as TRL's non-vLLM generation path: ``temperature`` 0
    decodes greedily, ``top_k`` is off (as in vLLM's defaults), ``batch_size`` counts (prompt, sample) rows per
    ``generate`` call, and ``seed`` is set before each call."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        batch_size: int = 64,
        seed: int = 0,
        progress: bool = True,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}.")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        self.seed = seed
        self.progress = progress

    @classmethod
    def from_pretrained(
        cls, model_name_or_path: str, *, dtype: str = "auto", device: str | None = None, **kwargs: Any
    ) -> TransformersGenerator:
        """Loads a model and tokenizer (local directory or hub id) and wraps them."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            # bf16/fp16 matmuls are slow or unsupported on many CPUs; keep the checkpoint's dtype on accelerators only.
            torch_dtype: Any = "auto" if device != "cpu" else torch.float32
        else:
            torch_dtype = getattr(torch, dtype)
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(model_name_or_path, dtype=torch_dtype).to(device)
        return cls(model, tokenizer, **kwargs)

    def __call__(self, prompts: Sequence[Prompt], num_samples: int) -> list[list[str]]:
        """``num_samples`` completions for each prompt, in prompt order."""
        import torch
        from tqdm.auto import tqdm
        from transformers import set_seed

        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}.")
        prompt_ids = tokenize_prompts(self.tokenizer, prompts)
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        # Rows sorted by prompt length keep padding small; each row is one (prompt, sample) pair.
        order = sorted(range(len(prompts)), key=lambda i: len(prompt_ids[i]))
        rows = [index for index in order for _ in range(num_samples)]
        results: list[list[str]] = [[] for _ in prompts]
        # Stop where the model's generation config says (chat models list their end-of-turn token there, as vLLM
        # reads it); fall back to the tokenizer's eos.
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "pad_token_id": pad_id,
            "eos_token_id": eos if eos is not None else self.tokenizer.eos_token_id,
            "repetition_penalty": 1.0,  # pure sampling, whatever the checkpoint's generation config suggests
        }
        if self.temperature > 0:
            gen_kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0)
        else:
            gen_kwargs.update(do_sample=False)
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        set_seed(self.seed)
        batches = range(0, len(rows), self.batch_size)
        with torch.no_grad():
            for start in tqdm(batches, desc="Sampling", disable=not self.progress, unit="batch"):
                batch = rows[start : start + self.batch_size]
                width = max(len(prompt_ids[i]) for i in batch)
                input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, index in enumerate(batch):
                    ids = prompt_ids[index]
                    if ids:
                        input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                        attention_mask[row, width - len(ids) :] = 1
                output = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **gen_kwargs
                )
                texts = self.tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
                for index, text in zip(batch, texts, strict=True):
                    results[index].append(text)
        self.model.train(was_training)
        return results


class VLLMGenerator:
    """Sampling with an in-process ``vllm.LLM`` (prompts passed as token ids, tokenised as TRL does), through vLLM's
    documented offline API (not run by the CPU tests)."""

    def __init__(
        self,
        model_name_or_path: str,
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        progress: bool = True,
        # The engine's own settings (`vllm.LLM`'s).
        max_model_len: int | None = None,
        seed: int = 0,
        dtype: str = "auto",
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
    ) -> None:
        from transformers import AutoTokenizer
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
        self.llm = LLM(
            model=model_name_or_path,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
        )
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.progress = progress

    def __call__(self, prompts: Sequence[Prompt], num_samples: int) -> list[list[str]]:
        """``num_samples`` completions for each prompt, in prompt order."""
        from vllm import SamplingParams

        params = SamplingParams(
            n=num_samples, temperature=self.temperature, top_p=self.top_p, top_k=-1, max_tokens=self.max_new_tokens
        )
        requests = [{"prompt_token_ids": ids} for ids in tokenize_prompts(self.tokenizer, prompts)]
        outputs = self.llm.generate(requests, sampling_params=params, use_tqdm=self.progress)
        return [[completion.text for completion in output.outputs] for output in outputs]


def load_generator(
    model_name_or_path: str,
    *,
    max_new_tokens: int,
    use_vllm: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
    dtype: str = "auto",
    gpu_memory_utilization: float = 0.9,
    tensor_parallel_size: int = 1,
    progress: bool = True,
) -> CompletionGenerator:
    """A completion generator for a checkpoint: vLLM when ``use_vllm`` and vLLM is installed, else transformers."""
    if use_vllm and not is_vllm_available():
        logger.warning("--use_vllm was set but vLLM is not installed; sampling with transformers instead (slower).")
        use_vllm = False
    shared: dict[str, Any] = dict(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed, dtype=dtype, progress=progress
    )
    if use_vllm:
        return VLLMGenerator(
            model_name_or_path,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            **shared,
        )
    return TransformersGenerator.from_pretrained(model_name_or_path, batch_size=batch_size, **shared)


__all__ = [
    "DEFAULT_INSTRUCTION",
    "DEFAULT_SYSTEM_PROMPT",
    "CompletionGenerator",
    "TransformersGenerator",
    "VLLMGenerator",
    "dataset_columns",
    "is_conversational_prompt",
    "is_vllm_available",
    "load_generator",
    "load_prompt_dataset",
    "make_prompt",
    "to_prompt_format",
    "tokenize_prompts",
    "validate_prompt_dataset",
]


def add_sampling_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """Adds the sampling flags `trl-ada prepare-data` and `trl-ada evaluate` share (read by [`generator_from_args`])."""
    parser.add_argument("--max_new_tokens", type=int, default=4096)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top_p", type=float, default=1.0)
    parser.add_argument("--use_vllm", action="store_true", help="Sample with vLLM when it is installed.")
    parser.add_argument("--batch_size", type=int, default=64, help="Rows per transformers generate call.")
    parser.add_argument("--dtype", default="auto", help="Model dtype: auto, bfloat16, float16, float32.")
    parser.add_argument("--gpu_memory_utilization", type=float, default=0.9, help="vLLM only.")
    parser.add_argument("--tensor_parallel_size", type=int, default=1, help="vLLM only.")
    parser.add_argument("--seed", type=int, default=0)


def generator_from_args(args: Any) -> Any:
    """`load_generator` configured from the sampling flags shared by `trl-ada prepare-data` and `trl-ada evaluate`."""
    return load_generator(
        args.model_name_or_path,
        max_new_tokens=args.max_new_tokens,
        use_vllm=args.use_vllm,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        batch_size=args.batch_size,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
    )
