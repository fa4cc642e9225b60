"""Train chapter 14's character-level GPT on Tiny Shakespeare, in NumPy, from scratch.

    .venv/bin/python scripts/train_shakespeare_gpt.py [--threads 2] [--steps 1800] [--out DIR]
        [--fused] [--activation gelu_tanh] [--checkpoint-minutes 5] [--resume FILE]

Writes, into --out:
- shakespeare_gpt.npz       the trained model and its vocabulary (attention_lib.training.gpt
                            documents the format; load it with load_shakespeare_gpt()),
- shakespeare_gpt_log.json  the configuration, the loss of every training step, and at every
                            evaluation: the learning rate, the loss on fixed samples of both
                            splits, and the induction-head probe (loss on the first and second
                            copy of a repeated random sequence, and each head's attention from
                            a token to the one after its previous occurrence); at the end the
                            loss on the whole validation split, the wall and CPU time,
- shakespeare_gpt_log.jsonl the same run as JSON lines, written as it goes: a "progress"
                            record every --print-every steps (step, mean loss since the last
                            one, learning rate, characters per second, elapsed and estimated
                            remaining seconds) and an "eval" record at every evaluation,
- shakespeare_gpt_resume.npz (or --checkpoint) the state to resume from, every
                            --checkpoint-minutes and when the run is stopped with Ctrl-C or
                            SIGTERM: the weights, AdamW's moments and step count, the number of
                            steps done, the states of the batch and dropout random generators,
                            the step losses and evaluations so far. --resume FILE continues
                            from it; removed at the end of a finished run (unless
                            --keep-checkpoint).

Everything random comes from --seed, and the thread count is set before NumPy is imported,
so a second run with the same arguments on the same machine repeats the first; a run stopped
and resumed writes the same bytes as one that was not stopped (tests/test_train_resume.py).
--stop-after N runs only the first N steps of the same schedule (to check that two runs
agree); --exit-after K stops after step K as an interruption would (a checkpoint, no final
evaluation).

The committed checkpoint (attention_lib/data/shakespeare_gpt.npz, sha256 ee891c9d...) was
made on one core in 5,980 s of wall time (issue 25) by

    .venv/bin/python scripts/train_shakespeare_gpt.py --threads 1 --fused \
        --activation gelu_tanh --d-model 192 --num-heads 6 --num-layers 4 --steps 15000 \
        --warmup-steps 100 --eval-every 500 --print-every 50 --checkpoint-minutes 5

stopped once (SIGTERM at step 95) and resumed with --resume, which changes no byte. --fused
computes the query, key and value projections with one product and does softmax, GELU and
dropout in place (the same function, other rounding); --activation gelu_tanh is GPT-2's tanh
approximation of GELU (saved in the checkpoint's config). The defaults (1800 steps, 2
threads, unfused, exact GELU) are the shorter run of issue 15, which reached 1.675.
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
parser.add_argument("--activation", choices=("gelu", "gelu_tanh"), default="gelu",
                    help="gelu: exact (the committed checkpoint); gelu_tanh: GPT-2's")
parser.add_argument("--fused", action="store_true",
                    help="the fused training pass (gpt_loss_and_grads(..., fused=True))")
parser.add_argument("--print-every", type=int, default=10,
                    help="a progress line and a JSON-lines record every this many steps")
parser.add_argument("--checkpoint", default=None,
                    help="the resume file (default: shakespeare_gpt_resume.npz in --out)")
parser.add_argument("--checkpoint-minutes", type=float, default=5.0)
parser.add_argument("--keep-checkpoint", action="store_true",
                    help="keep the resume file after a finished run")
parser.add_argument("--resume", default=None, help="continue the run saved in this file")
parser.add_argument("--exit-after", type=int, default=None,
                    help="stop after this step as an interruption would (for tests)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attention_lib.training import AdamW, clip_grad_norm, warmup_cosine_lr  # noqa: E402
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

# The arguments that define the run: a resumed run must be given the same ones (or none).
RUN_ARGUMENTS = ("seed", "steps", "stop_after", "batch_size", "context_len", "d_model",
                 "num_heads", "num_layers", "dropout", "lr", "min_lr", "warmup_steps",
                 "weight_decay", "beta2", "clip_norm", "eval_every", "eval_windows",
                 "activation", "fused")
# Arguments added after the committed run; left out of its log's config when at their
# defaults, so that a run with the defaults writes the log it wrote.
NEW_ARGUMENTS = {"activation": "gelu", "fused": False, "print_every": 10, "checkpoint": None,
                 "checkpoint_minutes": 5.0, "keep_checkpoint": False, "resume": None,
                 "exit_after": None}


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


def logged_config():
    config = vars(args).copy()
    for name, default in NEW_ARGUMENTS.items():
        if config[name] == default:
            del config[name]
    return config


def write_atomically(path: Path, write) -> None:
    """``write(file)`` into a temporary file next to ``path``, then rename it: a run killed
    while writing leaves the previous file whole."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        write(file)
    os.replace(temporary, path)


