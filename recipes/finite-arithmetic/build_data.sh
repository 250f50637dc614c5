#!/usr/bin/env bash
# Rebuilds the finite, hard-skewed arithmetic prompt sets of the finite learning comparison (issue 13, item 1).
#
# Four sets, every prompt scored with the difficulty filter of scripts/prepare_data.py: 16 completions at
# temperature 1 from the shipped tiny arithmetic model (trl_ada.tiny.TINY_ARITH_ASSETS), exact-match reward.
#
#   train_mix.jsonl     1,000 training prompts in the paper's pass-rate mix (984/3,082/870/63 of 4,999 at pass rate
#                       0, (0, 0.2], (0.2, 0.5], above 0.5), scaled by largest remainder: 197/616/174/13.
#   heldout_mix.jsonl   1,000 held-out prompts in the same mix.
#   train_hard.jsonl    400 training prompts with 1-2 correct of 16 (the paper's hard-subset rule).
#   heldout_hard.jsonl  400 held-out prompts with 1-2 correct of 16.
#
# Columns: prompt (the fixed-width problem), answer and solution (the exact integer), problem, level (0-5, see
# trl_ada.tasks.arithmetic.LEVELS), num_correct (of 16), pass_rate (num_correct / 16), band (the pass-rate band).
#
# Train and held-out prompts come from the arithmetic task's two splits (a fixed hash of the prompt,
# trl_ada.tasks.arithmetic.is_held_out), so no held-out prompt can be a training prompt. The hard pools draw from
# levels 3-5 only (3-digit sums and the products): the easier levels give almost no prompt with 1-2 correct of 16.
#
# Deterministic: fixed pool seeds, and prepare_data.py's --seed fixes both the sampling and the band selection
# (on one thread; other thread counts may change the sampled completions through float rounding).
#
#   OMP_NUM_THREADS=1 bash recipes/finite-arithmetic/build_data.sh [OUT_DIR] [POOL_SCALE]
#
# OUT_DIR defaults to benchmarks/results/finite/data. POOL_SCALE (default 1) multiplies the candidate pools (4,000
# training and 6,000 held-out draws for the mixes, 2,000 for each hard set; the held-out split is a tenth of the
# problems, so its draws repeat more and deduplication leaves fewer) and the set sizes, e.g. 0.5 for a quick check.
# Measured at scale 1: 3.7 CPU-minutes on one core (224 s, 4.7 min wall on a shared machine); 208,000 sampled
# completions, the rest is start-up of the four prepare_data.py calls.
set -euo pipefail

OUT=${1:-benchmarks/results/finite/data}
SCALE=${2:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
POOLS="$OUT/.pools"
mkdir -p "$POOLS"

# Candidate pools: problem/answer/level rows (duplicates are fine: prepare_data.py removes them).
python - "$POOLS" "$SCALE" <<'PY'
import json
import sys
from pathlib import Path

from trl_ada.tasks.arithmetic import held_out_problems, make_problems

out, scale = Path(sys.argv[1]), float(sys.argv[2])
pools = {
    "train_mix": make_problems(round(4000 * scale), seed=101),
    "heldout_mix": held_out_problems(round(6000 * scale), seed=202),
    "train_hard": make_problems(round(2000 * scale), seed=103, levels=[3, 4, 5]),
    "heldout_hard": held_out_problems(round(2000 * scale), seed=204, levels=[3, 4, 5]),
}
for name, problems in pools.items():
    with open(out / f"{name}.jsonl", "w") as handle:
        for problem in problems:
            row = {"problem": problem["prompt"], "answer": problem["answer"], "level": problem["level"]}
            handle.write(json.dumps(row) + "\n")
PY

MIX_SIZE=$(python -c "print(round(1000 * $SCALE))")
HARD_SIZE=$(python -c "print(round(400 * $SCALE))")
# The tiny model's task format: plain-text prompts, no system prompt or instruction, 8-token completions.
COMMON=(--model_name_or_path "$(python -c 'from trl_ada.tiny import TINY_ARITH_ASSETS; print(TINY_ARITH_ASSETS)')"
    --reward exact_match --prompt_format text --system_prompt "" --instruction "" --keep_columns level
    --num_samples 16 --max_new_tokens 8 --temperature 1.0 --batch_size 512 --seed 0)
PAPER_MIX=("[0,0]:984" "(0,0.2]:3082" "(0.2,0.5]:870" "(0.5,1]:63")
for split in train heldout; do
    python "$REPO/scripts/prepare_data.py" --dataset_name "$POOLS/${split}_mix.jsonl" --output "$OUT/${split}_mix.jsonl" \
        "${COMMON[@]}" --band_mix "${PAPER_MIX[@]}" --mix_total "$MIX_SIZE"
    python "$REPO/scripts/prepare_data.py" --dataset_name "$POOLS/${split}_hard.jsonl" \
        --output "$OUT/${split}_hard.jsonl" "${COMMON[@]}" --band_mix "[0.0625,0.125]:$HARD_SIZE"  # 1-2 of 16
done
rm -rf "$POOLS"
