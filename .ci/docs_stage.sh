#!/usr/bin/env bash
# CI stage: the documentation site (mkdocs.yml, docs/). Builds it with `mkdocs build --strict` (a broken link, a
# missing section or a docstring griffe cannot read fails) and opens it in a headless Chromium
# (tests/test_docs_site.py: titles, navigation, pictures, search index, screenshots against their references).
#
#   bash .ci/docs_stage.sh                     # create/reuse .venv-docs, install chromium if missing, build, test
#   DOCS_STAGE_REBUILD=1 bash .ci/docs_stage.sh
#   bash .ci/docs_stage.sh -k screenshots      # extra arguments go to pytest
#
# The docs tooling (setup.py's `docs` extra, at constraints/docs.txt's versions) goes into a venv layered on the main
# environment (stage_lib.sh's layer_venv_on: it sees trl_ada and the main stack, which the API reference imports for
# the configs' docstrings, and the main environment is never touched). The browser is Debian's `chromium` (apt, as
# root; no browser download). Exits non-zero when the build or a test fails, and when any selected test was skipped.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"
STAGE_NAME=docs-stage
# shellcheck source=stage_lib.sh
source .ci/stage_lib.sh

DOCS_VENV="${DOCS_VENV:-$REPO_ROOT/.venv-docs}"
BASE_PYTHON="${BASE_PYTHON:-$(command -v python)}"  # the main environment's interpreter, where trl_ada is installed
# Outside the project's virtualenv `python` is the system's: the docs venv would be layered on an interpreter without
# TRL, and the build would fail much later on a cross-reference into it.
"$BASE_PYTHON" -c 'import trl, trl_ada' 2>/dev/null || die "$BASE_PYTHON cannot import trl and trl_ada, which the \
API reference reads: activate the project's virtualenv first (the README's set-up, e.g. source .venv/bin/activate), \
or set BASE_PYTHON to its interpreter."
RECIPE_VERSION=1
BASE_PREFIX="$("$BASE_PYTHON" -c 'import sys; print(sys.prefix)')"
DOCS_HASH="$(cat constraints/docs.txt setup.py | sha256sum | cut -c1-16)"
EXPECTED_MARKER="recipe=$RECIPE_VERSION base=$BASE_PREFIX docs=$DOCS_HASH"

if ! command -v chromium >/dev/null 2>&1; then
    STEP=$(date +%s.%N)
    [[ $(id -u) == 0 ]] || die "chromium is missing and this is not root: apt-get install -y chromium"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    log "chromium installed in $(elapsed_since "$STEP") s"
fi

if venv_needs_build "$DOCS_VENV" "$EXPECTED_MARKER" "${DOCS_STAGE_REBUILD:-0}"; then
    layer_venv_on "$DOCS_VENV" "$BASE_PYTHON"
    STEP=$(date +%s.%N)
    # The `docs` extra's requirements, read from setup.py, at the exact versions of constraints/docs.txt.
    mapfile -t DOCS_REQUIREMENTS < <("$BASE_PYTHON" - <<'PY'
import runpy
import setuptools

captured = {}
setuptools.setup = lambda **kwargs: captured.update(kwargs)
runpy.run_path("setup.py", run_name="__main__")
print("\n".join(captured["extras_require"]["docs"]))
PY
)
    "$DOCS_VENV/bin/python" -m pip --disable-pip-version-check install --quiet -c constraints/docs.txt \
        "${DOCS_REQUIREMENTS[@]}"
    log "docs tooling installed in $(elapsed_since "$STEP") s: ${DOCS_REQUIREMENTS[*]}"
    venv_built "$DOCS_VENV" "$EXPECTED_MARKER"
fi
exit_if_setup_only

STEP=$(date +%s.%N)
NO_MKDOCS_2_WARNING=1 "$DOCS_VENV/bin/python" -m mkdocs build --strict --quiet --site-dir "$REPO_ROOT/site"
log "site built (mkdocs build --strict) in $(elapsed_since "$STEP") s: $REPO_ROOT/site"

log "running tests/test_docs_site.py $* in $DOCS_VENV"
# CI=true: a missing chromium fails the test rather than skipping it.
CI=true TRL_ADA_DOCS_SITE="$REPO_ROOT/site" run_stage_tests "$DOCS_VENV/bin/python" 0 -rfEs tests/test_docs_site.py \
    "$@"
log "OK: setup ${SETUP_SECONDS} s, tests ${TEST_SECONDS} s, total $(elapsed_since "$STAGE_START") s"
