"""Time the two forms of the (gated) delta rule: the recurrence against the chunkwise WY form.

    python benchmarks/delta_rule_forms.py [--T 1024] [--heads 4] [--d 64] [--repeat 5]

One thread (BLAS limited with threadpoolctl). Inputs: ``heads`` heads of ``T`` tokens, keys
L2-normalized, ``d_k = d_v = d``, beta in [0, 1], decay in [0.9, 1). Timed: the best of R runs
after a warm-up (benchmarks/timing.py). Printed per form: seconds, the multiply-add flops the
form performs (counted below, 2 per multiply-add), the rate they imply, and the largest
difference from the recurrence.

Flops per head (elementwise scalings of vectors left out). Recurrence, per token: decay
(d^2), S k (2 d^2), the rank-one update (2 d^2), S q (2 d^2): 7 d^2 T. Chunked, per chunk of
C (n = T / C chunks): K K^T and Q K^T (4 C^2 d), one np.linalg.solve, an LU (2/3 C^3) and
substitutions for 2 d right-hand sides (4 C^2 d), W H, Q H and the state update (6 C d^2),
inside @ V_new (2 C^2 d): n (2/3 C^3 + 10 C^2 d + 6 C d^2) = T (2/3 C^2 + 10 C d + 6 d^2).
The recurrence does the fewest flops, in T steps of small NumPy calls (a few microseconds of
overhead each); the chunked form does more, in one batched solve (np.linalg.solve loops over
the n small systems, one LAPACK call each) and T / C steps of matrix products.
"""

from __future__ import annotations

import argparse

import numpy as np
from threadpoolctl import threadpool_limits
from timing import best_time

from attention_lib.variants import delta_rule

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--T", type=int, default=1024)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--d", type=int, default=64)
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
args = parser.parse_args()

rng = np.random.default_rng(0)
T, H, d = args.T, args.heads, args.d
q = rng.normal(size=(H, T, d)).astype(args.dtype)
k = rng.normal(size=(H, T, d))
k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(args.dtype)
v = rng.normal(size=(H, T, d)).astype(args.dtype)
beta = rng.uniform(0, 1, size=(H, T)).astype(args.dtype)
decay = rng.uniform(0.9, 1.0, size=(H, T)).astype(args.dtype)

print(f"delta rule, {H} heads x T={T}, d_k=d_v={d}, {args.dtype}, 1 thread, best of "
      f"{args.repeat}")
with threadpool_limits(limits=1):
    for gate in (None, decay):
        name = "gated delta rule" if gate is not None else "delta rule"
        reference = delta_rule(q, k, v, beta, decay=gate)
        for C in (None, 16, 32, 64, 128):
            seconds = best_time(lambda C=C, gate=gate: delta_rule(q, k, v, beta, decay=gate,
                                                                  chunk_size=C), args.repeat)
            padded = T if C is None else -(-T // C) * C  # the chunked form pads to n C
            flops = H * padded * (7 * d * d if C is None
                                  else 2 / 3 * C * C + 10 * C * d + 6 * d * d)
            difference = np.abs(delta_rule(q, k, v, beta, decay=gate, chunk_size=C)
                                - reference).max()
            form = "recurrent" if C is None else f"chunked C={C}"
            print(f"{name:17s} {form:15s} {seconds * 1e3:8.1f} ms  {flops / 1e6:7.1f} Mflop  "
                  f"{flops / seconds / 1e9:6.2f} Gflop/s  max |diff| {difference:.1e}")
