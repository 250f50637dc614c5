#!/usr/bin/env bash
# The finite, hard-skewed learning comparison (issue 13, item 2): one command per table.
#
#   bash recipes/finite-arithmetic/run_tables.sh [mix|hard|both] [JOBS] [EPOCHS]
#
# mix:  train on train_mix.jsonl (1,000 prompts, the paper's pass-rate mix), held-out heldout_mix.jsonl;
#       4 epochs by default (200 steps: the table in BENCHMARKS.md, 45 minutes with JOBS=2).
# hard: train on train_hard.jsonl (400 prompts with 1-2 correct of 16), held-out heldout_hard.jsonl;
#       10 epochs by default (the same 200 steps) and 10 seeds, since its differences are smaller (the table in
#       BENCHMARKS.md).
# EPOCHS overrides both (e.g. 8 for the mix set; not run yet: about 90 minutes with JOBS=2).
# Both: 20 prompts per step (a divisor of both set sizes, so every prompt comes once per epoch), the 10 methods of
# FINITE_METHODS in scripts/benchmark_learning.py, 5 seeds (mix) or 10 (hard), lr 1e-4 constant, held-out pass rate at T=1 with 2
# completions per held-out prompt every 25 steps, one CPU thread per run. Results:
# benchmarks/results/finite/{mix,hard}-EPOCHS-epochs/ (table.md, summary.json, learning_curves.png, band_curves.png;
# runs/ holds each run's JSON and log and is not committed). Finished runs with the same settings are reused
# (--reuse_runs), so a rerun after an interruption, or with more seeds, runs only what is missing.
#
# Cost, measured: the 4-epoch mix table spent 70 CPU-minutes training (the sum of its runs' step times) and took
# 45 minutes of wall time with JOBS=2 on two otherwise idle cores. Data first:
# recipes/finite-arithmetic/build_data.sh (or the shipped benchmarks/results/finite/data/).
set -euo pipefail

WHICH=${1:-both}
JOBS=${2:-2}
EPOCHS=${3:-}
DATA=benchmarks/results/finite/data
COMMON=(--prompts_per_step 20 --eval_every 25 --eval_samples 2 --learning_rate 1e-4 --jobs "$JOBS" --reuse_runs)
export OMP_NUM_THREADS=1

if [[ $WHICH == mix || $WHICH == both ]]; then
    epochs=${EPOCHS:-4}
    python scripts/benchmark_learning.py --out "benchmarks/results/finite/mix-$epochs-epochs" \
        --train_data "$DATA/train_mix.jsonl" --heldout_data "$DATA/heldout_mix.jsonl" --epochs "$epochs" \
        --seeds 0 1 2 3 4 "${COMMON[@]}"
fi
if [[ $WHICH == hard || $WHICH == both ]]; then
    epochs=${EPOCHS:-10}
    python scripts/benchmark_learning.py --out "benchmarks/results/finite/hard-$epochs-epochs" \
        --train_data "$DATA/train_hard.jsonl" --heldout_data "$DATA/heldout_hard.jsonl" --epochs "$epochs" \
        --seeds 0 1 2 3 4 5 6 7 8 9 "${COMMON[@]}"
fi
