"""Time attention_lib's MultiHeadAttention forward against torch.nn.MultiheadAttention.

    .venv/bin/python benchmarks/mha_vs_torch.py [--threads N] [--repeat R]

CPU, float32, the same weights in both, the same number of threads for NumPy's BLAS and for
PyTorch (set before either is imported). B=2, d_model=512, H=8 at T = 128, 512 and 2048,
both ways:

- with the attention weights (ours: the default; torch: need_weights=True,
  average_attn_weights=False), both sides storing the (B, H, T, T) weights;
- without them (ours: need_weights=False, a block of queries at a time; torch:
  need_weights=False, its fused fast path that never stores the weights).

The best of R runs is reported, in milliseconds, with the ratio ours / torch (issue 13's
target without the weights: <= 1.2), and the peak memory our call allocates beyond its
inputs (tracemalloc; torch's allocations are not visible to it). PyTorch is a reference here,
not a dependency: pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
parser.add_argument("--batch", type=int, default=2)
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib import MultiHeadAttention  # noqa: E402
from attention_lib.flash import peak_extra_bytes  # noqa: E402

torch.set_num_threads(args.threads)
D_MODEL, HEADS = 512, 8


def torch_twin(ours: MultiHeadAttention) -> torch.nn.MultiheadAttention:
    reference = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.from_numpy(
            np.concatenate([ours.W_q.T, ours.W_k.T, ours.W_v.T])))
        reference.in_proj_bias.zero_()
        reference.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(ours.W_o.T)))
        reference.out_proj.bias.zero_()
    return reference


def main() -> None:
    rng = np.random.default_rng(0)
    ours = MultiHeadAttention.init(D_MODEL, HEADS, rng, dtype=np.float32)
    reference = torch_twin(ours)
    print(f"threads={args.threads}  B={args.batch} d_model={D_MODEL} H={HEADS} float32, "
          f"best of {args.repeat}; times in ms, memory in MiB")
    print(f"{'':6s} {'with the weights':^26s} | {'without the weights':^26s} | "
          f"{'our peak memory':^17s}")
    print(f"{'T':>6s} {'ours':>8s} {'torch':>8s} {'ratio':>8s} | {'ours':>8s} {'torch':>8s} "
          f"{'ratio':>8s} | {'with':>8s} {'without':>8s}")
    for T in args.lengths:
        x = rng.standard_normal((args.batch, T, D_MODEL)).astype(np.float32)
        x_torch = torch.from_numpy(x)

        def run_torch(need_weights, x_torch=x_torch):
            with torch.inference_mode():
                return reference(x_torch, x_torch, x_torch, need_weights=need_weights,
                                 average_attn_weights=False)

        times = [best_time(lambda x=x: ours(x), args.repeat),
                 best_time(lambda: run_torch(True), args.repeat),
                 best_time(lambda x=x: ours(x, need_weights=False), args.repeat),
                 best_time(lambda: run_torch(False), args.repeat)]
        memory = [peak_extra_bytes(lambda x=x: ours(x)) / 2**20,
                  peak_extra_bytes(lambda x=x: ours(x, need_weights=False)) / 2**20]
        ms = [1e3 * t for t in times]
        print(f"{T:6d} {ms[0]:8.1f} {ms[1]:8.1f} {times[0] / times[1]:8.2f} | {ms[2]:8.1f} "
              f"{ms[3]:8.1f} {times[2] / times[3]:8.2f} | {memory[0]:8.1f} {memory[1]:8.1f}",
              flush=True)
        expected = run_torch(False)[0].numpy()
        np.testing.assert_allclose(ours(x)[0], expected, atol=1e-4)
        np.testing.assert_allclose(ours(x, need_weights=False)[0], expected, atol=1e-4)
    print("outputs agree with torch (atol 1e-4), with and without the weights")


if __name__ == "__main__":
    main()
