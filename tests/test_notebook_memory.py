"""The memory budget of the notebooks (tests/nbval_memory.py) can pass, and can fail.

The plugin reads the peak resident memory of each notebook's kernel after its last cell. Here it
runs on small notebooks made for the purpose, in a separate pytest process: one that allocates
a known amount passes a budget above it and fails one below it, with a message naming the
notebook and its peak; a kernel that dies is reported as such.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import nbformat
import pytest
from nbval_memory import MEMORY_BUDGET_MIB, peak_rss_mib

TESTS = pathlib.Path(__file__).parent

pytestmark = pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(),
                                reason="the peak is read from Linux's /proc/<pid>/status")


def test_the_budget_is_binders_guaranteed_gibibyte():
    assert MEMORY_BUDGET_MIB == 1024


PEAK_PROBE = """
import os, sys
import numpy as np
from nbval_memory import peak_rss_mib
before = peak_rss_mib(os.getpid())
block = np.ones(64 * 2**20 // 8)  # 64 MiB, every page touched
during = peak_rss_mib(os.getpid())
del block
after = peak_rss_mib(os.getpid())
print(before, during, after)
"""


def test_peak_rss_grows_with_a_large_array_and_never_shrinks():
    # In a fresh process: a long-lived test worker may already have peaked higher, and a
    # high-water mark does not move for an array smaller than the earlier peak.
    result = subprocess.run([sys.executable, "-c", PEAK_PROBE], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(TESTS)}, timeout=120)
    assert result.returncode == 0, result.stderr
    before, during, after = map(float, result.stdout.split())
    assert during >= before + 60  # a high-water mark: the whole block was resident
    # and it stays after the array is freed (to within Linux's lazily synced page counts)
    assert after > during - 1
    assert peak_rss_mib(2**31) is None  # no such process


def run_notebook(tmp_path, sources, *options):
    """pytest with nbval and the plugin on a notebook of ``sources``; (exit code, output)."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    path = tmp_path / "probe.ipynb"
    nbformat.write(notebook, path)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "nbval_memory", "-p", "no:cacheprovider",
         "--nbval-lax", "--nbval-current-env", "-o", "addopts=", "-q", str(path), *options],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")},
             "PYTHONPATH": str(TESTS)},  # not the outer run's options or xdist identity
    )
    return result.returncode, result.stdout + result.stderr


ALLOCATE_200_MIB = ["import numpy as np", "block = np.ones(200 * 2**20 // 8)", "del block"]


def test_a_notebook_within_the_budget_passes_and_its_peak_is_reported(tmp_path):
    code, output = run_notebook(tmp_path, ALLOCATE_200_MIB, "--nbval-memory-budget-mib", "2000")
    assert code == 0, output
    assert "4 passed" in output  # three cells and the memory item
    assert "notebook kernels' peak memory (MiB)" in output
    peak = float(output.split("peak memory (MiB)")[1].split()[1])
    assert 200 < peak < 2000


def test_a_notebook_over_the_budget_fails_naming_it_and_its_peak(tmp_path):
    code, output = run_notebook(tmp_path, ALLOCATE_200_MIB, "--nbval-memory-budget-mib", "150")
    assert code == 1, output
    assert "FAILED probe.ipynb::kernel peak memory" in output
    assert "probe.ipynb: the kernel peaked at" in output
    assert "more than the budget of 150 MiB" in output


def test_a_budget_of_zero_adds_no_check(tmp_path):
    code, output = run_notebook(tmp_path, ALLOCATE_200_MIB, "--nbval-memory-budget-mib", "0")
    assert code == 0, output
    assert "3 passed" in output and "kernel peak memory" not in output


def test_a_kernel_that_dies_is_reported_as_dead(tmp_path):
    sources = ["import os, signal", "os.kill(os.getpid(), signal.SIGKILL)"]
    code, output = run_notebook(tmp_path, sources, "--nbval-cell-timeout", "8")
    assert code == 1, output
    assert "the kernel is not running after the last cell" in output
