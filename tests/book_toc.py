"""What _toc.yml lists and what book/ holds: shared by the toc, site and notebook tests."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


def toc_entries() -> list[str]:
    """Pages listed in _toc.yml, as paths from the repository root without a suffix."""
    text = (ROOT / "_toc.yml").read_text()
    return [name.removesuffix(".ipynb").removesuffix(".md")
            for name in re.findall(r"(?:file|root):\s*([\w./-]+)", text)]


def book_notebooks() -> list[str]:
    """Notebooks in book/, as paths from the repository root without a suffix."""
    return sorted(
        str(path.relative_to(ROOT).with_suffix(""))
        for path in (ROOT / "book").rglob("*.ipynb")
        if ".ipynb_checkpoints" not in path.parts and "_build" not in path.parts
    )


def toc_notebooks() -> list[str]:
    """The notebooks that _toc.yml lists, in book order, as paths from the repository root."""
    return [f"{name}.ipynb" for name in toc_entries() if (ROOT / f"{name}.ipynb").exists()]
