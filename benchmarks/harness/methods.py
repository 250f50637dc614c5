"""A benchmark's methods are a table of its own, name -> (label, `AdaGRPOConfig` overrides). Here: the sampler
configurations more than one benchmark runs, a method of one's own (`--method_config`), the method options every
benchmark shares, and the settings that tell a run of a redefined method from a run of the built-in one."""

from __future__ import annotations

import argparse
import json
from typing import Any

DAPO: dict[str, Any] = {"sampler": "dapo", "num_generations": 4, "dapo_on_exhausted": "keep_partial"}
SEQ_BALANCE: dict[str, Any] = {"sampler": "seq_balance", "num_generations": 4, "round_size": 8, "max_rounds": 4}
"""Seq-balance as the paper runs it: update group n=4, rounds of 8, at most 4."""
# The tournament's entries: Knapsack-RL (Li et al., arXiv 2509.25849) at GRPO n=4's budget per step, trained on every
# draw; DAPO whose refill passes over prompts predicted to come back unmixed (trl_ada/experimental/dapo_gated.py).
KNAPSACK: dict[str, Any] = {"sampler": "knapsack", "num_generations": 4}
DAPO_GATED: dict[str, Any] = {**DAPO, "sampler": "dapo_gated"}
# SPO's baseline (Xu et al., arXiv 2509.13232): each prompt's pass rate remembered from its earlier steps, advantages
# normalised over the update; SPO itself: the smallest group TRL allows on that baseline, prompts drawn by priority.
REMEMBERED_BASELINE: dict[str, Any] = {"baseline": "tracked", "scale_rewards": "none", "normalize_advantages": True}
SPO: dict[str, Any] = {"sampler": "spo", "num_generations": 2, **REMEMBERED_BASELINE}
# Replayed successes (AR3PO, arXiv 2509.25808; ExGRPO, arXiv 2510.02245): an all-wrong group trained on its prompt's
# latest stored correct completion, so DAPO kept it instead of refilling. trl-ada 0.1.0 removed `replay`; the
# definition stays so that the reports of its runs in benchmarks/results rebuild (`--report_only`, or `--reuse_runs`
# with every run there), and running it is refused (`refuse_removed`).
DAPO_REPLAY: dict[str, Any] = {**DAPO, "replay": "successes"}
REMOVED_KNOBS: dict[str, str] = {
    "replay": "replay was removed in trl-ada 0.1.0 (BENCHMARKS.md, 'Signal integrity': it tied the rule it extends, "
    "and it cannot be a sampler plug-in)",
}
"""`AdaGRPOConfig` fields that trl-ada no longer has, and why: a method that sets one can be reported, not run."""


def removed_reason(method: str, overrides: dict[str, Any], *, recorded: bool = True) -> str | None:
    """Why a run of `method` with these `overrides` cannot start (a knob of `REMOVED_KNOBS`), or `None` when it can;
    `recorded`: a built-in method, whose runs in benchmarks/results are what ran."""
    knobs = [knob for knob in REMOVED_KNOBS if knob in overrides]
    if not knobs:
        return None
    reason = f"{method} sets {', '.join(f'{knob}={overrides[knob]!r}' for knob in knobs)}: "
    reason += "; ".join(REMOVED_KNOBS[knob] for knob in knobs)
    if not recorded:
        return reason + f". Drop {' and '.join(knobs)} from it."
    return (
        reason + "; the records in benchmarks/results are what ran. Rebuild their reports with --report_only (or "
        "--reuse_runs, with every run already there)."
    )


def refuse_removed(method: str, overrides: dict[str, Any], *, recorded: bool = True) -> None:
    """`ValueError` (`removed_reason`) when a run of `method` would set a knob trl-ada no longer has."""
    reason = removed_reason(method, overrides, recorded=recorded)
    if reason is not None:
        raise ValueError(reason)


def update_group_rows(overrides: dict[str, Any], prompts_per_step: int) -> int | None:
    """The rows a step of a method with these `overrides` trains on: TRL's batch, or `None` where every draw is trained
    on (`train_on="pool"`)."""
    return None if overrides.get("train_on") == "pool" else prompts_per_step * overrides["num_generations"]


