#!/usr/bin/env bash
# Builds the trace-arithmetic testbed's prompt sets the way the paper builds its own (issue 45, item 2).
#
# Every candidate prompt is scored once with the difficulty filter of scripts/prepare_data.py: 16 completions at
# temperature 1 from the shipped trace model (trl_ada.tasks.trace_arithmetic.TINY_TRACE_ASSETS), up to the task's
# MAX_COMPLETION_LENGTH (96) new tokens, rewarded by the task's final-answer reward
# (trl_ada.tasks.trace_arithmetic.final_answer_reward). The sets are then selected from the scored pools with
# prepare_data's own band selection (select_band_mix, the same seeded draw as --band_mix):
#
#   train_paper.jsonl    320 training prompts in the paper's filter: pass rate in (0, 0.375] (1-6 correct of 16;
#                        unsolved and easier prompts dropped), drawn uniformly from the band; their band column
#                        splits it in three (1-2, 3-4 and 5-6 correct: (0, 0.125], (0.125, 0.25], (0.25, 0.375]) so
#                        the held-out is read per band.
#   heldout_paper.jsonl  320 held-out prompts in the same band.
#   train_mix.jsonl      320 training prompts in the paper's pass-rate mix, unsolved prompts included (984/3,082/870/63
#                        of 4,999 at pass rate 0, (0, 0.2], (0.2, 0.5], above 0.5, as recipes/finite-arithmetic
#                        scales it), by largest remainder: 63/197/56/4.
#   heldout_mix.jsonl    320 held-out prompts in the same mix.
#   train_scored.jsonl / heldout_scored.jsonl: the scored pools themselves (every distinct candidate, its
#                        num_correct and pass_rate), to select other sets from without sampling again.
#
#   bash recipes/trace-arithmetic/build_data.sh [OUT] [SCALE]
#
# TRACE_MODEL=DIR scores with another trace model (e.g. one built by scripts/build_trace_model.py --output-dir DIR
# with other noise), to calibrate the testbed; the default is the shipped one.
#
# Columns: prompt (the fixed-width problem), answer and solution (the exact integer), problem, level (0-4, see
# trl_ada.tasks.trace_arithmetic.LEVELS), num_correct (of 16), pass_rate (num_correct / 16), band (the pass-rate
# band, written as prepare_data's --band_mix writes it). Each prepare_data call also writes its report
# (*.report.json: counts, pass-rate histogram, settings).
#
# Train prompts come from the task's training split (make_problems), held-out prompts from its held-out split
# (held_out_problems): a fixed hash of the prompt decides the split, so no held-out prompt can be a training prompt.
# The held-out split is a tenth of the problems, so its draws repeat more and deduplication leaves fewer (2-digit x
# 1-digit products have only 72 held-out problems).
#
# Deterministic: fixed pool seeds, and prepare_data.py's --seed fixes the sampling and the selection (on one thread;
# other thread counts may change the sampled completions through float rounding).
#
#   OMP_NUM_THREADS=1 bash recipes/trace-arithmetic/build_data.sh [OUT_DIR] [POOL_SCALE]
#
# OUT_DIR defaults to benchmarks/results/trace-arithmetic/data. POOL_SCALE (default 1) multiplies the candidate pools
# (1,800 draws per split) and the set sizes, e.g. 0.25 for a quick check.
# Measured at scale 1: 5.1 CPU-minutes (306 s user + system; 5 min 27 s wall under nice -n 10 on the shared 2-core
# machine): 1,709 distinct training and 1,293 distinct held-out candidates, 48,032 sampled completions. The committed
# sets were built from a git worktree of this checkout (their reports name its model path).
set -euo pipefail

OUT=${1:-benchmarks/results/trace-arithmetic/data}
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

from trl_ada.tasks.trace_arithmetic import held_out_problems, make_problems

out, scale = Path(sys.argv[1]), float(sys.argv[2])
pools = {
    "train": make_problems(round(1800 * scale), seed=301),
    "heldout": held_out_problems(round(1800 * scale), seed=302),
}
for name, problems in pools.items():
    with open(out / f"{name}.jsonl", "w") as handle:
        for problem in problems:
            row = {"problem": problem["prompt"], "answer": problem["answer"], "level": problem["level"]}
            handle.write(json.dumps(row) + "\n")
PY

# The trace model's task format: plain-text prompts, no system prompt or instruction, 96-token trace completions.
MODEL=${TRACE_MODEL:-$(python -c 'from trl_ada.tasks.trace_arithmetic import TINY_TRACE_ASSETS as A; print(A)')}
COMMON=(--model_name_or_path "$MODEL"
    --reward trl_ada.tasks.trace_arithmetic.final_answer_reward --prompt_format text --system_prompt ""
    --instruction "" --keep_columns level --num_samples 16
    --max_new_tokens "$(python -c 'from trl_ada.tasks.trace_arithmetic import MAX_COMPLETION_LENGTH as M; print(M)')"
    --temperature 1.0 --batch_size 512 --seed 0)
for split in train heldout; do
    # Scores every candidate and keeps them all (band [0, 1]); the sets are selected below.
    python "$REPO/scripts/prepare_data.py" --dataset_name "$POOLS/$split.jsonl" --output "$OUT/${split}_scored.jsonl" \
        "${COMMON[@]}" --pass_rate_band 0 1 --band_ends "[]"
done

python - "$OUT" "$SCALE" <<'PY'
import json
import sys
from pathlib import Path

from datasets import Dataset

from trl_ada.cli.prepare_data import mix_counts, parse_band_mix, select_band_mix, write_dataset

out, scale = Path(sys.argv[1]), float(sys.argv[2])
size = round(320 * scale)
sets = {
    "paper": (["(0,0.375]:1"], size),  # the paper's filter: drop unsolved prompts and those above 0.375
    "mix": (["[0,0]:984", "(0,0.2]:3082", "(0.2,0.5]:870", "(0.5,1]:63"], size),  # the paper's training mix
}
# The paper set's band column splits the filter's band in three, to read the held-out per band: 1-2, 3-4, 5-6 of 16.
paper_bands = [band for band, _ in parse_band_mix(["(0,0.125]:1", "(0.125,0.25]:1", "(0.25,0.375]:1"])]
for split in ("train", "heldout"):
    with open(out / f"{split}_scored.jsonl") as handle:
        scored = Dataset.from_list([json.loads(line) for line in handle if line.strip()])
    for name, (specs, total) in sets.items():
        mix = parse_band_mix(specs)
        selected, stats = select_band_mix(scored, mix, mix_counts(mix, total, 16), 16, seed=0)
        if name == "paper":
            labels = [next(str(b) for b in paper_bands if b.contains(c, 16)) for c in selected["num_correct"]]
            selected = selected.remove_columns("band").add_column("band", labels)
        write_dataset(selected, out / f"{split}_{name}.jsonl")
        print(f"{split}_{name}: {len(selected)} prompts, per band {json.dumps(stats)}")
PY
rm -rf "$POOLS"
