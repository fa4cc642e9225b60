"""A pytest plugin: every notebook's kernel must peak at no more than the memory budget.

mybinder.org gives a session 1 GB guaranteed and 2 GB at most, the Jupyter server included,
and JupyterLab keeps a kernel alive when the reader opens the next chapter: a chapter whose
kernel needs more than 1 GiB can get the session killed. So each notebook that nbval runs gets
one more test item, ``<notebook>::kernel peak memory``, after its last cell. It reads the peak
resident memory of the notebook's kernel process (``VmHWM`` in ``/proc/<pid>/status``: the
high-water mark of its resident set, kept by Linux since the process started) while the kernel
is still alive, and fails if it exceeds the budget. It measures, in this run; it does not trust
the figure that ``scripts/execute_notebooks.py`` stores in the notebook for the status page.

Enable it with ``pytest_plugins = ["nbval_memory"]`` in tests/conftest.py (``tests`` is on the
path through pyproject's ``pythonpath``), or for one run with
``PYTHONPATH=tests pytest -p nbval_memory --nbval ...``. ``--nbval-memory-budget-mib N`` sets
another budget (0 switches the check off).
"""

from __future__ import annotations

import pathlib

import pytest

MEMORY_BUDGET_MIB = 1024
"""The most a notebook's kernel may hold at its peak: 1 GiB, Binder's guaranteed memory."""


def peak_rss_mib(pid: int) -> float | None:
    """The peak resident set size of process ``pid`` in MiB (Linux ``VmHWM``), or None where
    ``/proc`` has no such figure (not Linux, or the process is gone)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):  # "VmHWM:   123456 kB"
            return int(line.split()[1]) / 1024
    return None


def kernel_pid(kernel_manager) -> int | None:
    """The process id of a running Jupyter kernel (jupyter_client's local provisioner)."""
    process = getattr(getattr(kernel_manager, "provisioner", None), "process", None)
    return None if process is None else process.pid


class KernelPeakMemory(pytest.Item):
    """The peak memory of one notebook's kernel, read after its last cell ran."""

    def __init__(self, *, budget_mib: int, **kwargs):
        super().__init__(**kwargs)
        self.budget_mib = budget_mib
        self.peak_mib: float | None = None

    def runtest(self):
        kernel = getattr(self.parent, "kernel", None)  # nbval's RunningKernel of this notebook
        if kernel is None or not kernel.is_alive():
            raise KernelMemoryError(
                f"{self.parent.name}: the kernel is not running after the last cell (killed, "
                "for instance for lack of memory), so its peak memory cannot be read")
        self.peak_mib = peak_rss_mib(kernel_pid(kernel.km))
        if self.peak_mib is None:
            pytest.skip("the kernel's peak memory is read from Linux's /proc/<pid>/status")
        self.user_properties.append(("kernel_peak_mib", round(self.peak_mib, 1)))
        if self.peak_mib > self.budget_mib:
            raise KernelMemoryError(
                f"{self.parent.name}: the kernel peaked at {self.peak_mib:,.0f} MiB, more than "
                f"the budget of {self.budget_mib:,} MiB (Binder guarantees 1 GB per session, "
                "Jupyter server included). Free large arrays when a section ends, keep one "
                "float32 copy of a model at a time.")

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, KernelMemoryError):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}::kernel peak memory"


class KernelMemoryError(AssertionError):
    """A notebook's kernel exceeded the memory budget, or died before it could be read."""


def pytest_addoption(parser):
    parser.getgroup("nbval").addoption(
        "--nbval-memory-budget-mib", type=int, default=MEMORY_BUDGET_MIB,
        help=f"fail a notebook whose kernel's peak resident memory exceeds this many MiB "
             f"(default {MEMORY_BUDGET_MIB}; 0: no check)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    budget = config.getoption("--nbval-memory-budget-mib")
    if not budget:
        return
    try:
        from nbval.plugin import IPyNbFile
    except ImportError:  # no nbval, no notebooks to check
        return
    # After the last selected cell of each notebook, one item that reads its kernel's peak.
    last_cell_of = {}
    for index, item in enumerate(items):
        if isinstance(item.parent, IPyNbFile):
            last_cell_of[item.parent] = index
    for notebook, index in sorted(last_cell_of.items(), key=lambda pair: -pair[1]):
        items.insert(index + 1, KernelPeakMemory.from_parent(
            notebook, name="kernel peak memory", budget_mib=budget))


def pytest_terminal_summary(terminalreporter):
    peaks = [(report.nodeid, dict(report.user_properties)["kernel_peak_mib"])
             for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get(
                 "failed", [])
             if report.when == "call" and "kernel_peak_mib" in dict(report.user_properties)]
    if peaks:
        terminalreporter.section("notebook kernels' peak memory (MiB)")
        for nodeid, peak in sorted(peaks):
            terminalreporter.line(f"{peak:8.1f}  {nodeid.split('::')[0]}")
