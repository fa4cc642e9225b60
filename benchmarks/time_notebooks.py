"""Time each notebook's execution and a full build of the book, against their budgets.

    .venv/bin/python benchmarks/time_notebooks.py [--repeat N]

Each notebook in _toc.yml runs top to bottom in a fresh kernel (outputs are discarded: the
stored notebook is not touched), N times, and the best time is reported. The build is
`jupyter-book build --all` with execution off (the site shows stored outputs), into a
temporary folder. Budgets come from the issues, on a 2-core machine: 10 s per chapter, except
chapter 12 (training, 90 s) and the real models (13: 20 s, 14: 60 s); 60 s for the build.
The ratio column is time / budget: below 1 is within budget.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

import nbformat
from nbclient import NotebookClient

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from execute_notebooks import notebooks_in_toc  # noqa: E402

NOTEBOOK_BUDGET_S = 10.0
BUDGET_OVERRIDES_S = {"12_training": 90.0, "15_real_encoder": 20.0, "16_real_decoder": 60.0,
                      "17_from_weights_to_chat": 60.0}
BUILD_BUDGET_S = 60.0


def time_notebook(path: pathlib.Path) -> float:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


def time_build() -> float:
    jupyter_book = pathlib.Path(sys.executable).with_name("jupyter-book")
    with tempfile.TemporaryDirectory() as output:
        start = time.perf_counter()
        subprocess.run([str(jupyter_book), "build", str(ROOT), "--all", "--path-output", output],
                       check=True, capture_output=True)
        return time.perf_counter() - start


def report(name: str, seconds: float, budget: float) -> None:
    print(f"{name:56s} {seconds:8.2f} {budget:8.1f} {seconds / budget:7.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per item; the best is kept")
    args = parser.parse_args()
    print(f"{'what':56s} {'time s':>8s} {'budget':>8s} {'ratio':>7s}")
    for path in notebooks_in_toc():
        best = min(time_notebook(path) for _ in range(args.repeat))
        budget = BUDGET_OVERRIDES_S.get(path.stem, NOTEBOOK_BUDGET_S)
        report(f"execute {path.relative_to(ROOT)}", best, budget)
    best = min(time_build() for _ in range(args.repeat))
    report("build the book (execution off, --all)", best, BUILD_BUDGET_S)


if __name__ == "__main__":
    main()
