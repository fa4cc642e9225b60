#!/usr/bin/env bash
# Run every test: lint, the library (values, shapes, properties, parity with PyTorch), every
# notebook re-executed by nbval (natively, and in a Binder-like environment on a foreign CPU
# configuration), the book built with zero warnings, every page in Chromium with axe-core, and
# the whole book as a PDF. Installs what the tests need: the virtual environment, PyTorch
# (CPU), Debian's chromium and TeX Live, and axe-core from npm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_test_tools.sh

echo "== ruff"
.venv/bin/ruff check .
# One BLAS thread per test process: two processes already use both cores. The notebooks'
# native re-run below is the one step with 2 BLAS threads, and it runs alone; the Binder-
# environment re-run uses 1 thread on a foreign CPU configuration (tests/test_binder_env.py):
# stored outputs must hold under both.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
NBVAL=(--nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg)
if [ $# -gt 0 ]; then
    # Some tests only (e.g. `bash scripts/test.sh tests/test_softmax.py book/02_softmax.ipynb`).
    echo "== pytest $*"
    exec .venv/bin/python -m pytest -n 2 --nbval "${NBVAL[@]}" "$@"
fi
echo "== pytest: the library, the site, the PDF and the Binder environment (2 processes)"
# Two workers take the work longest unit first (tests/conftest.py): the Binder environment and
# the builds start at once, each built once and shared by both workers (tests/shared_build.py).
status=0
.venv/bin/python -m pytest -n 2 --durations=15 || status=$?
echo "== pytest: every notebook re-run natively by nbval (one process, 2 BLAS threads)"
mapfile -t notebooks < <(.venv/bin/python -c \
    'import sys; sys.path.insert(0, "tests"); from book_toc import toc_notebooks; print(*toc_notebooks(), sep="\n")')
.venv/bin/python -m pytest --nbval "${NBVAL[@]}" --durations=5 "${notebooks[@]}" || status=$?
exit "$status"
