"""A pytest plugin that records each test's wall and CPU seconds, child processes included.

    PYTEST_ADDOPTS='-p profile_plugin' bash scripts/test.sh   # then scripts/profile_tests.py

CPU counts this process, its live descendants and the children they have reaped: a notebook's
kernel, Chromium's renderer processes, a build's subprocesses. One JSON line per test goes to
_build/test-profile/<worker>.jsonl; scripts/profile_tests.py sums them per file and writes the
costs that order the work (tests/durations.json).
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import time

import psutil
import pytest

OUTPUT = pathlib.Path(__file__).resolve().parent.parent / "_build" / "test-profile"


def tree_cpu_seconds() -> float:
    me = psutil.Process()
    total = 0.0
    for process in me.children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        # children_*: the CPU of the children this process has reaped (a browser's renderers).
        total += times.user + times.system + times.children_user + times.children_system
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


_failed: set[str] = set()


def pytest_runtest_logreport(report):
    if report.failed:
        _failed.add(report.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = tree_cpu_seconds(), time.perf_counter()
    yield
    record = {"id": item.nodeid.split("@")[0], "wall": time.perf_counter() - wall,
              "cpu": tree_cpu_seconds() - cpu, "end": time.time(),
              "failed": item.nodeid in _failed}
    OUTPUT.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(OUTPUT / f"{worker}.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")
