"""Measure what quantizing SmolLM2-135M costs: size, KL divergence and perplexity (chapter 17).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python scripts/measure_quantization.py [--tokens 2048]

The reference is the installed GGUF file's weights dequantized to float32 (the file holds
Q4_1 matrices, a Q8_0 token embedding and float32 norms; there is no float16 original on
this machine). Each other version is ``attention_lib.models.quantize.quantize_model(reference,
TYPE)``: every weight matrix stored as TYPE and read back, the norms kept as float32.

Held-out text: the validation part of Tiny Shakespeare (its last 10% of characters, cut as
chapter 14's ``train_val_split`` cuts it), of which the first ``--tokens`` SmolLM2 tokens
(``ByteLevelBPE.from_gguf``, no BOS token) are run through each model in chunks of
``--chunk`` positions with the KV cache. For every version it records

- ``nbytes``: bytes the weights take stored that way (MB = 1e6 bytes in the table),
- ``mean_kl``: the mean over all positions of KL(p_ref || p_version) of the next-token
  distributions (``next_token_kl``, log-softmax in float64), and its median,
- ``perplexity``: exp of the mean negative log-likelihood of tokens 1..T-1,
- ``top1_agreement``: how often the version's most likely next token is the reference's,
- ``changed_matrices``: how many of the 211 weight matrices differ from the reference's
  (storing the file's Q4_1 matrices as Q4_1 again changes none of them),

and writes them with the settings to ``attention_lib/data/smollm2_quantization.json`` (or
``--out``), printing a table. Deterministic for a given machine and thread count.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--tokens", type=int, default=2048)
parser.add_argument("--chunk", type=int, default=512)
parser.add_argument("--out", default=None,
                    help="output file (default: the package's data/smollm2_quantization.json)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attention_lib.models.bpe import ByteLevelBPE  # noqa: E402
from attention_lib.models.gguf import read_gguf  # noqa: E402
from attention_lib.models.quantize import (  # noqa: E402
    next_token_kl,
    perplexity,
    quantize_model,
)
from attention_lib.models.smollm2 import (  # noqa: E402
    SMOLLM2_GGUF_SHA256,
    SMOLLM2_INSTALL,
    SmolLM2,
    smollm2_path,
)
from attention_lib.training.gpt import (  # noqa: E402
    DATA_DIR,
    SHAKESPEARE_SHA256,
    load_shakespeare_text,
    train_val_split,
)

VERSIONS = ("F16", "Q8_0", "Q4_1", "Q4_0")  # besides the float32 reference
TEXT_CHARS = 16_000  # encoded to find the first --tokens tokens (about 4 characters each)


def held_out_tokens(bpe: ByteLevelBPE, count: int) -> tuple[np.ndarray, int, int]:
    """The first ``count`` tokens of the validation text and the character span they cover."""
    text = load_shakespeare_text()
    _, validation = train_val_split(np.arange(len(text)))  # the same cut as chapter 14
    start = int(validation[0])
    tokens = bpe.encode(text[start:start + TEXT_CHARS])
    if tokens.size <= count:
        raise ValueError(f"{TEXT_CHARS} characters gave only {tokens.size} tokens")
    tokens = tokens[:count]
    covered = bpe.decode(tokens)
    end = start + len(covered)
    if text[start:end] != covered:
        raise RuntimeError("the tokens do not decode to the text they came from")
    return tokens, start, end


def matrices(model: SmolLM2) -> list[np.ndarray]:
    """The 211 weight matrices: the (tied) embedding, then seven per block."""
    arrays = [model.embedding]
    for block in model.blocks:
        attention, ff = block.self_attn, block.ff
        arrays += [attention.W_q, attention.W_k, attention.W_v, attention.W_o,
                   ff.W_gate, ff.W_up, ff.W_down]
    return arrays


def changed_matrices(model: SmolLM2, reference: SmolLM2) -> int:
    """How many weight matrices differ from the reference's in at least one entry."""
    return sum(not np.array_equal(ours, theirs)
               for ours, theirs in zip(matrices(model), matrices(reference)))


def run(model: SmolLM2, tokens: np.ndarray, chunk: int) -> list[np.ndarray]:
    """Logits of every position, fed ``chunk`` tokens at a time through a KV cache."""
    cache = model.new_cache(batch_shape=(1,), capacity=tokens.size)
    return [model.forward(tokens[None, start:start + chunk], cache)[0]  # (chunk, V)
            for start in range(0, tokens.size, chunk)]


