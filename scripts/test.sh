#!/usr/bin/env bash
# Run every test: lint, the library (values, shapes, properties, parity with PyTorch), every
# notebook re-executed by nbval (natively, and in a Binder-like environment on a foreign CPU
# configuration), the book built with zero warnings, every page in Chromium with axe-core, and
# the whole book as a PDF. Installs what the tests need: the virtual environment, PyTorch
# (CPU), Debian's chromium and TeX Live, and axe-core from npm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh dev

# PyTorch's CPU build for the parity tests (not in requirements-dev.txt: PyPI has no CPU-only
# Linux build). pip finds it in a local wheel directory when the machine has one, else on
# PyTorch's own CPU index.
TORCH=torch==2.13.0+cpu
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    echo "== installing PyTorch 2.13.0 (CPU build) for the parity tests"
    .venv/bin/python -m pip install --quiet "$TORCH" 2>/dev/null \
        || .venv/bin/python -m pip install --quiet "$TORCH" \
            --extra-index-url https://download.pytorch.org/whl/cpu
fi

CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
export CHROMIUM
# Debian's chromium for the browser tests, TeX Live for the PDF test.
bash scripts/install_system_packages.sh chromium tex
# axe-core for the accessibility checks, pinned by tests/browser/package-lock.json.
if [ ! -f tests/browser/node_modules/axe-core/axe.min.js ]; then
    echo "== installing axe-core (npm ci)"
    npm ci --prefix tests/browser --no-audit --no-fund --silent
fi

echo "== ruff"
.venv/bin/ruff check .
echo "== pytest"
# One BLAS thread per test process: two xdist workers already use both cores. The notebooks'
# kernels run with 2 (tests/conftest.py), the Binder-environment run with 1 on a foreign CPU
# configuration (tests/test_binder_env.py): stored outputs must hold under both.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# loadfile keeps each notebook's cells (and the site tests) on one worker.
.venv/bin/python -m pytest -n 2 --dist loadfile --durations=25 \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg "$@"
