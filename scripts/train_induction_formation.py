"""Watch an induction head form: a two-layer attention-only transformer trained in NumPy.

    .venv/bin/python scripts/train_induction_formation.py [--seeds 0 1 2] [--jobs 3]

Meant for chapter 18 (the formation of induction heads, Olsson et al. 2022). For each seed, an
``AttentionOnlyLM`` (``CONFIG``: 2 layers of 4 heads, width 64, vocabulary 64, context 32,
float32) is trained with Adam (linear warm-up) on batches of ``repeated_segment_batch``
(``attention_lib/training/attn_only.py``): random tokens in which a segment of distinct tokens
appears twice, each copy at a random place, the other tokens following, with probability
``follow_prob``, a rule a previous-token head can use (``follow``). Every ``eval_every`` steps
the model is probed on a fixed, held-out set of such rows without the rule (``probe_seed``):
the loss on the queries inside the second copy (``copy_positions``) and on all the others, and
each head's previous-token and induction scores (``segment_scores``: the copy is at a
different distance in every row, so only token matching scores); and, for comparison with
chapter 18's SmolLM2 scores, each head's induction score on sequences of ``context_len // 2``
random tokens followed by their copy (``head_scores``).

Per run it records: the loss of the first ``exact_steps`` training steps, the mean loss of each
later window of ``loss_window`` steps, the probes, and three steps: the *phase change* (the
first probed step at which the second-copy loss is below the midpoint of its first and last
probed values), and the first probed steps at which a layer-0 head's previous-token score and a
layer-1 head's induction score pass ``score_threshold``.

Writes ``attention_lib/data/induction_formation.json`` (or ``--out``) and the first seed's
final weights to ``induction_formation_model.npz`` next to it (every parameter under its name in
``model.parameters()``). Runs are deterministic given the seed, the NumPy version and the BLAS
(float32: another CPU's BLAS may change the last digits, and late in training more).
``--jobs`` runs seeds in parallel processes, each on ``--threads`` threads. One seed of 2000
steps (16 M tokens) took 287 s of CPU time on one thread (the committed record; 11 min of wall
time for three seeds in parallel at low priority on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import os
import sys

CONFIG = {
    "vocab_size": 64, "context_len": 32, "d_model": 64, "num_heads": 4, "num_layers": 2,
    "init_std": 0.02, "dtype": "float32",
    "batch_size": 256, "min_segment": 4, "max_segment": 12,
    "follow_prob": 0.25, "follow_seed": 99,
    "lr": 1e-2, "warmup_steps": 200, "num_steps": 2000,
    "eval_every": 50, "probe_rows": 128, "probe_seed": 12345,
    "exact_steps": 20, "loss_window": 10, "score_threshold": 0.5,
}
"""The run's settings: model sizes, data, optimizer, probing and recording."""


def probe_data(config: dict) -> dict:
    """The held-out probe rows (no follow rule) and the repeated random sequences."""
    import numpy as np

    from attention_lib.training.attn_only import copy_positions, repeated_segment_batch
    from attention_lib.training.gpt import repeated_random_sequences

    T = config["context_len"]
    ids, sources, copies, lengths = repeated_segment_batch(
        np.random.default_rng(config["probe_seed"]), config["probe_rows"], T,
        config["vocab_size"], config["min_segment"], config["max_segment"],
        return_positions=True)
    rows, queries, keys = copy_positions(sources, copies, lengths, T)
    repeated = repeated_random_sequences(np.random.default_rng([config["probe_seed"], 1]),
                                         config["probe_rows"] // 2, T // 2,
                                         config["vocab_size"])
    return {"ids": ids, "rows": rows, "queries": queries, "keys": keys, "repeated": repeated}


def token_losses(model, ids):
    """The loss (float64) of each next-token prediction of ``ids[:, :-1]``: (B, T - 1)."""
    import numpy as np

    logits = model.forward(ids[:, :-1]).astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, ids[:, 1:, None], axis=-1)[..., 0]


def probe(model, data: dict) -> dict:
    """The probe at the current weights: losses inside and outside the second copy, and each
    head's scores."""
    import numpy as np

    from attention_lib.training.attn_only import head_scores, segment_scores

    ids = data["ids"]
    losses = token_losses(model, ids)  # (B, T)
    in_copy = np.zeros(losses.shape, dtype=bool)
    in_copy[data["rows"], data["queries"]] = True
    _, weights = model.forward(ids[:, :-1], return_weights=True)
    previous, induction = segment_scores(weights, data["rows"], data["queries"], data["keys"])
    half = data["repeated"].shape[1] // 2
    _, repeated_weights = model.forward(data["repeated"], return_weights=True)
    _, repeat_induction = head_scores(repeated_weights, half)
    return {"loss_copy": round(float(losses[in_copy].mean()), 4),
            "loss_other": round(float(losses[~in_copy].mean()), 4),
            "previous_token_scores": previous.astype(float).round(4).tolist(),  # (L, H)
            "induction_scores": induction.astype(float).round(4).tolist(),
            "repeat_induction_scores": repeat_induction.astype(float).round(4).tolist()}


def phase_change_step(steps, loss_copy) -> int:
    """The first probed step whose second-copy loss is below the midpoint of its first and
    last values."""
    midpoint = (loss_copy[0] + loss_copy[-1]) / 2
    return int(next(step for step, loss in zip(steps, loss_copy) if loss < midpoint))


