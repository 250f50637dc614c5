#!/usr/bin/env bash
# CI stage: trl-ada on another TRL release, in its own virtualenv, with exactly the versions of constraints/trl-X.txt.
#
#   bash .ci/trl_stage.sh 1.14                     # create/reuse .venv-trl-1.14, install, run the trainer tests
#   bash .ci/trl_stage.sh 1.14 -k uniform          # extra arguments go to pytest
#   TRL_STAGE_SCOPE=seam bash .ci/trl_stage.sh 1.15  # 1.15 on CPU: the seam's checks only (TRL_STAGE_SCOPE below)
#   TRL_STAGE_REBUILD=1 bash .ci/trl_stage.sh 1.15 # throw the venv away and build it again
#   TRL_STAGE_VENV=/path/to/venv bash .ci/trl_stage.sh 1.15
#
# The main environment is never touched: a clean venv (no --system-site-packages) per TRL minor. Install recipe:
#   1. `pip install -c constraints/trl-X.txt torch`, then `pip install -c constraints/trl-X.txt -e ".[dev]"` (a
#      resolution conflict fails the stage: setup.py's ranges must admit every tested stack);
#   2. every package of the constraint file must then be installed at exactly its pinned version, or the stage fails.
# Idempotent: a marker in the venv records the recipe, the constraint file and setup.py; a matching venv is reused.
#
# Tests (the ones that depend on TRL's private API): `uniform` reproduces GRPOTrainer bit for bit, seq_balance on one
# process and on two (gloo), est and DAPO, checkpoint save/resume, the model card, and the TRL seam (no opt-out: the
# release must be inside trl_seam.SUPPORTED_TRL). TRL_STAGE_SCOPE (below) narrows the list.
# Exits non-zero when the setup fails, a test fails, or no test ran.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STAGE_NAME="trl-stage ${1:-?}"
# shellcheck source=stage_lib.sh
source .ci/stage_lib.sh

[[ $# -ge 1 ]] || die "usage: bash .ci/trl_stage.sh TRL_MINOR [pytest args...]   (e.g. 1.15; see constraints/)"
TRL_MINOR="$1"
shift
CONSTRAINTS="constraints/trl-${TRL_MINOR}.txt"
[[ -f "$CONSTRAINTS" ]] || die "no $CONSTRAINTS (have: $(ls constraints/ 2>/dev/null | tr '\n' ' '))"

TRL_VENV="${TRL_STAGE_VENV:-$REPO_ROOT/.venv-trl-${TRL_MINOR}}"
BASE_PYTHON="${BASE_PYTHON:-$(command -v python3.11 || command -v python3)}"
TESTS=(
    tests/test_trainer.py
    tests/test_trainer_est_dapo.py
    tests/test_multiprocess.py
    tests/test_hardening.py
    tests/test_resume.py
    tests/test_trl_drop_in.py
    tests/test_card.py
    tests/test_trl_seam.py
    tests/test_trl_touchpoints.py
    tests/test_trl_async_touchpoints.py
    tests/test_weight_sync.py
    tests/test_rollout_func.py
    tests/test_environments.py
    tests/test_tools.py
    tests/test_async_rollout.py
    tests/test_async_trainer.py
    tests/test_async_injection.py
    tests/test_async_cpu.py
    tests/test_tree_attention.py
    # installing the wheel over this stack changes none of it; the wheel pins nothing of the user's stack
    tests/test_install.py::test_installing_the_wheel_over_a_supported_stack_changes_none_of_it
    tests/test_install.py::test_wheel_pins_none_of_the_user_stack_and_leaves_torch_to_trl
    # setup.py's Python floor is one this stack's packages accept
    tests/test_install.py::test_python_floor_is_one_every_tested_package_installed_here_accepts
)
# TRL_STAGE_SCOPE=seam: the TRL seam's own checks, which build no trainer: the touchpoint tables, the seam's tests,
# the async rollout worker's protocols and the install checks. CI uses it for 1.15, the release between the floor
# (1.14) and the main suite's 1.16, whose GRPOTrainer cannot train on CPU: its fused LM head computes log-probabilities
# with a Triton kernel only, so trl-ada refuses 1.15 off CUDA/XPU (trl_seam.grpo_private.check_fused_lm_head_runs);
# the trainer files need a GPU there.
# TRL_STAGE_SCOPE=floor: the seam list plus the single-process trainer files that call TRL's private API (the
# trainer's overrides, weight sync, rollout_func, the async trainer) and the runs at the floor's accelerate and
# transformers (two processes over gloo, checkpoint save and resume, the model card), which are what an old stack
# changes. It leaves out the hardening and tool-loop files (about a third of the whole list's time), which run at 1.16
# in the main suite.
SEAM_TESTS=(
    tests/test_trl_seam.py tests/test_trl_touchpoints.py tests/test_trl_async_touchpoints.py tests/test_async_rollout.py
    "${TESTS[@]: -3}"
)
TRAINER_TESTS=(
    tests/test_trainer.py tests/test_trainer_est_dapo.py tests/test_trl_drop_in.py tests/test_weight_sync.py
    tests/test_rollout_func.py tests/test_async_trainer.py tests/test_async_injection.py tests/test_tree_attention.py
)
OLD_STACK_TESTS=(tests/test_multiprocess.py tests/test_resume.py tests/test_card.py)
case "${TRL_STAGE_SCOPE:-all}" in
    all) ;;
    seam) TESTS=("${SEAM_TESTS[@]}") ;;
    floor) TESTS=("${SEAM_TESTS[@]}" "${TRAINER_TESTS[@]}" "${OLD_STACK_TESTS[@]}") ;;
    *) die "TRL_STAGE_SCOPE is 'all' (default), 'floor' or 'seam', not '${TRL_STAGE_SCOPE}'" ;;
