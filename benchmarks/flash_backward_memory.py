"""Peak extra memory (and time) of forward + backward: tiled attention against dense attention.

    .venv/bin/python benchmarks/flash_backward_memory.py [--threads 1] [--repeat 5]
        [--lengths 512 1024 2048 4096 8192 16384]
        [--write benchmarks/results/flash_backward_memory.json]

The file in the repository was written with the defaults and ``--write`` (chapter 13 reads it).

One head, d = 64, float32, Tq = Tk = T, no mask. One training step of attention is a forward
pass and a backward pass with a given upstream gradient dO:

- dense: ``attention_forward`` then ``attention_backward`` (chapter 12): the forward keeps the
  (T, T) weights P for the backward, which builds dP, then the product dP * P (only its row
  sums are kept), then dP minus those row sums, which becomes dS;
- tiled: ``tiled_attention(..., return_lse=True)`` then ``tiled_attention_backward``
  (chapter 13): the forward keeps only the output and one log-sum-exp per query, and the
  backward recomputes each (block_q, block_k) tile of weights.

Memory: ``attention_lib.peak_extra_bytes``, the tracemalloc peak during forward + backward,
above what was allocated before (the inputs q, k, v and dO), so it counts the saved tensors,
every temporary and the gradients (NumPy reports its array buffers to tracemalloc). Time: the
best of --repeat runs after a warm-up, without tracemalloc, with the same BLAS threads for
both (set before NumPy is imported); only information, never asserted. From T = 16384 on,
each step runs only twice (one timed run whose gradients are compared, one traced run): the
dense one's traced peak is about 3 GiB (three (T, T) float32 arrays) and it takes tens of
seconds. The chapter plots the file written by --write.

What the file records besides the rows: the command line, the thread count, --repeat, the
NumPy and Python versions, the machine (``platform.machine()``, ``platform.system()``, the
processor name from /proc/cpuinfo where there is one, ``os.cpu_count()``), the float32
matrix-product rate of one large product on the same threads, the best of runs before and
after the rows (for a lower bound on each time: the steps are 6 or 7 products of 2 T^2 d
operations each), the UTC date, and
``os.getloadavg()`` (the 1, 5 and 15 minute load averages) before and after the run: the
times are one machine's, and a load above the number of cores means other work competed for
them. The memory figures do not depend on the load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
parser.add_argument("--write", type=Path, default=None,
                    help="also write the results as JSON (for the chapter's figure)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib import (  # noqa: E402
    peak_extra_bytes,
    tiled_attention,
    tiled_attention_backward,
)
from attention_lib.training import attention_backward, attention_forward  # noqa: E402

D = 64
MIB = 2**20
SINGLE_RUN_FROM = 16384  # from this length on, one timed run (tens of seconds each)


def dense_step(q, k, v, d_output):
    """Forward and backward with the (T, T) weights kept in between."""
    _, _, saved = attention_forward(q, k, v)
    return attention_backward(d_output, saved)


def tiled_step(q, k, v, d_output):
    """Forward and backward that keep only the output and the log-sum-exp in between."""
    output, lse = tiled_attention(q, k, v, return_lse=True)
    return tiled_attention_backward(d_output, q, k, v, output, lse)


def timed(function, *arrays):
    """Seconds of one call, and its result."""
    start = time.perf_counter()
    result = function(*arrays)
    return time.perf_counter() - start, result


def inputs(T: int):
    rng = np.random.default_rng(T)
    return tuple(rng.standard_normal((T, D), dtype=np.float32) for _ in range(4))


def processor_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else ``platform.processor()``."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return [round(value, 2) for value in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def matmul_gflops(size: int = 2048) -> float:
    """GFLOP/s of one float32 (size, size) @ (size, size) product on the chosen threads, best of 5:
    the rate a step made only of large matrix products could reach, for a lower bound on its
    time (a product of (m, k) and (k, n) matrices is 2 m k n floating-point operations)."""
    a, b = np.random.default_rng(0).standard_normal((2, size, size), dtype=np.float32)
    return 2 * size**3 / best_time(lambda: a @ b, repeat=5) / 1e9


def main() -> None:
    load_before = load_average()
    rate_before = matmul_gflops()  # measured before and after the rows; the best is kept
    print(f"one head, d={D}, float32, threads={args.threads}, forward + backward, "
          f"tiles 256 x 512 (the library's default)")
    print(f"{'T':>6s} {'dense MiB':>10s} {'tiled MiB':>10s} {'dense/tiled':>12s} "
          f"{'dense s':>8s} {'tiled s':>8s} {'tiled/dense time':>17s}")
    rows = []
    for T in args.lengths:
        arrays = inputs(T)
        tiled_s, tiled_grads = timed(tiled_step, *arrays)
        dense_s, dense_grads = timed(dense_step, *arrays)
        for ours, reference in zip(tiled_grads, dense_grads):
            scale = np.abs(reference).max()
            np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4 * scale)
        del tiled_grads, dense_grads
        dense_bytes = peak_extra_bytes(dense_step, *arrays)
        tiled_bytes = peak_extra_bytes(tiled_step, *arrays)
        if T < SINGLE_RUN_FROM:  # small enough to time properly: warm-up, then the best of --repeat
            dense_s = best_time(lambda a=arrays: dense_step(*a), repeat=args.repeat)
            tiled_s = best_time(lambda a=arrays: tiled_step(*a), repeat=args.repeat)
        rows.append({"T": T, "dense_bytes": dense_bytes, "tiled_bytes": tiled_bytes,
                     "dense_seconds": round(dense_s, 4), "tiled_seconds": round(tiled_s, 4)})
        print(f"{T:6d} {dense_bytes / MIB:10.1f} {tiled_bytes / MIB:10.2f} "
              f"{dense_bytes / tiled_bytes:12.1f} {dense_s:8.3f} {tiled_s:8.3f} "
              f"{tiled_s / dense_s:17.2f}", flush=True)
    print("dense/tiled = peak extra memory of dense forward + backward over tiled; "
          "tiled/dense time is for information")
    if args.write:
        args.write.parent.mkdir(parents=True, exist_ok=True)
        record = {"description": "tracemalloc peak extra bytes of forward + backward, one head, "
                                 "d = 64, float32, no mask; seconds: best of --repeat runs after "
                                 "a warm-up below T = 16384, one run from T = 16384 on "
                                 "(information only)",
                  "command": " ".join(["benchmarks/flash_backward_memory.py", *sys.argv[1:]]),
                  "d": D, "dtype": "float32", "block_q": 256, "block_k": 512,
                  "threads": args.threads, "repeat": args.repeat,
                  "single_run_from_T": SINGLE_RUN_FROM,
                  "matmul_gflops": round(max(rate_before, matmul_gflops()), 1),
                  "numpy": np.__version__, "python": platform.python_version(),
                  "machine": platform.machine(), "system": platform.system(),
                  "processor": processor_name(), "cpu_count": os.cpu_count(),
                  "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
                  "load_average_before": load_before, "load_average_after": load_average(),
                  "rows": rows}
        args.write.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
