"""The first steps of chapter 14's training run, in NumPy and in PyTorch, side by side.

    .venv/bin/python scripts/compare_gpt_training_torch.py [--num-steps 50] [--threads 1]
        [--log attention_lib/data/shakespeare_gpt_log.json] [--d-model N ...] [--out FILE]

Both runs start from the same initial weights (drawn by GPT.init from the training script's
seed, as scripts/train_shakespeare_gpt.py draws them), see the same batches (drawn from the
same generator as the training script's) and follow the same schedule, AdamW and clipping.
Dropout is 0 in both, the only change from the training run: the PyTorch model
(tests/gpt_torch_reference.py, as nanoGPT writes it) has no dropout, and feeding it our masks
would mean writing a second PyTorch model. The NumPy side is the library's training pass
(gpt_loss_and_grads, fused or not as the run) and AdamW; the PyTorch side is autograd and
torch.optim.AdamW with the same two parameter groups, and clip_grad_norm_.

The configuration is the training run's: read from its log's "config" (--log, default the
committed log), each value replaceable by an argument. Both runs are done in float32 (the
training run's precision) and, with --float64 (the default), again in float64: in float64 the
two curves agree to about 1e-12, which shows that the float32 differences are rounding.

Writes attention_lib/data/gpt_numpy_vs_torch.json (or --out): the configuration, the versions,
and for each precision the loss of every step on both sides. tests/test_gpt_eval.py re-runs
the first steps and compares them with the file; chapter 14 plots it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LOG = ROOT / "attention_lib" / "data" / "shakespeare_gpt_log.json"
DEFAULT_OUT = ROOT / "attention_lib" / "data" / "gpt_numpy_vs_torch.json"
# The training script's arguments that define the first steps (the rest do not matter here).
RUN_KEYS = ("seed", "steps", "batch_size", "context_len", "d_model", "num_heads", "num_layers",
            "lr", "min_lr", "warmup_steps", "weight_decay", "beta2", "clip_norm", "activation",
            "fused")
RUN_DEFAULTS = {"activation": "gelu", "fused": False}  # absent from the committed log


def run_config(log_path, overrides: dict) -> dict:
    """The training run's configuration from its log, with ``overrides`` (not None) applied."""
    logged = json.loads(Path(log_path).read_text())["config"]
    config = {key: logged.get(key, RUN_DEFAULTS.get(key)) for key in RUN_KEYS}
    config |= {key: value for key, value in overrides.items() if value is not None}
    missing = [key for key, value in config.items() if value is None]
    if missing:
        raise SystemExit(f"{log_path} has no {missing} in its config; pass them as arguments")
    return config


def numpy_losses(config: dict, num_steps: int, dtype) -> list[float]:
    """``num_steps`` steps of the library's training loop without dropout: the loss of each."""
    import numpy as np

    from attention_lib.training import AdamW, clip_grad_norm, warmup_cosine_lr
    from attention_lib.training.gpt import (
        gpt_loss_and_grads,
        random_windows,
    )

    model, train_ids, batch_rng = initial_state(config, dtype)
    optimizer = AdamW(model.parameters(), lr=config["lr"], betas=(0.9, config["beta2"]),
                      weight_decay=config["weight_decay"], no_decay=model.no_decay_names())
    losses = []
    for step in range(num_steps):
        optimizer.lr = warmup_cosine_lr(step, max_lr=config["lr"], min_lr=config["min_lr"],
                                        warmup_steps=config["warmup_steps"],
                                        decay_steps=config["steps"])
        inputs, targets = random_windows(train_ids, config["batch_size"],
                                         config["context_len"], batch_rng)
        loss, grads = gpt_loss_and_grads(model, inputs, targets, fused=config["fused"])
        clip_grad_norm(grads, config["clip_norm"])
        optimizer.step(grads)
        losses.append(float(loss))
    assert np.all(np.isfinite(losses))
    return losses


