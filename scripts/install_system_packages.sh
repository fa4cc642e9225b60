#!/usr/bin/env bash
# Install the Debian packages the tests and the PDF need, if they are missing:
#   chromium   the browser the site tests drive (tests/test_site.py)
#   TeX Live   xelatex, latexmk, xindy and the FreeFont fonts for the PDF (scripts/build_pdf.sh),
#              about 400 MB with --no-install-recommends; poppler-utils for pdftotext.
# Usage: bash scripts/install_system_packages.sh [chromium] [tex]
set -euo pipefail
# (No `grep -q` after a pipe: it exits at the first match, the writer dies of SIGPIPE, and
# pipefail would then report the fonts missing and reinstall TeX Live on every run.)

wanted=()
for part in "$@"; do
    case "$part" in
        chromium)
            [ -x "${CHROMIUM:-/usr/bin/chromium}" ] || wanted+=(chromium) ;;
        tex)
            if ! command -v xelatex > /dev/null || ! command -v latexmk > /dev/null \
                    || ! command -v xindy > /dev/null || ! command -v pdftotext > /dev/null \
                    || ! fc-list 2>/dev/null | grep -i freeserif > /dev/null \
                    || ! kpsewhich fncychap.sty > /dev/null 2>&1; then
                wanted+=(texlive-xetex texlive-latex-extra texlive-latex-recommended
                         texlive-fonts-recommended latexmk fonts-freefont-otf xindy
                         poppler-utils)
            fi ;;
        *) echo "unknown part: $part (chromium, tex)" >&2; exit 2 ;;
    esac
done
[ ${#wanted[@]} -eq 0 ] && exit 0

echo "== installing Debian packages: ${wanted[*]}"
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    "${wanted[@]}" > /dev/null
