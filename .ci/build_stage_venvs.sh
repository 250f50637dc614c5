#!/usr/bin/env bash
# CI: the install half of the stages, run by .ci/run in the background (niced) while the main suite runs: the GPU
# install's resolution (a dry run of pip's resolver, metadata only) and the virtualenvs of the vLLM, DeepSpeed, docs
# (and Debian's chromium) and TRL 1.14 / 1.15 stages, one after another. Each stage script stops once its venv is ready
# (STAGE_SETUP_ONLY=1); its later call from .ci/run reuses the venv (its marker matches) and runs the tests. Prints
# `[ci] NAME: N s` per step.
set -euo pipefail
cd "$(dirname "$0")/.."
timed() {
    local name="$1" s
    shift
    s=$(date +%s)
    "$@"
    echo "[ci] $name: $(( $(date +%s) - s )) s"
}
timed "GPU resolve check" bash .ci/gpu_resolve_check.sh
export STAGE_SETUP_ONLY=1
timed "vLLM venv" bash .ci/vllm_stage.sh
timed "DeepSpeed venv" bash .ci/deepspeed_stage.sh
timed "docs venv and chromium" bash .ci/docs_stage.sh
for trl_minor in 1.14 1.15; do
    timed "TRL $trl_minor venv" bash .ci/trl_stage.sh "$trl_minor"
done
