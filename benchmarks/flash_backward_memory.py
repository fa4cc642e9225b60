"""Peak extra memory (and time) of forward + backward: tiled attention against dense attention.

    .venv/bin/python benchmarks/flash_backward_memory.py [--threads 1] [--repeat 2]
        [--lengths 1024 2048 4096 8192 16384]
        [--write benchmarks/results/flash_backward_memory.json]

One head, d = 64, float32, Tq = Tk = T, no mask. One training step of attention is a forward
pass and a backward pass with a given upstream gradient dO:

- dense: ``attention_forward`` then ``attention_backward`` (chapter 12): the forward keeps the
  (T, T) weights for the backward, which builds dP and one more (T, T) array that becomes dS;
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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeat", type=int, default=2)
parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
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


def dense_step(q, k, v, d_output):
    """Forward and backward with the (T, T) weights kept in between."""
    _, _, cache = attention_forward(q, k, v)
    return attention_backward(d_output, cache)


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


def main() -> None:
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
        if T < 16384:  # small enough to time properly: warm-up, then the best of --repeat
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
                                 "d = 64, float32, no mask; seconds: best of runs "
                                 "(information only)",
                  "d": D, "dtype": "float32", "block_q": 256, "block_k": 512,
                  "threads": args.threads, "repeat": args.repeat, "numpy": np.__version__,
                  "machine": platform.machine(), "system": platform.system(), "rows": rows}
        args.write.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.write}")


if __name__ == "__main__":
    main()