esac
RECIPE_VERSION=2
EXPECTED_MARKER="recipe=$RECIPE_VERSION python=$("$BASE_PYTHON" -c 'import sys; print(sys.version.split()[0])')"
EXPECTED_MARKER+=" constraints=$(sha256sum "$CONSTRAINTS" | cut -c1-16) setup.py=$(sha256sum setup.py | cut -c1-16)"

# ------------------------------------------------------------------------------------------------------------------
# 1. The venv (reused when complete)
# ------------------------------------------------------------------------------------------------------------------
if venv_needs_build "$TRL_VENV" "$EXPECTED_MARKER" "${TRL_STAGE_REBUILD:-0}"; then
    PIP=("$TRL_VENV/bin/python" -m pip --disable-pip-version-check)

    STEP=$(date +%s.%N)
    # --no-compile: the tests compile what they import, once (stage_lib.sh's use_bytecode_cache), instead of all of
    # torch here, in the background set-up, on the main suite's CPU.
    "${PIP[@]}" install --quiet --no-compile -c "$CONSTRAINTS" torch
    log "torch installed in $(elapsed_since "$STEP") s"

    STEP=$(date +%s.%N)
    # A resolution conflict is a failure: setup.py's ranges must admit every stack CI tests.
    "${PIP[@]}" install --quiet --no-compile -c "$CONSTRAINTS" -e ".[dev]" \
        || die "pip install -c $CONSTRAINTS -e .[dev] failed: setup.py's ranges do not admit this stack (above)"
    log "installed -e .[dev] with its dependencies under $CONSTRAINTS in $(elapsed_since "$STEP") s"

    # Every pin of the constraint file must be what is installed, whichever install path ran.
    "$TRL_VENV/bin/python" - "$CONSTRAINTS" <<'EOF' || die "the venv does not hold the pinned stack (above)"
import importlib.metadata as m
import re
import sys

from packaging.version import Version

bad = []
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, pinned = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
    try:
        have = m.version(name)
    except m.PackageNotFoundError:
        bad.append(f"{name}: not installed (pinned {pinned})")
        continue
    if Version(have).public != Version(pinned).public:
        bad.append(f"{name}: {have} installed, {pinned} pinned")
import torch, trl, transformers, trl_ada  # noqa: E401,F401

print(f"[trl-stage] torch {torch.__version__} | trl {trl.__version__} | transformers {transformers.__version__} | "
      f"trl_ada from {trl_ada.__file__}")
if bad:
    sys.exit("\n".join(bad))
EOF
    venv_built "$TRL_VENV" "$EXPECTED_MARKER"
fi
exit_if_setup_only

# ------------------------------------------------------------------------------------------------------------------
# 2. The tests (some must run; failures fail the stage)
# ------------------------------------------------------------------------------------------------------------------
log "running ${TESTS[*]} $* in $TRL_VENV"
# PYTHONSAFEPATH=1 (python -P): no current directory on sys.path, so `import trl_ada` is the venv's install.
use_bytecode_cache
PYTHONSAFEPATH=1 run_stage_tests "$TRL_VENV/bin/python" 1 -rfEs "${TESTS[@]}" "$@"
log "OK: setup ${SETUP_SECONDS} s, tests ${TEST_SECONDS} s, total $(elapsed_since "$STAGE_START") s"