def save_resume_state(path, model, optimizer, steps_done, batch_rng, dropout_rng, log,
                      step_losses, elapsed):
    """Everything the rest of the run depends on, in one .npz (see the module's docstring)."""
    arrays = {}
    for name, param in model.parameters().items():
        arrays[f"param/{name}"] = param
        arrays[f"adam_m/{name}"] = optimizer.m[name]
        arrays[f"adam_v/{name}"] = optimizer.v[name]
    arrays["step_losses"] = np.asarray(step_losses, dtype=np.float64)
    state = {"steps_done": steps_done, "adam_t": optimizer.t,
             "batch_rng": batch_rng.bit_generator.state,
             "dropout_rng": dropout_rng.bit_generator.state,
             "run": {name: getattr(args, name) for name in RUN_ARGUMENTS},
             "log": log, "elapsed_s": elapsed}
    arrays["state"] = np.array(json.dumps(state))
    write_atomically(Path(path), lambda file: np.savez(file, **arrays))


def load_resume_state(path, model, optimizer, batch_rng, dropout_rng):
    """Restore what :func:`save_resume_state` wrote; returns (steps_done, log, losses, elapsed)."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    state = json.loads(str(arrays.pop("state")))
    mine = {name: getattr(args, name) for name in RUN_ARGUMENTS}
    differing = {name: (state["run"][name], mine[name]) for name in RUN_ARGUMENTS
                 if state["run"][name] != mine[name]}
    if differing:
        raise SystemExit(f"{path} was written by a run with other arguments (saved, given): "
                         f"{differing}")
    for name, param in model.parameters().items():
        param[...] = arrays[f"param/{name}"]
        optimizer.m[name][...] = arrays[f"adam_m/{name}"]
        optimizer.v[name][...] = arrays[f"adam_v/{name}"]
    optimizer.t = state["adam_t"]
    batch_rng.bit_generator.state = state["batch_rng"]
    dropout_rng.bit_generator.state = state["dropout_rng"]
    return (state["steps_done"], state["log"], arrays["step_losses"].tolist(),
            state["elapsed_s"])


def duration(seconds):
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def main():
    out = Path(args.out) if args.out else DATA_DIR
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = Path(args.checkpoint) if args.checkpoint else out / "shakespeare_gpt_resume.npz"
    start_wall, start_cpu = time.perf_counter(), time.process_time()

    text = load_shakespeare_text()
    codec = CharCodec.from_text(text)
    train_ids, val_ids = train_val_split(codec.encode(text))
    print(f"{len(text):,} characters, vocabulary of {codec.vocab_size}; train {train_ids.size:,}, "
          f"val {val_ids.size:,}", flush=True)

    seeds = np.random.SeedSequence(args.seed).spawn(4)  # init, batches, dropout, evaluation
    model = GPT.init(codec.vocab_size, args.context_len, args.d_model, args.num_heads,
                     args.num_layers, np.random.default_rng(seeds[0]), dropout=args.dropout,
                     activation=args.activation)
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

    log = {"config": logged_config() | {"model": model.config(), "vocabulary": codec.chars,
                                        "parameters": int(sum(p.size for p in params.values()))},
           "evaluations": [], "step_losses": []}
    log_path, lines_path = out / "shakespeare_gpt_log.json", out / "shakespeare_gpt_log.jsonl"
    steps_done, step_losses, elapsed_before = 0, [], 0.0
    if args.resume:
        steps_done, saved_log, step_losses, elapsed_before = load_resume_state(
            args.resume, model, optimizer, batch_rng, dropout_rng)
        log["evaluations"] = saved_log["evaluations"]
        # Records written after the checkpoint are about to be written again.
        kept = [line for line in lines_path.read_text().splitlines()
                if json.loads(line)["step"] <= steps_done] if lines_path.exists() else []
        lines_path.write_text("".join(line + "\n" for line in kept))
        print(f"resumed from {args.resume} after step {steps_done} "
              f"({duration(elapsed_before)} of training so far)", flush=True)
    else:
        lines_path.write_text("")

    def elapsed():
        return elapsed_before + time.perf_counter() - start_wall

    def write_line(record):
        with open(lines_path, "a") as file:
            file.write(json.dumps(record) + "\n")

    def evaluate(step):
        record = {"step": step, "lr": schedule(min(step, args.steps - 1))}
        for split, (inputs, targets) in eval_sets.items():
            record[split] = mean_loss(model, inputs, targets)
        # The same probe sequences every time, from their own seed.
        record["induction"] = induction_probe(model, np.random.default_rng(args.seed))
        record["elapsed_s"] = elapsed()
        log["evaluations"].append(record)
        log_path.write_text(json.dumps(log))
        write_line({"kind": "eval"} | record)
        if args.snapshot_dir:
            Path(args.snapshot_dir).mkdir(parents=True, exist_ok=True)
            save_gpt(model, codec, Path(args.snapshot_dir) / f"step{step:05d}.npz")
        print(f"step {step}: train {record['train']:.4f}  val {record['val']:.4f}", flush=True)

    stop_requested = []
    for signal_number in (signal.SIGINT, signal.SIGTERM):  # finish the step, then stop
        signal.signal(signal_number, lambda number, frame: stop_requested.append(number))

    def checkpoint_now(step):
        save_resume_state(checkpoint, model, optimizer, step, batch_rng, dropout_rng, log,
                          step_losses, elapsed())
        print(f"checkpoint after step {step}: {checkpoint}", flush=True)

    num_steps = args.steps if args.stop_after is None else args.stop_after
    if steps_done == 0:
        evaluate(0)
    # The loop of attention_lib.training.train, step for step (the same arithmetic in the
    # same order, so the committed checkpoint is reproduced), with checkpoints added.
    last_checkpoint = time.perf_counter()
    mark_step, mark_time = steps_done, time.perf_counter()
    chars_per_step = args.batch_size * args.context_len
    for step in range(steps_done, num_steps):
        optimizer.lr = schedule(step)
        loss, grads = gpt_loss_and_grads(model, *random_windows(
            train_ids, args.batch_size, args.context_len, batch_rng), rng=dropout_rng,
            fused=args.fused)
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss is {loss} at step {step}")
        if args.clip_norm is not None:
            clip_grad_norm(grads, args.clip_norm)
        optimizer.step(grads)
        step_losses.append(loss)
        done = step + 1
        if done % args.print_every == 0 or done == num_steps:
            now = time.perf_counter()
            rate = (done - mark_step) * chars_per_step / (now - mark_time)
            since = (done - 1) // args.print_every * args.print_every  # the last line's step
            record = {"kind": "progress", "step": done,
                      "loss": float(np.mean(step_losses[since:done])),
                "lr": optimizer.lr, "chars_per_s": rate, "elapsed_s": elapsed(),
                "eta_s": (num_steps - done) * chars_per_step / rate}
            write_line(record)
            print(f"step {done:5d}/{num_steps}  loss {record['loss']:.4f}  "
                  f"lr {record['lr']:.2e}  {rate:,.0f} chars/s  elapsed "
                  f"{duration(record['elapsed_s'])}  left {duration(record['eta_s'])}",
                  flush=True)
            mark_step, mark_time = done, time.perf_counter()
        if done % args.eval_every == 0 or done == num_steps:
            evaluate(done)
            mark_time = time.perf_counter()  # the evaluation is not training speed
        if stop_requested or done == args.exit_after:
            checkpoint_now(done)
            print(f"stopped after step {done}; continue with --resume {checkpoint}", flush=True)
            return 0
        if time.perf_counter() - last_checkpoint >= 60 * args.checkpoint_minutes:
            checkpoint_now(done)
            last_checkpoint = time.perf_counter()
    log["step_losses"] = list(step_losses)
    train_wall, train_cpu = elapsed(), time.process_time() - start_cpu
    val_loss = evaluate_loss(model, val_ids)
    log["final"] = {"val_loss_full_split": val_loss, "train_wall_s": train_wall,
                    "train_cpu_s": train_cpu, "steps": num_steps, "wall_s": elapsed()}
    if args.resume:
        log["final"]["resumed"] = True  # train_cpu_s counts this process only
    sha = save_gpt(model, codec, out / "shakespeare_gpt.npz")
    log["final"]["sha256"] = sha
    log_path.write_text(json.dumps(log))
    if checkpoint.exists() and not args.keep_checkpoint:
        checkpoint.unlink()
    print(f"validation loss on the whole split: {val_loss:.4f} nats/char "
          f"({val_loss / np.log(2):.4f} bits/char)", flush=True)
    print(f"trained {num_steps} steps in {train_wall:.0f} s wall, {train_cpu:.0f} s CPU "
          f"({args.threads} threads); checkpoint sha256 {sha}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
