#!/usr/bin/env bash
# Set up, then run the demos in fresh temporary directories: the queue demo (a small service whose
# tasks succeed, retry and give up, then the operator CLI and a restart), the storage-level demo, and
# the PostgreSQL demo (two worker processes sharing a throwaway database; skipped with a message
# when no PostgreSQL server is installed).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
.venv/bin/deferq queue-demo --path "$dir/queue-storage"
echo
.venv/bin/deferq demo --path "$dir/storage"
echo
.venv/bin/python -m deferq._demos.postgres
