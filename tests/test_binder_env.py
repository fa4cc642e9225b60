"""Binder builds the course from the repository's files alone; so does this test.

repo2docker reads runtime.txt (the Python version), requirements.txt (the pinned packages
and ``-e .``, the course package) and runs postBuild if there is one. This test does the
same in a fresh virtual environment, outside the development one, adds only the test runner
(pytest and nbval, pinned in requirements-dev.txt), and re-runs every chapter notebook there
with nbval, under a foreign CPU configuration: if a notebook needs something that only the
developers' environment has (PyTorch, for one), or prints a number that depends on the CPU,
it fails here.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import venv

import pytest
from book_toc import ROOT, toc_entries
from filelock import FileLock
from shared_build import shared_folder


def test_runtime_txt_names_the_python_the_course_is_tested_with():
    runtime = (ROOT / "runtime.txt").read_text().strip()
    assert runtime == f"python-{sys.version_info.major}.{sys.version_info.minor}", runtime


# What a reader's environment must not hold: the tests' tools and PyTorch (requirements-dev.txt).
TEST_TOOLS = {"pytest", "nbval", "pytest-xdist", "hypothesis", "ruff", "playwright", "torch",
              "gguf", "safetensors"}
# What the notebook re-run below adds to the Binder environment: the test runner alone.
TEST_RUNNER = {"pytest", "nbval", "pluggy", "iniconfig", "coverage"}


def pinned(path: pathlib.Path) -> dict[str, str]:
    """Package name (lower case) -> its ``name==version`` line, from a requirements file."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    pins = [line for line in lines if "==" in line and not line.startswith("#")]
    return {line.split("==")[0].lower().replace("_", "-"): line for line in pins}


def test_requirements_txt_holds_no_test_tools():
    reader = pinned(ROOT / "requirements.txt")
    assert sorted(TEST_TOOLS & reader.keys()) == []
    dev = pinned(ROOT / "requirements-dev.txt")
    assert TEST_RUNNER <= dev.keys(), sorted(TEST_RUNNER - dev.keys())
    assert sorted(reader.keys() & dev.keys()) == [], "pinned in both files"


def build_binder_environment(folder: pathlib.Path) -> dict:
    """Build, once per test run, a virtual environment from runtime.txt, requirements.txt and
    postBuild alone; record which of PyTorch and the test tools it can import; then add the
    pinned test runner (pytest, nbval) to re-run the notebooks in it. Returns the record."""
    record = folder / "binder.json"
    with FileLock(str(folder / "binder.lock")):
        if not record.exists():
            env_dir = folder / "binder-env"
            venv.EnvBuilder(with_pip=True).create(env_dir)
            python = env_dir / "bin" / "python"
            run = {"cwd": ROOT, "check": True, "capture_output": True, "text": True,
                   "timeout": 900}
            # --no-compile: no .pyc files written ahead for every installed module (Python
            # writes those a notebook imports when it first imports them): the same packages.
            subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", "-r",
                            "requirements.txt"], **run)
            post_build = ROOT / "postBuild"
            if post_build.exists():
                env = {**os.environ,
                       "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"}
                subprocess.run(["bash", str(post_build)], env=env, **run)
            # What a reader's environment holds, before the test runner is added below.
            importable = [module for module in ("torch", "pytest", "nbval")
                          if subprocess.run([python, "-c", f"import {module}"],
                                            capture_output=True).returncode == 0]
            runner = [pin for name, pin in pinned(ROOT / "requirements-dev.txt").items()
                      if name in TEST_RUNNER]
            subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-compile", *runner],
                           **run)
            record.write_text(json.dumps({"python": str(python),
                                          "importable_before_the_runner": importable}))
    return json.loads(record.read_text())


@pytest.fixture(scope="module")
def binder_environment(tmp_path_factory, worker_id) -> dict:
    return build_binder_environment(shared_folder(tmp_path_factory, worker_id))