def compare(reference: list[np.ndarray], logits: list[np.ndarray], tokens: np.ndarray) -> dict:
    """Mean and median KL to the reference, perplexity, top-1 agreement, chunk by chunk."""
    kl, nll_sum, agree, start = [], 0.0, 0, 0
    for ref_chunk, chunk in zip(reference, logits):
        kl.append(next_token_kl(ref_chunk, chunk, per_position=True))
        agree += int((ref_chunk.argmax(-1) == chunk.argmax(-1)).sum())
        targets = tokens[start + 1:start + 1 + len(chunk)]  # the last position has none
        nll_sum += np.log(perplexity(chunk[:len(targets)], targets)) * len(targets)
        start += len(chunk)
    kl = np.concatenate(kl)
    return {"mean_kl": float(kl.mean()), "median_kl": float(np.median(kl)),
            "perplexity": float(np.exp(nll_sum / (tokens.size - 1))),
            "top1_agreement": agree / tokens.size}


def main():
    began = time.time()
    path = smollm2_path()
    gguf = read_gguf(path)
    bpe = ByteLevelBPE.from_gguf(gguf)
    tokens, start, end = held_out_tokens(bpe, args.tokens)
    print(f"text: characters [{start}, {end}) of tinyshakespeare.txt, {tokens.size} tokens",
          flush=True)
    reference = SmolLM2.from_gguf(gguf)
    file_types = {}
    for info in gguf.tensors.values():
        file_types[info.ggml_type] = file_types.get(info.ggml_type, 0) + 1
    reference_logits = run(reference, tokens, args.chunk)
    _, reference_nbytes = quantize_model(reference, "F32")
    rows = {"reference (F32)": {"ggml_type": "F32", "nbytes": reference_nbytes,
                                "changed_matrices": 0,
                                **compare(reference_logits, reference_logits, tokens)}}
    print(f"reference done ({time.time() - began:.0f} s)", flush=True)
    for ggml_type in VERSIONS:
        model, nbytes = quantize_model(reference, ggml_type)
        rows[ggml_type] = {"ggml_type": ggml_type, "nbytes": nbytes,
                           "changed_matrices": changed_matrices(model, reference),
                           **compare(reference_logits, run(model, tokens, args.chunk), tokens)}
        del model
        print(f"{ggml_type} done ({time.time() - began:.0f} s)", flush=True)
    results = {
        "description": (
            "SmolLM2-135M-Instruct quantized by attention_lib.models.quantize.quantize_model "
            "(every weight matrix stored as ggml_type and read back; norms float32) against "
            "the reference: the installed GGUF file's weights dequantized to float32 (the file "
            "is itself quantized: Q4_1 matrices, a Q8_0 token embedding, float32 norms). "
            "mean_kl: mean over positions of KL(p_ref || p_version) of the next-token "
            "distributions (nats, log-softmax in float64); perplexity over tokens 1..T-1; "
            "top1_agreement: fraction of positions whose most likely next token matches the "
            "reference's. nbytes: bytes of the weights stored that way. changed_matrices: "
            "how many of the 211 weight matrices differ from the reference's (the file's Q4_1 "
            "matrices come back unchanged from Q4_1, its Q8_0 embedding from Q8_0)."),
        "settings": {
            "model_file": path.name, "model_sha256": SMOLLM2_GGUF_SHA256,
            "model_install": SMOLLM2_INSTALL,
            "text_file": "attention_lib/data/tinyshakespeare.txt",
            "text_sha256": SHAKESPEARE_SHA256,
            "text_span": [start, end],
            "text_span_note": ("characters [start, end): the start of the validation split "
                               "(last 10%, train_val_split) and the first tokens of it"),
            "tokenizer": "ByteLevelBPE.from_gguf, no BOS token",
            "num_tokens": int(tokens.size), "chunk": args.chunk,
            "kv_cache_capacity": int(tokens.size), "model_dtype": "float32",
            "threads": args.threads, "python": platform.python_version(),
            "numpy": np.__version__, "machine": platform.machine(),
        },
        "file": {
            "tensor_nbytes": sum(info.nbytes for info in gguf.tensors.values()),
            "file_size": path.stat().st_size,
            "tensor_types": file_types,
            "note": ("the file's own storage: the reference model, KL 0; file_size adds the "
                     "header, metadata and tokenizer"),
        },
        "versions": rows,
    }
    out = Path(args.out) if args.out else DATA_DIR / "smollm2_quantization.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\n{'version':<18}{'MB':>9}{'mean KL':>11}{'median KL':>11}{'perplexity':>12}"
          f"{'top-1':>8}{'changed':>9}")
    for name, row in rows.items():
        print(f"{name:<18}{row['nbytes'] / 1e6:>9.1f}{row['mean_kl']:>11.3g}"
              f"{row['median_kl']:>11.3g}{row['perplexity']:>12.3f}"
              f"{row['top1_agreement']:>8.3f}{row['changed_matrices']:>9}")
    print(f"{'file (Q4_1+Q8_0)':<18}{results['file']['tensor_nbytes'] / 1e6:>9.1f}"
          "  (the reference's own storage)")
    print(f"\nwrote {out} in {time.time() - began:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
