#!/usr/bin/env bash
# Build the book into _build/html, exactly as CI checks it: every page rebuilt, warnings are
# errors. Creates the virtual environment first if there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
.venv/bin/jupyter-book build . --all -W -n --keep-going
echo "== the book is in _build/html/index.html"