@pytest.fixture(scope="module")
def binder_python(binder_environment) -> pathlib.Path:
    """The Binder environment's interpreter (with the test runner added after the check)."""
    return pathlib.Path(binder_environment["python"])


def test_binder_environment_has_no_pytorch_and_no_test_tools(binder_environment):
    # Readers need neither PyTorch nor the tests' tools; the chapters must run without them.
    # Checked when the environment was built, before the test runner was added to it.
    assert binder_environment["importable_before_the_runner"] == []


# Another CPU than the one the notebooks were executed on: OpenBLAS forced to an old kernel
# (other blocking, other summation order), NumPy's dispatched SIMD code paths above its
# baseline switched off, one thread. NumPy 2.4 dispatches by feature group (X86_V3 holds AVX,
# AVX2, FMA3, F16C; X86_V4 and AVX512_* the AVX-512 kernels); it rejects the whole variable,
# with only an ImportWarning, if one name in it is not a dispatch target, so the probe below
# turns that warning into an error. The main test run re-executes the notebooks natively with
# 2 threads (conftest.py); a stored output that depends on the CPU, the BLAS kernel or the
# thread count fails one of the two runs.
FOREIGN_CPU = {
    "OPENBLAS_CORETYPE": "Prescott",
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
}

# Prints NumPy's X86_V3 and AVX2 flags and the name of the kernel OpenBLAS chose.
CPU_PROBE = """
import ctypes, pathlib, numpy as np
from numpy._core._multiarray_umath import __cpu_features__ as features
libs = pathlib.Path(np.__file__).parent.parent / "numpy.libs"
openblas = ctypes.CDLL(str(next(libs.glob("libscipy_openblas64_*.so"))))
openblas.scipy_openblas_get_corename64_.restype = ctypes.c_char_p
print(features["X86_V3"], openblas.scipy_openblas_get_corename64_().decode())
"""


def probe_cpu(python, extra_env):
    # The native probe must not inherit the foreign variables from a run that exports them.
    native = {key: value for key, value in os.environ.items() if key not in FOREIGN_CPU}
    result = subprocess.run([python, "-W", "error::ImportWarning", "-c", CPU_PROBE],
                            capture_output=True, text=True, env={**native, **extra_env})
    assert result.returncode == 0, result.stderr
    dispatch_v3, kernel = result.stdout.split()
    return dispatch_v3 == "True", kernel


def test_the_foreign_cpu_configuration_takes_effect(binder_python):
    _, native_kernel = probe_cpu(binder_python, {})
    foreign_v3, foreign_kernel = probe_cpu(binder_python, FOREIGN_CPU)
    assert not foreign_v3, "NumPy still dispatches to its AVX2/FMA3 (X86_V3) kernels"
    assert foreign_kernel != native_kernel, f"OpenBLAS kept its {native_kernel} kernel"


def foreign_environment() -> dict[str, str]:
    """This process's environment on the foreign CPU configuration, without the settings of
    the outer test run (its extra pytest options, its xdist worker's identity)."""
    outer = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
             "PYTEST_XDIST_TESTRUNUID", "PYTEST_CURRENT_TEST")
    return {**{key: value for key, value in os.environ.items() if key not in outer},
            **FOREIGN_CPU}


NOTEBOOKS = [f"{name}.ipynb" for name in toc_entries() if (ROOT / f"{name}.ipynb").exists()]


def test_the_foreign_cpu_run_covers_every_notebook_in_the_toc():
    assert len(NOTEBOOKS) > 10 and all(name.startswith("book/") for name in NOTEBOOKS)


# One test per notebook, so that the test processes share the re-runs between them.
@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_in_the_binder_environment_on_a_foreign_cpu(binder_python, notebook):
    result = subprocess.run(
        [binder_python, "-m", "pytest", "--nbval", "--nbval-current-env",
         "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "-p", "no:cacheprovider",
         "-o", "addopts=", "-q", notebook],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env=foreign_environment(),
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
