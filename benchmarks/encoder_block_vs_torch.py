"""Time attention_lib's EncoderBlock forward against torch.nn.TransformerEncoderLayer.

    .venv/bin/python benchmarks/encoder_block_vs_torch.py [--threads N] [--repeat R]

CPU, float32, the same weights, the same thread count for NumPy's BLAS and PyTorch; B=4,
T=512, d_model=512, H=8, d_ff=2048, post-LN, ReLU, dropout 0, eval mode. Prints the best of
R runs in milliseconds and the ratio ours / torch (target <= 1.5). PyTorch is a reference
here, not a dependency: pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--repeat", type=int, default=5)
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib import EncoderBlock  # noqa: E402

torch.set_num_threads(args.threads)
B, T, D_MODEL, HEADS, D_FF = 4, 512, 512, 8, 2048



def copy_weights(ours: EncoderBlock, layer: torch.nn.TransformerEncoderLayer) -> None:
    attention = ours.self_attn
    tensor = torch.from_numpy
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(tensor(np.concatenate(
            [attention.W_q.T, attention.W_k.T, attention.W_v.T])))
        layer.self_attn.in_proj_bias.copy_(tensor(np.concatenate(
            [attention.b_q, attention.b_k, attention.b_v])))
        layer.self_attn.out_proj.weight.copy_(tensor(np.ascontiguousarray(attention.W_o.T)))
        layer.self_attn.out_proj.bias.copy_(tensor(attention.b_o))
        layer.linear1.weight.copy_(tensor(np.ascontiguousarray(ours.ff.W1.T)))
        layer.linear1.bias.copy_(tensor(ours.ff.b1))
        layer.linear2.weight.copy_(tensor(np.ascontiguousarray(ours.ff.W2.T)))
        layer.linear2.bias.copy_(tensor(ours.ff.b2))
        for norm, torch_norm in ((ours.norm1, layer.norm1), (ours.norm2, layer.norm2)):
            torch_norm.weight.copy_(tensor(norm.gamma))
            torch_norm.bias.copy_(tensor(norm.beta))


def main() -> None:
    rng = np.random.default_rng(0)
    ours = EncoderBlock.init(D_MODEL, HEADS, D_FF, rng, dtype=np.float32)
    layer = torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, D_FF, dropout=0.0,
                                             batch_first=True).eval()
    copy_weights(ours, layer)
    x = rng.standard_normal((B, T, D_MODEL)).astype(np.float32)
    x_torch = torch.from_numpy(x)

    def run_torch():
        with torch.inference_mode():
            layer(x_torch)

    ours_s = best_time(lambda: ours(x), args.repeat)
    torch_s = best_time(run_torch, args.repeat)
    print(f"threads={args.threads}  B={B} T={T} d_model={D_MODEL} H={HEADS} d_ff={D_FF} "
          f"float32, best of {args.repeat}")
    print(f"ours {ours_s * 1e3:.1f} ms   torch {torch_s * 1e3:.1f} ms   "
          f"ratio ours/torch {ours_s / torch_s:.2f} (target <= 1.5)")
    with torch.inference_mode():
        reference = layer(x_torch).numpy()
    np.testing.assert_allclose(ours(x), reference, atol=2e-4)
    print("outputs agree (atol 2e-4)")


if __name__ == "__main__":
    main()
