"""Ablations and patching sweeps on SmolLM2-135M's 270 heads, too heavy for chapter 18.

    .venv/bin/python scripts/measure_heads_smollm2.py [--threads 1] [--out FILE] [--pilot]
                                                      [--parts scores_check,patching,...]

Writes ``attention_lib/data/smollm2_heads.json`` (or ``--out``) after every part, so that a
stopped run keeps what it finished (a rerun skips the parts already in the file). Every
capture and intervention goes through :mod:`attention_lib.hooks`; every sweep that changes
block ``l`` keeps the clean stream entering block ``l`` and runs only the blocks from ``l`` on
(:func:`attention_lib.heads.forward_from_layer`). The parts, in order:

- ``scores``: previous-token, first-token, duplicate-token and induction scores of every head
  (mean and std over the repeated sequences), the top heads.
- ``scores_check``: the four mean scores over the first 10 sequences alone, which
  tests/test_heads.py recomputes in a few seconds (the check that the file has not rotted).
- ``induction_ablation``: losses on the first and second copy with the top induction heads
  zero-ablated, and with as many random heads (several draws).
- ``k_composition``: every head's induction score with the top previous-token heads ablated,
  and with as many random heads from the same layers.
- ``patching``: an indirect-object task (Wang et al. 2023): clean and corrupted logit
  differences, and the fraction restored by patching each head's output, and each layer's
  residual stream at each position, from the clean run into the corrupted one (a screen on
  PATCH_PROMPTS prompts, with the spread of each prompt's own share), then the screen's
  five best heads and two most negative again on every prompt.
- ``ablation_map``: each head zero-ablated alone: the change of the second-copy loss on
  repeated sequences and of the loss on Tiny Shakespeare windows.
- ``ablation_confirm``: the heads the map ranks highest, the strongest sinks and the top
  induction heads ablated again, on every repeated sequence and as many other Shakespeare
  windows.
- ``pruning``: heads removed together, least important first (by the map's text effect),
  loss on PRUNE_WINDOWS other Shakespeare windows and on every repeated sequence, and its
  change from the intact model's on the same inputs (paired); a control removes the first 27
  heads but the strongest previous-token head among them.

The repeated sequences are the chapter's: ``repeated_random_tokens(default_rng(0), 100, 8,
49152, low=17, prefix=0)`` (token 0 is ``<|endoftext|>``; ids below 17 are control tokens).
"""

from __future__ import annotations

import argparse
import os

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--out", default=None)
parser.add_argument("--pilot", action="store_true", help="tiny sizes, to time the parts")
parser.add_argument("--parts", default=None,
                    help="comma-separated parts to run if missing (default: every missing part)")
args = parser.parse_args()
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(args.threads)

import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from attention_lib.heads import (  # noqa: E402
    copy_losses,
    duplicate_token_score,
    first_token_score,
    forward_from_layer,
    induction_score,
    logit_difference,
    per_position_loss,
    previous_token_score,
    repeated_random_tokens,
)
from attention_lib.hooks import capture, intervene, patch, zero_ablate  # noqa: E402
from attention_lib.models.smollm2 import SMOLLM2_GGUF_SHA256, load_smollm2  # noqa: E402
from attention_lib.training.gpt import load_shakespeare_text  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "attention_lib" / "data"
OUT = Path(args.out) if args.out else DATA / "smollm2_heads.json"
if args.pilot and not args.out:
    parser.error("--pilot writes to --out only (not the package's data file)")

# The chapter's settings (book/18_what_heads_do.ipynb): change both together.
SEED, NUM_SEQUENCES, LENGTH, LOW, PREFIX = 0, 100, 8, 17, 0
TOP_K = 10  # heads ablated together (induction heads, previous-token heads)
RANDOM_DRAWS = 3
MAP_SEQUENCES = 6  # repeated sequences and Shakespeare windows for the per-head map
PRUNE_WINDOWS = 100
PATCH_PROMPTS = 8
BATCH = 20
NAMES = ("Mary John Tom James Anna Sarah David Paul Mark Alice Emma Peter Lucy Kate Jack Sam "
         "Ben Max Rose Laura Mike Lisa Jane Dan Chris Amy Tim Joe Bob Eric").split()
