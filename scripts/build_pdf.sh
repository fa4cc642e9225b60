#!/usr/bin/env bash
# Build the whole book as one PDF, through LaTeX (xelatex):
#   bash scripts/build_pdf.sh          -> _build/latex/attention-step-by-step.pdf
#   bash scripts/build_pdf.sh DIR      -> DIR/_build/latex/attention-step-by-step.pdf
# Installs what it needs: the course's virtual environment and Debian's TeX Live packages.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
bash scripts/install_system_packages.sh tex
output="${1:-.}"
.venv/bin/jupyter-book build . --builder pdflatex --path-output "$output"
echo "== the PDF is $output/_build/latex/attention-step-by-step.pdf"
