#!/usr/bin/env bash
# Set up, then run the storage demo in a fresh temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
.venv/bin/deferq demo --path "$dir/storage" "$@"
