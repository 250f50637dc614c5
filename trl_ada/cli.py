"""
The `trl-ada` command line. `trl-ada simulate` plans a sampling budget with no model and no GPU; `trl-ada train` runs
the main job (`trl_ada.train`, the code of `scripts/train_ada.py`); `trl-ada prepare-data` and `trl-ada evaluate` are
`scripts/prepare_data.py` and `scripts/evaluate.py` (`trl_ada.prepare_data`, `trl_ada.evaluate`), with the same flags.

Import-light: only `trl-ada train`, `prepare-data` and `evaluate` import torch, transformers or TRL. `trl-ada train
--help` answers from a cached copy of its text when the installation has not changed since it was built.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import types
import typing
import warnings
from collections.abc import Callable, Sequence
from dataclasses import Field, fields
from importlib.metadata import version
from pathlib import Path
from typing import Any

from .samplers import SamplerSettings, sampler_names, simulate
from .samplers.simulate import ARRIVALS, GENERATION_SCHEDULES


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _parse_optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_or_none(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    return parse_or_none


_PARSERS: dict[type, Callable[[str], Any]] = {int: int, float: float, bool: _parse_bool, str: str}


def _knob_parser(declared: Field) -> Callable[[str], Any]:
    # The resolved annotation (HfArgumentParser also resolves `Field.type` in place, so the text cannot be relied on):
    # its first type parses (a dict is given as JSON text), and "None" is accepted when it allows None.
    annotation = typing.get_type_hints(SamplerSettings)[declared.name]
    members = (
        typing.get_args(annotation)
        if isinstance(annotation, types.UnionType) or (typing.get_origin(annotation) is typing.Union)
        else (annotation,)
    )
    first = next(member for member in members if member is not type(None))
    parse = _PARSERS.get(first, str)
    return _parse_optional(parse) if type(None) in members else parse


def _add_simulate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="Run a sampler against Bernoulli pass rates and print one JSON object per pass rate.",
        description=(
            "Run a sampler against Bernoulli pass rates (reward 1 with probability p, else 0), with no model. "
            "Prints one JSON object per pass rate: pass_rate, mean_samples (completions drawn per prompt), "
            "mean_rounds (rounds a prompt took part in), mixed_share (share of prompts whose kept group holds "
            "both outcomes), max_samples and trials. All pass rates form one population (est shares its budget "
            "across it); --steps repeats the batch over the same prompts and reports the last one, so est's tracker "
            "and --round-policy tracked learn the pass rates. Every sampler knob of AdaGRPOConfig is a flag here, "
            "with the same default and meaning (--num-generations is TRL's num_generations; --seed also seeds the "
            "simulated rewards)."
        ),
    )
    parser.add_argument("--pass-rates", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95])
    parser.add_argument("--trials", type=int, default=10_000, help="Prompts simulated per pass rate.")
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        help="Generation batches over the same prompts; the last is reported (est's tracker and the tracked round "
        "policy learn across steps).",
    )
    parser.add_argument(
        "--generation-schedule",
        choices=GENERATION_SCHEDULES,
        default="rounds",
        help="rounds, or the round-free continuous schedule of vLLM server mode (seq_pos, seq_balance): the same "
        "pools as rounds with the same settings, whatever the order completions come back in.",
    )
    parser.add_argument(
        "--arrival",
        choices=ARRIVALS,
        default="in_order",
        help="continuous schedule: completions come back in submission order, or length_correlated (right ones "
        "faster, so out of order).",
    )
    knobs = parser.add_argument_group("sampler knobs (declared in trl_ada.samplers.settings, as in AdaGRPOConfig)")
    for declared in fields(SamplerSettings):
        flag = "--" + declared.name.replace("_", "-")
        first_sentence = declared.metadata["help"].split(". ")[0].rstrip(".") + "."
        # Samplers are checked by the registry, which also imports a plug-in named by its import path.
        choices = declared.metadata.get("choices")
        help_text = f"{first_sentence} Default: {declared.default!r}."
        if declared.name == "sampler":
            help_text += f" Registered: {', '.join(sampler_names())}, or a plug-in's import path (module:Class)."
        knobs.add_argument(
            flag,
            dest=declared.name,
            type=_knob_parser(declared),
            choices=choices,
            default=declared.default,
            help=help_text,
        )
    knobs.add_argument("--est-decay", type=float, default=None, help="Deprecated: use --pass-rate-decay.")


def _run_simulate(args: argparse.Namespace) -> int:
    if args.est_decay is not None:
        default_decay = SamplerSettings.__dataclass_fields__["pass_rate_decay"].default
        if args.pass_rate_decay not in (default_decay, args.est_decay):
            raise ValueError(
                f"--est-decay {args.est_decay} and --pass-rate-decay {args.pass_rate_decay} disagree: --est-decay is "
                "the deprecated name of --pass-rate-decay. Pass only --pass-rate-decay."
            )
        warnings.warn("--est-decay is deprecated: use --pass-rate-decay.", FutureWarning, stacklevel=2)
        args.pass_rate_decay = args.est_decay
    settings = SamplerSettings(**{declared.name: getattr(args, declared.name) for declared in fields(SamplerSettings)})
    results = simulate(
        settings,
        args.pass_rates,
        trials=args.trials,
        seed=args.seed,
        steps=args.steps,
        schedule=args.generation_schedule,
        arrival=args.arrival,
    )
    for result in results:
        print(json.dumps(result.to_dict()))
    return 0


def _add_train(subparsers: argparse._SubParsersAction) -> None:
    # Listed for `trl-ada --help` only: `main` hands `trl-ada train ...` to TRL's parser in `trl_ada.train` before
    # argparse sees it, so every GRPOConfig/AdaGRPOConfig flag and `--config` work (`trl-ada train --help` lists them).
    subparsers.add_parser(
        "train",
        add_help=False,
        help="Train with Reinforce-Ada (the main job; same flags and YAML recipes as scripts/train_ada.py). "
        "`--config` takes a file or a shipped recipe name (qwen2.5-math-1.5b/seq_balance). With no model and no "
        "dataset: the embedded tiny arithmetic run on CPU. Several processes: accelerate launch -m trl_ada.train.",
    )


def _add_data_commands(subparsers: argparse._SubParsersAction) -> None:
    # Listed for `trl-ada --help` only: `main` hands them to their own parsers (`trl-ada prepare-data --help`).
    subparsers.add_parser(
        "prepare-data",
        add_help=False,
        help="Prepare an OpenR1-Math-style training set as the paper does (deduplicate, drop unverifiable "
        "references, difficulty band from base-model samples); what the shipped recipes read. Same flags as "
        "scripts/prepare_data.py.",
    )
    subparsers.add_parser(
        "evaluate",
        add_help=False,
        help="Evaluate a checkpoint: Ave@k and pass@k on math datasets, scored by a verifier. Same flags as "
        "scripts/evaluate.py.",
    )


TRAIN_PROG = "trl-ada train"


def train_help_cache() -> tuple[Path, str]:
    """Where `trl-ada train --help`'s text is cached, and the key of the installation it was built for.

    Building it imports transformers' `TrainingArguments` (with torch and peft: most of the ~20 s the help took), so
    it is built once and kept under `$XDG_CACHE_HOME/trl-ada/` (default `~/.cache`), one file per installation of
    trl-ada. The key covers what the text depends on: Python, the versions of trl-ada, TRL and transformers, every
    source file of trl-ada (an editable install changes without a version bump) and the terminal's width.
    """
    package = Path(__file__).resolve().parent
    sources = []
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        sources.append((path.relative_to(package).as_posix(), stat.st_mtime_ns, stat.st_size))
    versions = [version(name) for name in ("trl-ada", "trl", "transformers")]
    key = json.dumps([sys.version, versions, shutil.get_terminal_size().columns, sources])
    cache_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trl-ada"
    installation = hashlib.sha256(f"{sys.executable}|{package}".encode()).hexdigest()[:16]
    return cache_root / f"train-help-{installation}.txt", hashlib.sha256(key.encode()).hexdigest()


def train_help() -> str:
    """`trl-ada train --help`'s text: the cached copy when its key matches, else built (and cached) by
    `trl_ada.train.help_text`. A cache that cannot be read or written only costs the time."""
    path, key = train_help_cache()
    try:
        cached_key, text = path.read_text().split("\n", 1)
        if cached_key == key:
            return text
    except (OSError, ValueError):
        pass
    from .train import help_text

    text = help_text(TRAIN_PROG)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_text(f"{key}\n{text}")
        os.replace(partial, path)  # a concurrent reader sees the old copy or the new one, never half of one
    except OSError:
        pass
    return text


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"] and argv[1:] in (["--help"], ["-h"]):
        sys.stdout.write(train_help())
        return 0
    if argv[:1] == ["train"]:
        from .train import cli_main  # torch, transformers and TRL: only here

        return cli_main(argv[1:], prog=TRAIN_PROG)
    if argv[:1] == ["prepare-data"]:
        from .prepare_data import main as prepare_data_main

        return prepare_data_main(argv[1:], prog="trl-ada prepare-data")
    if argv[:1] == ["evaluate"]:
        from .evaluate import main as evaluate_main

        return evaluate_main(argv[1:], prog="trl-ada evaluate")
    parser = argparse.ArgumentParser(prog="trl-ada", description="Reinforce-Ada adaptive sampling for TRL.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_simulate(subparsers)
    _add_train(subparsers)
    _add_data_commands(subparsers)
    args = parser.parse_args(argv)
    try:
        return _run_simulate(args)
    except ValueError as error:  # a bad combination of knobs: say what to change, no traceback
        parser.exit(2, f"trl-ada {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
