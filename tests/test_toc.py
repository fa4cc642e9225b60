"""Every notebook in book/ is listed in _toc.yml (so it is built and re-run by nbval), and
every entry of _toc.yml exists."""

from book_toc import ROOT, book_notebooks, toc_entries


def test_every_notebook_in_book_is_listed_in_toc():
    missing = sorted(set(book_notebooks()) - set(toc_entries()))
    assert not missing, f"notebooks not in _toc.yml (neither built nor tested): {missing}"


def test_every_toc_entry_exists():
    absent = [name for name in toc_entries()
              if not any((ROOT / f"{name}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert not absent, f"_toc.yml lists pages that do not exist: {absent}"


def test_part_one_notebooks_are_present():
    # Guards the helpers above against matching nothing (an empty book passes them trivially).
    assert len(book_notebooks()) >= 4
