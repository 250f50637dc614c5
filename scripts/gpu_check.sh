#!/usr/bin/env bash
# GPU check of AdaGRPOTrainer on one GPU, bf16 (scripts/gpu_check.py's docstring says what each phase measures).
# Phase 1 needs no vLLM: TRL, datasets and math-verify travel as small wheels, generation is transformers', and it
# fits 8 minutes: uniform against TRL's GRPOTrainer on the same seed, then GRPO n=4, Seq-balance and DAPO step times
# on a random model of the paper's shape (Qwen2.5-Math-1.5B), as ratios to GRPO n=4. The vLLM phases follow only
# where `import vllm` works.
#
# On the lent GPU machine (torch, transformers, accelerate, peft; no TRL, datasets or vLLM; no network; 64 MiB
# carried per call; 15 minutes of device time in all):
#   python scripts/gpu_check.py --fetch-wheels      # here, once: the pinned wheels into .whl/ (git ignores it)
#   bash scripts/gpu_check.sh --dry-run             # here: configs, plan and budgets, wheel set and tree size
#   WHEELS_DIR=.whl bash scripts/gpu_check.sh       # there: the device tool's run with carry [".whl"], timeout_s 560
#
# Elsewhere:
#   bash scripts/gpu_check.sh                       # a GPU machine where trl and datasets import (vLLM optional)
#   bash scripts/gpu_check.sh --skip vllm --steps 6 # extra arguments go to scripts/gpu_check.py
#
# The repository is used in place (PYTHONPATH), so trl_ada needs no `pip install`. Results go to $OUT (the device
# tool's output folder) when it is set, else outputs/gpu_check: summary.json, table.txt, logs.tar.gz.
# GPU_CHECK_TIMEOUT is a hard cap on gpu_check.py (default 460 s, 970 s where vLLM is installed); gpu_check.py keeps
# its own budgets below it (--budget-s 450 for phase 1, --vllm-budget-s 480) and stops what it started on SIGTERM.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
PYTHON="${PYTHON:-python3}"
WHEELS_DIR="${WHEELS_DIR:-}"
SITE_DIR="${SITE_DIR:-/tmp/trl_ada_site}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TRL_EXPERIMENTAL_SILENCE=1

# Neither the dry run nor the download needs the GPU, the carried wheels or a time cap.
if [[ " $* " == *" --dry-run "* || " $* " == *" --fetch-wheels "* ]]; then
    export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
    exec "$PYTHON" scripts/gpu_check.py "$@"
fi

if [[ -n "$WHEELS_DIR" ]]; then
    shopt -s nullglob
    wheels=("$WHEELS_DIR"/*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
        echo "[gpu-check] WHEELS_DIR=$WHEELS_DIR holds no .whl files" >&2
        exit 2
    fi
    echo "[gpu-check] installing ${#wheels[@]} carried wheels into $SITE_DIR"
    timeout 20 "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE_DIR" "${wheels[@]}"
    export PYTHONPATH="$SITE_DIR${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE_DIR/bin:$PATH"
fi
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"

OUT_DIR="${OUT:-$REPO_ROOT/outputs/gpu_check}"
mkdir -p "$OUT_DIR"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
# Which of the needed packages are missing; the exit status says whether vLLM is there at all.
has_vllm=0
"$PYTHON" - <<'EOF' || has_vllm=$?
import importlib.util
import sys
names = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "math_verify", "vllm")
missing = [m for m in names if importlib.util.find_spec(m) is None]
print("[gpu-check] missing packages: " + (", ".join(missing) if missing else "none"))
sys.exit(0 if "vllm" in missing else 3)
EOF
default_timeout=460
[[ "$has_vllm" == 3 ]] && default_timeout=970

exec timeout --signal=TERM --kill-after=15 "${GPU_CHECK_TIMEOUT:-$default_timeout}" \
    "$PYTHON" scripts/gpu_check.py --out-dir "$OUT_DIR" "$@"
