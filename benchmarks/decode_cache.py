"""Greedy decoding with and without the KV cache (chapter 10).

    .venv/bin/python benchmarks/decode_cache.py [--tokens 256] [--threads 1]

A randomly initialised decoder-only stack, 4 layers, d_model=256, 8 heads, d_ff=1024,
float32, generates --tokens tokens greedily from a 1-token prompt, once recomputing the
whole sequence at every step and once with the cache. Prints the total times, their ratio
(target: the cache at least 10x faster at 256 tokens) and the time per token at a few
positions (with the cache it should stay flat).
"""

from __future__ import annotations

import argparse
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int, default=256)
parser.add_argument("--threads", type=int, default=1)
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402

from attention_lib import DecoderOnlyLM  # noqa: E402


def per_token_times(model, tokens: int, use_cache: bool) -> tuple[np.ndarray, np.ndarray]:
    """Decode greedily, timing every step; return (generated tokens, seconds per step)."""
    sequence = np.array([[1]])
    cache = model.new_cache((1,), tokens + 1) if use_cache else None
    step_input, seconds = sequence, []
    for _ in range(tokens):
        start = time.perf_counter()
        logits = model(step_input, cache=cache) if use_cache else model(sequence)
        next_token = logits[:, -1].argmax(axis=-1)[:, None]
        seconds.append(time.perf_counter() - start)
        sequence = np.concatenate([sequence, next_token], axis=1)
        step_input = next_token
    return sequence, np.array(seconds)


def main() -> None:
    model = DecoderOnlyLM.init(vocab_size=1000, d_model=256, num_heads=8, d_ff=1024,
                               num_layers=4, rng=np.random.default_rng(0), dtype=np.float32)
    tokens_without, without = per_token_times(model, args.tokens, use_cache=False)
    tokens_with, with_cache = per_token_times(model, args.tokens, use_cache=True)
    assert (tokens_with == tokens_without).all(), "cached decoding changed the tokens"
    print(f"threads={args.threads}, 4 layers, d_model=256, 8 heads, float32, "
          f"{args.tokens} tokens (same tokens with and without the cache)")
    print(f"{'':24s} {'total s':>9s} {'tokens/s':>9s}")
    for name, seconds in (("without cache", without), ("with cache", with_cache)):
        print(f"{name:24s} {seconds.sum():9.3f} {args.tokens / seconds.sum():9.1f}")
    print(f"speed-up with the cache: {without.sum() / with_cache.sum():.1f}x (target >= 10x)")
    print(f"{'position':>9s} {'no cache ms':>12s} {'cache ms':>9s}")
    for position in (1, args.tokens // 4, args.tokens // 2, args.tokens - 1):
        window = slice(max(0, position - 4), position + 1)  # median of nearby steps
        print(f"{position:9d} {np.median(without[window]) * 1e3:12.2f} "
              f"{np.median(with_cache[window]) * 1e3:9.2f}")


if __name__ == "__main__":
    main()
