"""What the input checks cost: a checked MultiHeadAttention call against the bare NumPy
computation of the same layer, for a small call where the checks weigh most.

    .venv/bin/python benchmarks/mha_check_overhead.py [--threads N] [--repeat R]

float32, B=1, T=16, d_model=64, H=4 by default (issue 13's target: checks add <= 20%). The
bare function below is multi-head attention written out with no check at all, as a reader
would write it after chapter 06; `forward` is the layer's trusted kernel (what the blocks
call). Times are the best of R runs of a loop of 200 calls, per call in microseconds.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeat", type=int, default=20)
parser.add_argument("--shape", type=int, nargs=4, default=[1, 16, 64, 4],
                    metavar=("B", "T", "D", "H"))
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib import MultiHeadAttention  # noqa: E402

CALLS = 200


def bare_mha(x, layer):
    """Multi-head attention with no checks: project, split, attend, merge, mix."""
    B, T, D = x.shape
    H = layer.num_heads
    d = D // H

    def heads(y):
        return y.reshape(B, T, H, d).transpose(0, 2, 1, 3)  # (B, H, T, d)

    q = heads(x @ layer.W_q + layer.b_q)
    k = heads(x @ layer.W_k + layer.b_k)
    v = heads(x @ layer.W_v + layer.b_v)
    scores = (q / np.float32(np.sqrt(d))) @ k.transpose(0, 1, 3, 2)  # (B, H, T, T)
    scores -= scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    merged = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
    return merged @ layer.W_o + layer.b_o, weights


def per_call(function) -> float:
    def loop():
        for _ in range(CALLS):
            function()
    return best_time(loop, args.repeat) / CALLS


def main() -> None:
    B, T, D, H = args.shape
    rng = np.random.default_rng(0)
    layer = MultiHeadAttention.init(D, H, rng, dtype=np.float32)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    np.testing.assert_allclose(layer(x)[0], bare_mha(x, layer)[0], rtol=1e-5, atol=1e-6)
    bare = per_call(lambda: bare_mha(x, layer))
    checked = per_call(lambda: layer(x))
    rows = [("bare NumPy", bare), ("layer(x) (checked)", checked)]
    if hasattr(layer, "forward"):  # absent before issue 13, for a before/after run
        rows.insert(1, ("layer.forward (kernel)", per_call(lambda: layer.forward(x))))
    print(f"threads={args.threads}  B={B} T={T} d_model={D} H={H} float32, "
          f"best of {args.repeat} x {CALLS} calls")
    print(f"{'':24s} {'us/call':>8s} {'/ bare':>7s}")
    for name, seconds in rows:
        print(f"{name:24s} {seconds * 1e6:8.1f} {seconds / bare:7.2f}")
    print(f"checks add {100 * (checked / bare - 1):.0f}% to the bare computation")


if __name__ == "__main__":
    main()
