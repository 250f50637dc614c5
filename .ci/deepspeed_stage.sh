#!/usr/bin/env bash
# CI stage: DeepSpeed ZeRO-2 and ZeRO-3 on two CPU processes (tests/test_sharded.py: the same decisions, losses and
# weights as DDP; ZeRO-3 gathers its parameters once per step), in a venv layered on the main environment.
#
#   bash .ci/deepspeed_stage.sh                      # create/reuse .venv-deepspeed, then run the tests
#   DEEPSPEED_STAGE_REBUILD=1 bash .ci/deepspeed_stage.sh
#   bash .ci/deepspeed_stage.sh -k zero3             # extra arguments go to pytest
#
# deepspeed is not in the main environment (the README's install; it is the optional `deepspeed` extra). Its sdist
# imports torch to build, so it is installed with --no-build-isolation into a venv that sees the main environment's
# packages (a .pth file adds the main environment's site directories: stage_lib.sh's layer_venv_on, which works when
# that environment is itself a virtualenv, where --system-site-packages would expose the base interpreter's instead):
# it keeps that torch (a build-isolated install would fetch a CUDA torch) and the main environment is never touched. DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) talks gloo without oneCCL and
# JIT-compiles its shared-memory comm op on first use (gcc; ninja comes with deepspeed).
# Exits non-zero when the setup or a test fails, and when any selected test was skipped.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STAGE_NAME=deepspeed-stage
# shellcheck source=stage_lib.sh
source .ci/stage_lib.sh

DS_VENV="${DEEPSPEED_VENV:-$REPO_ROOT/.venv-deepspeed}"
BASE_PYTHON="${BASE_PYTHON:-$(command -v python)}"  # the main environment's interpreter, where trl_ada is installed
DEEPSPEED_SPEC="deepspeed==0.19.8"
RECIPE_VERSION=2
BASE_STACK="$("$BASE_PYTHON" -c 'import sys, torch, trl, accelerate; print(sys.prefix, torch.__version__, trl.__version__, accelerate.__version__)')"
EXPECTED_MARKER="recipe=$RECIPE_VERSION $DEEPSPEED_SPEC base=[$BASE_STACK] setup.py=$(sha256sum setup.py | cut -c1-16)"

if venv_needs_build "$DS_VENV" "$EXPECTED_MARKER" "${DEEPSPEED_STAGE_REBUILD:-0}"; then
    layer_venv_on "$DS_VENV" "$BASE_PYTHON"
    PIP=("$DS_VENV/bin/python" -m pip --disable-pip-version-check)
    STEP=$(date +%s.%N)
    # setuptools >= 70.1 builds wheels by itself (no `wheel` package); satisfied from the main environment if there.
    "${PIP[@]}" install --quiet "setuptools>=70.1"
    "${PIP[@]}" install --quiet --no-build-isolation "$DEEPSPEED_SPEC"
    log "$DEEPSPEED_SPEC installed in $(elapsed_since "$STEP") s"
    # The main environment's stack must be what the venv runs: deepspeed may add packages, never replace these.
    "$DS_VENV/bin/python" - "$BASE_STACK" <<'PY' || die "installing deepspeed changed the main stack (above)"
import sys

import accelerate
import deepspeed
import torch
import trl

have = f"{torch.__version__} {trl.__version__} {accelerate.__version__}"
print(f"[deepspeed-stage] deepspeed {deepspeed.__version__} over torch/trl/accelerate {have}")
sys.exit(0 if sys.argv[1].split(" ", 1)[1] == have else f"expected {sys.argv[1]}")
PY
    venv_built "$DS_VENV" "$EXPECTED_MARKER"
fi
exit_if_setup_only

log "running tests/test_sharded.py (ZeRO-2, ZeRO-3 and their DDP baseline) $* in $DS_VENV"
DS_ACCELERATOR=cpu run_stage_tests "$DS_VENV/bin/python" 0 -rfEs tests/test_sharded.py \
    -k "(zero2 or zero3) and not fsdp2" "$@"
log "OK: setup ${SETUP_SECONDS} s, tests ${TEST_SECONDS} s, total $(elapsed_since "$STAGE_START") s"
