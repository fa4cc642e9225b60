"""Time and memory of one decoding step of an attention layer against the context length, for
multi-head, grouped-query and latent attention (naive and absorbed) and for linear attention and
the gated delta rule, whose state does not grow (chapter 19).

    taskset -c 1 .venv/bin/python benchmarks/decode_variants.py \
        [--contexts 128 256 ... 16384] [--repeat 5] [--out benchmarks/results/decode_variants.json]
    .venv/bin/python benchmarks/decode_variants.py --quick   # a short test of the script

``--quick`` times three contexts (128, 512, 2048) with 2 runs each and the rates with 3, and
writes to the system's temporary directory unless ``--out`` is given, so that a test run never
replaces the committed results.

One layer of each kind, float32, d_model = 2048, 32 query heads of 64 features (GQA: 8
key/value heads; MLA: a latent of 512 and a RoPE key of 64, DeepSeek-V3's sizes), batch of
one. The weights of a layer (42 to 68 MB) exceed the processor's last-level cache (its size is
read from /sys and recorded in the JSON), so, as in a real model whose many layers could never
all stay in cache, every step reads them from main memory.
Each step takes the hidden state of one new token, projects it, appends to the layer's cache (or
updates its state), attends and applies the output projection: what a decoder does per layer
and per generated token. Before each step the cache holds ``T`` positions (filled with random
numbers, then rewound to ``T`` after each run, as chapter 16 does); the time is the fastest of
``--repeat`` runs after a warm-up (benchmarks/timing.py), every run recorded. BLAS is limited
to one thread (threadpoolctl), and the process to one processor (``os.sched_setaffinity``)
where the system allows it.

Memory: the bytes the layer holds after ``T`` tokens (the cache's ``T`` positions, or the
state), and the peak of the memory one step allocates on top of that (``tracemalloc``, which
NumPy reports its arrays to), in a separate, untimed run.

Predicted bound: the roofline of chapter 16, ``max(bytes / bandwidth, flops / peak)``, with the
*read* bandwidth (the dot product of a 64 MiB float32 vector with itself, which streams it from
memory once and writes nothing, as a decoding step only reads its weights and cache; in a trial
on the machine of the committed results it streamed faster than a vector times a matrix of the
same size) and the matrix-product peak (1024 x 1024 float32), both measured by this script
under the same thread limit and both from the FASTEST of their runs, as the steps' times are:
on a shared machine every disturbance only adds time. The copy bandwidth of chapter 16 (64 MiB,
counting bytes read and written) is recorded too, for comparison. Bytes: the layer's weights
and the cache (or state) read once; flops: 2 per multiply-add of the products with the weights
and of the attention (counted in ``flops_and_bytes``). The JSON records the machine (with its
last-level cache), the git commit of the code measured and whether ``attention_lib`` or this
script had uncommitted changes, the load average before and after, and all of this.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import tempfile
import time
import tracemalloc
from functools import partial
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from attention_lib import MultiHeadAttention
from attention_lib.cache import KVCache
from attention_lib.variants import MultiHeadLatentAttention, delta_rule, linear_attention

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--contexts", type=int, nargs="+",
                    default=[128, 256, 512, 1024, 2048, 4096, 8192, 16384])
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--out", type=Path, default=None,
                    help="default benchmarks/results/decode_variants.json "
                         "(with --quick: decode_variants_quick.json in the temporary directory)")
parser.add_argument("--quick", action="store_true",
                    help="contexts 128 512 2048, 2 runs each, 3 runs of each rate (a test)")
args = parser.parse_args()
RATE_REPEAT = 7
if args.quick:
    args.contexts, args.repeat, RATE_REPEAT = [128, 512, 2048], 2, 3
if args.out is None:
    args.out = (Path(tempfile.gettempdir()) / "decode_variants_quick.json" if args.quick else
                Path(__file__).parent / "results" / "decode_variants.json")
REPO = Path(__file__).resolve().parent.parent

CONFIG = {"d_model": 2048, "num_heads": 32, "d_head": 64, "num_kv_heads": 8, "d_latent": 512,
          "d_query_latent": 768, "d_rope": 64, "dtype": "float32"}
D, H, d_head = CONFIG["d_model"], CONFIG["num_heads"], CONFIG["d_head"]
H_KV = CONFIG["num_kv_heads"]
D_C, D_CQ, D_R = CONFIG["d_latent"], CONFIG["d_query_latent"], CONFIG["d_rope"]
DTYPE = np.float32
ITEM = 4
T_MAX = max(args.contexts)


def timed(function, repeat):
    """Seconds of each of ``repeat`` calls, after one warm-up call."""
    function()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        seconds.append(time.perf_counter() - start)
    return seconds


def peak_step_bytes(function):
    """Peak bytes allocated during one call (tracemalloc), beyond what existed before."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    function()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return int(peak)


