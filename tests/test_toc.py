"""Every notebook in book/ is listed in _toc.yml (so it is built and re-run by nbval), and
every entry of _toc.yml exists."""

import re

from book_toc import ROOT, book_notebooks, toc_entries


def test_every_notebook_in_book_is_listed_in_toc():
    missing = sorted(set(book_notebooks()) - set(toc_entries()))
    assert not missing, f"notebooks not in _toc.yml (neither built nor tested): {missing}"


def test_every_toc_entry_exists():
    absent = [name for name in toc_entries()
              if not any((ROOT / f"{name}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert not absent, f"_toc.yml lists pages that do not exist: {absent}"


def test_the_toc_lists_the_chapters_in_order_and_the_helpers_see_them():
    # Guards the helpers above against matching nothing (an empty book passes them trivially):
    # the chapters, book/NN_*.ipynb, appear in _toc.yml in the order of their numbers.
    chapters = [name for name in book_notebooks() if re.fullmatch(r"book/\d\d_\w+", name)]
    listed = [name for name in toc_entries() if name in chapters]
    assert listed == chapters
    assert [int(name[len("book/"):][:2]) for name in chapters] == list(range(1, len(chapters) + 1))
