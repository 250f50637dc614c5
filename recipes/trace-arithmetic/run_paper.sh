#!/usr/bin/env bash
# The paper's ordering at equal steps on the trace-arithmetic testbed (issue 45, item 3): GRPO n=4, GRPO n=16, DAPO,
# Seq-pos, Seq-balance and Est on the paper-filtered set (pass rate in (0, 0.375], built by build_data.sh), same
# learning rate and steps for all, held-out pass rate overall and per band.
#
#   bash recipes/trace-arithmetic/run_paper.sh [JOBS] [SEEDS...]   # default: 1 job, seeds 0-4
#
# 3 epochs of the 320 training prompts (60 steps of 16 prompts), lr 1e-4 constant, held-out every 10 steps (320
# prompts x 2 samples at temperature 1). Runs go seed by seed (every method of seed 0, then seed 1, ...), so whatever
# has finished is a paired set; runs already in the results folder with the same settings are kept (--reuse_runs), so
# the command resumes an interrupted grid. Report: benchmarks/results/trace-arithmetic/paper/{table.md,summary.json}.
set -euo pipefail
cd "$(dirname "$0")/../.."
JOBS=${1:-1}
shift $(( $# >= 1 ? 1 : 0 ))
SEEDS=(${@:-0 1 2 3 4})
DATA=benchmarks/results/trace-arithmetic/data
export OMP_NUM_THREADS=1
python scripts/benchmark_learning.py --task trace --out benchmarks/results/trace-arithmetic/paper \
    --train_data "$DATA/train_paper.jsonl" --heldout_data "$DATA/heldout_paper.jsonl" --epochs 3 \
    --prompts_per_step 16 --eval_every 10 --eval_samples 2 --learning_rate 1e-4 \
    --methods grpo_n4 grpo_n16 dapo seq_pos seq_balance est --seeds "${SEEDS[@]}" --jobs "$JOBS" --reuse_runs
