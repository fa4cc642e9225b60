"""Time one training step of chapter 14's GPT in NumPy against the same model in PyTorch.

    .venv/bin/python benchmarks/gpt_train_step_vs_torch.py [--threads N] [--repeat R]

One step = forward, backward and an AdamW update (with gradient clipping), on a batch of
random windows, float32, CPU, the same shapes and weights in both and the same number of
threads for NumPy's BLAS and for PyTorch (set before either is imported). The model is the
chapter's (4 blocks, d_model 192, 6 heads, context 128) with the training script's batch of
16; dropout is 0 in both so they do the same arithmetic. PyTorch runs its own fused
attention (F.scaled_dot_product_attention) and autograd. Prints the best of R steps of each,
their ratio ours / torch (goal: <= 1.5) and tokens per second. PyTorch is a reference here,
not a dependency: pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=16)
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib.training import (  # noqa: E402
    GPT,
    AdamW,
    clip_grad_norm,
    gpt_loss_and_grads,
    random_windows,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpt_torch_reference import torch_gpt_from  # noqa: E402

torch.set_num_threads(args.threads)
CONFIG = {"context_len": 128, "d_model": 192, "num_heads": 6, "num_layers": 4}
B, T = args.batch_size, CONFIG["context_len"]

rng = np.random.default_rng(0)
model = GPT.init(65, rng=rng, **CONFIG)
data = rng.integers(0, 65, 100_000)
inputs, targets = random_windows(data, B, T, rng)
optimizer = AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1,
                  no_decay=model.no_decay_names())

reference, names = torch_gpt_from(model)
by_name = dict(reference.named_parameters())
no_decay = {names[name][0] for name in model.no_decay_names()}
torch_optimizer = torch.optim.AdamW(
    [{"params": [p for n, p in by_name.items() if n not in no_decay], "weight_decay": 0.1},
     {"params": [p for n, p in by_name.items() if n in no_decay], "weight_decay": 0.0}],
    lr=1e-4, betas=(0.9, 0.99))
torch_inputs, torch_targets = torch.from_numpy(inputs), torch.from_numpy(targets)


def numpy_step():
    loss, grads = gpt_loss_and_grads(model, inputs, targets)
    clip_grad_norm(grads, 1.0)
    optimizer.step(grads)


def torch_step():
    torch_optimizer.zero_grad(set_to_none=True)
    logits = reference(torch_inputs)
    loss = F.cross_entropy(logits.reshape(-1, 65), torch_targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    torch_optimizer.step()


ours = best_time(numpy_step, args.repeat)
theirs = best_time(torch_step, args.repeat)
tokens = B * T
print(f"one training step, B={B}, T={T}, {sum(p.size for p in model.parameters().values()):,} "
      f"parameters, float32, {args.threads} thread(s), best of {args.repeat}")
print(f"  NumPy (attention_lib): {ours * 1e3:8.1f} ms  {tokens / ours:8.0f} tokens/s")
print(f"  PyTorch (CPU):         {theirs * 1e3:8.1f} ms  {tokens / theirs:8.0f} tokens/s")
print(f"  ratio NumPy / PyTorch: {ours / theirs:.2f}  (goal: <= 1.5)")
