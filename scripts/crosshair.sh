#!/usr/bin/env bash
# Check the pre:/post: contracts of the pure modules with CrossHair, time-bounded.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/crosshair check --analysis_kind=PEP316 --per_condition_timeout=4 --per_path_timeout=2 \
    src/deferq/_core/frame.py src/deferq/_core/taskid.py src/deferq/_core/b64.py \
    src/deferq/_core/walcodec.py src/deferq/_core/deadcodec.py src/deferq/_core/names.py \
    src/deferq/_core/recovery.py src/deferq/_core/limits.py src/deferq/_core/ctxmeta.py
echo "crosshair: no counterexamples"
