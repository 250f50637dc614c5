#!/usr/bin/env bash
# CI stage: the README's GPU install must resolve. Runs pip's resolver on exactly that command,
#   pip install -c constraints/trl-1.16-gpu.txt -e ".[vllm,deepspeed]"
# as a dry run against the package registry (`--dry-run --ignore-installed --report`), then checks the report: every
# pin of the constraints file is what pip picked, and torch is the registry's own (CUDA) build, not a local CPU wheel.
#
#   bash .ci/gpu_resolve_check.sh                                  # constraints/trl-1.16-gpu.txt
#   bash .ci/gpu_resolve_check.sh constraints/trl-1.16.txt        # another file (this one fails: vllm 0.31 needs
#                                                                  # transformers < 5.18, it pins 5.24)
#   GPU_RESOLVE_REBUILD=1 bash .ci/gpu_resolve_check.sh            # rebuild the pip venv
#
# Cheap by construction: nothing is installed, and no multi-GB wheel is downloaded. The resolver reads each wheel's
# metadata only, from the registry's separate metadata files where it serves them and otherwise with HTTP range
# requests (`--use-feature=fast-deps`: pip reads the wheel's METADATA out of the zip, not the whole file; measured:
# the only full downloads are deepspeed's 2 MB source distribution and the build backends). That needs a newer pip
# than Python 3.11's bundled one, so the resolver runs from a small venv holding only a pinned pip.
# `pip --isolated`: the user's pip configuration and PIP_* variables are ignored (they may point pip at local wheel
# stores, such as a CPU torch, which would hide the GPU resolution); the global one (/etc/pip.conf) still applies.
# Exits non-zero when the resolution fails or differs from the pins.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STAGE_NAME=gpu-resolve
# shellcheck source=stage_lib.sh
source .ci/stage_lib.sh

CONSTRAINTS="${1:-constraints/trl-1.16-gpu.txt}"
EXTRAS="${GPU_RESOLVE_EXTRAS:-vllm,deepspeed}"
[[ -f "$CONSTRAINTS" ]] || die "no $CONSTRAINTS"
RESOLVER_VENV="${GPU_RESOLVE_VENV:-$REPO_ROOT/.venv-gpu-resolve}"
BASE_PYTHON="${BASE_PYTHON:-$(command -v python3.11 || command -v python3)}"
PIP_SPEC="pip==26.3"
EXPECTED_MARKER="recipe=1 $PIP_SPEC python=$("$BASE_PYTHON" -c 'import sys; print(sys.version.split()[0])')"

if venv_needs_build "$RESOLVER_VENV" "$EXPECTED_MARKER" "${GPU_RESOLVE_REBUILD:-0}"; then
    "$RESOLVER_VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$PIP_SPEC"
    venv_built "$RESOLVER_VENV" "$EXPECTED_MARKER"
fi

REPORT="$(mktemp -t trl-ada-gpu-resolve.XXXXXX.json)"
LOG="$(mktemp -t trl-ada-gpu-resolve.XXXXXX.log)"
trap 'rm -f "$REPORT" "$LOG"' EXIT
log "resolving: pip install -c $CONSTRAINTS -e .[$EXTRAS] (dry run, metadata only)"
STEP=$(date +%s.%N)
set +e
"$RESOLVER_VENV/bin/python" -m pip --isolated --disable-pip-version-check install --dry-run --ignore-installed \
    --use-feature=fast-deps --progress-bar off --report "$REPORT" -c "$CONSTRAINTS" -e ".[$EXTRAS]" >"$LOG" 2>&1
rc=$?
set -e
if [[ $rc -ne 0 ]]; then
    grep -v -e "Location 'file:" "$LOG" | tail -40 >&2
    die "pip could not resolve -c $CONSTRAINTS -e .[$EXTRAS] (exit $rc, above)"
fi
# Full downloads (everything else was read as metadata): a multi-GB one means the check lost its cheapness.
grep -E "^\s*Downloading " "$LOG" | sed 's/^ */  full download: /' || true
log "resolved in $(elapsed_since "$STEP") s"

"$RESOLVER_VENV/bin/python" - "$REPORT" "$CONSTRAINTS" <<'PY'
import json
import re
import sys

from pip._vendor.packaging.version import Version


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


report, constraints = json.load(open(sys.argv[1])), sys.argv[2]
resolved = {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}
bad = []
for line in open(constraints):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, pinned = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line).groups()
    have = resolved.get(canonical(name))
    if have is None:
        bad.append(f"{name}=={pinned} is pinned but not part of the resolution (a stale pin?)")
    elif Version(have) != Version(pinned):
        bad.append(f"{name}: pip picked {have}, the file pins {pinned}")
torch = resolved.get("torch")
if torch is not None and Version(torch).local:
    bad.append(f"torch resolved to the local build {torch}, not the registry's: a local wheel store leaked in")
print(
    f"[gpu-resolve] {len(resolved)} packages: "
    + ", ".join(f"{n} {resolved[n]}" for n in ("trl", "vllm", "deepspeed", "torch", "transformers", "trl-ada") if n in resolved)
)
cuda = sorted(n for n in resolved if n.startswith("nvidia-") and n.endswith(("-cu12", "-cu13")))
print(f"[gpu-resolve] CUDA wheels in the resolution: {', '.join(cuda) or 'none'}")
sys.exit("\n".join(bad) if bad else 0)
PY
log "OK: $CONSTRAINTS resolves with .[$EXTRAS] at its pins ($(elapsed_since "$STAGE_START") s)"
