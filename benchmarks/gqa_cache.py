"""KV-cache size and decoding speed: multi-head against grouped-query attention.

    .venv/bin/python benchmarks/gqa_cache.py [--threads 1] [--prompt 1024] [--new 64]

Part 1, cache size: for model shapes of published configurations (layers, query heads, kv
heads, head size), the bytes of a float16 KVCache for one sequence, measured with
KVCache.nbytes on a cache of --capacity positions and scaled to a 32k context (the bytes are
linear in the capacity; a 32k multi-head cache of the 70B shape would need 80 GiB of RAM).
GQA is the configuration as published; MHA is the same model with one kv head per query head.

Part 2, decoding speed: a small random DecoderOnlyLM (float32) with 8 query heads and 8
(MHA), 2 (GQA) or 1 (MQA) key/value heads: prefill a prompt of --prompt tokens, then decode
--new tokens one at a time with the cache; the best of --repeat runs, in ms per token
(the prefill is not timed). The same is timed for the model's attention layers alone, the part
that grouped-query attention changes.
Nothing is asserted: the script prints the numbers.
"""

from __future__ import annotations

import argparse
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--capacity", type=int, default=1024)
parser.add_argument("--prompt", type=int, default=1024)
parser.add_argument("--new", type=int, default=64)
parser.add_argument("--repeat", type=int, default=3)
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402

from attention_lib import (  # noqa: E402
    DecoderOnlyLM,
    KVCache,
    MultiHeadAttention,
    causal_mask,
)

CONTEXT = 32768
GIB = 2**30
# name: (layers, query heads, kv heads, head size), from the models' published configurations.
CONFIGS = {
    "SmolLM2-135M": (30, 9, 3, 64),
    "Llama-2-7B": (32, 32, 32, 128),
    "Mistral-7B": (32, 32, 8, 128),
    "Llama-3-8B": (32, 32, 8, 128),
    "Llama-2-70B": (80, 64, 8, 128),
}


def cache_bytes_at_32k(layers: int, kv_heads: int, d_head: int) -> int:
    cache = KVCache.init(layers, kv_heads, args.capacity, d_head, dtype=np.float16)
    return cache.nbytes * CONTEXT // args.capacity


def cache_sizes() -> None:
    print(f"KV cache for one sequence of {CONTEXT} tokens, float16 (KVCache.nbytes at "
          f"capacity {args.capacity}, scaled)")
    print(f"{'model':>14s} {'L':>3s} {'H':>3s} {'H_kv':>4s} {'d':>4s} {'MHA GiB':>8s} "
          f"{'as published GiB':>17s} {'ratio':>6s}")
    for name, (layers, heads, kv_heads, d_head) in CONFIGS.items():
        mha = cache_bytes_at_32k(layers, heads, d_head)
        gqa = cache_bytes_at_32k(layers, kv_heads, d_head)
        print(f"{name:>14s} {layers:3d} {heads:3d} {kv_heads:4d} {d_head:4d} {mha / GIB:8.2f} "
              f"{gqa / GIB:17.2f} {mha / gqa:6.1f}")


def model_with_kv_heads(num_kv_heads: int) -> DecoderOnlyLM:
    rng = np.random.default_rng(0)
    vocab, d_model, heads, d_ff, layers = 512, 512, 8, 1024, 4
    model = DecoderOnlyLM.init(vocab, d_model, heads, d_ff, layers, rng, dtype=np.float32)
    for block in model.blocks:
        block.self_attn = MultiHeadAttention.init(d_model, heads, rng, dtype=np.float32,
                                                  num_kv_heads=num_kv_heads)
    return model


def decode_seconds_per_token(model: DecoderOnlyLM, prompt: np.ndarray) -> tuple[float, int]:
    cache = model.new_cache((), capacity=prompt.size + args.new)
    token = model(prompt, cache=cache)[-1:].argmax(axis=-1)  # prefill, not timed
    start = time.perf_counter()
    for _ in range(args.new):
        token = model(token, cache=cache)[-1:].argmax(axis=-1)
    return (time.perf_counter() - start) / args.new, cache.nbytes


def attention_seconds_per_token(layers: list[MultiHeadAttention], prompt_length: int
                                ) -> float:
    """Decode with the attention layers alone (random inputs): the part GQA changes."""
    rng = np.random.default_rng(2)
    d_model, H_kv = layers[0].d_model, layers[0].num_kv_heads
    cache = KVCache.init(len(layers), H_kv, prompt_length + args.new,
                         d_model // layers[0].num_heads, dtype=np.float32)
    prompt = rng.standard_normal((prompt_length, d_model), dtype=np.float32)
    for index, layer in enumerate(layers):  # prefill, not timed
        layer(prompt, mask=causal_mask(prompt_length), cache=cache.layer(index))
    steps = rng.standard_normal((args.new, 1, d_model), dtype=np.float32)
    start = time.perf_counter()
    for x in steps:  # one new token: it may attend to every cached position
        for index, layer in enumerate(layers):
            x = layer(x, cache=cache.layer(index))[0]
    return (time.perf_counter() - start) / args.new


def decoding_speed() -> None:
    prompt = np.random.default_rng(1).integers(0, 512, size=args.prompt)
    print(f"\ndecoding a random model (d_model=512, 8 query heads, 4 layers, float32), "
          f"prompt {args.prompt}, {args.new} new tokens, threads={args.threads}, "
          f"best of {args.repeat} (the models take turns, so a busy machine slows all alike)")
    models = {kv_heads: model_with_kv_heads(kv_heads) for kv_heads in (8, 2, 1)}
    best = dict.fromkeys(models, np.inf)
    best_attention = dict.fromkeys(models, np.inf)
    nbytes = {}
    for _ in range(args.repeat):
        for kv_heads, model in models.items():
            seconds, nbytes[kv_heads] = decode_seconds_per_token(model, prompt)
            best[kv_heads] = min(best[kv_heads], seconds)
            layers = [block.self_attn for block in model.blocks]
            best_attention[kv_heads] = min(best_attention[kv_heads],
                                           attention_seconds_per_token(layers, args.prompt))
    print(f"{'kv heads':>9s} {'cache MiB':>10s} {'model ms/token':>15s} {'vs MHA':>7s} "
          f"{'attention ms/token':>19s} {'vs MHA':>7s}")
    for kv_heads in models:
        print(f"{kv_heads:9d} {nbytes[kv_heads] / 2**20:10.1f} {1000 * best[kv_heads]:15.2f} "
              f"{best[kv_heads] / best[8]:7.2f} {1000 * best_attention[kv_heads]:19.2f} "
              f"{best_attention[kv_heads] / best_attention[8]:7.2f}")
    print("model: the whole DecoderOnlyLM step; attention: the 4 attention layers alone with "
          "their caches.")


if __name__ == "__main__":
    cache_sizes()
    decoding_speed()
