"""
The `trl-ada` command line. `trl-ada simulate` plans a sampling budget with no model and no GPU; `trl-ada train` runs
the main job (`trl_ada.train`, the code of `scripts/train_ada.py`).

Import-light: only `trl-ada train` imports torch, transformers and TRL.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .samplers import SAMPLER_NAMES, SamplerSettings, simulate
from .samplers.settings import DOWNSAMPLES, EST_TRAIN_ON, ROUND_POLICIES


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
            "and --round-policy tracked learn the pass rates."
        ),
    )
    parser.add_argument("--sampler", choices=SAMPLER_NAMES, default="seq_balance")
    parser.add_argument("--pass-rates", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95])
    parser.add_argument("--trials", type=int, default=10_000, help="Prompts simulated per pass rate.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-generations", type=int, default=4, help="Update group size n.")
    parser.add_argument("--round-size", type=int, default=8, help="Completions per active prompt and round (M).")
    parser.add_argument("--max-rounds", type=int, default=4)
    parser.add_argument("--positive-quota", type=int, default=None)
    parser.add_argument("--negative-quota", type=int, default=None)
    parser.add_argument("--downsample", choices=DOWNSAMPLES, default="balanced")
    parser.add_argument(
        "--steps",
        type=int,
        default=1,
        help="Generation batches over the same prompts; the last is reported (est's tracker and the tracked round "
        "policy learn across steps).",
    )
    parser.add_argument(
        "--round-policy",
        choices=ROUND_POLICIES,
        default="fixed",
        help="Request size per round of seq_*: fixed round_size, or predictive/tracked from a Beta posterior.",
    )
    parser.add_argument(
        "--round-confidence",
        type=float,
        default=0.7,
        help="Target probability of finishing a prompt in its next round (predictive and tracked policies).",
    )
    parser.add_argument("--est-sample-power", type=float, default=0.5)
    parser.add_argument("--est-decay", type=float, default=0.9)
    parser.add_argument("--est-min-samples", type=int, default=None)
    parser.add_argument("--est-max-samples", type=int, default=None)
    parser.add_argument(
        "--est-mean-samples",
        type=float,
        default=None,
        help="est: completions drawn per prompt on average. Default: n with --est-train-on all, 2n with downsample.",
    )
    parser.add_argument("--est-train-on", choices=EST_TRAIN_ON, default="all")


def _run_simulate(args: argparse.Namespace) -> int:
    settings = SamplerSettings(
        sampler=args.sampler,
        num_generations=args.num_generations,
        round_size=args.round_size,
        max_rounds=args.max_rounds,
        positive_quota=args.positive_quota,
        negative_quota=args.negative_quota,
        downsample=args.downsample,
        seed=args.seed,
        est_sample_power=args.est_sample_power,
        est_decay=args.est_decay,
        est_min_samples=args.est_min_samples,
        est_max_samples=args.est_max_samples,
        est_mean_samples=args.est_mean_samples,
        est_train_on=args.est_train_on,
        round_policy=args.round_policy,
        round_confidence=args.round_confidence,
    )
    for result in simulate(settings, args.pass_rates, trials=args.trials, seed=args.seed, steps=args.steps):
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:
        from .train import cli_main  # torch, transformers and TRL: only here

        return cli_main(argv[1:], prog="trl-ada train")
    parser = argparse.ArgumentParser(prog="trl-ada", description="Reinforce-Ada adaptive sampling for TRL.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_simulate(subparsers)
    _add_train(subparsers)
    args = parser.parse_args(argv)
    try:
        return _run_simulate(args)
    except ValueError as error:  # a bad combination of knobs: say what to change, no traceback
        parser.exit(2, f"trl-ada {args.command}: error: {error}\n")


if __name__ == "__main__":
    sys.exit(main())
