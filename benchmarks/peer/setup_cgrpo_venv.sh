#!/usr/bin/env bash
# The peer package trl-cgrpo in a virtualenv of its own (.venv-cgrpo), on the TRL 1.14 stack CI tests trl-ada on.
#
#   bash benchmarks/peer/setup_cgrpo_venv.sh            # create .venv-cgrpo (reused if it already imports trl_cgrpo)
#   CGRPO_VENV=/path/to/venv bash benchmarks/peer/setup_cgrpo_venv.sh
#
# trl-cgrpo 0.2.0 requires trl>=1.12,<1.15, so it cannot live in the dev environment (TRL 1.16). The stack is exactly
# constraints/trl-1.14.txt (trl 1.14.2, transformers 5.0.0, torch 2.13.0 CPU); trl-ada is installed editable without
# its dependencies so that benchmarks/peer/cgrpo_learning.py can import the testbeds' tasks, tiny model and rewards.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO_ROOT"
VENV="${CGRPO_VENV:-$REPO_ROOT/.venv-cgrpo}"
PYTHON="${BASE_PYTHON:-$(command -v python3.11 || command -v python3)}"
CONSTRAINTS="constraints/trl-1.14.txt"

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import trl_cgrpo, trl_ada" 2>/dev/null; then
    echo "[cgrpo-venv] $VENV is ready"
    exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" torch==2.13.0
"$VENV/bin/python" -m pip install -q -c "$CONSTRAINTS" \
    trl==1.14.2 transformers accelerate peft datasets huggingface_hub tokenizers \
    math-verify antlr4-python3-runtime matplotlib numpy pytest trl-cgrpo==0.2.0
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -c "import torch, trl, transformers, trl_cgrpo, trl_ada; \
print('[cgrpo-venv] torch', torch.__version__, 'trl', trl.__version__, 'transformers', transformers.__version__, \
'trl-cgrpo', trl_cgrpo.__version__ if hasattr(trl_cgrpo, '__version__') else '0.2.0')"
