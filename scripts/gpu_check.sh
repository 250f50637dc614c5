#!/usr/bin/env bash
# GPU check of AdaGRPOTrainer + vLLM on one GPU (server mode, colocate mode, bf16, step-time table), ~8 minutes.
# Phase 5b compares the asynchronous trainers (TRL's AsyncGRPOTrainer n=4 against AdaAsyncGRPOTrainer seq_balance,
# benchmarks/async_learning.py on `vllm serve`): `--async-gpus 0,1` gives the server and the trainer a GPU each and
# syncs weights over NCCL; on one GPU the adapter goes over HTTP (`--skip async` leaves the phase out).
#
#   bash scripts/gpu_check.sh                       # on a GPU machine where vllm, trl and datasets import
#   bash scripts/gpu_check.sh --dry-run             # anywhere: model build + config validation + the plan
#   WHEELS_DIR=.whl bash scripts/gpu_check.sh       # install carried wheels first (no network on the machine)
#   bash scripts/gpu_check.sh --skip colocate --budget-s 300   # extra arguments go to scripts/gpu_check.py
#
# The repository is used in place (PYTHONPATH), so trl_ada needs no `pip install`. Results go to $OUT (the device
# tool's output folder) when it is set, else outputs/gpu_check: summary.json, table.txt, logs.tar.gz.
# GPU_CHECK_TIMEOUT (default 540 s) is a hard cap on the whole run; gpu_check.py keeps its own budget (--budget-s,
# default 480 s) below it and stops the vLLM server on SIGTERM.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
PYTHON="${PYTHON:-python3}"
WHEELS_DIR="${WHEELS_DIR:-}"
SITE_DIR="${SITE_DIR:-/tmp/trl_ada_site}"

if [[ -n "$WHEELS_DIR" ]]; then
    shopt -s nullglob
    wheels=("$WHEELS_DIR"/*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
        echo "[gpu-check] WHEELS_DIR=$WHEELS_DIR holds no .whl files" >&2
        exit 2
    fi
    echo "[gpu-check] installing ${#wheels[@]} carried wheels into $SITE_DIR"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE_DIR" \
        "${wheels[@]}"
    export PYTHONPATH="$SITE_DIR${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE_DIR/bin:$PATH"
fi
export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1

OUT_DIR="${OUT:-$REPO_ROOT/outputs/gpu_check}"
mkdir -p "$OUT_DIR"

if [[ " $* " != *" --dry-run "* ]]; then
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv || true
fi
# Which of the needed packages are missing (vllm, trl and datasets are not in a bare CUDA image).
"$PYTHON" - <<'EOF' || true
import importlib.util
missing = [m for m in ("torch", "vllm", "trl", "transformers", "accelerate", "datasets") if importlib.util.find_spec(m) is None]
print("[gpu-check] missing packages: " + (", ".join(missing) if missing else "none"))
EOF

exec timeout --signal=TERM --kill-after=30 "${GPU_CHECK_TIMEOUT:-540}" \
    "$PYTHON" scripts/gpu_check.py --out-dir "$OUT_DIR" "$@"
