"""Build the book once per test run, however many test processes need it.

The site tests need the HTML build and the PDF tests the LaTeX build of the same sources. With
pytest-xdist, tests of both run on either worker; each worker's fixtures call `build_once`,
and a file lock in the folder the workers share makes the first caller build while a second
one waits for it and then reads the same result. The LaTeX build goes into the same output
folder after the HTML build, so it reuses the parsed sources (Sphinx's pickled environment)
instead of reading every notebook again.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

from book_toc import ROOT
from filelock import FileLock


def shared_folder(tmp_path_factory, worker_id: str) -> pathlib.Path:
    """A folder every worker of this run sees (one of its own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def jupyter_book() -> str:
    beside_python = pathlib.Path(sys.executable).with_name("jupyter-book")
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("jupyter-book") or str(ROOT / ".venv" / "bin" / "jupyter-book")


def build_once(folder: pathlib.Path, name: str, arguments: list[str],
               timeout: int = 1500) -> tuple[pathlib.Path, str, int]:
    """Run ``jupyter-book build ROOT <arguments> --path-output folder/book`` once for this
    run; return (output folder, log, exit code), the same in every worker."""
    output = folder / "book"
    record = folder / f"{name}.json"
    with FileLock(str(folder / "book.lock")):
        if not record.exists():
            result = subprocess.run(
                [jupyter_book(), "build", str(ROOT), *arguments, "--path-output", str(output)],
                capture_output=True, text=True, timeout=timeout,
            )
            record.write_text(json.dumps({"log": result.stdout + result.stderr,
                                          "returncode": result.returncode}))
    done = json.loads(record.read_text())
    return output / "_build", done["log"], done["returncode"]


def html_build(folder: pathlib.Path) -> tuple[pathlib.Path, str, int]:
    """The site, as scripts/build_book.sh builds it: every page, warnings are errors."""
    built, log, returncode = build_once(folder, "html", ["--all", "-W", "-n", "--keep-going"])
    return built / "html", log, returncode


def pdf_build(folder: pathlib.Path) -> tuple[pathlib.Path, str, int]:
    """The PDF, as scripts/build_pdf.sh builds it, after (and reusing) the HTML build."""
    html_build(folder)
    built, log, returncode = build_once(folder, "pdf", ["--builder", "pdflatex"])
    return built / "latex", log, returncode
