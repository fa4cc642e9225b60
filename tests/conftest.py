"""Shared test setup: a headless matplotlib backend, closed figures, one hypothesis profile."""

import os

import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no display needed

# The notebooks' kernels (nbval) run with 2 BLAS threads: the native configuration of the two
# that CI checks (tests/test_binder_env.py re-runs every notebook under a foreign CPU
# configuration with 1 thread). A kernel is a child process started after this line, so only
# kernels see it; this test worker's NumPy was loaded above with scripts/test.sh's setting.
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "2"

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
