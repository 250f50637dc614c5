"""
The `trl-ada` command line (`python -m trl_ada.cli`): `simulate` plans a sampling budget with no model and no GPU;
`train`, `prepare-data` and `evaluate` are `trl_ada.cli.train`, `.prepare_data` and `.evaluate` (also run by
`scripts/`), the only ones that import torch, transformers or TRL. `trl-ada train --help` is answered from a cache.
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
from collections.abc import Callable, Sequence
from dataclasses import Field, fields
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ..samplers import SamplerSettings, sampler_names, simulate
from ..samplers.settings import KNOB_FIELDS, SETTINGS_DEFAULTS, option_fields
from ..samplers.simulate import (
    ARRIVALS,
    GENERATION_SCHEDULES,
    MAX_MATCH_COMPLETIONS,
    PASS_RATE_COLUMN,
    REFERENCE_GENERATIONS,
    SamplerPlan,
    plan,
    read_pass_rates,
)


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


DEFAULT_PASS_RATES = [0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95]
DEFAULT_TRIALS = 10_000
DEFAULT_PLAN_TRIALS = 2_000


def _add_simulate(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="Run a sampler against Bernoulli pass rates and print one JSON object per pass rate.",
        description=(
            "Run a sampler against Bernoulli pass rates (reward 1 with probability p, else 0), with no model, and "
            "print one JSON object per pass rate: mean_samples (completions drawn per prompt), mean_rounds, "
            "mixed_share (share of prompts whose kept group holds both outcomes), max_samples and trials. Every "
            "sampler knob of AdaGRPOConfig is a flag here, with the same default and meaning (--seed also seeds the "
            "simulated rewards). With --pass-rates-from FILE it plans on your own prompts instead: per --sampler, "
            "completions per prompt, mixed share and the budget that matches GRPO "
            f"n={REFERENCE_GENERATIONS}'s mixed share (within {MAX_MATCH_COMPLETIONS} completions per prompt). "
            "docs/simulate.md explains the output."
        ),
    )
    parser.add_argument(
        "--pass-rates",
        type=float,
        nargs="+",
        help=f"Pass rates to simulate. Default: {' '.join(map(str, DEFAULT_PASS_RATES))}.",
    )
    parser.add_argument(
        "--pass-rates-from",
        type=Path,
        metavar="FILE",
        help=f"Plan on your own prompts: a .jsonl or .parquet with a {PASS_RATE_COLUMN!r} column in [0, 1] (what "
        "trl-ada prepare-data writes). Prints a table per --sampler (several may be named); see above.",
    )
    parser.add_argument(
        "--trials",
        type=int,
        help=f"Prompts simulated per pass rate (default {DEFAULT_TRIALS}). With --pass-rates-from: prompts simulated "
        f"per setting (default {DEFAULT_PLAN_TRIALS}): each prompt of the file ceil(trials / prompts) times, or a "
        "file of more prompts at trials evenly spaced quantiles of its pass rates.",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="With --pass-rates-from: one JSON object per sampler instead of the table (without it, simulate always "
        "prints JSON).",
    )
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
        several: dict[str, Any] = {}
        if declared.name == "sampler":
            help_text += (
                f" Registered: {', '.join(sampler_names())}, or a plug-in's import path (module:Class). Several with "
                "--pass-rates-from (default there: every registered one)."
            )
            several = {"nargs": "+", "metavar": "SAMPLER"}
        knobs.add_argument(
            flag,
            dest=declared.name,
            type=_knob_parser(declared),
            choices=choices,
            default=None if several else declared.default,
            help=help_text,
            **several,
        )


def _run_simulate(args: argparse.Namespace) -> int:
    if args.pass_rates_from is not None:
        return _run_plan(args)
    if args.sampler is not None and len(args.sampler) > 1:
        raise ValueError(
            f"--sampler names {len(args.sampler)} samplers; simulating --pass-rates runs one. Name one, or compare "
            "several on your prompts with --pass-rates-from FILE."
        )
    values = {declared.name: getattr(args, declared.name) for declared in fields(SamplerSettings)}
    values["sampler"] = SETTINGS_DEFAULTS["sampler"] if args.sampler is None else args.sampler[0]
    results = simulate(
        SamplerSettings(**values),
        DEFAULT_PASS_RATES if args.pass_rates is None else args.pass_rates,
        trials=DEFAULT_TRIALS if args.trials is None else args.trials,
        **_schedule_options(args),
    )
    for result in results:
        print(json.dumps(result.to_dict()))
    return 0


def _schedule_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options `simulate` and `plan` both take from the command line."""
    return {"seed": args.seed, "steps": args.steps, "schedule": args.generation_schedule, "arrival": args.arrival}