PLACES = ("store", "park", "school", "beach", "office")
OBJECTS = ("drink", "ball", "book", "gift", "letter")
TEMPLATE = "When {first} and {second} went to the {place}, {subject} gave a {thing} to"
NUM_PROMPTS = 120
if args.pilot:
    NUM_SEQUENCES, MAP_SEQUENCES, PRUNE_WINDOWS, PATCH_PROMPTS, RANDOM_DRAWS = 20, 4, 4, 4, 1
    NUM_PROMPTS = 20

began = time.perf_counter()
model, tokenizer = load_smollm2()
L, H = model.config.num_layers, model.config.num_heads
V = model.config.vocab_size
results = json.loads(OUT.read_text()) if OUT.exists() and not args.pilot else {}
results["settings"] = {
    "model": "SmolLM2-135M-Instruct Q4_1 GGUF dequantized to float32",
    "gguf_sha256": SMOLLM2_GGUF_SHA256, "seed": SEED, "num_sequences": NUM_SEQUENCES,
    "length": LENGTH, "low": LOW, "prefix": PREFIX, "top_k": TOP_K,
    "random_draws": RANDOM_DRAWS, "map_sequences": MAP_SEQUENCES,
    "prune_windows": PRUNE_WINDOWS, "patch_prompts": PATCH_PROMPTS, "ablation": "zero",
    "threads": args.threads, "numpy": np.__version__, "machine": platform.machine(),
}


def wanted(part):
    """Run ``part``: it is not in the file yet and --parts (if given) names it."""
    return part not in results and (args.parts is None or part in args.parts.split(","))


def log(message):
    print(f"[{time.perf_counter() - began:7.0f} s] {message}", flush=True)


def save():
    # Write a new file and rename it over the old one: a reader never sees half a file.
    partial = OUT.with_name(OUT.name + ".partial")
    partial.write_text(json.dumps(results, separators=(",", ":")) + "\n")
    partial.replace(OUT)


def rounded(array, digits=4):
    return np.round(np.asarray(array, dtype=np.float64), digits).tolist()


def batches(n):
    return [slice(start, min(start + BATCH, n)) for start in range(0, n, BATCH)]


def head_changes(heads):
    """{point: zero_ablate(heads of that layer)} for a list of (layer, head)."""
    by_layer = {}
    for layer, head in heads:
        by_layer.setdefault(int(layer), []).append(int(head))
    return {f"blocks.{layer}.attn.head_out": zero_ablate(chosen)
            for layer, chosen in by_layer.items()}


def copy_loss_run(tokens, heads=(), weights=False):
    """Per-sequence first- and second-copy losses (and every head's scores) with ``heads``
    zero-ablated."""
    first, second, scores = [], [], []
    for part in batches(len(tokens)):
        names = ["blocks.*.attn.weights"] if weights else []
        with intervene(model, head_changes(heads)), capture(model, names) as recording:
            logits = model(tokens[part])
        f, s = copy_losses(per_position_loss(logits, tokens[part]), LENGTH)
        first.append(f)
        second.append(s)
        if weights:
            attention = recording.stack("attn.weights")  # (L, B, H, T, T)
            scores.append(np.stack([previous_token_score(attention),
                                    first_token_score(attention),
                                    duplicate_token_score(attention, LENGTH),
                                    induction_score(attention, LENGTH)]))  # (4, L, B, H)
            del attention, recording
    out = {"first": np.concatenate(first), "second": np.concatenate(second)}
    if weights:
        out["scores"] = np.concatenate(scores, axis=2)  # (4, L, N, H)
    return out


def mean_std(values):
    values = np.asarray(values, dtype=np.float64)
    return {"mean": round(float(values.mean()), 4), "std": round(float(values.std()), 4)}