def first_step_above(steps, values, threshold):
    """The first probed step at which ``values`` exceeds ``threshold`` (None if never)."""
    return next((int(step) for step, value in zip(steps, values) if value > threshold), None)


def run(seed: int, config: dict = CONFIG, num_steps: int | None = None,
        log: bool = False) -> dict:
    """Train one model from ``seed``; return its losses, probes and the model (``log``:
    print each probe's summary to stderr)."""
    import numpy as np

    from attention_lib.training import Adam, train
    from attention_lib.training.attn_only import (
        AttentionOnlyLM,
        attn_only_loss_and_grads,
        repeated_segment_batch,
    )

    num_steps = config["num_steps"] if num_steps is None else num_steps
    model = AttentionOnlyLM.init(config["vocab_size"], config["context_len"],
                                 config["d_model"], config["num_heads"], config["num_layers"],
                                 np.random.default_rng(seed), std=config["init_std"],
                                 dtype=np.dtype(config["dtype"]))
    optimizer = Adam(model.parameters(), lr=config["lr"])
    data_rng = np.random.default_rng([seed, 1])  # the batches: their own stream
    # The rule of the background tokens, the same for every seed: part of the task.
    follow = np.random.default_rng(config["follow_seed"]).permutation(config["vocab_size"])
    data = probe_data(config)

    def batch(_step):
        ids = repeated_segment_batch(data_rng, config["batch_size"], config["context_len"],
                                     config["vocab_size"], config["min_segment"],
                                     config["max_segment"], follow=follow,
                                     follow_prob=config["follow_prob"])
        return ids[:, :-1], ids[:, 1:]

    def step_fn(inputs_targets):
        return attn_only_loss_and_grads(model, *inputs_targets)

    probes, losses = [], []
    done = 0
    every = config["eval_every"]
    while True:  # train `every` steps at a time, probing in between
        probes.append({"step": done, **probe(model, data)})
        if log:
            last = probes[-1]
            print(f"seed {seed} step {done}: loss in / outside the copy {last['loss_copy']:.3f}"
                  f" / {last['loss_other']:.3f}; best previous-token score (layer 0) "
                  f"{max(last['previous_token_scores'][0]):.2f}, induction (layer 1) "
                  f"{max(last['induction_scores'][1]):.2f}", file=sys.stderr, flush=True)
        if done >= num_steps:
            break
        chunk = min(every, num_steps - done)
        start = done
        losses.extend(train(step_fn, optimizer, batch, chunk,
                            lr_schedule=lambda step, start=start: config["lr"] * min(
                                1.0, (start + step + 1) / config["warmup_steps"])).tolist())
        done += chunk
    losses = np.array(losses)
    exact, window = config["exact_steps"], config["loss_window"]
    later = losses[exact:]
    later = later[:len(later) // window * window].reshape(-1, window).mean(axis=1)
    steps = [p["step"] for p in probes]
    best_previous = [max(p["previous_token_scores"][0]) for p in probes]
    best_induction = [max(p["induction_scores"][1]) for p in probes]
    threshold = config["score_threshold"]
    return {"first_step_losses": losses[:exact].round(6).tolist(),
            "window_losses": later.round(4).tolist(), "probes": probes,
            "phase_change_step": phase_change_step(steps, [p["loss_copy"] for p in probes]),
            "previous_token_step": first_step_above(steps, best_previous, threshold),
            "induction_step": first_step_above(steps, best_induction, threshold),
            "model": model}


def _run_timed(args):
    import time

    seed, config = args
    start = time.process_time()
    result = run(seed, config, log=True)
    result["cpu_seconds"] = round(time.process_time() - start)
    return seed, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads per job")
    parser.add_argument("--steps", type=int, default=None, help="override num_steps (pilots)")
    parser.add_argument("--out", default=None, help="output file (default: the package's "
                        "data/induction_formation.json)")
    args = parser.parse_args()
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)

    import json
    import multiprocessing
    import platform
    from pathlib import Path

    import numpy as np

    config = dict(CONFIG)
    if args.steps is not None:
        config["num_steps"] = args.steps
    out = (Path(args.out) if args.out else Path(__file__).resolve().parent.parent
           / "attention_lib" / "data" / "induction_formation.json")
    weights_out = out.with_name(out.stem + "_model.npz")
    jobs = [(seed, config) for seed in args.seeds]
    if args.jobs > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            results = dict(pool.imap(_run_timed, jobs))
    else:
        results = dict(map(_run_timed, jobs))
    runs = {}
    for seed in args.seeds:
        result = results[seed]
        model = result.pop("model")
        if seed == args.seeds[0]:  # the run the chapter looks at: keep its final weights
            with open(weights_out, "wb") as file:
                np.savez(file, **model.parameters())
        runs[str(seed)] = result
        last = result["probes"][-1]
        print(f"seed {seed}: phase change at step {result['phase_change_step']}, previous-"
              f"token head at {result['previous_token_step']}, induction head at "
              f"{result['induction_step']}; final loss in / outside the copy "
              f"{last['loss_copy']:.3f} / {last['loss_other']:.3f}; best induction score "
              f"{max(last['induction_scores'][1]):.2f}; {result['cpu_seconds']} s CPU",
              flush=True)
    record = {"config": config, "seeds": args.seeds, "threads": args.threads,
              "numpy": np.__version__, "python": platform.python_version(),
              "machine": platform.machine(), "runs": runs}
    out.write_text(json.dumps(record, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {out} and {weights_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
