"""Train the digit-reversal transformer of chapter 12 longer and larger than the chapter can.

    .venv/bin/python benchmarks/train_reversal.py [--steps 2000] [--threads 1] [--quick]

1. Speed: milliseconds per training step (forward + backward + Adam, batch 64) of the
   chapter's model (T=8, d_model=32, 1 block, 2 heads), float64 and float32, and, if PyTorch
   is installed, of the same model trained by PyTorch's autograd and torch.optim.Adam on the
   same threads. Each is timed for 100 steps, three rounds taken in turn; the best round counts,
   so a busy machine disturbs the ratios less.
2. Accuracy: final training loss, per-token and exact-sequence accuracy on 10,000 held-out
   sequences that training never saw, for the chapter's run (600 steps), a harder task (T=16,
   1 and 2 blocks) and the two baselines (no positions, no attention) with the longer budget,
   to show that more steps do not help them (the chapter trains them for 400).

Timings vary by machine; the ratios and accuracies are the point.
"""

from __future__ import annotations

import argparse
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=2000, help="steps of the longer runs")
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--quick", action="store_true", help="a few steps of each run (smoke test)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402

from attention_lib.training import (  # noqa: E402
    Adam,
    EncoderModel,
    loss_and_grads,
    model_forward,
    reversal_data,
    train,
)

SEED, NUM_DIGITS, BATCH = 12, 10, 64


def make_model(T, dtype=np.float64, num_layers=1, d_model=32, **options):
    return EncoderModel.init(NUM_DIGITS, T, d_model, 2, 2 * d_model, num_layers, NUM_DIGITS,
                             np.random.default_rng(SEED), dtype=dtype, **options)


def run(name, T, steps, *, num_layers=1, **options):
    """Train, then report the loss and the held-out accuracy."""
    test_inputs, test_targets = reversal_data(np.random.default_rng(SEED), 10_000, T,
                                              NUM_DIGITS)
    model = make_model(T, num_layers=num_layers, **options)
    batch_rng = np.random.default_rng(SEED + 1)
    start = time.perf_counter()
    losses = train(lambda batch: loss_and_grads(model, *batch),
                   Adam(model.parameters(), lr=3e-3),
                   lambda step: reversal_data(batch_rng, BATCH, T, NUM_DIGITS,
                                              exclude=test_inputs),
                   steps, clip_norm=1.0)
    seconds = time.perf_counter() - start
    predictions = model_forward(model, test_inputs)[0].argmax(axis=-1)
    correct = predictions == test_targets
    print(f"{name:<26}{T:>3}{steps:>7}{1000 * seconds / steps:>9.2f}"
          f"{losses[-50:].mean():>11.4f}{correct.mean():>10.2%}"
          f"{correct.all(axis=-1).mean():>10.2%}", flush=True)


def numpy_timer(dtype):
    model = make_model(8, dtype=dtype)
    optimizer = Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(SEED)

    def steps(n):
        start = time.perf_counter()
        for _ in range(n):
            inputs, targets = reversal_data(rng, BATCH, 8, NUM_DIGITS)
            _, grads = loss_and_grads(model, inputs, targets)
            optimizer.step(grads)
        return 1000 * (time.perf_counter() - start) / n

    return steps


def torch_timer(dtype, d_model=32, T=8):
    """The same model and batch trained by PyTorch's autograd."""
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(NUM_DIGITS, d_model)
            self.positions = torch.nn.Parameter(torch.randn(T, d_model) / d_model**0.5)
            self.block = torch.nn.TransformerEncoderLayer(
                d_model, 2, 2 * d_model, dropout=0.0, batch_first=True, norm_first=True)
            self.norm = torch.nn.LayerNorm(d_model)
            self.out = torch.nn.Linear(d_model, NUM_DIGITS)

        def forward(self, tokens):
            x = self.embedding(tokens) + self.positions
            return self.out(self.norm(self.block(x)))

    model = Model().to({np.float64: torch.float64, np.float32: torch.float32}[dtype])
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(SEED)

    def steps(n):
        start = time.perf_counter()
        for _ in range(n):
            inputs, targets = reversal_data(rng, BATCH, T, NUM_DIGITS)
            logits = model(torch.from_numpy(inputs))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, NUM_DIGITS),
                                                     torch.from_numpy(targets.reshape(-1)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return 1000 * (time.perf_counter() - start) / n

    return steps


def speed(steps_per_round):
    timers = {"NumPy by hand, float64": numpy_timer(np.float64),
              "NumPy by hand, float32": numpy_timer(np.float32)}
    try:
        timers["PyTorch autograd, float64"] = torch_timer(np.float64)
        timers["PyTorch autograd, float32"] = torch_timer(np.float32)
    except ImportError:
        print("(PyTorch is not installed: no reference timing)")
    for timer in timers.values():
        timer(5)  # warm up
    best = dict.fromkeys(timers, float("inf"))
    for _ in range(3):  # three rounds, the timers taken in turn
        for name, timer in timers.items():
            best[name] = min(best[name], timer(steps_per_round))
    reference = best["NumPy by hand, float64"]
    print(f"{'training step of the chapter model':<34}{'ms/step':>9}{'ratio':>8}"
          "   (ratio: to NumPy float64)")
    for name, ms in best.items():
        print(f"{name:<34}{ms:>9.2f}{ms / reference:>8.2f}")
    print()


def main():
    short, long = (20, 40) if args.quick else (600, args.steps)
    print(f"threads: {args.threads}; batch {BATCH}; held-out set: 10,000 sequences\n")
    speed(10 if args.quick else 100)
    print(f"{'run':<26}{'T':>3}{'steps':>7}{'ms/step':>9}{'final loss':>11}"
          f"{'per token':>10}{'sequence':>10}")
    run("chapter model", 8, short)
    run("T=16, 1 block", 16, long)
    run("T=16, 2 blocks", 16, long, num_layers=2)
    run("no positions (T=8)", 8, long, positions=None)
    run("no attention (T=8)", 8, long, attention=False)


if __name__ == "__main__":
    main()