def top(score_map, k):
    order = np.argsort(-score_map, axis=None)[:k]
    return [[int(i // H), int(i % H)] for i in order]


rng = np.random.default_rng(SEED)
repeated = repeated_random_tokens(rng, NUM_SEQUENCES, LENGTH, V, low=LOW, prefix=PREFIX)
text = load_shakespeare_text()
shakespeare = tokenizer.encode(text[int(0.9 * len(text)):])  # the validation split
window = 2 * LENGTH
count = MAP_SEQUENCES + PRUNE_WINDOWS + NUM_SEQUENCES
windows = shakespeare[:count * window].reshape(-1, window)
windows = np.concatenate([np.full((len(windows), 1), PREFIX, np.int64), windows], axis=1)
map_windows = windows[:MAP_SEQUENCES]
prune_windows = windows[MAP_SEQUENCES:MAP_SEQUENCES + PRUNE_WINDOWS]
confirm_windows = windows[MAP_SEQUENCES + PRUNE_WINDOWS:]  # as many as repeated sequences

# ---- scores --------------------------------------------------------------------------------
if wanted("scores"):
    clean = copy_loss_run(repeated, weights=True)
    names = ["previous_token", "first_token", "duplicate_token", "induction"]
    results["scores"] = {name: {"mean": rounded(clean["scores"][i].mean(axis=1)),
                                "std": rounded(clean["scores"][i].std(axis=1))}
                         for i, name in enumerate(names)}
    results["clean_copy_losses"] = {"first": mean_std(clean["first"]),
                                    "second": mean_std(clean["second"])}
    save()
    log(f"scores; clean losses {results['clean_copy_losses']}")
scores = {name: np.array(value["mean"]) for name, value in results["scores"].items()}
top_induction = top(scores["induction"], TOP_K)
top_previous = top(scores["previous_token"], TOP_K)

# ---- scores_check --------------------------------------------------------------------------
if wanted("scores_check"):
    CHECK_SEQUENCES = 10
    check = copy_loss_run(repeated[:CHECK_SEQUENCES], weights=True)
    names = ["previous_token", "first_token", "duplicate_token", "induction"]
    results["scores_check"] = {"num_sequences": CHECK_SEQUENCES,
                               **{name: rounded(check["scores"][i].mean(axis=1))
                                  for i, name in enumerate(names)}}
    save()
    log("scores_check")

# ---- induction_ablation --------------------------------------------------------------------
if wanted("induction_ablation"):
    draw_rng = np.random.default_rng(SEED + 1)
    others = [[layer, head] for layer in range(L) for head in range(H)
              if [layer, head] not in top_induction]
    ablated = copy_loss_run(repeated, top_induction)
    entry = {"heads": top_induction, "first": mean_std(ablated["first"]),
             "second": mean_std(ablated["second"]), "random": []}
    for _ in range(RANDOM_DRAWS):
        chosen = [others[i] for i in draw_rng.choice(len(others), TOP_K, replace=False)]
        run = copy_loss_run(repeated, chosen)
        entry["random"].append({"heads": chosen, "first": mean_std(run["first"]),
                                "second": mean_std(run["second"])})
        log(f"random draw: second-copy loss {entry['random'][-1]['second']}")
    results["induction_ablation"] = entry
    save()
    log(f"induction ablation: second-copy loss {entry['second']}")

# ---- k_composition -------------------------------------------------------------------------
if wanted("k_composition"):
    draw_rng = np.random.default_rng(SEED + 2)
    layers = sorted({layer for layer, _ in top_previous})
    pool = [[layer, head] for layer in layers for head in range(H)
            if [layer, head] not in top_previous]
    entry = {"previous_heads": top_previous}
    run = copy_loss_run(repeated, top_previous, weights=True)
    entry["induction"] = {"mean": rounded(run["scores"][3].mean(axis=1)),
                          "std": rounded(run["scores"][3].std(axis=1))}
    entry["second"] = mean_std(run["second"])
    entry["random"] = []
    for _ in range(max(2, RANDOM_DRAWS - 1)):
        chosen = [pool[i] for i in draw_rng.choice(len(pool), min(TOP_K, len(pool)),
                                                   replace=False)]
        run = copy_loss_run(repeated, chosen, weights=True)
        entry["random"].append({"heads": chosen,
                                "induction": {"mean": rounded(run["scores"][3].mean(axis=1))},
                                "second": mean_std(run["second"])})
        log("k-composition control draw")
    results["k_composition"] = entry
    save()
    log("k-composition")

# ---- patching ------------------------------------------------------------------------------
if wanted("patching"):
    prompt_rng = np.random.default_rng(SEED + 3)
    prompts, corrupted, correct, wrong = [], [], [], []
    for _ in range(NUM_PROMPTS):
        io, s = prompt_rng.choice(NAMES, 2, replace=False)
        place, thing = prompt_rng.choice(PLACES), prompt_rng.choice(OBJECTS)
        first, second = (io, s) if prompt_rng.random() < 0.5 else (s, io)
        fill = {"first": first, "second": second, "place": place, "thing": thing}
        prompts.append(TEMPLATE.format(subject=s, **fill))
        corrupted.append(TEMPLATE.format(subject=io, **fill))  # the other name repeated
        correct.append(int(tokenizer.encode(" " + io)[0]))
        wrong.append(int(tokenizer.encode(" " + s)[0]))
    clean_ids = np.stack([tokenizer.encode(p) for p in prompts])
    corrupt_ids = np.stack([tokenizer.encode(p) for p in corrupted])
    correct, wrong = np.array(correct), np.array(wrong)
    # One run of each kind over all prompts, recording what the sweeps copy and start from
    # (about 8 MB a layer).
    with capture(model, ["blocks.*.resid_pre", "blocks.*.attn.head_out"]) as clean_run:
        clean_ld = np.concatenate([logit_difference(model(clean_ids[part]), correct[part],
                                                    wrong[part])
                                   for part in batches(NUM_PROMPTS)])
    with capture(model, ["blocks.*.resid_pre"]) as corrupt_run:
        corrupt_ld = np.concatenate([logit_difference(model(corrupt_ids[part]), correct[part],
                                                      wrong[part])
                                     for part in batches(NUM_PROMPTS)])
    clean_points = {name: np.concatenate(clean_run.steps(name)) for name in clean_run}
    corrupt_points = {name: np.concatenate(corrupt_run.steps(name)) for name in corrupt_run}
    del clean_run, corrupt_run
    entry = {"template": TEMPLATE, "prompts": prompts, "corrupted": corrupted,
             "correct": correct.tolist(), "wrong": wrong.tolist(),
             "clean_ld": rounded(clean_ld, 3), "corrupt_ld": rounded(corrupt_ld, 3)}
    log(f"patching: clean LD {clean_ld.mean():.2f} +- {clean_ld.std():.2f}, corrupted "
        f"{corrupt_ld.mean():.2f}, correct {np.mean(clean_ld > 0):.2f}")

    def restored(layer, changes, prompts=slice(0, PATCH_PROMPTS)):
        """The patched logit differences, and the share of the clean one they restore."""
        start = corrupt_points[f"blocks.{layer}.resid_pre"][prompts]
        with intervene(model, changes):
            logits = forward_from_layer(model, start, layer, positions=-1)
        ld = logit_difference(logits, correct[prompts], wrong[prompts])
        base_clean, base_corrupt = clean_ld[prompts].mean(), corrupt_ld[prompts].mean()
        per_prompt = (ld - corrupt_ld[prompts]) / (clean_ld[prompts] - corrupt_ld[prompts])
        return ld, (ld.mean() - base_corrupt) / (base_clean - base_corrupt), per_prompt

    # The screen: the first PATCH_PROMPTS prompts.
    heads_map, heads_std = np.zeros((L, H)), np.zeros((L, H))
    for layer in range(L):
        source = clean_points[f"blocks.{layer}.attn.head_out"][:PATCH_PROMPTS]
        for head in range(H):
            _, heads_map[layer, head], per_prompt = restored(
                layer, {f"blocks.{layer}.attn.head_out": patch(source, heads=head)})
            heads_std[layer, head] = per_prompt.std()
    entry["heads"] = rounded(heads_map)
    # the spread over the screen's prompts of each prompt's own restored share
    entry["heads_prompt_std"] = rounded(heads_std)
    log(f"head patching: top {top(heads_map, 5)}")
    # The screen's top heads, and the two most negative, again on every prompt.
    entry["confirm"] = []
    for layer, head in top(heads_map, 5) + top(-heads_map, 2):
        source = clean_points[f"blocks.{layer}.attn.head_out"]
        patched, share, _ = restored(
            layer, {f"blocks.{layer}.attn.head_out": patch(source, heads=head)},
            slice(None))
        entry["confirm"].append({"head": [layer, head], "patched_ld": mean_std(patched),
                                 "restored": round(float(share), 4)})
        log(f"patching confirm {layer}.{head}: {entry['confirm'][-1]}")
    entry["tokens"] = tokenizer.token_strings(clean_ids[0])
    results["patching"] = entry
    save()

# ---- ablation_map --------------------------------------------------------------------------
if wanted("ablation_map"):
    sequences = np.concatenate([repeated[:MAP_SEQUENCES], map_windows])  # (2M, T)
    m = MAP_SEQUENCES
    with capture(model, ["blocks.*.resid_pre"]) as clean_run:
        logits = model(sequences)
    losses = per_position_loss(logits, sequences)
    del logits
    clean_second = copy_losses(losses[:m], LENGTH)[1]
    clean_text = losses[m:].mean(axis=-1)
    second_delta = np.zeros((L, H, m))
    text_delta = np.zeros((L, H, m))
    for layer in range(L):
        start = clean_run[f"blocks.{layer}.resid_pre"]
        for head in range(H):
            with intervene(model, head_changes([(layer, head)])):
                logits = forward_from_layer(model, start, layer)
            losses = per_position_loss(logits, sequences)
            second_delta[layer, head] = copy_losses(losses[:m], LENGTH)[1] - clean_second
            text_delta[layer, head] = losses[m:].mean(axis=-1) - clean_text
        log(f"ablation map, layer {layer}")
    results["ablation_map"] = {
        "second_copy_delta": rounded(second_delta), "text_delta": rounded(text_delta),
        "clean_second": rounded(clean_second), "clean_text": rounded(clean_text)}
    save()

# ---- ablation_confirm ----------------------------------------------------------------------
if wanted("ablation_confirm"):
    # The map is a screen on a few inputs; the heads it ranks highest, and the strongest
    # attention sinks, are measured again on every repeated sequence and as many windows.
    second_map = np.array(results["ablation_map"]["second_copy_delta"]).mean(axis=-1)
    text_map = np.array(results["ablation_map"]["text_delta"]).mean(axis=-1)
    chosen = []
    for head in (top(second_map, 8) + top(text_map, 5) + top(scores["first_token"], 3)
                 + top_induction):
        if head not in chosen:
            chosen.append(head)
    sequences = np.concatenate([repeated, confirm_windows])
    n = len(repeated)
    entry = {"heads": chosen, "second_copy_delta": [], "text_delta": []}
    clean_losses = []
    layers = sorted({layer for layer, _ in chosen})
    with capture(model, [f"blocks.{layer}.resid_pre" for layer in layers]) as clean_run:
        for part in batches(len(sequences)):
            clean_losses.append(per_position_loss(model(sequences[part]), sequences[part]))
    clean_losses = np.concatenate(clean_losses)
    clean_second = copy_losses(clean_losses[:n], LENGTH)[1]
    clean_text = clean_losses[n:].mean(axis=-1)
    entry["clean_second"] = mean_std(clean_second)
    entry["clean_text"] = mean_std(clean_text)
    starts = {layer: np.concatenate(clean_run.steps(f"blocks.{layer}.resid_pre"))
              for layer in layers}
    del clean_run
    for layer, head in chosen:
        losses = []
        for part in batches(len(sequences)):
            with intervene(model, head_changes([(layer, head)])):
                logits = forward_from_layer(model, starts[layer][part], layer)
            losses.append(per_position_loss(logits, sequences[part]))
        losses = np.concatenate(losses)
        entry["second_copy_delta"].append(
            mean_std(copy_losses(losses[:n], LENGTH)[1] - clean_second))
        entry["text_delta"].append(mean_std(losses[n:].mean(axis=-1) - clean_text))
        log(f"confirm {layer}.{head}: {entry['second_copy_delta'][-1]} {entry['text_delta'][-1]}")
    results["ablation_confirm"] = entry
    save()

# ---- pruning -------------------------------------------------------------------------------
if wanted("pruning"):
    text_effect = np.array(results["ablation_map"]["text_delta"]).mean(axis=-1)  # (L, H)
    order = np.argsort(text_effect, axis=None, kind="stable")  # least harmful first
    counts = [0, 9, 27, 54, 90, 135, 180, 270]
    entry = {"order": [[int(i // H), int(i % H)] for i in order], "counts": counts,
             "text_loss": [], "second_copy_loss": [], "text_delta": [], "text_lower": [],
             "second_copy_delta": []}
    intact_text = intact_second = None
    for count in counts:  # counts[0] == 0: the intact model first
        heads = entry["order"][:count]
        text_losses = []
        for part in batches(len(prune_windows)):
            with intervene(model, head_changes(heads)):
                logits = model(prune_windows[part])
            text_losses.append(per_position_loss(logits, prune_windows[part]).mean(axis=-1))
        text_losses = np.concatenate(text_losses)
        second = copy_loss_run(repeated, heads)["second"]
        if intact_text is None:
            intact_text, intact_second = text_losses, second
        entry["text_loss"].append(mean_std(text_losses))
        entry["second_copy_loss"].append(mean_std(second))
        # paired with the intact model on the same inputs
        entry["text_delta"].append(mean_std(text_losses - intact_text))
        entry["text_lower"].append(round(float(np.mean(text_losses < intact_text)), 4))
        entry["second_copy_delta"].append(mean_std(second - intact_second))
        log(f"pruning {count}: {entry['text_loss'][-1]}")
    # The control for the jump of the second-copy loss between 9 and 27 heads removed: the
    # same 27 heads without the strongest previous-token head among them.
    previous = [list(head) for head in top_previous if list(head) in entry["order"][:27]][:1]
    if previous:
        without = [head for head in entry["order"][:27] if head != previous[0]]
        entry["control_27"] = {"kept": previous[0], "second_copy_loss": mean_std(
            copy_loss_run(repeated, without)["second"])}
        log(f"pruning control: {entry['control_27']}")
    results["pruning"] = entry
    save()

# ---- residual patching (last: the longest sweep) -------------------------------------------
if "patching" in results and "resid_pre" not in results["patching"] and (
        args.parts is None or "patching" in args.parts.split(",")):
    if "restored" not in globals():
        raise SystemExit("rerun from the patching part: delete 'patching' from the file")
    T = clean_ids.shape[1]
    resid_map, resid_std = np.zeros((L, T)), np.zeros((L, T))
    for layer in range(L):
        source = clean_points[f"blocks.{layer}.resid_pre"][:PATCH_PROMPTS]
        for position in range(T):
            _, resid_map[layer, position], per_prompt = restored(
                layer, {f"blocks.{layer}.resid_pre": patch(source, positions=position)})
            resid_std[layer, position] = per_prompt.std()
        log(f"residual patching, layer {layer}")
    results["patching"]["resid_pre"] = rounded(resid_map)
    results["patching"]["resid_pre_prompt_std"] = rounded(resid_std)
    save()

if args.parts is None:  # a whole run (a run of chosen parts leaves the figure alone)
    results["settings"]["seconds"] = round(time.perf_counter() - began)
save()
log("done")
