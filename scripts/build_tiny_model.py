"""Build the warm-started tiny arithmetic model on CPU and save it (by default into the package assets).

    python scripts/build_tiny_model.py                       # -> trl_ada/assets/tiny-arith/
    python scripts/build_tiny_model.py --output-dir /tmp/m   # anywhere else
    python scripts/build_tiny_model.py --cache               # -> $TRL_ADA_CACHE/tiny-arith-v1 (or ~/.cache/...)

Phase 1 is completion-only SFT with TRL's ``SFTTrainer`` on clean problems of all six levels; phase 2 is SFT on fresh
problems with 30% plausible wrong answers, so that sampling at temperature 1 is noisy while the skill survives. The
held-out accuracy at temperature 1 is logged per level after each phase, and at temperatures 1, 0.5 and greedy at the
end (a larger sample). Deterministic for a seed on a given machine, thread count and library versions.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

logger = logging.getLogger("build_tiny_model")


def main(argv: list[str] | None = None) -> None:
    """Parses arguments, builds the model, evaluates it and saves it."""
    from trl_ada.tiny import TINY_ARITH_ASSETS, default_cache_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=None, help=f"Where to save (default {TINY_ARITH_ASSETS}).")
    parser.add_argument("--cache", action="store_true", help=f"Save into the cache ({default_cache_dir()}).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clean-steps", type=int, default=1200)
    parser.add_argument("--noisy-steps", type=int, default=400)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--noise", type=float, default=0.3)
    parser.add_argument(
        "--clean-problems", type=int, default=None, help="Distinct phase-1 problems, cycled (default: fresh)."
    )
    parser.add_argument("--eval-problems", type=int, default=600, help="Held-out problems evaluated after each phase.")
    parser.add_argument(
        "--final-eval-problems", type=int, default=1200, help="Held-out problems for the final report."
    )
    parser.add_argument("--final-eval-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice).")
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="Also write the JSON report here (it is always saved as build_report.json beside the model).",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import datasets

    datasets.disable_progress_bars()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_warning()

    from trl_ada.tasks.arithmetic import accuracy_by_level, format_accuracy, held_out_problems
    from trl_ada.tiny import build_warm_started, save_tiny

    if args.threads:
        torch.set_num_threads(args.threads)
    # No torch.use_deterministic_algorithms: the CPU kernels used here are deterministic for a fixed thread count,
    # and the flag halves the training speed.
    output_dir = default_cache_dir() if args.cache else (args.output_dir or TINY_ARITH_ASSETS)

    start = time.perf_counter()
    model, tokenizer, report = build_warm_started(
        seed=args.seed,
        clean_steps=args.clean_steps,
        noisy_steps=args.noisy_steps,
        batch_size=args.batch_size,
        noise=args.noise,
        clean_problems=args.clean_problems,
        eval_problems=args.eval_problems,
    )
    build_seconds = time.perf_counter() - start
    logger.info("Build took %.1f s", build_seconds)
    report["build_seconds"] = build_seconds
    report["parameters"] = sum(p.numel() for p in model.parameters())

    if args.final_eval_problems:
        problems = held_out_problems(args.final_eval_problems, seed=args.seed + 1)
        report["final"] = {}
        for name, temperature in (("t1", 1.0), ("t0.5", 0.5), ("greedy", 0.0)):
            samples = args.final_eval_samples if temperature > 0 else 1
            result = accuracy_by_level(
                model, tokenizer, problems, temperature=temperature, num_samples=samples, seed=args.seed
            )
            report["final"][name] = result
            logger.info(
                "Final held-out %-6s (%d completions): %s", name, result["num_completions"], format_accuracy(result)
            )

    save_tiny(model, tokenizer, output_dir)
    text = json.dumps(report, indent=2, default=str) + "\n"
    (Path(output_dir) / "build_report.json").write_text(text, encoding="utf-8")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text, encoding="utf-8")
    size = sum(f.stat().st_size for f in Path(output_dir).iterdir() if f.is_file())
    logger.info("Saved to %s (%.2f MB); total time %.1f s", output_dir, size / 1e6, time.perf_counter() - start)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
