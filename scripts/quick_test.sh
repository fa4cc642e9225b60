#!/usr/bin/env bash
# The development loop, about 2 minutes: lint, the library's tests (values, properties,
# PyTorch parity, the real models) and nbval on the notebooks your change touched (differing
# from the upstream branch, committed or not). No site, PDF or Binder environment: before you
# push, run the full command, scripts/test.sh, which is what CI runs.
#   bash scripts/quick_test.sh                  # changed notebooks, found with git
#   bash scripts/quick_test.sh book/02_softmax.ipynb   # these notebooks instead
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_test_tools.sh quick

echo "== ruff"
.venv/bin/ruff check .
if [ $# -gt 0 ]; then
    notebooks=("$@")
else
    base=$(git merge-base HEAD '@{upstream}' 2>/dev/null || git rev-parse HEAD)
    mapfile -t notebooks < <({ git diff --name-only "$base" -- 'book/*.ipynb'
                               git ls-files --others --exclude-standard -- 'book/*.ipynb'; } \
                             | sort -u | while read -r f; do [ -f "$f" ] && echo "$f"; done)
fi
echo "== pytest: the library's tests, and nbval on: ${notebooks[*]:-(no changed notebook)}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest -n 2 -q \
    --ignore tests/test_site.py --ignore tests/test_pdf.py --ignore tests/test_binder_env.py \
    --ignore tests/test_attention_viewer.py \
    --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
    attention_lib tests book/_ext ${notebooks[@]+"${notebooks[@]}"}
