"""Chapter 14's measurements of the trained GPT over whole splits and many inputs.

    .venv/bin/python scripts/measure_gpt_chapter14.py [--threads 1] [--stride 16]
        [--probe-sequences 256] [--checkpoint FILE] [--out FILE]

Too heavy for the page's time budget (several minutes of forward passes), so done here and
written to attention_lib/data/gpt_chapter14_measurements.json, which chapter 14 loads (it
checks that the file was made from the checkpoint it loads, by sha256, and recomputes a few
of the numbers). Re-run it whenever the checkpoint changes. Everything is measured with the
float32 model and no dropout, as the training script evaluates; every mean comes with its
standard error over the independent units it averages (windows, blocks, sequences).

- "context": the loss on the whole validation split cut into consecutive 128-character
  windows (the context starts again at every window), by position in the window; and the
  sliding-window loss (each character predicted from at least T - stride + 1 of the
  characters before it), with the reset-window loss of the same characters; a stretch at
  stride 1 (exactly T characters of context) checks the stride.
- "splits": the reset-window loss on the whole training split and on parts of both splits:
  The Taming of the Shrew in the training text (its Induction and first act), the Shrew in
  the validation text, The Tempest (validation only).
- "probes": repeated text (random characters, validation snippets, random words), the loss on
  the second copy against a control with the same second half after other text, with each
  head's previous-token and induction scores, and with heads ablated
  (attention_lib.hooks at attn.head_out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "attention_lib" / "data" / "gpt_chapter14_measurements.json"
SEED = 14
BIN_EDGES = [0, 1, 2, 4, 8, 16, 32, 64, 128]  # positions, bins doubling in width


def mean_se(values, axis=0):
    """Mean and standard error (ddof=1) of independent units along ``axis``."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    n = values.shape[axis]
    return values.mean(axis=axis), values.std(axis=axis, ddof=1) / np.sqrt(n)


def rounded(value, digits=6):
    """JSON-friendly floats, rounded far below anything the chapter prints."""
    import numpy as np

    return np.round(np.asarray(value, dtype=np.float64), digits).tolist()


def bins_of(edges, T):
    return [(lo, hi) for lo, hi in zip(edges, edges[1:]) if hi <= T]


def measure_context(model, val_ids, stride, check_targets):
    import numpy as np

    from attention_lib.training.gpt import sliding_window_losses, window_losses

    T = model.context_len
    reset = window_losses(model, val_ids)  # (num_windows, T)
    bins = bins_of([edge for edge in BIN_EDGES if edge < T] + [T], T)
    per_window_bins = np.stack([reset[:, lo:hi].mean(axis=1) for lo, hi in bins], axis=1)
    bin_mean, bin_se = mean_se(per_window_bins)
    pos_mean, pos_se = mean_se(reset)
    window_mean = reset.mean(axis=1)
    overall, overall_se = mean_se(window_mean)
    # Sliding windows: the losses of targets val_ids[T:T + n]; reset[i, t] is the loss of
    # target i T + t + 1, so the same targets are reset.reshape(-1)[T - 1:T - 1 + n].
    sliding = sliding_window_losses(model, val_ids, stride)
    flat = reset.reshape(-1)
    n = min(sliding.size, flat.size - (T - 1)) // T * T  # whole blocks of T targets
    sliding_blocks = sliding[:n].reshape(-1, T).mean(axis=1)
    reset_blocks = flat[T - 1:T - 1 + n].reshape(-1, T).mean(axis=1)
    s_mean, s_se = mean_se(sliding_blocks)
    r_mean, r_se = mean_se(reset_blocks)
    d_mean, d_se = mean_se(reset_blocks - sliding_blocks)
    # Stride 1 on a stretch: every character from exactly T before it.
    stretch = val_ids[:T + check_targets + stride]
    exact = sliding_window_losses(model, stretch, 1)[:check_targets]
    strided = sliding_window_losses(model, stretch, stride)[:check_targets]
    c_mean, c_se = mean_se((strided - exact).reshape(-1, T).mean(axis=1))
    return {"context_len": T, "num_windows": int(reset.shape[0]),
            "bins": [[lo, hi] for lo, hi in bins], "bin_mean": rounded(bin_mean),
            "bin_se": rounded(bin_se), "position_mean": rounded(pos_mean),
            "position_se": rounded(pos_se), "window_mean": rounded(window_mean),
            "mean": float(overall), "se": float(overall_se),
            "sliding": {"stride": stride, "min_context": T - stride + 1,
                        "num_targets": int(n), "block": T,
                        "first_block_mean": float(sliding_blocks[0]),
                        "mean": float(s_mean), "se": float(s_se),
                        "reset_mean": float(r_mean), "reset_se": float(r_se),
                        "reset_minus_sliding": float(d_mean),
                        "reset_minus_sliding_se": float(d_se),
                        "stride_check": {"num_targets": int(check_targets),
                                         "strided_minus_exact": float(c_mean),
                                         "se": float(c_se)}}}


