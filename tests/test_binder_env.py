"""Binder builds the course from the repository's files alone; so does this test.

repo2docker reads runtime.txt (the Python version), requirements.txt (the pinned packages
and ``-e .``, the course package) and runs postBuild if there is one. This test does the
same in a fresh virtual environment, outside the development one, and re-runs every
chapter notebook there with nbval: if a notebook needs something that only the developers'
environment has (PyTorch, for one), it fails here.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import venv

import pytest
from book_toc import ROOT, toc_entries


def test_runtime_txt_names_the_python_the_course_is_tested_with():
    runtime = (ROOT / "runtime.txt").read_text().strip()
    assert runtime == f"python-{sys.version_info.major}.{sys.version_info.minor}", runtime


@pytest.fixture(scope="module")
def binder_python(tmp_path_factory) -> pathlib.Path:
    """A virtual environment built only from runtime.txt, requirements.txt and postBuild."""
    env_dir = tmp_path_factory.mktemp("binder") / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    run = {"cwd": ROOT, "check": True, "capture_output": True, "text": True, "timeout": 900}
    subprocess.run([python, "-m", "pip", "install", "--quiet", "-r", "requirements.txt"], **run)
    post_build = ROOT / "postBuild"
    if post_build.exists():
        env = {**os.environ, "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        subprocess.run(["bash", str(post_build)], env=env, **run)
    return python


def test_binder_environment_has_no_pytorch(binder_python):
    # Readers do not need PyTorch; the chapters must run without it.
    result = subprocess.run([binder_python, "-c", "import torch"], capture_output=True)
    assert result.returncode != 0


def test_every_notebook_runs_in_the_binder_environment(binder_python):
    notebooks = [f"{name}.ipynb" for name in toc_entries() if (ROOT / f"{name}.ipynb").exists()]
    assert notebooks
    result = subprocess.run(
        [binder_python, "-m", "pytest", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-p", "no:cacheprovider",
         "-o", "addopts=", "-q", *notebooks],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
