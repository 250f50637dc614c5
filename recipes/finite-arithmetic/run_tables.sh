#!/usr/bin/env bash
# The finite, hard-skewed learning comparison (issue 13, item 2): one command per table.
#
#   bash recipes/finite-arithmetic/run_tables.sh [mix|hard|both] [JOBS]
#
# mix:  train on train_mix.jsonl (1,000 prompts, the paper's pass-rate mix) for 8 epochs, held-out heldout_mix.jsonl.
# hard: train on train_hard.jsonl (400 prompts with 1-2 correct of 16) for 20 epochs (the same 400 steps),
#       held-out heldout_hard.jsonl.
# Both: 20 prompts per step (a divisor of both set sizes, so every prompt comes once per epoch), the 10 methods of
# FINITE_METHODS in scripts/benchmark_learning.py, 5 seeds, lr 1e-4 constant, held-out pass rate at T=1 with 2
# completions per held-out prompt every 25 steps. Results: benchmarks/results/finite/{mix,hard}/ (table.md,
# summary.json, learning_curves.png, band_curves.png; runs/ holds each run's JSON and log).
#
# Cost, measured per step on one core (first steps, the shipped model on train_mix): 4.2 s for one step of each of the
# 10 methods, so about 160 CPU-minutes per table with evaluation and start-up (about 80 minutes with JOBS=2 on two
# free cores). Data first: recipes/finite-arithmetic/build_data.sh (or the shipped benchmarks/results/finite/data/).
set -euo pipefail

WHICH=${1:-both}
JOBS=${2:-2}
DATA=benchmarks/results/finite/data
COMMON=(--prompts_per_step 20 --eval_every 25 --eval_samples 2 --learning_rate 1e-4 --seeds 0 1 2 3 4 --jobs "$JOBS")

if [[ $WHICH == mix || $WHICH == both ]]; then
    python scripts/benchmark_learning.py --out benchmarks/results/finite/mix \
        --train_data "$DATA/train_mix.jsonl" --heldout_data "$DATA/heldout_mix.jsonl" --epochs 8 "${COMMON[@]}"
fi
if [[ $WHICH == hard || $WHICH == both ]]; then
    python scripts/benchmark_learning.py --out benchmarks/results/finite/hard \
        --train_data "$DATA/train_hard.jsonl" --heldout_data "$DATA/heldout_hard.jsonl" --epochs 20 "${COMMON[@]}"
fi