def add_method_config(spec: str, methods: dict[str, tuple[str, dict]]) -> str:
    """`NAME='{json}'` (`--method_config`) added to `methods`; `ValueError` naming the fix when it is not one."""
    from dataclasses import fields

    from trl_ada.samplers import SamplerSettings

    name, sep, text = spec.partition("=")
    name = name.strip()
    if not sep or not name.isidentifier():
        raise ValueError(
            f"--method_config {spec!r}: write NAME='{{json}}', NAME a plain word, e.g. my_rule='{{...}}'."
        )
    try:
        overrides = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"--method_config {name}: the config is not JSON ({error}); quote it: {name}='{{...}}'."
        ) from None
    if not isinstance(overrides, dict) or "sampler" not in overrides:
        raise ValueError(f'--method_config {name}: give a JSON object with at least a "sampler", got {text!r}.')
    overrides = {"num_generations": 4, **overrides}
    known = {field.name for field in fields(SamplerSettings)}
    # The sampler's knobs are checked here, before any run starts; the rest are AdaGRPOConfig's, checked by it.
    SamplerSettings(**{key: value for key, value in overrides.items() if key in known}).validated()
    methods[name] = (name, overrides)
    return name


def method_settings(settings: dict[str, Any], overrides: dict, built_in: tuple[str, dict] | None) -> dict[str, Any]:
    """What one run depends on: the shared `settings`, and its method's `overrides` when they are not the built-in
    method's of that name (a `--method_config` may reuse a name with other fields)."""
    if built_in is not None and overrides == built_in[1]:
        return settings
    return {**settings, "overrides": overrides}


def add_method_arguments(
    parser: argparse.ArgumentParser,
    methods: dict,
    *,
    defaults: str,
    tournament_methods: list[str],
    budget_help: str,
) -> None:
    """The options every learning benchmark shares: which methods (`--methods`, `--method_config`), the equal
    completions stop (`--completions_budget`) and the tournament (`--tournament`)."""
    tournament = " ".join(tournament_methods)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"any of {' '.join(methods)}, or a name given by --method_config (default: {defaults}; "
        f"--tournament: {tournament})",
    )
    parser.add_argument(
        "--method_config",
        action="append",
        default=[],
        metavar="NAME='{json}'",
        help="a method of one's own: AdaGRPOConfig fields as JSON, e.g. "
        """my_rule='{"sampler": "seq_balance", "max_rounds": 2}' (num_generations defaults to 4); repeatable""",
    )
    parser.add_argument(
        "--completions_budget",
        type=int,
        default=None,
        help=f"train every method until it has drawn this many completions (equal completions), {budget_help}",
    )
    parser.add_argument(
        "--tournament",
        action="store_true",
        help=f"the tournament's methods ({tournament}) unless --methods says otherwise, and the tournament report "
        "(tournament.md / tournament.json: paired differences against DAPO at equal completions and at equal "
        "training time, the useful-draw shares per band); needs --completions_budget",
    )


def check_method_arguments(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    methods: dict[str, tuple[str, dict]],
    *,
    tournament_methods: list[str],
    budget_example: str,
) -> None:
    """Refuses bad method options before anything is built or run: adds each `--method_config` to `methods`, and
    sets `args.methods` to the tournament's when `--tournament` is given without it."""
    for spec in args.method_config:
        try:
            add_method_config(spec, methods)
        except ValueError as error:
            parser.error(str(error))
    if args.tournament and args.completions_budget is None:
        parser.error(
            f"--tournament compares methods at equal completions: give --completions_budget (e.g. {budget_example})."
        )
    if args.completions_budget is not None and args.completions_budget < 1:
        parser.error("--completions_budget must be a positive number of completions.")
    if args.methods is None and args.tournament:
        args.methods = list(tournament_methods)
    unknown = [method for method in args.methods or () if method not in methods]
    if unknown:
        parser.error(f"unknown methods {unknown}: choose from {sorted(methods)}, or define one with --method_config.")
