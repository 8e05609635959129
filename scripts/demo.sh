#!/usr/bin/env bash
# Set up, then run the demos in fresh temporary directories: the queue demo (a small service whose
# tasks succeed, retry and give up, then the operator CLI and a restart) and the storage-level demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
.venv/bin/deferq queue-demo --path "$dir/queue-storage"
echo
.venv/bin/deferq demo --path "$dir/storage"
