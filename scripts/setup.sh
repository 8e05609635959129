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

# The PostgreSQL backend's tests (tests/postgres) start a throwaway server: install Debian's
# PostgreSQL when its binaries are missing (CI runs this as root on a fresh Debian machine).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "setup: installing postgresql (Debian package) for tests/postgres"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "setup: warning: no PostgreSQL server binaries and not root: tests/postgres will skip" >&2
    fi
fi

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
