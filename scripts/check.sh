#!/usr/bin/env bash
# Set up, then run every check: mypy --strict, the whole pytest suite, CrossHair on the pure core.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== mypy --strict (src, tests and the conformance tools)"
.venv/bin/mypy --strict src tests conformance
echo "== CrossHair contracts on the pure core"
bash scripts/crosshair.sh
echo "== pytest"
.venv/bin/python -m pytest -q "$@"
