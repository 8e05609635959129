#!/usr/bin/env bash
# Create .venv (if missing) with the default python3 and install deferq with its test tools
# into it; then the same for each further Python that DEFERQ_PYTHONS or the arguments name
# (e.g. `bash scripts/setup.sh 3.13+`), each in its own .venv-X.Y (scripts/pythons.sh).
# It fails, saying what it looked for, when a Python that was asked for cannot be found.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pythons.sh

install_into() {  # VENV_DIR PYTHON
    if [ ! -x "$1/bin/python" ]; then
        "$2" -m venv "$1"
    fi
    "$1/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[test]'
}

PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "error: $PYTHON is $("$PYTHON" --version 2>&1); deferq needs Python 3.11 or later" >&2
    exit 1
}
install_into .venv "$PYTHON"

specs=("$@")
if [ ${#specs[@]} -eq 0 ] && [ -n "${DEFERQ_PYTHONS:-}" ]; then
    read -r -a specs <<<"$DEFERQ_PYTHONS"
fi
for spec in "${specs[@]}"; do
    python="$(find_python "$spec")"
    venv="$(venv_of "$python")"
    echo "setup: $venv with $python ($("$python" --version 2>&1))"
    install_into "$venv" "$python"
done
