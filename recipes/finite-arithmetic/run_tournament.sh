#!/usr/bin/env bash
# Issue 33's tournament, one command per table: GRPO n=4, GRPO n=16, DAPO, Seq-balance, Knapsack-RL and DAPO with a
# gated refill (both priors), every run stopped at the same number of completions (DAPO's total in the table this testbed had
# before: BENCHMARKS.md), read at equal completions and at DAPO's training time, with paired differences against DAPO.
#
#   bash recipes/finite-arithmetic/run_tournament.sh mix    [JOBS] [SEEDS...]   # default seeds 0-4
#   bash recipes/finite-arithmetic/run_tournament.sh hard   [JOBS] [SEEDS...]   # default seeds 0-9
#   bash recipes/finite-arithmetic/run_tournament.sh stream [JOBS] [SEEDS...]   # default seeds 0-4
#   bash recipes/finite-arithmetic/run_tournament.sh stream-budget [JOBS] [SEEDS...]   # the same, its own folder
#   bash recipes/finite-arithmetic/run_tournament.sh code   [JOBS] [SEEDS...]   # default seeds 0-4
#   bash recipes/finite-arithmetic/run_tournament.sh code-budget [JOBS] [SEEDS...]   # the same, its own folder
#   bash recipes/finite-arithmetic/run_tournament.sh trace  [JOBS] [SEEDS...]   # default seeds 0-4
#
# trace: the trace-arithmetic testbed's paper set (recipes/trace-arithmetic/, the grid's settings: 16 prompts per step,
# lr 1e-4, held-out 320 x 2), stopped at 8,064 completions (DAPO's mean total over the grid's 60 steps); at most 7
# epochs, which GRPO n=4 needs to reach the budget.
#
# code: the CPU code task (benchmarks/code_learning.py, sandboxed reward) at the published code table's settings (60
# steps of 8 prompts, lr 2e-4, held-out 300 x 2), stopped at 4,683 completions (DAPO's mean total there), one run at a
# time (JOBS is ignored: the sandboxes take the other core), 6-10.5 minutes a run measured (364-627 s, mostly
# beside other runs), about 4 h for 5 seeds; the gated refill with its default prior only. Report:
# benchmarks/results/code-tournament/tournament.md.
#
# code-budget: the code task's settings in a folder of their own (benchmarks/results/code-tournament-budget), for the
# budget issue's mechanisms with DAPO rerun beside them, as stream-budget is for the stream.
#
# stream-budget: the stream's settings in a folder of their own (benchmarks/results/tournament-stream-budget), for the
# budget issue's mechanisms and DAPO rerun beside them: today's DAPO runs are not the older folder's run for run (see
# BENCHMARKS.md, "The streaming testbed: the budget issue's mechanisms"), so each folder pairs runs of one code.
#
# Neither the stream nor the code task is free of repeats: both draw their problems with replacement (the stream's
# 19,800 draws at seed 0 hold 10,665 distinct problems; the code task's 1,200 hold 1,156), so the gated refill and
# Knapsack-RL use what they remember there too, and every method runs at every seed.
#
# Runs already in the results folder with the same settings are kept (--reuse_runs): more seeds can be added later.
# METHODS="dapo spo ..." runs those methods instead of the tournament's (scripts/benchmark_learning.py's names).
# A method of one's own: call scripts/benchmark_learning.py (code: benchmarks/code_learning.py) with these arguments
# plus --method_config NAME='{json}'.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHICH=${1:?usage: run_tournament.sh mix|hard|stream|stream-budget|code|code-budget|trace [JOBS] [SEEDS...]}
JOBS=${2:-2}
shift $(( $# >= 2 ? 2 : 1 ))
DATA=benchmarks/results/finite/data
export OMP_NUM_THREADS=1
COMMON=(--tournament --jobs "$JOBS" --reuse_runs)
if [[ -n "${METHODS:-}" ]]; then
    read -r -a CHOSEN <<< "$METHODS"
    COMMON+=(--methods "${CHOSEN[@]}")
fi
case $WHICH in
    mix)
        SEEDS=(${@:-0 1 2 3 4})
        python scripts/benchmark_learning.py --out benchmarks/results/finite/tournament-mix \
            --train_data "$DATA/train_mix.jsonl" --heldout_data "$DATA/heldout_mix.jsonl" --epochs 4 \
            --prompts_per_step 20 --eval_every 25 --eval_samples 2 --learning_rate 1e-4 \
            --completions_budget 54416 --seeds "${SEEDS[@]}" "${COMMON[@]}" ;;
    hard)
        SEEDS=(${@:-0 1 2 3 4 5 6 7 8 9})
        python scripts/benchmark_learning.py --out benchmarks/results/finite/tournament-hard \
            --train_data "$DATA/train_hard.jsonl" --heldout_data "$DATA/heldout_hard.jsonl" --epochs 10 \
            --prompts_per_step 20 --eval_every 25 --eval_samples 2 --learning_rate 1e-4 \
            --completions_budget 58216 --seeds "${SEEDS[@]}" "${COMMON[@]}" ;;
    stream|stream-budget)
        SEEDS=(${@:-0 1 2 3 4})
        OUT=benchmarks/results/tournament-stream
        [[ $WHICH == stream-budget ]] && OUT+=-budget
        python scripts/benchmark_learning.py --out "$OUT" \
            --steps 300 --eval_every 25 --heldout_size 600 --learning_rate 1e-4 \
            --completions_budget 78891 --seeds "${SEEDS[@]}" "${COMMON[@]}" ;;
    code|code-budget)
        SEEDS=(${@:-0 1 2 3 4})
        OUT=benchmarks/results/code-tournament
        [[ $WHICH == code-budget ]] && OUT+=-budget
        METHOD_ARGS=()
        [[ -n "${METHODS:-}" ]] && METHOD_ARGS=(--methods "${CHOSEN[@]}")
        nice -n 10 python benchmarks/code_learning.py --out "$OUT" \
            --steps 60 --prompts_per_step 8 --learning_rate 2e-4 --heldout_size 300 --eval_samples 2 \
            --completions_budget 4683 --seeds "${SEEDS[@]}" --tournament --reuse_runs "${METHOD_ARGS[@]}" ;;
    trace)
        SEEDS=(${@:-0 1 2 3 4})
        TRACE=benchmarks/results/trace-arithmetic/data
        python scripts/benchmark_learning.py --task trace --out benchmarks/results/trace-arithmetic/tournament \
            --train_data "$TRACE/train_paper.jsonl" --heldout_data "$TRACE/heldout_paper.jsonl" --epochs 7 \
            --prompts_per_step 16 --eval_every 10 --eval_samples 2 --learning_rate 1e-4 \
            --completions_budget 8064 --seeds "${SEEDS[@]}" "${COMMON[@]}" ;;
    *) echo "run_tournament.sh: mix, hard, stream, stream-budget, code, code-budget or trace, not '$WHICH'" >&2; exit 2 ;;
esac
