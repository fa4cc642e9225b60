"""Time attention_lib's MultiHeadAttention forward against torch.nn.MultiheadAttention.

    .venv/bin/python benchmarks/mha_vs_torch.py [--threads N] [--repeat R]

CPU, float32, the same weights in both, the same number of threads for NumPy's BLAS and for
PyTorch (set before either is imported). B=4, d_model=512, H=8 at T = 128, 512 and 2048; the
best of R runs is reported, in milliseconds, with the ratio ours / torch (target: <= 1.5).
PyTorch is a reference here, not a dependency: pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib import MultiHeadAttention  # noqa: E402

torch.set_num_threads(args.threads)
B, D_MODEL, HEADS = 4, 512, 8



def main() -> None:
    rng = np.random.default_rng(0)
    ours = MultiHeadAttention.init(D_MODEL, HEADS, rng, dtype=np.float32)
    reference = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True).eval()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.from_numpy(
            np.concatenate([ours.W_q.T, ours.W_k.T, ours.W_v.T])))
        reference.in_proj_bias.zero_()
        reference.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(ours.W_o.T)))
        reference.out_proj.bias.zero_()
    print(f"threads={args.threads}  B={B} d_model={D_MODEL} H={HEADS} float32, best of "
          f"{args.repeat}")
    print(f"{'T':>6s} {'ours ms':>10s} {'torch ms':>10s} {'ratio':>7s}")
    for T in args.lengths:
        x = rng.standard_normal((B, T, D_MODEL)).astype(np.float32)
        x_torch = torch.from_numpy(x)
        ours_s = best_time(lambda x=x: ours(x), args.repeat)

        def run_torch(x_torch=x_torch):
            with torch.inference_mode():
                reference(x_torch, x_torch, x_torch, need_weights=True,
                          average_attn_weights=False)

        torch_s = best_time(run_torch, args.repeat)
        print(f"{T:6d} {ours_s * 1e3:10.1f} {torch_s * 1e3:10.1f} {ours_s / torch_s:7.2f}",
              flush=True)
    np.testing.assert_allclose(
        ours(x)[0], reference(x_torch, x_torch, x_torch)[0].detach().numpy(), atol=1e-4)
    print("outputs agree (atol 1e-4)")


if __name__ == "__main__":
    main()
