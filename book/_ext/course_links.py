"""Link the API reference to the chapters: "chapter 03, *Title*" in a docstring becomes a link.

Every public docstring of attention_lib says which chapter derives it, as
``Derived in chapter 03, *Scaled dot-product attention*``. When autodoc renders a
docstring, this turns each such mention into a link to that chapter's page, so that every
API entry links to its derivation. A chapter that is not in the book yet stays plain text.
"""

from __future__ import annotations

import pathlib
import re

CHAPTER = re.compile(r"chapter (\d\d), \*([^*]+)\*")


def _chapter_pages(app) -> dict[str, str]:
    """Chapter number -> docname, for the chapter notebooks the book builds."""
    pages = {}
    for path in sorted(pathlib.Path(app.srcdir, "book").glob("[0-9][0-9]_*.ipynb")):
        docname = f"book/{path.stem}"
        if docname in app.env.found_docs:
            pages[path.name[:2]] = docname
    return pages


def _link_chapters(app, what, name, obj, options, lines):
    pages = _chapter_pages(app)

    def link(match):
        number, title = match.groups()
        if number not in pages:
            return match.group(0)
        return f"chapter {number}, :doc:`{title} </{pages[number]}>`"

    lines[:] = [CHAPTER.sub(link, line) for line in lines]


def setup(app):
    app.connect("autodoc-process-docstring", _link_chapters)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
