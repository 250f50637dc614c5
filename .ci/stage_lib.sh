# Shared by the CI stages that run in their own virtualenv (.ci/vllm_stage.sh, .ci/trl_stage.sh, .ci/deepspeed_stage.sh): timing and logging,
# a venv reused while its marker matches what it must contain, and a pytest run that must really test something.
# Source it after setting STAGE_NAME (and BASE_PYTHON, the interpreter new venvs are made from).

STAGE_START=$(date +%s.%N)
SETUP_SECONDS=0
TEST_SECONDS=0

elapsed_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[%s %6ss] %s\n' "$STAGE_NAME" "$(elapsed_since "$STAGE_START")" "$*"; }
die() { printf '[%s] ERROR: %s\n' "$STAGE_NAME" "$*" >&2; exit 1; }

# venv_needs_build VENV EXPECTED_MARKER REBUILD: false (1) when VENV is a complete venv built for EXPECTED_MARKER and no
# rebuild is asked for; otherwise removes whatever is there, creates an empty venv, starts the setup clock, true (0).
venv_needs_build() {
    local venv="$1" expected="$2" rebuild="$3"
    if [[ "$rebuild" == "1" && -d "$venv" ]]; then
        log "rebuild requested: removing $venv"
        rm -rf "$venv"
    fi
    if [[ -f "$venv/.trl-ada-stage" && "$(cat "$venv/.trl-ada-stage")" == "$expected" && -x "$venv/bin/python" ]]; then
        log "reusing $venv ($expected)"
        return 1
    fi
    SETUP_START=$(date +%s.%N)
    [[ -n "${BASE_PYTHON:-}" ]] || die "no python3.11 / python3 found; set BASE_PYTHON"
    if [[ -d "$venv" ]]; then
        log "removing incomplete or outdated venv $venv"
        rm -rf "$venv"
    fi
    log "creating venv $venv with $BASE_PYTHON ($("$BASE_PYTHON" --version 2>&1))"
    # shellcheck disable=SC2086  # VENV_ARGS: extra `python -m venv` flags (e.g. --system-site-packages), word-split
    "$BASE_PYTHON" -m venv ${VENV_ARGS:-} "$venv" || die "could not create the venv $venv"
}

# exit_if_setup_only: with STAGE_SETUP_ONLY=1 the stage stops once its venv is ready (.ci/run builds the stage venvs in
# the background while the main suite runs; the stage's later call reuses the venv by its marker and runs the tests).
exit_if_setup_only() {
    if [[ "${STAGE_SETUP_ONLY:-0}" == "1" ]]; then
        log "setup only: venv ready (setup ${SETUP_SECONDS} s)"
        exit 0
    fi
}

# layer_venv_on VENV BASE_PYTHON: VENV sees BASE_PYTHON's packages after its own, through a .pth file that adds the base
# environment's site directories (their own .pth files, such as an editable install's, included). Unlike
# `venv --system-site-packages`, which exposes the *base interpreter's* site-packages, this also works when BASE_PYTHON
# is itself a virtualenv's interpreter (the environment the README's commands are run in).
layer_venv_on() {
    local venv="$1" base="$2" site
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "$base" - "$site/_trl_ada_base_env.pth" <<'PY'
import site
import sys
import sysconfig

dirs = list(dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
with open(sys.argv[1], "w") as pth:
    pth.write("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
PY
}

# venv_built VENV EXPECTED_MARKER: mark VENV complete (only once everything in it was checked).
venv_built() {
    printf '%s\n' "$2" >"$1/.trl-ada-stage"
    SETUP_SECONDS=$(elapsed_since "$SETUP_START")
    log "venv ready in ${SETUP_SECONDS} s ($(du -sh "$1" | cut -f1))"
}

# use_bytecode_cache: the stage's test processes write the bytecode of what they import (next to the sources, in the
# stage venv and the checkout's git-ignored __pycache__) and later processes read it. The CI machine sets
# PYTHONDONTWRITEBYTECODE=1 and the stage venvs are installed --no-compile, so every process compiled torch,
# transformers, TRL and vLLM from source again: a `trl vllm-serve` start took 128 s, 39 s with bytecode (issues stop 37,
# 2-core machine). .ci/run does the same for the main suite.
use_bytecode_cache() {
    unset PYTHONDONTWRITEBYTECODE
}

# run_stage_tests PYTHON ALLOW_SKIPS [pytest arguments...]: exits the stage when pytest fails, when no test ran, and
# (ALLOW_SKIPS=0) when any test was skipped: a run where everything was skipped exits 0 too.
run_stage_tests() {
    local python="$1" allow_skips="$2" junit rc test_start
    shift 2
    test_start=$(date +%s.%N)
    junit="$(mktemp -t trl-ada-stage-junit.XXXXXX.xml)"
    set +e
    "$python" -m pytest -q -p no:cacheprovider --junitxml="$junit" "$@"
    rc=$?
    set -e
    TEST_SECONDS=$(elapsed_since "$test_start")
    if [[ $rc -ne 0 ]]; then
        rm -f "$junit"
        log "FAILED: pytest exited with $rc after ${TEST_SECONDS} s"
        exit "$rc"
    fi
    "$python" - "$junit" "$allow_skips" "$STAGE_NAME" <<'PY' || { rm -f "$junit"; log "FAILED: tests were skipped or none ran"; exit 1; }
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
print(f"[{sys.argv[3]}] junit: {tests} tests, {skipped} skipped")
sys.exit(0 if tests - skipped > 0 and (sys.argv[2] == "1" or skipped == 0) else 1)
PY
    rm -f "$junit"
}
