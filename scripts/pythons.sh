# Sourced by setup.sh and check.sh: which Pythons the checks run on, and where their venvs are.
#
# .venv is the default python3 (the oldest supported, 3.11 here): mypy, CrossHair and the first
# pytest run use it. DEFERQ_PYTHONS names further Pythons, space-separated: "X.Y" is exactly
# that minor version, "X.Y+" the lowest of X.Y, X.Y+1, ... up to X.Y+3 that can be found; each
# gets its own .venv-X.Y (named after the version found). check.sh defaults it to "3.13+".

# find_python SPEC: print the path of a working interpreter for SPEC ("3.13" or "3.13+"), or
# print why none was found on stderr and return 1. It tries pythonX.Y on PATH (a pyenv shim for
# a version pyenv has not activated fails to run, so each candidate is run), then the newest
# ~/.pyenv/versions/X.Y.*/bin/pythonX.Y.
find_python() {
    local spec="$1" major minor last want cand tried=()
    major="${spec%%.*}"
    minor="${spec#*.}"
    minor="${minor%+}"
    last="$minor"
    if [[ "$spec" == *+ ]]; then last=$((minor + 3)); fi
    for ((want = minor; want <= last; want++)); do
        local name="python$major.$want"
        local pyenv_root="${PYENV_ROOT:-${HOME:-}/.pyenv}"
        local candidates=()
        if command -v "$name" >/dev/null 2>&1; then candidates+=("$(command -v "$name")"); fi
        # newest patch release first
        while IFS= read -r cand; do
            candidates+=("$cand")
        done < <(ls -d "$pyenv_root/versions/$major.$want".*/bin/"$name" 2>/dev/null | sort -rV)
        for cand in "${candidates[@]}"; do
            tried+=("$cand")
            if "$cand" -c "import sys; sys.exit(sys.version_info[:2] != ($major, $want))" \
                    >/dev/null 2>&1; then
                echo "$cand"
                return 0
            fi
        done
    done
    echo "error: no Python $spec found: looked for python$major.$minor$([[ "$spec" == *+ ]] \
&& echo " to python$major.$last") on PATH and under ${PYENV_ROOT:-${HOME:-}/.pyenv}/versions" \
"(tried: ${tried[*]:-nothing}). Install one (e.g. 'pyenv install $major.$minor'), or run with" \
"DEFERQ_PYTHONS= to check on the default python3 only." >&2
    return 1
}

# venv_of PYTHON: the venv directory for that interpreter, .venv-X.Y.
venv_of() {
    echo ".venv-$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
}
