"""Measure what re-quantizing SmolLM2-135M costs: size, KL divergence, perplexity (chapter 17).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/measure_quantization.py [--windows 16]

The starting point is the installed GGUF file, which is itself quantized: ``Q4_1`` matrices, a
``Q8_0`` token embedding (tied: also the output matrix), float32 norms. There is no float16
original on this machine, so the reference is that file's weights dequantized to float32,
and every other version re-quantizes the ``Q4_1`` file, as ``llama-quantize
--allow-requantize`` would (``attention_lib.models.quantize.llama_quantize_model``: llama.cpp's
per-tensor rule, ``llama_tensor_get_type``, then dequantize and quantize every tensor whose
type changes). The versions:

- ``F16``, ``Q8_0``, ``Q4_0``: ``llama-quantize`` to that file type. For the block types the
  rule keeps the tied embedding at 8 bits (it is the output tensor: ``Q6_K``, which falls back
  to ``Q8_0`` since 576 is not a multiple of 256), so only the 210 layer matrices change.
- ``Q4_0 --pure``: the embedding in ``Q4_0`` too (every matrix one type).
- ``Q4_1 + Q4_0 embedding``: the file's layers, only the embedding stored as ``Q4_0``
  (``--token-embedding-type q4_0``): the cost of the placement the rule avoids.

(``llama-quantize`` to ``Q4_1`` gives the file back unchanged: no tensor changes type.)

Held-out text: the validation part of Tiny Shakespeare (its last 10% of characters, cut as
chapter 14's ``train_val_split`` cuts it), tokenized (``ByteLevelBPE.from_gguf``, no BOS
token), of which the first ``--windows`` x ``--n-ctx`` tokens are cut into windows of
``--n-ctx`` tokens, each read from an empty cache as ``llama-perplexity`` reads its chunks.
For every version and every window the script records the mean over the window's positions
of the next-token negative log-likelihood (NLL), of KL(p_ref || p_version) and of top-1
agreement with the reference, twice: over every position that has a next token (1..n_ctx-1
predicted) and over the second half only (what ``llama-perplexity`` scores:
``first = n_ctx/2``). Windows are the unit of the spread: the chapter bootstraps over them.
It writes the per-window values and their summaries with the settings to
``attention_lib/data/smollm2_quantization.json`` (or ``--out``), printing a table.
Deterministic for a given machine and thread count.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--windows", type=int, default=16)
parser.add_argument("--n-ctx", type=int, default=512)
parser.add_argument("--out", default=None,
                    help="output file (default: the package's data/smollm2_quantization.json)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attention_lib.models.bpe import ByteLevelBPE  # noqa: E402
from attention_lib.models.gguf import read_gguf  # noqa: E402
from attention_lib.models.quantize import (  # noqa: E402
    llama_quantize_model,
    llama_quantize_types,
    next_token_kl,
)
from attention_lib.models.smollm2 import (  # noqa: E402
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_INSTALL,
    SmolLM2,
    smollm2_path,
)
from attention_lib.softmax import log_softmax  # noqa: E402
from attention_lib.training.gpt import (  # noqa: E402
    DATA_DIR,
    SHAKESPEARE_SHA256,
    load_shakespeare_text,
    train_val_split,
)

# name -> (llama_quantize_model arguments, the llama-quantize command it stands for)
VERSIONS = {
    "F16": ({"ftype": "F16"}, "llama-quantize --allow-requantize IN OUT F16"),
    "Q8_0": ({"ftype": "Q8_0"}, "llama-quantize --allow-requantize IN OUT Q8_0"),
    "Q4_0": ({"ftype": "Q4_0"}, "llama-quantize --allow-requantize IN OUT Q4_0"),
    "Q4_0 --pure": ({"ftype": "Q4_0", "pure": True},
                    "llama-quantize --allow-requantize --pure IN OUT Q4_0"),
    "Q4_1 + Q4_0 embedding": ({"ftype": "Q4_1", "token_embedding_type": "Q4_0"},
                              "llama-quantize --allow-requantize --token-embedding-type q4_0 "
                              "IN OUT Q4_1"),
}


def held_out_tokens(bpe: ByteLevelBPE, count: int) -> tuple[np.ndarray, int, int]:
    """The first ``count`` tokens of the validation text and the character span they cover."""
    text = load_shakespeare_text()
    _, validation = train_val_split(np.arange(len(text)))  # the same cut as chapter 14
    start = int(validation[0])
    tokens = bpe.encode(text[start:])
    if tokens.size < count:
        raise ValueError(f"the validation text has only {tokens.size} tokens; asked for {count}")
    tokens = tokens[:count]
    covered = bpe.decode(tokens)
    end = start + len(covered)
    if text[start:end] != covered:
        raise RuntimeError("the tokens do not decode to the text they came from")
    return tokens, start, end


def window_logits(model: SmolLM2, window: np.ndarray) -> np.ndarray:
    """Logits of every position of one window, read from an empty cache: (n_ctx, V)."""
    return model.forward(window[None])[0]


def window_stats(ref_logits: np.ndarray, logits: np.ndarray, window: np.ndarray) -> dict:
    """Per-window means over all predicted positions and over the second half."""
    targets = window[1:]
    log_probs = log_softmax(logits[:-1].astype(np.float64))  # (n_ctx - 1, V)
    nll = -np.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    kl = next_token_kl(ref_logits[:-1], logits[:-1], per_position=True)
    same = ref_logits[:-1].argmax(-1) == logits[:-1].argmax(-1)
    half = window.size // 2  # llama-perplexity: first = n_ctx/2, predictions first..n_ctx-2
    return {"nll": float(nll.mean()), "kl": float(kl.mean()), "top1": float(same.mean()),
            "nll_second_half": float(nll[half:].mean()), "kl_second_half": float(kl[half:].mean()),
            "top1_second_half": float(same[half:].mean())}


def summary(windows: list[dict], reference: list[dict] | None) -> dict:
    """Means over windows (every window scores the same number of positions)."""
    out = {}
    for suffix in ("", "_second_half"):
        nll = np.array([w["nll" + suffix] for w in windows])
        out["perplexity" + suffix] = float(np.exp(nll.mean()))
        out["mean_kl" + suffix] = float(np.mean([w["kl" + suffix] for w in windows]))
        out["top1_agreement" + suffix] = float(np.mean([w["top1" + suffix] for w in windows]))
        if reference is not None:
            diff = nll - np.array([w["nll" + suffix] for w in reference])
            out["nll_change_stderr" + suffix] = float(diff.std(ddof=1) / np.sqrt(diff.size))
    return out


def main():
    began = time.time()
    path = smollm2_path()
    gguf = read_gguf(path)
    bpe = ByteLevelBPE.from_gguf(gguf)
    n_ctx, count = args.n_ctx, args.windows * args.n_ctx
    tokens, start, end = held_out_tokens(bpe, count)
    windows = tokens.reshape(args.windows, n_ctx)
    print(f"text: characters [{start}, {end}) of tinyshakespeare.txt, {tokens.size} tokens in "
          f"{args.windows} windows of {n_ctx}", flush=True)
    file_types = {}
    for info in gguf.tensors.values():
        file_types[info.ggml_type] = file_types.get(info.ggml_type, 0) + 1
    file_nbytes = sum(info.nbytes for info in gguf.tensors.values())
    reference = SmolLM2.from_gguf(gguf)
    scratch = tempfile.TemporaryDirectory()  # the reference logits: windows x n_ctx x V
    reference_logits = np.lib.format.open_memmap(  # float32 (1.6 GB for 16 x 512), on disk
        Path(scratch.name) / "reference_logits.npy", mode="w+", dtype=np.float32,
        shape=(args.windows, n_ctx, reference.config.vocab_size))
    for index, window in enumerate(windows):
        reference_logits[index] = window_logits(reference, window)
    reference_logits.flush()
    del reference
    print(f"reference done ({time.time() - began:.0f} s)", flush=True)
    # The reference's own statistics, against itself (KL 0): the NLL is what matters.
    ref_windows = [window_stats(ref, ref, window)
                   for ref, window in zip(reference_logits, windows)]
    rows = {"reference (Q4_1 file)": {
        "llama_quantize": None, "nbytes": file_nbytes, "requantized_tensors": 0,
        "types": file_types, **summary(ref_windows, None), "windows": ref_windows}}
    for name, (kwargs, command) in VERSIONS.items():
        model, stored = llama_quantize_model(gguf, allow_requantize=True, **kwargs)
        stats = []
        for ref, window in zip(reference_logits, windows):
            logits = window_logits(model, window)
            stats.append(window_stats(np.asarray(ref), logits, window))
        del model
        types = {}
        for ggml_type in stored.types.values():
            types[ggml_type] = types.get(ggml_type, 0) + 1
        rows[name] = {"llama_quantize": command, "nbytes": stored.nbytes,
                      "requantized_tensors": len(stored.requantized), "types": types,
                      **summary(stats, ref_windows), "windows": stats}
        print(f"{name} done ({time.time() - began:.0f} s)", flush=True)
    del reference_logits
    scratch.cleanup()
    unchanged = llama_quantize_types(gguf, "Q4_1")
    assert all(unchanged[name] == info.ggml_type for name, info in gguf.tensors.items())
    results = {
        "description": (
            "SmolLM2-135M-Instruct, re-quantized from its Q4_1 GGUF file as llama-quantize "
            "--allow-requantize lays a file out (attention_lib.models.quantize."
            "llama_quantize_model: llama.cpp's llama_tensor_get_type rule, then every tensor "
            "whose type changes dequantized and quantized again), against the reference: the "
            "file's weights dequantized to float32 (Q4_1 matrices, a Q8_0 tied token "
            "embedding, float32 norms). Held-out text cut into windows of n_ctx tokens, each "
            "read from an empty cache. Per window: mean next-token NLL (nats), mean "
            "KL(p_ref || p_version) (nats, log-softmax in float64; the reference logits were "
            "kept in float32 between runs), top-1 agreement with the reference; over every "
            "predicted position (1..n_ctx-1) and over the second half only (as "
            "llama-perplexity scores). perplexity = exp(mean over windows of the window NLL). "
            "nll_change_stderr: standard error over windows of the paired NLL change. "
            "nbytes: bytes of all tensors stored that way. llama-quantize to Q4_1 gives the "
            "file back unchanged (no tensor changes type)."),
        "settings": {
            "model_file": path.name, "model_sha256": SMOLLM2_GGUF_SHA256,
            "model_install": SMOLLM2_INSTALL,
            "text_file": "attention_lib/data/tinyshakespeare.txt",
            "text_sha256": SHAKESPEARE_SHA256,
            "text_span": [start, end],
            "text_span_note": ("characters [start, end): the start of the validation split "
                               "(last 10%, train_val_split) and the first tokens of it"),
            "tokenizer": "ByteLevelBPE.from_gguf, no BOS token",
            "num_tokens": int(tokens.size), "n_ctx": n_ctx, "windows": args.windows,
            "model_dtype": "float32", "threads": args.threads,
            "python": platform.python_version(), "numpy": np.__version__,
            "machine": platform.machine(),
            "llama_cpp_rule": ("src/llama-quant.cpp, llama_tensor_get_type, read at commit "
                               "007dbbf3fd17eefe9b47fee45f48f7ba5e62b714"),
        },
        "file": {
            "tensor_nbytes": file_nbytes,
            "file_size": path.stat().st_size,
            "tensor_types": file_types,
        },
        "versions": rows,
    }
    out = Path(args.out) if args.out else DATA_DIR / "smollm2_quantization.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{'version':<24}{'MB':>7}{'requant.':>9}{'mean KL':>10}{'perplexity':>12}"
          f"{'+-':>7}{'top-1':>7}{'ppl 2nd half':>14}")
    for name, row in rows.items():
        spread = row.get("nll_change_stderr")
        spread = f"{100 * spread:6.2f}%" if spread is not None else f"{'':7}"
        print(f"{name:<24}{row['nbytes'] / 1e6:>7.1f}{row['requantized_tensors']:>9}"
              f"{row['mean_kl']:>10.4f}{row['perplexity']:>12.3f}{spread}"
              f"{row['top1_agreement']:>7.3f}{row['perplexity_second_half']:>14.3f}")
    print(f"\nwrote {out} in {time.time() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