rng = np.random.default_rng(0)
x_new = rng.standard_normal((1, D)).astype(DTYPE)  # the new token's hidden state


# --- multi-head and grouped-query attention with the library's KVCache -----------------------

def make_kv_variant(num_kv_heads):
    layer = MultiHeadAttention.init(D, H, np.random.default_rng(1), num_kv_heads=num_kv_heads,
                                    dtype=DTYPE)
    layer.rope_base = 10000.0  # RoPE on queries and keys, as in the models of the table
    cache = KVCache.init(1, num_kv_heads, T_MAX + 1, d_head, dtype=DTYPE)
    cache.keys[...] = rng.standard_normal(cache.keys.shape, dtype=DTYPE)
    cache.values[...] = rng.standard_normal(cache.values.shape, dtype=DTYPE)
    weights = sum(W.nbytes for W in (layer.W_q, layer.W_k, layer.W_v, layer.W_o))
    assert layer.W_q.dtype == DTYPE

    def prepare(T):
        cache.lengths[0] = T

    def step(T):
        cache.lengths[0] = T  # rewind: the cache holds T positions before the step
        return layer(x_new, cache=cache.layer(0), need_weights=False)[0]

    def held(T):
        return 2 * num_kv_heads * T * d_head * ITEM

    def flops_and_bytes(T):
        flops = 2 * (D * D * 2 + 2 * D * num_kv_heads * d_head) + 2 * 2 * H * d_head * (T + 1)
        return flops, weights + held(T + 1)

    return prepare, step, held, flops_and_bytes


# --- multi-head latent attention, naive and absorbed, with its LatentCache -------------------

mla = MultiHeadLatentAttention.init(D, H, np.random.default_rng(2), d_latent=D_C,
                                    d_query_latent=D_CQ, d_head=d_head, d_rope=D_R, dtype=DTYPE)
latent_cache = mla.new_cache(T_MAX + 1)
latent_cache.entries[...] = rng.standard_normal(latent_cache.entries.shape, dtype=DTYPE)
mla_weights = sum(W.nbytes for W in (mla.W_dq, mla.W_uq, mla.W_qr, mla.W_dkv, mla.W_uk,
                                     mla.W_uv, mla.W_kr, mla.W_o))
mla_projection_flops = 2 * (D * D_CQ + D_CQ * H * (d_head + D_R) + D * (D_C + D_R) + H * d_head * D)


def make_mla_variant(absorb):
    def prepare(T):
        latent_cache.length = T

    def step(T):
        latent_cache.length = T
        return mla(x_new, cache=latent_cache, absorb=absorb)[0]

    def held(T):
        return (D_C + D_R) * T * ITEM

    def flops_and_bytes(T):
        Tk = T + 1
        if absorb:  # fold W_uk into the query, score the latents, map by W_uv afterwards
            attention = 2 * H * (d_head * D_C + Tk * (D_C + D_R) + Tk * D_C + D_C * d_head)
        else:  # up-project every cached latent into per-head keys and values, then attend
            attention = 2 * Tk * D_C * 2 * H * d_head + 2 * H * Tk * (d_head + D_R + d_head)
        return mla_projection_flops + attention, mla_weights + held(Tk)

    return prepare, step, held, flops_and_bytes


# --- linear attention and the gated delta rule: one state per head --------------------------

recurrent_rng = np.random.default_rng(3)
W_q, W_k, W_v, W_o = ((recurrent_rng.standard_normal((D, D)) / np.sqrt(D)).astype(DTYPE)
                      for _ in range(4))
W_beta, W_decay = ((recurrent_rng.standard_normal((D, H)) / np.sqrt(D)).astype(DTYPE)
                   for _ in range(2))
assert W_q.dtype == DTYPE
recurrent_weights = sum(W.nbytes for W in (W_q, W_k, W_v, W_o, W_beta, W_decay))


def heads(x):
    return x.reshape(-1, H, d_head).swapaxes(0, 1)  # (T, D) -> (H, T, d_head)


def elu_plus_one(x):
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def linear_step(x, state, normalizer):
    """One token of causal linear attention, in place on (state, normalizer)."""
    q, k, v = elu_plus_one(heads(x @ W_q)), elu_plus_one(heads(x @ W_k)), heads(x @ W_v)
    state += k.swapaxes(-1, -2) @ v  # (H, d, d): S += phi(k)^T v
    normalizer += k[:, 0, :]  # (H, d)
    output = (q @ state) / (q @ normalizer[..., None])  # (H, 1, d)
    return output.swapaxes(0, 1).reshape(-1, D) @ W_o


