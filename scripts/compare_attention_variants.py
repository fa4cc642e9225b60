"""Train a small version of chapter 14's character model with each attention variant of
chapter 19 (d_model 64, context 64, no dropout): same task, steps, data order and seeds.

    .venv/bin/python scripts/compare_attention_variants.py [--out FILE] [--variants mha gqa ...]
        [--seeds 0 1 2] [--stop-after N]

For every variant (attention_lib.training.variant_lm.VARIANTS) and seed, trains a small
character-level model on Tiny Shakespeare (chapter 14's text, codec and split: validation =
the last 10%) with train_variant(), then measures on the trained model:
- val_loss: the mean next-character loss over a fixed sample of the validation split:
  VAL_WINDOWS windows of context_len characters at evenly spaced starts, the same for every
  run (512 x 64 = 32768 characters, 29% of the split; nats per character);
- first_token_weight: the mean attention weight on the window's first token (a sink) per
  layer, with the uniform-attention value for comparison, on the first FIRST_TOKEN_WINDOWS
  of those windows;
- copy_probe: the loss on a repeated random string, first and second copy;
- train_cpu_seconds, train_wall_seconds: the training steps' CPU time (one thread) and wall
  time;
and once per variant the cache a decoder keeps (cache_bytes at context_len tokens, all layers,
float32) and kv_bytes_per_token = that / context_len.

Writes --out (default attention_lib/data/variant_comparison.json) after EVERY finished run,
so a stopped run loses at most the run in progress; started again with the same settings it
skips the runs already in the file (a file written with other settings is an error). Each
run also keeps its step losses, so a test can re-run the first steps and compare.
--stop-after N trains only the first N steps of one variant and seed (the first ones given)
and prints their losses as JSON, writing nothing. To use both cores, run two processes with
different --out files and disjoint --seeds/--variants, then --merge FILE FILE ... joins them
into --out (the settings must agree; a run in two files is an error).

Runs on one BLAS thread (set before NumPy is imported); order: seed by seed, every variant
of a seed (in RUN_ORDER) before the next seed, so a partial file has whole seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = "1"

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attention_lib.training.gpt import (  # noqa: E402
    CharCodec,
    load_shakespeare_text,
    train_val_split,
)
from attention_lib.training.variant_lm import (  # noqa: E402
    VARIANTS,
    cache_bytes,
    copy_probe,
    first_token_weight,
    train_variant,
    validation_loss,
)

CONFIG = {
    "steps": 1000,
    "batch_size": 16,
    "context_len": 64,
    "d_model": 64,
    "num_heads": 4,
    "num_layers": 4,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "warmup_steps": 50,
    "weight_decay": 0.1,
    "beta2": 0.99,
    "clip_norm": 1.0,
}
"""The training settings shared by every run (recorded in the output file)."""

SEEDS = (0, 1, 2)
RUN_ORDER = ("mha", "gated", "linear", "delta", "hybrid", "mqa", "gqa", "mla", "sliding_window")
"""The order of the runs within a seed: the comparisons the chapter draws first (a partial
file answers them)."""
VAL_WINDOWS = 512
FIRST_TOKEN_WINDOWS = 128
PROBE_SEED = 1234
DEFAULT_OUT = ROOT / "attention_lib" / "data" / "variant_comparison.json"


def load_data():
    text = load_shakespeare_text()
    codec = CharCodec.from_text(text)
    return codec, *train_val_split(codec.encode(text))


def fixed_windows(data, count: int, context_len: int) -> np.ndarray:
    """``count`` windows at evenly spaced starts of ``data``: the same for every run."""
    starts = np.linspace(0, data.size - context_len - 1, count).astype(int)
    return data[starts[:, None] + np.arange(context_len)]


def measure(model, val_data, val_windows: int) -> dict:
    windows = fixed_windows(val_data, val_windows, model.context_len + 1)  # inputs + 1 target
    return {"val_loss": validation_loss(model, windows),
            "first_token_weight": first_token_weight(
                model, windows[:FIRST_TOKEN_WINDOWS, :-1]),
            "copy_probe": copy_probe(model, np.random.default_rng(PROBE_SEED))}


def write(path: Path, results: dict) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    temporary.replace(path)  # atomic: a reader never sees half a file


def merge(parts: list[dict]) -> dict:
    """One results file from several written with the same settings by separate processes."""
    merged = {key: value for key, value in parts[0].items() if key not in ("runs", "cache")}
    merged["runs"], merged["cache"] = {}, {}
    for part in parts:
        if {key: part[key] for key in merged if key not in ("runs", "cache")} != {
                key: merged[key] for key in merged if key not in ("runs", "cache")}:
            raise SystemExit("the files were written with other settings")
        for variant, runs in part["runs"].items():
            for seed, run in runs.items():
                if seed in merged["runs"].setdefault(variant, {}):
                    raise SystemExit(f"{variant} seed {seed} is in two files")
                merged["runs"][variant][seed] = run
        merged["cache"].update(part["cache"])
    return merged


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--variants", nargs="+", default=list(RUN_ORDER), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--stop-after", type=int, default=None)
    parser.add_argument("--steps", type=int, default=CONFIG["steps"],
                        help="other than the default only for a quick trial (recorded)")
    parser.add_argument("--val-windows", type=int, default=VAL_WINDOWS,
                        help="other than the default only for a quick trial (recorded)")
    parser.add_argument("--merge", nargs="+", default=None, metavar="FILE",
                        help="join the runs of these files (written with the same settings)")
    args = parser.parse_args(argv)
    if args.merge:
        write(Path(args.out), merge([json.loads(Path(name).read_text()) for name in args.merge]))
        return

    codec, train_data, val_data = load_data()
    settings = dict(CONFIG, steps=args.steps, vocab_size=codec.vocab_size)
    settings["warmup_steps"] = min(CONFIG["warmup_steps"], args.steps // 2)  # a short trial
    if args.stop_after is not None:
        _, losses, _ = train_variant(args.variants[0], args.seeds[0], train_data,
                                     stop_after=args.stop_after, **settings)
        print(json.dumps({"variant": args.variants[0], "seed": args.seeds[0],
                          "step_losses": losses}))
        return

    path = Path(args.out)
    header = {"config": settings,
              "validation": f"{args.val_windows} windows of {CONFIG['context_len']} "
                            f"characters at evenly spaced starts of the validation split (the "
                            f"last 10% of Tiny Shakespeare, {val_data.size} characters)",
              "first_token_windows": FIRST_TOKEN_WINDOWS, "probe_seed": PROBE_SEED,
              "variants": VARIANTS}
    results = json.loads(path.read_text()) if path.exists() else {}
    if results and {key: results.get(key) for key in header} != json.loads(json.dumps(header)):
        raise SystemExit(f"{path} was written with other settings; move it away to start over")
    results = {**header, "cache": results.get("cache", {}), "runs": results.get("runs", {})}
    for seed in args.seeds:
        for variant in args.variants:
            runs = results["runs"].setdefault(variant, {})
            if str(seed) in runs:
                continue
            wall = time.perf_counter()
            model, losses, cpu_seconds = train_variant(variant, seed, train_data, **settings)
            wall = time.perf_counter() - wall
            runs[str(seed)] = {"step_losses": losses, "train_cpu_seconds": cpu_seconds,
                               "train_wall_seconds": wall,
                               "num_parameters": int(sum(p.size for p in
                                                         model.parameters().values())),
                               **measure(model, val_data, args.val_windows)}
            results["cache"][variant] = {
                "cache_bytes": cache_bytes(model, model.context_len),
                "kv_bytes_per_token": cache_bytes(model, model.context_len) / model.context_len}
            write(path, results)
            print(f"{variant:>15} seed {seed}: val loss {runs[str(seed)]['val_loss']:.4f}, "
                  f"{cpu_seconds:.0f} s CPU, {wall:.0f} s wall", flush=True)


if __name__ == "__main__":
    main()
