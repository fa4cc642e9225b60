"""Peak memory and time of naive attention against tiled (flash-style) attention.

    .venv/bin/python benchmarks/flash_memory_time.py [--threads 1] [--repeat 3]
        [--lengths 1024 4096 16384] [--block-q 256] [--block-k 512] [--sweep]

One head, d = 64, float32, Tq = Tk = T. Naive is scaled_dot_product_attention (it builds the
(T, T) scores and weights); tiled is tiled_attention (one (block_q, block_k) tile at a time).
Memory: ``attention_lib.peak_extra_bytes``, the tracemalloc peak during one call, above what
was allocated before it (NumPy reports its array buffers to tracemalloc, so this is the memory
of the temporaries and the result). Time: the best of --repeat calls, measured without
tracemalloc, with the same number of BLAS threads for both (set before NumPy is imported).
The naive call at T = 16384 needs a few GB and a few seconds. --sweep also times a grid of
tile sizes at T = 4096.

Targets (issue 6): at T = 16384 the tiled peak is <= 1/8 of the naive peak; at T = 4096 the
tiled time is <= 1.5x the naive time. Nothing is asserted: the script prints the numbers.
"""

from __future__ import annotations

import argparse
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeat", type=int, default=3)
parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
parser.add_argument("--block-q", type=int, default=None, help="default: the library's")
parser.add_argument("--block-k", type=int, default=None, help="default: the library's")
parser.add_argument("--sweep", action="store_true", help="time tile sizes at T = 4096")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402

from attention_lib import (  # noqa: E402
    peak_extra_bytes,
    scaled_dot_product_attention,
    tiled_attention,
)

D = 64
MIB = 2**20
BLOCKS = {name: value for name, value in (("block_q", args.block_q), ("block_k", args.block_k))
          if value is not None}


def naive(q, k, v):
    return scaled_dot_product_attention(q, k, v)[0]


def tiled(q, k, v, **blocks):
    return tiled_attention(q, k, v, **(blocks or BLOCKS))


def best_time(function, *arrays, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function(*arrays)
        times.append(time.perf_counter() - start)
    return min(times)


def inputs(T: int):
    rng = np.random.default_rng(T)
    return tuple(rng.standard_normal((T, D), dtype=np.float32) for _ in range(3))


def main() -> None:
    blocks = BLOCKS or {"block_q": "default 256", "block_k": "default 512"}
    print(f"one head, d={D}, float32, threads={args.threads}, best of {args.repeat}, "
          f"tiles {blocks}")
    print(f"{'T':>6s} {'naive MiB':>10s} {'tiled MiB':>10s} {'mem ratio':>10s} "
          f"{'naive s':>9s} {'tiled s':>9s} {'time ratio':>11s}")
    for T in args.lengths:
        q, k, v = inputs(T)
        np.testing.assert_allclose(tiled(q, k, v), naive(q, k, v), rtol=1e-4, atol=1e-5)
        naive_bytes = peak_extra_bytes(naive, q, k, v)
        tiled_bytes = peak_extra_bytes(tiled, q, k, v)
        repeat = args.repeat if T < 16384 else min(args.repeat, 2)
        naive_s = best_time(naive, q, k, v, repeat=repeat)
        tiled_s = best_time(tiled, q, k, v, repeat=repeat)
        print(f"{T:6d} {naive_bytes / MIB:10.1f} {tiled_bytes / MIB:10.2f} "
              f"{tiled_bytes / naive_bytes:10.4f} {naive_s:9.3f} {tiled_s:9.3f} "
              f"{tiled_s / naive_s:11.2f}")
    print("mem ratio = tiled / naive peak (target at 16384: <= 0.125); "
          "time ratio = tiled / naive (target at 4096: <= 1.5)")
    if args.sweep:
        T = 4096
        q, k, v = inputs(T)
        naive_s = best_time(naive, q, k, v, repeat=args.repeat)
        print(f"\ntile sizes at T={T} (naive {naive_s:.3f} s): tiled time / naive time, "
              "peak MiB")
        for block_q in (64, 128, 256, 512, 1024):
            cells = []
            for block_k in (128, 256, 512, 1024, 2048):
                sizes = {"block_q": block_q, "block_k": block_k}
                seconds = best_time(lambda *a, s=sizes: tiled(*a, **s), q, k, v,
                                    repeat=args.repeat)
                peak = peak_extra_bytes(lambda *a, s=sizes: tiled(*a, **s), q, k, v)
                cells.append(f"{block_k:>5d}: {seconds / naive_s:4.2f} {peak / MIB:5.1f}")
            print(f"block_q {block_q:5d} | " + " | ".join(cells))


if __name__ == "__main__":
    main()
