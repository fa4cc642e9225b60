"""Shared test setup: a headless matplotlib backend, closed figures, one hypothesis profile,
and the order in which the two test processes take the work (longest first)."""

import json
import os
import pathlib
import re

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no display needed

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: a modest number of examples, no per-example deadline (the first call of a
# function can be slow on a busy CI machine), reproducible example sequences (a CI failure
# reproduces locally) and no example database. Hypothesis still keeps a small cache in
# .hypothesis/ (it writes its own .gitignore there).
settings.register_profile(
    "attention_lib",
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
# A longer hunt, for a maintainer who changed the library: pytest --hypothesis-profile=thorough
settings.register_profile(
    "thorough", parent=settings.get_profile("attention_lib"), max_examples=2000, derandomize=False
)
settings.load_profile("attention_lib")


def pytest_configure(config):
    # The notebooks' kernels (nbval) run with 2 BLAS threads when nbval runs alone (the native
    # re-run of scripts/test.sh): the second configuration of the two that CI checks
    # (tests/test_binder_env.py re-runs every notebook on a foreign CPU configuration with 1
    # thread). Beside another test process (pytest -n 2) a kernel gets 1 thread, so that no step
    # runs more BLAS threads than there are free cores. A kernel is a child process started
    # after this line, so only kernels see it; this process's NumPy is already loaded.
    if config.getoption("nbval", default=False):
        workers = config.getoption("numprocesses", default=None) or 0
        threads = "1" if workers not in (0, 1) else "2"
        os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = threads


@pytest.fixture(autouse=True)
def close_figures():
    """Close every figure a test opened, so figures never pile up across tests."""
    yield
    plt.close("all")


# A skipped test verifies nothing. Locally a test may skip when an optional dependency (the
# real models' weights, PyTorch) is missing; in CI (CI set, as .ci/run runs) every dependency
# is installed, so any skip means a check silently did not run, and the run fails.
_skipped: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _skipped.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("CI") and _skipped:
        terminalreporter.section("skipped in CI (each one fails the run)", red=True)
        for line in _skipped:
            terminalreporter.line(line)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("CI") and _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Scheduling. scripts/test.sh runs two pytest-xdist workers; a worker takes the next unit of
# work in collection order whenever it runs low. A unit is one test, or a group that must stay
# on one worker: the cells of one notebook (they share a kernel), the tests that read one build
# (the first of them builds it). Handing out the longest units first (the classic
# longest-processing-time rule) keeps both workers busy to the end instead of leaving one to
# finish a long unit alone. The costs, in seconds, come from a profiled run
# (tests/durations.json, written by scripts/profile_tests.py); a unit not listed counts as 1 s.
# The units are told apart by test id alone: the scheduler in the main process sees only ids.
# (xdist's own `--dist loadgroup` cannot be used: it renames test ids, which pytest 9.2 ignores.)
DURATIONS = pathlib.Path(__file__).with_name("durations.json")
FOREIGN_RUN = re.compile(r"test_notebook_runs_in_the_binder_environment_on_a_foreign_cpu\[(.+)\]")
SITE_PAGE_TESTS = ("test_page_works_in_a_browser", "test_index_redirects")


def schedule_unit(nodeid: str) -> tuple[int, str, str]:
    """(rank, unit of work, the name of its cost in durations.json) of one test id."""
    path, _, name = nodeid.partition("::")
    if path.endswith(".ipynb"):                     # a cell of a notebook, re-run by nbval
        return 3, path, path
    if path == "tests/test_binder_env.py":
        foreign = FOREIGN_RUN.fullmatch(name)
        if foreign:                                 # one notebook on the foreign CPU
            return 4, nodeid, "binder:" + foreign.group(1)
        return 0, "binder-env", "binder-env"        # builds the Binder environment
    if path == "tests/test_site.py":
        if name.startswith(SITE_PAGE_TESTS):        # one page in Chromium
            return 5, nodeid, "site-page"
        return 1, "html-build", "html-build"        # builds the site, reads the build
    if path == "tests/test_pdf.py":
        return 2, "pdf", "pdf"                      # builds the PDF after the site
    return 6, nodeid, ""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    costs = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    order = {}
    for index, item in enumerate(items):
        rank, _, name = schedule_unit(item.nodeid)
        # Stable: the cells of a notebook keep their order, other tests their file order.
        order[item.nodeid] = (rank, -costs.get(name, 1.0), index)
    items.sort(key=lambda item: order[item.nodeid])


def pytest_xdist_make_scheduler(config, log):
    """xdist's load-by-scope scheduler, with the units above as scopes, in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class LongestUnitFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return schedule_unit(nodeid)[1]

    config.option.loadscopereorder = False  # keep the order sorted above
    return LongestUnitFirst(config, log)
