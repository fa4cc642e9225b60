"""Restart-and-run-all for the course notebooks, in place, the way CI will re-run them.

    python scripts/execute_notebooks.py book/01_vectors_and_cosine_similarity.ipynb ...
    python scripts/execute_notebooks.py --all        # every notebook listed in _toc.yml

Each notebook runs top to bottom in a fresh kernel (working directory: its own folder),
its outputs are stored, and the time it took and the kernel's peak memory are printed and
recorded in the notebook's metadata for the status page (book/status.md). Run it before
committing a notebook.

The peak memory is the kernel process's peak resident set size (Linux's ``VmHWM``), read while
the kernel is still alive after each cell; the last reading is the peak of the whole run. The
tests measure it again (tests/nbval_memory.py) against the budget of 1 GiB per notebook.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import re
import sys
import time

import nbformat
from nbclient import NotebookClient

# Chapters use small matrices: one BLAS thread is as fast and gives steady timings on a busy
# machine. The kernel inherits this environment (scripts/test.sh sets the same for nbval).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the memory budget and its reading, shared with pytest
from nbval_memory import MEMORY_BUDGET_MIB, kernel_pid, peak_rss_mib  # noqa: E402


def notebooks_in_toc() -> list[pathlib.Path]:
    """The notebooks that _toc.yml lists, in book order."""
    names = re.findall(r"(?:file|root):\s*([\w./-]+)", (ROOT / "_toc.yml").read_text())
    paths = [ROOT / f"{name.removesuffix('.ipynb')}.ipynb" for name in names]
    return [path for path in paths if path.exists()]


def execute(path: pathlib.Path, timeout: int = 600) -> tuple[float, float | None]:
    """Run one notebook in a fresh kernel and store its outputs; return the seconds it took
    and the kernel's peak memory in MiB (None where Linux's /proc cannot tell)."""
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python",
    }
    peak = {"mib": None}

    def read_peak(**_):  # after every code cell, while the kernel is alive
        peak["mib"] = peak_rss_mib(kernel_pid(client.km))

    client = NotebookClient(
        notebook, timeout=timeout, kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        # print() sends its text and its newline separately; when the kernel's flush timer
        # fires in between, a cell stores two outputs (one of them a lone newline). Merge them.
        coalesce_streams=True,
        on_cell_executed=read_peak,
    )
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    # What the status page shows (book/status.md); nbval ignores metadata.
    notebook.metadata["course"] = {"last_run": {
        "seconds": round(seconds, 1),
        "peak_memory_mib": None if peak["mib"] is None else round(peak["mib"]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
        "python": platform.python_version(),
        "blas_threads": os.environ["OPENBLAS_NUM_THREADS"],
    }}
    nbformat.write(notebook, path)
    return seconds, peak["mib"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=pathlib.Path)
    parser.add_argument("--all", action="store_true", help="every notebook in _toc.yml")
    args = parser.parse_args()
    paths = notebooks_in_toc() if args.all else args.notebooks
    if not paths:
        parser.error("name notebooks or pass --all")
    over_budget = []
    for path in paths:
        seconds, peak_mib = execute(path.resolve())
        memory = "  ?  MiB" if peak_mib is None else f"{peak_mib:5.0f} MiB"
        print(f"{seconds:6.1f} s  {memory}  {path}", flush=True)
        if peak_mib is not None and peak_mib > MEMORY_BUDGET_MIB:
            over_budget.append(path)
    if over_budget:  # stored anyway: the tests (tests/nbval_memory.py) will fail these
        print(f"over the {MEMORY_BUDGET_MIB} MiB budget: {', '.join(map(str, over_budget))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
