#!/usr/bin/env bash
# CI: the side lane that .ci/run starts in the background while the main suite runs. First the install half of the
# stages, niced so that the main suite keeps its cores: the GPU install's resolution (a dry run of pip's resolver,
# metadata only) and the virtualenvs of the vLLM, DeepSpeed and TRL 1.14 / 1.15 stages, one after another (each stage
# script stops once its venv is ready, STAGE_SETUP_ONLY=1, and its later call reuses the venv by its marker). Then the
# stages whose tests can share the machine with the main suite: DeepSpeed ZeRO on two CPU processes and the other
# supported TRL releases (1.14 at setup.py's lower bounds, 1.15). The vLLM stage (a real server with timeouts) runs
# after the main suite, alone. Prints `[ci] NAME: N s` per step.
set -euo pipefail
cd "$(dirname "$0")/.."
timed() {
    local name="$1" s
    shift
    s=$(date +%s)
    "$@"
    echo "[ci] $name: $(( $(date +%s) - s )) s"
}
timed "GPU resolve check" nice -n 10 bash .ci/gpu_resolve_check.sh
timed "vLLM venv" env STAGE_SETUP_ONLY=1 nice -n 10 bash .ci/vllm_stage.sh
timed "DeepSpeed venv" env STAGE_SETUP_ONLY=1 nice -n 10 bash .ci/deepspeed_stage.sh
for trl_minor in 1.14 1.15; do
    timed "TRL $trl_minor venv" env STAGE_SETUP_ONLY=1 nice -n 10 bash .ci/trl_stage.sh "$trl_minor"
done
timed "DeepSpeed stage" bash .ci/deepspeed_stage.sh
for trl_minor in 1.14 1.15; do
    timed "TRL $trl_minor stage" bash .ci/trl_stage.sh "$trl_minor"
done
