"""Binder builds the course from the repository's files alone; so does this test.

repo2docker reads runtime.txt (the Python version), requirements.txt (the pinned packages
and ``-e .``, the course package) and runs postBuild if there is one. This test does the
same in a fresh virtual environment, outside the development one, and re-runs every
chapter notebook there with nbval, under a foreign CPU configuration: if a notebook needs
something that only the developers' environment has (PyTorch, for one), or prints a number
that depends on the CPU, it fails here.
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


# Another CPU than the one the notebooks were executed on: OpenBLAS forced to an old kernel
# (other blocking, other summation order), NumPy's AVX/FMA code paths switched off, one
# thread. The main test run re-executes the notebooks natively with 2 threads (conftest.py);
# a stored output that depends on the CPU, the BLAS kernel or the thread count fails one run.
FOREIGN_CPU = {
    "OPENBLAS_CORETYPE": "Prescott",
    "NPY_DISABLE_CPU_FEATURES": "AVX2 FMA3 X86_V3 AVX F16C",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}


def test_the_foreign_cpu_configuration_takes_effect(binder_python):
    probe = ("import numpy as np; from numpy._core._multiarray_umath import __cpu_features__ as f;"
             "print(f['AVX2'], f['FMA3'], np.show_config(mode='dicts')['Build Dependencies']"
             "['blas']['name'])")
    result = subprocess.run([binder_python, "-c", probe], capture_output=True, text=True,
                            env={**os.environ, **FOREIGN_CPU}, check=True)
    assert result.stdout.split()[:2] == ["False", "False"], result.stdout
    assert "openblas" in result.stdout, "OPENBLAS_CORETYPE only steers OpenBLAS"


def test_every_notebook_runs_in_the_binder_environment_on_a_foreign_cpu(binder_python):
    notebooks = [f"{name}.ipynb" for name in toc_entries() if (ROOT / f"{name}.ipynb").exists()]
    assert notebooks
    result = subprocess.run(
        [binder_python, "-m", "pytest", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-p", "no:cacheprovider",
         "-o", "addopts=", "-q", *notebooks],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={**os.environ, **FOREIGN_CPU},
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
