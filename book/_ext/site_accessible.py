"""Fix the accessibility faults axe-core reports as serious or critical, in the written pages.

The book's theme names three kinds of controls with an ``aria-label`` that does not contain
their visible text (axe rule ``label-content-name-mismatch``, WCAG 2.5.3 "Label in Name"): a
speech-input user who says what they see ("click Show code cell source") would not reach them.

- The search field shows "Search Ctrl+K" but is named "Search": drop the label, so its name is
  its visible text.
- The colour-mode button holds three icons whose ``title`` ("Light", "Dark", ...) counts as
  text inside it: hide the icons from assistive technology; the button keeps its name
  "Color mode" (and its tooltip).
- A collapsed cell's toggle shows "Show code cell source" but is named "Toggle hidden
  content": drop the label, so its name is what it shows.

And one that axe-core reports as critical (``aria-required-children``): Sphinx writes the
bibliography as ``role="list"`` holding entries with ``role="doc-biblioentry"``, a role that
DPUB-ARIA 1.1 deprecated and that no longer counts as a list item. The entries become
``role="listitem"``, so assistive technology announces a list of references.

The pages are rewritten after the build (``build-finished``), because the markup comes from
the theme's and myst-nb's templates, not from the book's sources. tests/test_site.py runs
axe-core on every page in both colour modes at desktop and mobile widths.
"""

from __future__ import annotations

import pathlib
import re

FIXES = [
    # The search field with visible text (the icon-only search button has no visible text
    # and keeps its label).
    (re.compile(r'(<button class="btn search-button-field search-button__button[^"]*" '
                r'title="Search") aria-label="Search"'), r"\1"),
    (re.compile(r'<i class="(theme-switch fa-solid [^"]*)" data-mode="(\w+)"\s+title="[^"]*"></i>'),
     r'<i class="\1" data-mode="\2" aria-hidden="true"></i>'),
    (re.compile(r'<summary aria-label="Toggle hidden content">'), "<summary>"),
    (re.compile(r'(<div class="citation" id="[^"]*") role="doc-biblioentry">'),
     r'\1 role="listitem">'),
]


def fix_page(html: str) -> str:
    """The page with the theme's mislabelled controls fixed (see the module docstring)."""
    for pattern, replacement in FIXES:
        html = pattern.sub(replacement, html)
    return html


def _fix_written_pages(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    for path in pathlib.Path(app.outdir).rglob("*.html"):
        text = path.read_text(encoding="utf-8")
        fixed = fix_page(text)
        if fixed != text:
            path.write_text(fixed, encoding="utf-8")


def setup(app):
    app.connect("build-finished", _fix_written_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
