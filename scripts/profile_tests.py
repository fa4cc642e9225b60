"""Sum a profiled test run per test file, and store the cost of each unit of work.

    rm -rf _build/test-profile && PYTEST_ADDOPTS='-p profile_plugin' bash scripts/test.sh
    .venv/bin/python scripts/profile_tests.py            # the table, and tests/durations.json

Prints wall and CPU seconds per test file (Chromium and notebook kernels included). Writes
tests/durations.json, the seconds of each unit that tests/conftest.py schedules longest first:
each notebook's native run, each notebook's foreign-CPU run, each build, a site page.
"""

from __future__ import annotations

import collections
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROFILE = ROOT / "_build" / "test-profile"


def unit_of(nodeid: str) -> str | None:
    """The name tests/conftest.py gives the unit a test belongs to (None: not a long unit)."""
    path = nodeid.split("::")[0]
    if path.endswith(".ipynb"):
        return path
    match = re.search(r"test_notebook_runs_in_the_binder_environment_on_a_foreign_cpu\[(.+)\]",
                      nodeid)
    if match:
        return "binder:" + match.group(1)
    if "test_binder_env.py" in path and ("no_pytorch" in nodeid or "takes_effect" in nodeid):
        return "binder-env"
    if "test_site.py" in path:
        return "site-page" if "in_a_browser" in nodeid else "html-build"
    if "test_pdf.py" in path:
        return "pdf"
    return None


def main() -> int:
    records = [json.loads(line) for path in sorted(PROFILE.glob("*.jsonl"))
               for line in path.read_text().splitlines()]
    if not records:
        print(f"no profile in {PROFILE}: run "
              "PYTEST_ADDOPTS='-p profile_plugin' bash scripts/test.sh first")
        return 1
    files = collections.defaultdict(lambda: [0, 0.0, 0.0])
    units = collections.defaultdict(float)
    site_pages = []
    for record in records:
        path = record["id"].split("::")[0]
        key = "book/*.ipynb (nbval, native)" if path.endswith(".ipynb") else path
        files[key][0] += 1
        files[key][1] += record["wall"]
        files[key][2] += record["cpu"]
        unit = unit_of(record["id"])
        if unit == "site-page":
            site_pages.append(record["wall"])
        elif unit:
            units[unit] += record["wall"]
    if site_pages:
        units["site-page"] = sum(site_pages) / len(site_pages)
    print("| test file | tests | wall (s) | CPU (s) |\n|---|---:|---:|---:|")
    for key, (count, wall, cpu) in sorted(files.items(), key=lambda kv: -kv[1][1]):
        print(f"| {key} | {count} | {wall:.0f} | {cpu:.0f} |")
    total = [sum(v[i] for v in files.values()) for i in range(3)]
    print(f"| all | {total[0]} | {total[1]:.0f} | {total[2]:.0f} |")
    durations = {name: round(seconds, 1) for name, seconds in sorted(units.items())}
    (ROOT / "tests" / "durations.json").write_text(json.dumps(durations, indent=1) + "\n")
    print(f"wrote tests/durations.json ({len(durations)} units)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
