#!/usr/bin/env bash
# Calibration attempts of the trace-arithmetic testbed (docs/trace-arithmetic.md): when the shipped model's grid
# (run_paper.sh) did not separate Seq-balance from DAPO, vary what plausibly matters and compare the two again, same
# settings otherwise (60 steps of 16 prompts, held-out 320 x 2 at T=1 every 10 steps), seeds 0-4, one run at a time.
#
#   bash recipes/trace-arithmetic/calibrate.sh lr           # learning rate 3e-4 instead of 1e-4, the shipped model
#   bash recipes/trace-arithmetic/calibrate.sh hard-share   # a trace model with twice the misconceptions
#                                                          # (hard_share 0.3 instead of 0.15), scored into its own
#                                                          # paper sets, lr 1e-4
#   bash recipes/trace-arithmetic/calibrate.sh model-size   # a larger trace model (hidden 192, 6 layers,
#                                                          # intermediate 512: 4x the parameters), same noise, twice
#                                                          # the SFT steps (it fits the traces more slowly), scored
#                                                          # into its own paper sets, lr 1e-4
#
# Results: benchmarks/results/trace-arithmetic/calibration/{lr3e-4,hard-share-0.3,model-size}/ (table.md, summary.json, runs/).
# The hard-share and model-size models are rebuilt into that folder's model/ (not committed: about 6 CPU-minutes); its build report is
# model_build_report.json there, and its prompt sets are data/ (built again only when missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHICH=${1:?usage: calibrate.sh lr|hard-share|model-size}
export OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
OUT=benchmarks/results/trace-arithmetic/calibration
COMMON=(--task trace --epochs 3 --prompts_per_step 16 --eval_every 10 --eval_samples 2 --methods dapo seq_balance
    --seeds 0 1 2 3 4 --jobs 1 --reuse_runs)
case $WHICH in
    lr)
        DATA=benchmarks/results/trace-arithmetic/data
        python scripts/benchmark_learning.py "${COMMON[@]}" --out "$OUT/lr3e-4" --learning_rate 3e-4 \
            --train_data "$DATA/train_paper.jsonl" --heldout_data "$DATA/heldout_paper.jsonl" ;;
    hard-share)
        HERE=$OUT/hard-share-0.3
        [ -f "$HERE/model/model.safetensors" ] ||
            python scripts/build_trace_model.py --output-dir "$HERE/model" --hard-share 0.3 --threads 1
        [ -f "$HERE/data/train_paper.jsonl" ] ||
            TRACE_MODEL=$HERE/model bash recipes/trace-arithmetic/build_data.sh "$HERE/data"
        python scripts/benchmark_learning.py "${COMMON[@]}" --out "$HERE" --model "$HERE/model" --learning_rate 1e-4 \
            --train_data "$HERE/data/train_paper.jsonl" --heldout_data "$HERE/data/heldout_paper.jsonl" ;;
    model-size)
        HERE=$OUT/model-size
        [ -f "$HERE/model/model.safetensors" ] ||
            python scripts/build_trace_model.py --output-dir "$HERE/model" --hidden-size 192 --layers 6 --steps 3000 \
                --intermediate-size 512 --threads 1
        [ -f "$HERE/data/train_paper.jsonl" ] ||
            TRACE_MODEL=$HERE/model bash recipes/trace-arithmetic/build_data.sh "$HERE/data"
        python scripts/benchmark_learning.py "${COMMON[@]}" --out "$HERE" --model "$HERE/model" --learning_rate 1e-4 \
            --train_data "$HERE/data/train_paper.jsonl" --heldout_data "$HERE/data/heldout_paper.jsonl" ;;
    *) echo "calibrate.sh: lr, hard-share or model-size, not '$WHICH'" >&2; exit 2 ;;
esac
