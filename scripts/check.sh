#!/usr/bin/env bash
# Set up, then run every check: mypy --strict and CrossHair on the pure core once, with .venv
# (the default python3, the oldest supported: 3.11), then the whole pytest suite on each
# supported Python: .venv first, then the newest (.venv-3.13). DEFERQ_PYTHONS picks the further
# Pythons (default "3.13+": 3.13 or a later one; see scripts/pythons.sh; DEFERQ_PYTHONS= runs
# pytest on .venv only). Arguments go to every pytest run. Each part's time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pythons.sh
export DEFERQ_PYTHONS="${DEFERQ_PYTHONS-3.13+}"
# tests/postgres must run here (setup.sh installs the server): fail rather than skip them.
export DEFERQ_REQUIRE_POSTGRES="${DEFERQ_REQUIRE_POSTGRES-1}"
timings=()
started=$SECONDS
part() {  # LABEL COMMAND...: run it, note its wall time, return its status
    local label="$1" t0=$SECONDS status=0
    shift
    echo "== $label"
    "$@" || status=$?
    timings+=("$label: $((SECONDS - t0)) s")
    return $status
}

part "setup" bash scripts/setup.sh
venvs=(.venv)
read -r -a specs <<<"$DEFERQ_PYTHONS"
for spec in "${specs[@]}"; do
    venvs+=("$(venv_of "$(find_python "$spec")")")
done
part "mypy --strict (src, tests, the conformance tools and the benchmarks)" .venv/bin/mypy --strict src tests conformance benchmarks
part "CrossHair contracts on the pure core" bash scripts/crosshair.sh
failed=()
for venv in "${venvs[@]}"; do
    version="$("$venv/bin/python" -c 'import platform; print(platform.python_version())')"
    # Every Python runs the whole suite even if an earlier one failed: both results are wanted.
    if ! part "pytest on Python $version ($venv)" "$venv/bin/python" -m pytest -q "$@"; then
        failed+=("pytest on Python $version")
    fi
done
echo "== wall times"
printf '  %s\n' "${timings[@]}" "total: $((SECONDS - started)) s"
if [ ${#failed[@]} -gt 0 ]; then
    echo "check: FAILED: ${failed[*]}" >&2
    exit 1
fi
