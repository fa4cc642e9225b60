"""Train chapter 14's character-level GPT on Tiny Shakespeare, in NumPy, from scratch.

    .venv/bin/python scripts/train_shakespeare_gpt.py [--threads 2] [--steps 1800] [--out DIR]

Writes, into --out:
- shakespeare_gpt.npz       the trained model and its vocabulary (attention_lib.training.gpt
                            documents the format; load it with load_shakespeare_gpt()),
- shakespeare_gpt_log.json  the configuration, the loss of every training step, and at every
                            evaluation: the learning rate, the loss on fixed samples of both
                            splits, and the induction-head probe (loss on the first and second
                            copy of a repeated random sequence, and each head's attention from
                            a token to the one after its previous occurrence); at the end the
                            loss on the whole validation split, the wall and CPU time.

Everything random comes from --seed, and the thread count is set before NumPy is imported,
so a second run with the same arguments on the same machine repeats the first. --stop-after N
runs only the first N steps of the same schedule (to check that two runs agree).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--out", default=None, help="output folder (default: the package's data/)")
parser.add_argument("--seed", type=int, default=1337)
parser.add_argument("--steps", type=int, default=1800)
parser.add_argument("--stop-after", type=int, default=None)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--context-len", type=int, default=128)
parser.add_argument("--d-model", type=int, default=192)
parser.add_argument("--num-heads", type=int, default=6)
parser.add_argument("--num-layers", type=int, default=4)
parser.add_argument("--dropout", type=float, default=0.1)
parser.add_argument("--lr", type=float, default=2e-3)
parser.add_argument("--min-lr", type=float, default=2e-4)
parser.add_argument("--warmup-steps", type=int, default=60)
parser.add_argument("--weight-decay", type=float, default=0.1)
parser.add_argument("--beta2", type=float, default=0.99)
parser.add_argument("--clip-norm", type=float, default=1.0)
parser.add_argument("--eval-every", type=int, default=100)
parser.add_argument("--eval-windows", type=int, default=64)
parser.add_argument("--snapshot-dir", default=None,
                    help="also save the model at every evaluation here (not committed)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attention_lib.training import AdamW, train, warmup_cosine_lr  # noqa: E402
from attention_lib.training.gpt import (  # noqa: E402
    DATA_DIR,
    GPT,
    CharCodec,
    evaluate_loss,
    gpt_loss_and_grads,
    induction_probe,
    load_shakespeare_text,
    random_windows,
    save_gpt,
    train_val_split,
)


def fixed_windows(data, num_windows, context_len, rng):
    """The same evaluation windows at every evaluation, so the curves compare like with like."""
    return random_windows(data, num_windows, context_len, rng)


def mean_loss(model, inputs, targets, batch_size=32):
    total = 0.0
    for start in range(0, len(inputs), batch_size):
        logits = model.forward(inputs[start:start + batch_size])
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        picked = np.take_along_axis(log_probs, targets[start:start + batch_size, :, None], -1)
        total -= float(picked.astype(np.float64).sum())
    return total / targets.size


def main():
    out = Path(args.out) if args.out else DATA_DIR
    out.mkdir(parents=True, exist_ok=True)
    start_wall, start_cpu = time.perf_counter(), time.process_time()

    text = load_shakespeare_text()
    codec = CharCodec.from_text(text)
    train_ids, val_ids = train_val_split(codec.encode(text))
    print(f"{len(text):,} characters, vocabulary of {codec.vocab_size}; train {train_ids.size:,}, "
          f"val {val_ids.size:,}", flush=True)

    seeds = np.random.SeedSequence(args.seed).spawn(4)  # init, batches, dropout, evaluation
    model = GPT.init(codec.vocab_size, args.context_len, args.d_model, args.num_heads,
                     args.num_layers, np.random.default_rng(seeds[0]), dropout=args.dropout)
    params = model.parameters()
    print(f"GPT: {sum(p.size for p in params.values()):,} parameters, {model.config()}",
          flush=True)
    optimizer = AdamW(params, lr=args.lr, betas=(0.9, args.beta2),
                      weight_decay=args.weight_decay, no_decay=model.no_decay_names())
    batch_rng, dropout_rng = np.random.default_rng(seeds[1]), np.random.default_rng(seeds[2])
    eval_rng = np.random.default_rng(seeds[3])
    eval_sets = {"train": fixed_windows(train_ids, args.eval_windows, args.context_len, eval_rng),
                 "val": fixed_windows(val_ids, args.eval_windows, args.context_len, eval_rng)}

    def schedule(step):
        return warmup_cosine_lr(step, max_lr=args.lr, min_lr=args.min_lr,
                                warmup_steps=args.warmup_steps, decay_steps=args.steps)

    log = {"config": vars(args) | {"model": model.config(), "vocabulary": codec.chars,
                                   "parameters": int(sum(p.size for p in params.values()))},
           "evaluations": [], "step_losses": []}
    log_path = out / "shakespeare_gpt_log.json"

    def evaluate(step):
        record = {"step": step, "lr": schedule(min(step, args.steps - 1))}
        for split, (inputs, targets) in eval_sets.items():
            record[split] = mean_loss(model, inputs, targets)
        # The same probe sequences every time, from their own seed.
        record["induction"] = induction_probe(model, np.random.default_rng(args.seed))
        record["elapsed_s"] = time.perf_counter() - start_wall
        log["evaluations"].append(record)
        log_path.write_text(json.dumps(log))
        if args.snapshot_dir:
            Path(args.snapshot_dir).mkdir(parents=True, exist_ok=True)
            save_gpt(model, codec, Path(args.snapshot_dir) / f"step{step:05d}.npz")
        return {"train": record["train"], "val": record["val"]}

    def step_fn(batch):
        inputs, targets = batch
        return gpt_loss_and_grads(model, inputs, targets, rng=dropout_rng)

    num_steps = args.steps if args.stop_after is None else args.stop_after
    first = evaluate(0)
    print(f"step 0: train {first['train']:.4f}  val {first['val']:.4f}", flush=True)
    losses = train(step_fn, optimizer,
                   lambda _: random_windows(train_ids, args.batch_size, args.context_len,
                                            batch_rng),
                   num_steps, clip_norm=args.clip_norm, lr_schedule=schedule,
                   log_every=args.eval_every, eval_fn=evaluate,
                   print_fn=lambda line: print(
                       f"{line}  ({time.perf_counter() - start_wall:.0f} s)", flush=True))
    log["step_losses"] = losses.tolist()
    train_wall, train_cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    val_loss = evaluate_loss(model, val_ids)
    log["final"] = {"val_loss_full_split": val_loss, "train_wall_s": train_wall,
                    "train_cpu_s": train_cpu, "steps": num_steps,
                    "wall_s": time.perf_counter() - start_wall}
    sha = save_gpt(model, codec, out / "shakespeare_gpt.npz")
    log["final"]["sha256"] = sha
    log_path.write_text(json.dumps(log))
    print(f"validation loss on the whole split: {val_loss:.4f} nats/char "
          f"({val_loss / np.log(2):.4f} bits/char)", flush=True)
    print(f"trained {num_steps} steps in {train_wall:.0f} s wall, {train_cpu:.0f} s CPU "
          f"({args.threads} threads); checkpoint sha256 {sha}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
