#!/usr/bin/env bash
# What the tests need beyond a reader's environment, installed once (safe to run again): the
# test tools of requirements-dev.txt, PyTorch's CPU build, Debian's chromium and TeX Live, and
# axe-core from npm. Used by scripts/test.sh (everything) and scripts/quick_test.sh (no
# browser or PDF; pass `quick`).
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

if [ "${1:-}" = quick ]; then
    exit 0
fi
# Debian's chromium for the browser tests, TeX Live for the PDF test.
bash scripts/install_system_packages.sh chromium tex
# axe-core for the accessibility checks, pinned by tests/browser/package-lock.json.
if [ ! -f tests/browser/node_modules/axe-core/axe.min.js ]; then
    echo "== installing axe-core (npm ci)"
    npm ci --prefix tests/browser --no-audit --no-fund --silent
fi