def _plan_settings(args: argparse.Namespace) -> list[SamplerSettings]:
    """The settings of each sampler compared: every knob the user set, for the samplers that read it."""
    names = sampler_names() if args.sampler is None else args.sampler
    given = {
        declared.name: getattr(args, declared.name)
        for declared in fields(SamplerSettings)
        if declared.name != "sampler" and getattr(args, declared.name) != declared.default
    }
    settings_list, applied = [], set()
    for name in names:
        candidate = SamplerSettings(sampler=name, **given)
        read = {
            knob: value
            for knob, value in given.items()
            # sampler_kwargs are a sampler's own options: they go to the samplers that declare options.
            if (
                set(option_fields(candidate.sampler_class.Options)) - set(KNOB_FIELDS)
                if knob == "sampler_kwargs"
                else candidate.reads(knob)
            )
        }
        applied.update(read)
        # A sampler that cannot run at the defaults (`spo`) is compared with its recipe, under what the user set.
        settings_list.append(SamplerSettings(sampler=name, **(dict(candidate.sampler_class.Options.recipe) | read)))
    unread = [knob for knob in given if knob not in applied]
    if unread:
        flags = ", ".join("--" + knob.replace("_", "-") for knob in unread)
        raise ValueError(
            f"{flags} is read by none of the samplers compared ({', '.join(names)}): remove it, or name a sampler "
            "that reads it with --sampler."
        )
    return settings_list


def _run_plan(args: argparse.Namespace) -> int:
    if args.pass_rates is not None:
        raise ValueError("--pass-rates and --pass-rates-from both give pass rates: pass one of them.")
    trials = DEFAULT_PLAN_TRIALS if args.trials is None else args.trials
    settings_list = _plan_settings(args)
    pass_rates = read_pass_rates(args.pass_rates_from)  # every input error before any compute
    plans = plan(settings_list, pass_rates, trials=trials, **_schedule_options(args))
    if args.json:
        sys.stdout.write("".join(json.dumps(row.to_dict()) + "\n" for row in plans))
    else:
        sys.stdout.write(_plan_table(plans, args.pass_rates_from, args.seed))
    return 0


def _plan_table(plans: Sequence[SamplerPlan], path: Path, seed: int) -> str:
    first = plans[0]
    lines = [
        f"{first.prompts} prompts from {path}; {first.simulated_prompts} simulated per setting, seed {seed}.",
        f"GRPO n={REFERENCE_GENERATIONS} (uniform, {REFERENCE_GENERATIONS} completions per prompt): mixed share "
        f"{first.reference_mixed_share:.4f}.",
        "",
    ]
    header = ("sampler", "completions/prompt", "mixed share", "completions/mixed prompt", "to match GRPO n=16")
    rows = [header]
    for row in plans:
        budget = row.budget_note
        if row.budget_value is not None:
            budget = (
                f"{row.budget_knob}={row.budget_value} ({row.budget_completions_per_prompt:.2f} completions/prompt)"
            )
        per_mixed = "-" if row.completions_per_mixed_prompt is None else f"{row.completions_per_mixed_prompt:.2f}"
        rows.append((row.sampler, f"{row.completions_per_prompt:.2f}", f"{row.mixed_share:.4f}", per_mixed, budget))
    widths = [max(len(cells[column]) for cells in rows) for column in range(len(header) - 1)]
    for cells in rows:
        aligned = [cells[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(cells[1:-1], widths[1:])]
        lines.append("  ".join([*aligned, cells[-1]]))
    return "\n".join(lines) + "\n"


HANDED_OFF_COMMANDS = {
    "train": "Train with Reinforce-Ada (the main job; same flags and YAML recipes as scripts/train_ada.py). "
    "`--config` takes a file or a shipped recipe name (qwen2.5-math-1.5b/seq_balance). With no model and no "
    "dataset: the embedded tiny arithmetic run on CPU. Several processes: accelerate launch -m trl_ada.cli.train.",
    "prepare-data": "Prepare an OpenR1-Math-style training set as the paper does (deduplicate, drop unverifiable "
    "references, difficulty band from base-model samples); what the shipped recipes read. Same flags as "
    "scripts/prepare_data.py.",
    "evaluate": "Evaluate a checkpoint: Ave@k and pass@k on math datasets, scored by a verifier. Same flags as "
    "scripts/evaluate.py.",
}
"""The commands `main` hands to their own parsers before argparse runs, with their line in `trl-ada --help`."""


TRAIN_PROG = "trl-ada train"


def train_help_cache() -> tuple[Path, str]:
    """Where `trl-ada train --help`'s text is cached (under `$XDG_CACHE_HOME/trl-ada/`, one file per installation),
    and the key of what it depends on: Python, trl-ada, TRL, transformers, trl-ada's sources and the terminal width."""
    package = Path(__file__).resolve().parents[1]  # trl_ada/, not only trl_ada/cli/
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
    `trl_ada.cli.train.help_text`. A cache that cannot be read or written only costs the time."""
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
    for command, help_text in HANDED_OFF_COMMANDS.items():
        subparsers.add_parser(command, add_help=False, help=help_text)
    args = parser.parse_args(argv)
    try:
        return _run_simulate(args)
    except ValueError as error:  # a bad combination of knobs: say what to change, no traceback
        parser.exit(2, f"trl-ada {args.command}: error: {error}\n")