def delta_inputs(x):
    q, k, v = heads(x @ W_q), heads(x @ W_k), heads(x @ W_v)
    k = k / np.linalg.norm(k, axis=-1, keepdims=True)  # unit keys: the state stays bounded
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    beta = 1 / (1 + np.exp(-(x @ W_beta)))  # (T, H) in (0, 1)
    decay = 1 / (1 + np.exp(-(x @ W_decay + 3.0)))  # (T, H) in (0, 1), near 0.95
    return q, k, v, beta.T, decay.T


def delta_step(x, state):
    q, k, v, beta, decay = delta_inputs(x)
    output, new_state = delta_rule(q, k, v, beta, decay=decay, initial_state=state,
                                   return_state=True)
    state[...] = new_state
    return output.swapaxes(0, 1).reshape(-1, D) @ W_o


def check_recurrent_steps():
    """The one-token steps above, run over a short sequence, equal the library's forms."""
    x = np.random.default_rng(4).standard_normal((12, D)).astype(np.float64)
    state, normalizer = np.zeros((H, d_head, d_head)), np.zeros((H, d_head))
    stepped = np.concatenate([linear_step(x[t:t + 1], state, normalizer) for t in range(12)])
    whole = linear_attention(heads(x @ W_q), heads(x @ W_k), heads(x @ W_v))
    np.testing.assert_allclose(stepped, whole.swapaxes(0, 1).reshape(-1, D) @ W_o, rtol=1e-4,
                               atol=1e-4)
    state = np.zeros((H, d_head, d_head))
    stepped = np.concatenate([delta_step(x[t:t + 1], state) for t in range(12)])
    q, k, v, beta, decay = delta_inputs(x)
    whole = delta_rule(q, k, v, beta, decay=decay, chunk_size=4)
    np.testing.assert_allclose(stepped, whole.swapaxes(0, 1).reshape(-1, D) @ W_o, rtol=1e-4,
                               atol=1e-4)


def make_recurrent_variant(kind):
    state = np.zeros((H, d_head, d_head), dtype=DTYPE)
    normalizer = np.zeros((H, d_head), dtype=DTYPE)

    def prepare(T):
        # The state after T tokens: its size does not depend on T, nor does the step's cost.
        state[...] = recurrent_rng.standard_normal(state.shape).astype(DTYPE) / d_head
        normalizer[...] = T

    def step(T):
        if kind == "linear":
            return linear_step(x_new, state, normalizer)
        return delta_step(x_new, state)

    def held(T):
        return state.nbytes + (normalizer.nbytes if kind == "linear" else 0)

    def flops_and_bytes(T):
        weights = 2 * (4 * D * D + (2 * D * H if kind == "delta" else 0))
        # linear: S += k^T v, q S, q z; delta: decay, S k, the rank-one update, S q (7 d^2)
        per_head = (4 * d_head**2 + 2 * d_head) if kind == "linear" else 7 * d_head**2
        return weights + H * per_head, recurrent_weights + 2 * held(T)  # state read + written

    return prepare, step, held, flops_and_bytes


def last_level_cache():
    """The largest-level cache of processor 0, from /sys (None where /sys does not say)."""
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        number = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        caches.append({"level": level, "bytes": number, "source": str(index / "size")})
    return max(caches, key=lambda cache: cache["level"]) if caches else None


