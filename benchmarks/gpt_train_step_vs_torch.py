"""Time one training step of chapter 14's GPT in NumPy against the same model in PyTorch.

    .venv/bin/python benchmarks/gpt_train_step_vs_torch.py [--threads 2] [--repeat 9]
        [--profile] [--json benchmarks/results/gpt_train_step.json]

One step = forward, backward and an AdamW update (with gradient clipping), on a batch of
random windows, float32, CPU, the same shapes and initial weights everywhere and the same
number of threads for NumPy's BLAS and for PyTorch (set before either is imported). The
model is the chapter's (4 blocks, d_model 192, 6 heads, context 128) with the training
script's batch of 16; dropout is 0 so every variant does the same arithmetic.

Four steps are timed, interleaved in every round (so a change in the machine's load hits
all four alike), and each one's median over the rounds is printed, in wall time and in CPU
time (all threads; on a machine busy with other work the CPU time varies less):

- NumPy, unfused, exact GELU: ``gpt_loss_and_grads(..., fused=False)``, the pass that made
  the committed checkpoint (chapter 12's functional layers, GELU through scipy's ``erf``);
- NumPy, fused, tanh GELU: ``fused=True`` on a model with ``activation="gelu_tanh"``;
- PyTorch with the exact GELU, and with ``F.gelu(approximate="tanh")``; PyTorch runs its
  fused attention (F.scaled_dot_product_attention) and autograd.

The ratios compare each NumPy step with PyTorch on the same GELU (goal: <= 1.25). With
--profile, each NumPy step is also run under cProfile and its time split into matrix
products, GELU, softmax, layer norm, the optimizer and the rest. The 1-minute load average
is printed before and after: on a shared machine, a load above the thread count means the
steps competed for cores. PyTorch is a reference here, not a dependency:
pip install torch==2.13.0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--repeat", type=int, default=9)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--profile", action="store_true")
parser.add_argument("--json", default=None, help="also write the numbers to this file")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import cProfile  # noqa: E402
import pstats  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

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
data = np.random.default_rng(1).integers(0, 65, 100_000)
inputs, targets = random_windows(data, B, T, np.random.default_rng(2))
torch_inputs, torch_targets = torch.from_numpy(inputs), torch.from_numpy(targets)


def numpy_step_fn(activation, fused):
    model = GPT.init(65, rng=np.random.default_rng(0), activation=activation, **CONFIG)
    optimizer = AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1,
                      no_decay=model.no_decay_names())

    def step():
        _, grads = gpt_loss_and_grads(model, inputs, targets, fused=fused)
        clip_grad_norm(grads, 1.0)
        optimizer.step(grads)

    return model, step


def torch_step_fn(model):
    reference, names = torch_gpt_from(model)
    by_name = dict(reference.named_parameters())
    no_decay = {names[name][0] for name in model.no_decay_names()}
    optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in by_name.items() if n not in no_decay], "weight_decay": 0.1},
         {"params": [p for n, p in by_name.items() if n in no_decay], "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.99))

    def step():
        optimizer.zero_grad(set_to_none=True)
        logits = reference(torch_inputs)
        loss = F.cross_entropy(logits.reshape(-1, 65), torch_targets.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()

    return step


exact_model, numpy_before = numpy_step_fn("gelu", fused=False)
tanh_model, numpy_after = numpy_step_fn("gelu_tanh", fused=True)
steps = {"numpy_unfused_exact_gelu": numpy_before, "numpy_fused_tanh_gelu": numpy_after,
         "torch_exact_gelu": torch_step_fn(exact_model),
         "torch_tanh_gelu": torch_step_fn(tanh_model)}

load_before = os.getloadavg()[0]
for step in steps.values():  # warm up: first-call allocations, caches, lazy imports
    step()
times = {name: [] for name in steps}
cpu_times = {name: [] for name in steps}
for _ in range(args.repeat):
    for name, step in steps.items():
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        times[name].append(time.perf_counter() - start)
        cpu_times[name].append(time.process_time() - start_cpu)
load_after = os.getloadavg()[0]
median = {name: float(np.median(values)) for name, values in times.items()}
median_cpu = {name: float(np.median(values)) for name, values in cpu_times.items()}
spread = {name: [float(min(values)), float(max(values))] for name, values in times.items()}

tokens = B * T
print(f"one training step, B={B}, T={T}, "
      f"{sum(p.size for p in exact_model.parameters().values()):,} parameters, float32, "
      f"{args.threads} thread(s); median of {args.repeat} interleaved rounds (min..max); "
      f"load average {load_before:.2f} before, {load_after:.2f} after "
      f"on {os.cpu_count()} cores")
for name, value in median.items():
    low, high = spread[name]
    print(f"  {name:26s} {value * 1e3:7.1f} ms ({low * 1e3:6.1f}..{high * 1e3:6.1f})  "
          f"{tokens / value:7.0f} tokens/s  CPU {median_cpu[name] * 1e3:7.1f} ms")
ratios = {"unfused_exact_vs_torch_exact": median["numpy_unfused_exact_gelu"]
          / median["torch_exact_gelu"],
          "fused_tanh_vs_torch_tanh": median["numpy_fused_tanh_gelu"]
          / median["torch_tanh_gelu"],
          "speedup_numpy": median["numpy_unfused_exact_gelu"] / median["numpy_fused_tanh_gelu"]}
print(f"  ratio NumPy / PyTorch, before (unfused, exact GELU): "
      f"{ratios['unfused_exact_vs_torch_exact']:.2f}")
print(f"  ratio NumPy / PyTorch, after (fused, tanh GELU):    "
      f"{ratios['fused_tanh_vs_torch_tanh']:.2f}  (goal: <= 1.25)")
print(f"  NumPy speed-up: {ratios['speedup_numpy']:.2f}x")

# Where a NumPy step spends its time: cProfile's cumulative time of the functions that do
# one kind of work each, (name, sign, caller): a caller restricts the time to the calls from
# it, so nested functions are not counted twice. In the unfused pass, attention_forward
# less its softmax is the two batched products plus the scaling of q and the masking, and
# attention_backward holds four batched products and the softmax backward: both are counted
# as matrix products (an upper bound on them).
CATEGORIES = {
    "matrix products": [("_mm", 1, None), ("_matmul_rows", 1, None),
                        ("linear_backward", 1, None), ("_matmul_rows", -1, "linear_backward"),
                        ("attention_forward", 1, None), ("_max_along", -1, "_attend"),
                        ("_softmax_in_place", -1, "_attend"), ("attention_backward", 1, None)],
    "GELU": [("_gelu_forward", 1, None), ("_gelu_backward", 1, None),
             ("activation_forward", 1, None), ("activation_backward", 1, None)],
    "softmax": [("_softmax_inplace", 1, None), ("_softmax_backward_inplace", 1, None),
                ("_max_along", 1, "_attend"), ("_softmax_in_place", 1, "_attend")],
    "layer norm": [("_ln_forward", 1, None), ("_ln_backward", 1, None),
                   ("layer_norm_forward", 1, None), ("layer_norm_backward", 1, None)],
    "optimizer and clipping": [("step", 1, None), ("clip_grad_norm", 1, None)],
}


def profile(step, rounds=5):
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(rounds):
        step()
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)

    def cumulative(name, caller):
        total = 0.0
        for (filename, _, function), (_, _, _, ct, callers) in stats.items():
            if function != name or "attention_lib" not in filename:
                continue
            if caller is None:
                total += ct
            else:
                total += sum(times[3] for (_, _, by), times in callers.items() if by == caller)
        return total / rounds

    total = sum(ct for (filename, _, name), (_, _, _, ct, _) in stats.items()
                if name == "step" and filename.endswith("gpt_train_step_vs_torch.py")) / rounds
    parts = {category: sum(sign * cumulative(name, caller) for name, sign, caller in entries)
             for category, entries in CATEGORIES.items()}
    parts["elementwise and other"] = total - sum(parts.values())
    return total, parts


profiles = {}
if args.profile:
    print("\nprofile (cProfile, mean of 5 steps; cProfile adds a little to each call):")
    for name in ("numpy_unfused_exact_gelu", "numpy_fused_tanh_gelu"):
        total, parts = profile(steps[name])
        profiles[name] = {"total_s": total, "parts_s": parts}
        print(f"  {name}: {total * 1e3:.0f} ms")
        for category, seconds in parts.items():
            print(f"    {category:24s} {seconds * 1e3:7.1f} ms  {100 * seconds / total:5.1f}%")

if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(
        {"threads": args.threads, "batch_size": B, "context_len": T, "repeat": args.repeat,
         "load_average_1min": [load_before, load_after], "cpu_count": os.cpu_count(),
         "median_s": median, "min_max_s": spread, "median_cpu_s": median_cpu,
         "ratios": ratios, "profile": profiles,
         "numpy": np.__version__, "torch": torch.__version__}, indent=1) + "\n")