def measure_splits(model, text, train_ids, val_ids, train_every=1):
    import numpy as np

    from attention_lib.training.gpt import token_losses, window_losses

    cut = train_ids.size
    shrew = text.find("SLY:\nI'll pheeze you")  # the first line of the Shrew's Induction
    tempest = text.find("Master:\nBoatswain!")  # the first line of The Tempest
    assert 0 < shrew < cut < tempest, (shrew, cut, tempest)
    ids = np.concatenate([train_ids, val_ids])
    parts = {"train split": (0, cut), "validation split": (cut, ids.size),
             "Shrew, training part": (shrew, cut), "Shrew, validation part": (cut, tempest),
             "Tempest, validation part": (tempest, ids.size)}
    result = {"boundaries": {"shrew_start": shrew, "cut": cut, "tempest_start": tempest},
              "parts": {}}
    T = model.context_len
    for name, (start, stop) in parts.items():
        if name == "train split" and train_every > 1:  # every train_every-th window only
            stop = start + ((stop - start - 1) // T) * T + 1
            windows = ids[start:stop - 1].reshape(-1, T)[::train_every]
            targets = ids[start + 1:stop].reshape(-1, T)[::train_every]
            losses = token_losses(model, windows, targets).mean(axis=1)
        else:
            losses = window_losses(model, ids[start:stop]).mean(axis=1)  # per window
        mean, se = mean_se(losses)
        result["parts"][name] = {"start": int(start), "stop": int(stop),
                                 "every": train_every if name == "train split" else 1,
                                 "num_windows": int(losses.size), "mean": float(mean),
                                 "se": float(se)}
    return result


def random_word_text(words, num_sequences, length, rng):
    """Rows of ``length`` characters: words drawn at random from ``words`` (their frequency
    in the text), joined by spaces, cut to length."""
    rows = []
    for _ in range(num_sequences):
        row = ""
        while len(row) < length:
            row += words[rng.integers(len(words))] + " "
        rows.append(row[:length])
    return rows


def head_scores(model, ids, half, batch_size=32):
    """Each head's mean weight on the previous token (all queries t >= 1) and, on the second
    copy (queries t >= half), on the token after the previous occurrence (t - half + 1);
    and every head's mean weight on the previous token at each query position."""
    import numpy as np

    T = ids.shape[1]
    steps = np.arange(1, T)
    queries = np.arange(half, 2 * half)
    previous, induction, by_position = 0.0, 0.0, 0.0
    for start in range(0, len(ids), batch_size):
        _, weights = model.forward(ids[start:start + batch_size], return_weights=True)
        weights = np.stack(weights).astype(np.float64)  # (L, b, H, T, T)
        back = weights[..., steps, steps - 1]  # (L, b, H, T - 1)
        previous = previous + back.mean(axis=-1).sum(axis=1)
        by_position = by_position + back.sum(axis=1)
        induction = induction + weights[..., queries, queries - half + 1].mean(-1).sum(1)
    n = len(ids)
    return previous / n, induction / n, by_position / n  # (L, H), (L, H), (L, H, T - 1)


def probe(model, repeated, control, ablations):
    """Second-copy losses (predictions of tokens half + 1 ... 2 half - 1) per sequence, on the
    repeated rows and on the controls, with nothing ablated and with each ablation."""
    from attention_lib.hooks import intervene
    from attention_lib.training.gpt import token_losses

    half = repeated.shape[1] // 2
    result = {}
    for condition, changes in [("none", {})] + list(ablations.items()):
        row = {}
        for kind, ids in (("repeated", repeated), ("control", control)):
            with intervene(model, changes):
                losses = token_losses(model, ids[:, :-1], ids[:, 1:])  # (n, 2 half - 1)
            second = losses[:, half:].mean(axis=1)
            first = losses[:, :half - 1].mean(axis=1)
            row[kind] = {"second": rounded(mean_se(second)), "first": rounded(mean_se(first)),
                         "second_per_sequence": second}
        benefit = row["control"].pop("second_per_sequence") - row["repeated"].pop(
            "second_per_sequence")
        row["copy_benefit"] = rounded(mean_se(benefit))  # control minus repeated, paired
        result[condition] = row
    return result


def measure_probes(model, codec, text, train_ids, val_ids, num_sequences):
    import numpy as np

    from attention_lib.hooks import capture, mean_ablate, zero_ablate
    from attention_lib.training.gpt import (
        repeated_random_sequences,
        repeated_snippets,
        token_losses,
    )

    T = model.context_len
    half = T // 2
    rng = np.random.default_rng(SEED)
    # Random characters, as induction_probe (half = min(T // 2, V) distinct characters).
    char_half = min(half, model.vocab_size)
    chars = repeated_random_sequences(rng, num_sequences, char_half, model.vocab_size)
    other = repeated_random_sequences(rng, num_sequences, char_half, model.vocab_size)
    char_control = np.concatenate([other[:, :char_half], chars[:, char_half:]], axis=1)
    # Validation snippets, doubled; the control is each snippet after its own text.
    snippets, snippet_control = repeated_snippets(val_ids, num_sequences, half, rng)
    # Random words of the training text (with their frequencies), doubled; the control is
    # another row of random words, then the same second half.
    words = re.findall(r"[A-Za-z']+", text[:train_ids.size])
    rows = random_word_text(words, 2 * num_sequences, half, rng)
    first_rows = np.stack([codec.encode(row) for row in rows[:num_sequences]])
    other_rows = np.stack([codec.encode(row) for row in rows[num_sequences:]])
    word_repeated = np.concatenate([first_rows, first_rows], axis=1)
    word_control = np.concatenate([other_rows, first_rows], axis=1)

    # Which heads: previous-token scores on natural text (the snippets' controls), induction
    # scores on the doubled snippets.
    previous, _, back_by_position = head_scores(model, snippet_control, half)
    _, induction, _ = head_scores(model, snippets, half)
    prev_block, prev_head = (int(i) for i in np.unravel_index(previous.argmax(), previous.shape))
    ind_block, ind_head = (int(i) for i in np.unravel_index(induction.argmax(), induction.shape))
    previous_by_position = back_by_position[prev_block, prev_head]  # (T - 1,)
    # The previous-token head's mean output at each position, over natural text: the value
    # mean ablation puts in its place (cut to the length of the rows it replaces).
    point = f"blocks.{prev_block}.attn.head_out"
    with capture(model, point) as recording:
        model.forward(snippet_control)
    means = recording[point].mean(axis=0)  # (H, T, d_head)

    def mean_of_head(value):
        return mean_ablate(prev_head, means[:, :value.shape[-2]])(value)

    ablations = {
        "previous-token head, zeroed": {point: zero_ablate(prev_head)},
        "previous-token head, mean": {point: mean_of_head},
        "top induction head, zeroed": {f"blocks.{ind_block}.attn.head_out":
                                       zero_ablate(ind_head)},
    }
    # The first copy of random characters: the loss by target character, and how often
    # the training text has each character.
    first_losses = np.zeros(model.vocab_size)
    first_counts = np.zeros(model.vocab_size)
    losses = token_losses(model, chars[:, :-1], chars[:, 1:])[:, :char_half - 1]
    targets = chars[:, 1:char_half]
    np.add.at(first_losses, targets, losses)
    np.add.at(first_counts, targets, 1)
    return {
        "num_sequences": num_sequences, "half_len": half, "char_half_len": char_half,
        "previous_token_scores": rounded(previous), "induction_scores": rounded(induction),
        "previous_token_head": [prev_block, prev_head],
        "top_induction_head": [ind_block, ind_head],
        "previous_by_position": rounded(previous_by_position),
        "random_characters": probe(model, chars, char_control, ablations),
        "validation_snippets": probe(model, snippets, snippet_control, ablations),
        "random_words": probe(model, word_repeated, word_control, ablations),
        "random_words_example": rows[0],
        "first_copy_loss_by_character": rounded(first_losses / np.maximum(first_counts, 1)),
        "first_copy_count_by_character": first_counts.astype(int).tolist(),
        "training_count_by_character": np.bincount(train_ids, minlength=model.vocab_size)
        .astype(int).tolist(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stride", type=int, default=16,
                        help="sliding-window stride (each character sees >= T - stride + 1)")
    parser.add_argument("--stride-check", type=int, default=2048,
                        help="targets measured at stride 1 too (a multiple of T)")
    parser.add_argument("--probe-sequences", type=int, default=256)
    parser.add_argument("--train-every", type=int, default=1,
                        help="measure every k-th window of the training split (default: all)")
    parser.add_argument("--checkpoint", default=None,
                        help="default: the committed checkpoint (sha256 checked)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)
    import hashlib

    from attention_lib.training.gpt import (
        DATA_DIR,
        load_shakespeare_gpt,
        load_shakespeare_text,
        train_val_split,
    )

    path = Path(args.checkpoint) if args.checkpoint else DATA_DIR / "shakespeare_gpt.npz"
    model, codec = load_shakespeare_gpt(args.checkpoint)
    text = load_shakespeare_text()
    train_ids, val_ids = train_val_split(codec.encode(text))
    start = time.process_time()
    result = {"arguments": vars(args),
              "checkpoint_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
              "model": model.config(), "dtype": str(model.embedding.dtype),
              "threads": args.threads}
    result["context"] = measure_context(model, val_ids, args.stride, args.stride_check)
    print(f"context done ({time.process_time() - start:.0f} s CPU)", flush=True)
    result["splits"] = measure_splits(model, text, train_ids, val_ids, args.train_every)
    print(f"splits done ({time.process_time() - start:.0f} s CPU)", flush=True)
    result["probes"] = measure_probes(model, codec, text, train_ids, val_ids,
                                      args.probe_sequences)
    result["cpu_s"] = round(time.process_time() - start)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['cpu_s']} s CPU)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
