#!/usr/bin/env bash
# CI: the side lane that .ci/run starts in the background while the main suite runs. First the install half of the
# stages, niced (.ci/build_stage_venvs.sh: the GPU install's resolution and the stage virtualenvs), then the stages whose
# tests can share the machine with the main suite: DeepSpeed ZeRO on two CPU processes and the other supported TRL
# releases (1.14 at setup.py's lower bounds, 1.15), each in its own virtualenv. The vLLM stage (a real server with
# timeouts) runs after the main suite, alone. Prints `[ci] NAME: N s` per step.
set -euo pipefail
cd "$(dirname "$0")/.."
timed() {
    local name="$1" s
    shift
    s=$(date +%s)
    "$@"
    echo "[ci] $name: $(( $(date +%s) - s )) s"
}
timed "stage venvs and GPU resolve check" nice -n 10 bash .ci/build_stage_venvs.sh
timed "DeepSpeed stage" bash .ci/deepspeed_stage.sh
for trl_minor in 1.14 1.15; do
    timed "TRL $trl_minor stage" bash .ci/trl_stage.sh "$trl_minor"
done
