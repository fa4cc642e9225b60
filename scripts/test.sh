#!/usr/bin/env bash
# Run every test: lint, the library (values, shapes, properties, parity with PyTorch), every
# notebook re-executed by nbval, the book built with zero warnings, every page in Chromium.
# Installs what the tests need: the virtual environment, PyTorch (CPU) and Debian's chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh

if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    echo "== installing PyTorch 2.13.0 (CPU) for the parity tests"
    .venv/bin/python -m pip install --quiet torch==2.13.0
fi

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "== installing Debian's chromium for the browser tests"
    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium > /dev/null
fi
export CHROMIUM

echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
# One BLAS thread per process: two xdist workers already use both cores, and the chapters'
# small matrices gain nothing from threads (scripts/execute_notebooks.py does the same).
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# loadfile keeps each notebook's cells (and the site tests) on one worker.
.venv/bin/python -m pytest -n 2 --dist loadfile \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg "$@"