def code_version():
    """The git commit of the checkout measured, and which measured files differ from it."""
    def git(*arguments):
        return subprocess.run(["git", *arguments], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout
    try:
        commit = git("rev-parse", "HEAD").strip()
        changed = git("status", "--porcelain", "--", "attention_lib",
                      "benchmarks/decode_variants.py").splitlines()
    except (OSError, subprocess.CalledProcessError):
        return None
    changed = sorted(line[3:] for line in changed)
    return {"commit": commit,
            # the library's code (its .py files) differs from the commit; data files aside
            "attention_lib_uncommitted": any(path.startswith("attention_lib")
                                             and path.endswith(".py") for path in changed),
            "script_uncommitted": "benchmarks/decode_variants.py" in changed,
            "uncommitted_files": changed}


def machine():
    model = "unknown"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    blas = [{key: pool.get(key) for key in ("internal_api", "version", "num_threads")}
            for pool in threadpool_info() if pool["user_api"] == "blas"]
    return {"cpu": model, "cpu_count": os.cpu_count(), "last_level_cache": last_level_cache(),
            "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "blas": blas}


def main():
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        pinned = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pinned = None
    load_before = os.getloadavg()
    code = code_version()
    with threadpool_limits(limits=1):
        check_recurrent_steps()
        info = machine()
        # The machine's rates, each from the fastest of its runs (as the steps' times are).
        # Read: the dot product of a 64 MiB vector with itself streams it once, writes nothing.
        vector = rng.standard_normal(2**24, dtype=DTYPE)
        read_runs = timed(partial(np.dot, vector, vector), RATE_REPEAT)
        bandwidth = vector.nbytes / min(read_runs)
        del vector
        # Copy (chapter 16's measurement): reads and writes 64 MiB each; for comparison only.
        source = rng.standard_normal(2**24, dtype=DTYPE)  # 64 MiB
        target = np.empty_like(source)
        copy_runs = timed(partial(np.copyto, target, source), RATE_REPEAT)
        copy_bandwidth = 2 * source.nbytes / min(copy_runs)
        del source, target
        left, right = rng.standard_normal((2, 1024, 1024), dtype=DTYPE)
        matmul_runs = timed(partial(np.matmul, left, right), RATE_REPEAT)
        peak = 2 * 1024**3 / min(matmul_runs)
        variants = {
            "MHA": make_kv_variant(H),
            "GQA": make_kv_variant(H_KV),
            "MLA naive": make_mla_variant(absorb=False),
            "MLA absorbed": make_mla_variant(absorb=True),
            "linear attention": make_recurrent_variant("linear"),
            "gated delta rule": make_recurrent_variant("delta"),
        }
        # The two MLA paths give the same step (to float32 rounding).
        latent_cache.length = min(args.contexts)
        naive = mla(x_new, cache=latent_cache, absorb=False)[0]
        latent_cache.length = min(args.contexts)
        absorbed = mla(x_new, cache=latent_cache, absorb=True)[0]
        np.testing.assert_allclose(naive, absorbed, rtol=1e-3, atol=1e-4)
        results = {}
        for name, (prepare, step, held, flops_and_bytes) in variants.items():
            curve = {"seconds": [], "runs": [], "cache_bytes": [], "step_peak_bytes": [],
                     "flops": [], "bytes_read": [], "predicted_seconds": []}
            for T in args.contexts:
                prepare(T)
                runs = timed(partial(step, T), args.repeat)
                flops, bytes_read = flops_and_bytes(T)
                curve["seconds"].append(min(runs))
                curve["runs"].append(runs)
                curve["cache_bytes"].append(held(T))
                curve["step_peak_bytes"].append(peak_step_bytes(partial(step, T)))
                curve["flops"].append(flops)
                curve["bytes_read"].append(bytes_read)
                curve["predicted_seconds"].append(max(bytes_read / bandwidth, flops / peak))
                print(f"{name:17s} T={T:6d} {1e3 * min(runs):8.2f} ms (predicted "
                      f"{1e3 * curve['predicted_seconds'][-1]:7.2f}), holds "
                      f"{held(T) / 2**20:7.2f} MiB, step peak "
                      f"{curve['step_peak_bytes'][-1] / 2**20:7.2f} MiB", flush=True)
            results[name] = curve
    load_after = os.getloadavg()
    output = {
        "script": "benchmarks/decode_variants.py",
        "format": 2,  # 2: rates from the fastest runs, read bandwidth, cache size, code version
        "quick": args.quick,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "code": code,
        "machine": info,
        "threads": 1,
        "pinned_cpus": pinned,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        "config": CONFIG,
        "repeat": args.repeat,
        "contexts": args.contexts,
        "rate_repeat": RATE_REPEAT,
        "bandwidth_bytes_per_s": bandwidth,  # read-only, fastest run: the bound's bytes rate
        "bandwidth_kind": "read: dot product of a 2**24 float32 vector with itself",
        "bandwidth_bytes_per_run": 2**24 * ITEM,
        "bandwidth_runs_s": read_runs,
        "copy_bandwidth_bytes_per_s": copy_bandwidth,  # read + written, fastest run
        "copy_bytes_per_run": 2 * 2**24 * ITEM,
        "copy_runs_s": copy_runs,
        "peak_flops_per_s": peak,  # fastest run
        "matmul_flops_per_run": 2 * 1024**3,
        "matmul_runs_s": matmul_runs,
        "variants": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(output, indent=1) + "\n")
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (copy {copy_bandwidth / 1e9:.1f}), peak "
          f"{peak / 1e9:.1f} GFLOP/s, load average {load_before[0]:.2f} -> {load_after[0]:.2f}; "
          f"wrote {args.out}")


if __name__ == "__main__":
    assert math.isclose(ITEM, np.dtype(DTYPE).itemsize)
    main()