def torch_losses(config: dict, num_steps: int, dtype) -> list[float]:
    """The same steps with PyTorch's autograd, AdamW and clipping."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "tests"))
    from gpt_torch_reference import torch_gpt_from

    from attention_lib.training import warmup_cosine_lr
    from attention_lib.training.gpt import random_windows

    model, train_ids, batch_rng = initial_state(config, dtype)
    reference, names = torch_gpt_from(model)
    theirs = dict(reference.named_parameters())
    no_decay = set(model.no_decay_names())
    groups = [{"params": [theirs[names[n][0]] for n in names if n not in no_decay],
               "weight_decay": config["weight_decay"]},
              {"params": [theirs[names[n][0]] for n in names if n in no_decay],
               "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=config["lr"], betas=(0.9, config["beta2"]),
                                  eps=1e-8)
    losses = []
    for step in range(num_steps):
        lr = warmup_cosine_lr(step, max_lr=config["lr"], min_lr=config["min_lr"],
                              warmup_steps=config["warmup_steps"], decay_steps=config["steps"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = random_windows(train_ids, config["batch_size"],
                                         config["context_len"], batch_rng)
        optimizer.zero_grad()
        logits = reference(torch.from_numpy(inputs))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                               torch.from_numpy(targets).reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), config["clip_norm"])
        optimizer.step()
        losses.append(float(loss.item()))
    assert np.all(np.isfinite(losses))
    return losses


def initial_state(config: dict, dtype):
    """The training script's initial model (without dropout), training ids and batch generator."""
    import numpy as np

    from attention_lib.training.gpt import (
        GPT,
        CharCodec,
        load_shakespeare_text,
        train_val_split,
    )

    text = load_shakespeare_text()
    codec = CharCodec.from_text(text)
    train_ids, _ = train_val_split(codec.encode(text))
    # scripts/train_shakespeare_gpt.py: SeedSequence(seed).spawn(4) gives the generators of
    # the initial weights, the batches, dropout and evaluation, in that order.
    seeds = np.random.SeedSequence(config["seed"]).spawn(4)
    model = GPT.init(codec.vocab_size, config["context_len"], config["d_model"],
                     config["num_heads"], config["num_layers"], np.random.default_rng(seeds[0]),
                     dropout=0.0, activation=config["activation"])
    return model.astype(dtype), train_ids, np.random.default_rng(seeds[1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-steps", type=int, default=50,
                        help="how many steps to compare (--steps is the run's schedule length)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--log", default=str(DEFAULT_LOG),
                        help="the training run's log, for its configuration")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--no-float64", dest="float64", action="store_false",
                        help="compare in float32 only")
    for key in RUN_KEYS:
        if key == "fused":
            parser.add_argument("--fused", dest="fused", action="store_true", default=None)
            parser.add_argument("--unfused", dest="fused", action="store_false")
        elif key == "activation":
            parser.add_argument("--activation", choices=("gelu", "gelu_tanh"), default=None)
        else:
            kind = float if key in ("lr", "min_lr", "weight_decay", "beta2",
                                    "clip_norm") else int
            parser.add_argument(f"--{key.replace('_', '-')}", type=kind, default=None,
                                dest=key, help=f"default: the log's {key}")
    args = parser.parse_args(argv)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    config = run_config(args.log, {key: getattr(args, key) for key in RUN_KEYS})
    result = {"config": config, "num_steps": args.num_steps, "dropout": 0.0,
              "threads": args.threads,
              "versions": {"numpy": np.__version__, "torch": torch.__version__,
                           "python": platform.python_version()},
              "runs": {}}
    for name, dtype in [("float32", np.float32)] + [("float64", np.float64)] * args.float64:
        ours = numpy_losses(config, args.num_steps, dtype)
        theirs = torch_losses(config, args.num_steps, dtype)
        gap = max(abs(a - b) for a, b in zip(ours, theirs))
        print(f"{name}: {args.num_steps} steps, loss {ours[0]:.4f} -> {ours[-1]:.4f}; "
              f"largest |NumPy - PyTorch| {gap:.2e}", flush=True)
        result["runs"][name] = {"numpy": ours, "torch": theirs}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
