"""Perplexity of SmolLM2-135M on a long text with three KV caches: full, window, sinks + window.

    .venv/bin/python scripts/measure_attention_sinks.py [--tokens 4096] [--threads 1]

Chapter 17 plots its results. The text is the validation part of Tiny Shakespeare (its last
10% of characters, cut as chapter 14's ``train_val_split`` cuts it), of which the first
``--tokens`` SmolLM2 tokens (``ByteLevelBPE.from_gguf``, no BOS token) are read. For each
cache, ``attention_lib.cache.next_token_nll`` gives the negative log-likelihood of every next
token:

- ``full``: a cache that keeps every token (chunks of 512 tokens);
- ``window``: a rolling window of the last ``--cache`` tokens, the oldest dropped
  (``num_sinks=0``);
- ``sinks``: the first ``--sinks`` tokens kept plus a window of the last
  ``--cache - --sinks`` (StreamingLLM, Xiao et al. 2024): the same cache size.

Both bounded caches count positions inside the cache. The per-token values (float32) and the
perplexities go to ``attention_lib/data/smollm2_attention_sinks.json`` (or ``--out``). The two
bounded runs read the text one token per step: about 15 minutes on one thread.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--tokens", type=int, default=4096)
parser.add_argument("--cache", type=int, default=256, help="positions a bounded cache keeps")
parser.add_argument("--sinks", type=int, default=4)
parser.add_argument("--out", default=None,
                    help="output file (default: the package's data/smollm2_attention_sinks.json)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attention_lib.cache import next_token_nll  # noqa: E402
from attention_lib.models.bpe import ByteLevelBPE  # noqa: E402
from attention_lib.models.gguf import read_gguf  # noqa: E402
from attention_lib.models.smollm2 import SMOLLM2_GGUF_SHA256, SmolLM2, smollm2_path  # noqa: E402
from attention_lib.training.gpt import load_shakespeare_text  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "attention_lib" / "data"
OUT = Path(args.out) if args.out else DATA / "smollm2_attention_sinks.json"

gguf = read_gguf(smollm2_path())
model, tokenizer = SmolLM2.from_gguf(gguf), ByteLevelBPE.from_gguf(gguf)
text = load_shakespeare_text()
start = int(0.9 * len(text))  # the validation split
ids = tokenizer.encode(text[start:start + 8 * args.tokens])[:args.tokens]
assert ids.size == args.tokens, ids.size
end = start + len(tokenizer.decode(ids))

caches = {"full": {},
          "window": {"num_sinks": 0, "window": args.cache},
          "sinks": {"num_sinks": args.sinks, "window": args.cache - args.sinks}}
results = {}
for name, kwargs in caches.items():
    began = time.perf_counter()
    nll = next_token_nll(model, ids, **kwargs)
    seconds = time.perf_counter() - began
    results[name] = {**kwargs, "perplexity": float(np.exp(nll.mean())),
                     # nll[t] predicts token t + 1 from tokens 0..t. Step t attends to the
                     # cache and itself, and the cache is cut back after the step, so step
                     # args.cache still sees every token; step args.cache + 1 is the first that
                     # lost one.
                     "perplexity_after_first_drop": float(np.exp(nll[args.cache + 1:].mean())),
                     "seconds": round(seconds, 1),
                     "nll": [round(float(value), 5) for value in nll.astype(np.float32)]}
    print(f"{name:7s} {kwargs}: perplexity {results[name]['perplexity']:.3f}, after the "
          f"first drop {results[name]['perplexity_after_first_drop']:.3f} ({seconds:.0f} s)",
          flush=True)

OUT.write_text(json.dumps({
    "description": "Per-token negative log-likelihood (natural log) of the next token of a "
                   "long text under SmolLM2-135M-Instruct with three KV caches; written by "
                   "scripts/measure_attention_sinks.py. 'perplexity_after_first_drop' "
                   "averages over the predictions made after a bounded cache first dropped a "
                   "token (nll[cache_size + 1:]).",
    "settings": {"model_sha256": SMOLLM2_GGUF_SHA256,
                 "text": "attention_lib/data/tinyshakespeare.txt", "text_span": [start, end],
                 "num_tokens": int(ids.size), "cache_size": args.cache,
                 "threads": args.threads, "python": platform.python_version(),
                 "numpy": np.__version__},
    "caches": results,
}, indent=1) + "\n")
print(f"wrote {OUT}")
