"""Head scores, losses and circuits (attention_lib.heads, chapter 18).

The scores are checked on hand-made attention patterns whose answer is known and against a
Python loop; the circuit functions against the big products they avoid forming; the
attributions against the model's own forward pass (they must sum to the logit difference);
and a part of attention_lib/data/smollm2_heads.json against a fresh SmolLM2 run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from model_helpers import HAVE_SMOLLM2_WEIGHTS, HAVE_TOKENIZERS, SMOLLM2_WEIGHTS_INSTALL, randomize

from attention_lib import DecoderOnlyLM
from attention_lib.heads import (
    copy_losses,
    direct_logit_attribution,
    duplicate_token_score,
    first_token_score,
    forward_from_layer,
    head_contributions,
    head_ov,
    induction_score,
    logit_difference,
    offset_score,
    ov_copying_ranks,
    per_position_loss,
    positive_eigenvalue_score,
    previous_token_score,
    repeated_random_tokens,
)
from attention_lib.hooks import capture, intervene, zero_ablate
from attention_lib.softmax import softmax

HEADS_JSON = Path(__file__).parent.parent / "attention_lib" / "data" / "smollm2_heads.json"


def pattern(T, keys):
    """Weights (T, T) where query i puts all its weight on key keys(i) (itself if None)."""
    weights = np.zeros((T, T))
    for i in range(T):
        j = keys(i)
        weights[i, i if j is None else j] = 1.0
    return weights


def random_weights(rng, shape):
    T = shape[-1]
    scores = rng.normal(size=shape)
    scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
    return softmax(scores, axis=-1)


def test_previous_token_head_scores_one_and_others_less():
    prev = pattern(8, lambda i: i - 1 if i else None)
    sink = pattern(8, lambda i: 0)
    weights = np.stack([prev, sink])  # (H=2, T, T)
    np.testing.assert_allclose(previous_token_score(weights), [1.0, 1 / 7])
    np.testing.assert_allclose(first_token_score(weights), [1 / 7, 1.0])


def test_induction_and_duplicate_heads_on_a_repeated_sequence():
    period, T = 5, 11  # a prefix, then two copies of 5
    induction = pattern(T, lambda i: i - period + 1 if i >= T - period else 0)
    duplicate = pattern(T, lambda i: i - period if i >= T - period else 0)
    weights = np.stack([induction, duplicate])
    np.testing.assert_allclose(induction_score(weights, period), [1.0, 0.0])
    np.testing.assert_allclose(duplicate_token_score(weights, period), [0.0, 1.0])


def test_offset_score_equals_a_loop_over_batch_heads_and_queries():
    rng = np.random.default_rng(0)
    weights = random_weights(rng, (3, 4, 9, 9))
    for offset, first in [(1, 0), (3, 5), (0, 2)]:
        expected = np.zeros((3, 4))
        for b in range(3):
            for h in range(4):
                queries = range(max(first, offset), 9)
                expected[b, h] = np.mean([weights[b, h, i, i - offset] for i in queries])
        np.testing.assert_allclose(offset_score(weights, offset, first), expected)


def test_scores_keep_float32():
    weights = random_weights(np.random.default_rng(1), (2, 6, 6)).astype(np.float32)
    assert previous_token_score(weights).dtype == np.float32


@pytest.mark.parametrize("call, message", [
    (lambda w: offset_score(w, 6), "offset=6"),
    (lambda w: induction_score(w, 4), "period"),
    (lambda w: induction_score(w, 1), "period >= 2"),
    (lambda w: previous_token_score(w[0, 0]), r"\(\.\.\., H, T, T\)"),
])
def test_bad_score_arguments_are_named(call, message):
    weights = random_weights(np.random.default_rng(2), (2, 6, 6))
    with pytest.raises(ValueError, match=message):
        call(weights)


def test_repeated_random_tokens_repeat_after_the_prefix():
    tokens = repeated_random_tokens(np.random.default_rng(0), 4, 7, 50, low=10, prefix=3)
    assert tokens.shape == (4, 15) and tokens.dtype == np.int64
    assert (tokens[:, 0] == 3).all()
    np.testing.assert_array_equal(tokens[:, 1:8], tokens[:, 8:])
    assert tokens[:, 1:].min() >= 10 and tokens.max() < 50
    with pytest.raises(ValueError, match="low"):
        repeated_random_tokens(np.random.default_rng(0), 4, 7, 50, low=50)


def test_per_position_loss_is_minus_log_probability_of_the_next_token():
    rng = np.random.default_rng(3)
    logits, tokens = rng.normal(size=(2, 5, 7)), rng.integers(0, 7, (2, 5))
    probs = softmax(logits, axis=-1)
    expected = [[-np.log(probs[b, t, tokens[b, t + 1]]) for t in range(4)] for b in range(2)]
    np.testing.assert_allclose(per_position_loss(logits, tokens), expected)
    # Any leading axes, computed one sequence at a time, and float32 kept.
    stacked = np.stack([logits, logits[::-1]]).astype(np.float32)  # (2, 2, 5, 7)
    both = per_position_loss(stacked, np.stack([tokens, tokens[::-1]]))
    assert both.shape == (2, 2, 4) and both.dtype == np.float32
    np.testing.assert_allclose(both[0], expected, rtol=1e-5)
    np.testing.assert_allclose(both[1], expected[::-1], rtol=1e-5)
    assert per_position_loss(logits[:0], tokens[:0]).shape == (0, 4)
    with pytest.raises(ValueError, match="must agree"):
        per_position_loss(logits, tokens[:, :4])


def test_copy_losses_average_the_predictions_of_each_copy():
    # T = 1 + 2 * 4 = 9 tokens: entry t predicts token t + 1. First copy = tokens 1..4, its
    # predictable tokens 2..4 are entries 1..3; second copy = tokens 5..8, entries 4..7.
    losses = np.arange(8.0)
    first, second = copy_losses(losses, 4)
    assert first == np.mean([1, 2, 3]) and second == np.mean([4, 5, 6, 7])


def test_head_ov_reads_the_shared_value_head_of_each_group():
    rng = np.random.default_rng(4)
    d, d_head, H, kv = 12, 2, 6, 2
    W_v, W_o = rng.normal(size=(d, kv * d_head)), rng.normal(size=(H * d_head, d))
    ov = head_ov(W_v, W_o, H, kv)
    for h in range(H):
        g = h // (H // kv)
        expected = W_v[:, g * d_head:(g + 1) * d_head] @ W_o[h * d_head:(h + 1) * d_head]
        np.testing.assert_allclose(ov[h], expected)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        head_ov(W_v, W_o, H, 4)


def test_positive_eigenvalue_score_equals_the_big_matrix_computation():
    rng = np.random.default_rng(5)
    left, right = rng.normal(size=(3, 20, 4)), rng.normal(size=(3, 4, 20))
    for b in range(3):
        eigenvalues = np.linalg.eigvals(left[b] @ right[b])
        expected = eigenvalues.real.sum() / np.abs(eigenvalues).sum()
        np.testing.assert_allclose(positive_eigenvalue_score(left, right)[b], expected,
                                   atol=1e-9)
    basis = np.linalg.qr(rng.normal(size=(20, 4)))[0]
    assert positive_eigenvalue_score(basis, basis.T) == pytest.approx(1.0)
    assert positive_eigenvalue_score(basis, -basis.T) == pytest.approx(-1.0)


def test_ov_copying_ranks_are_zero_for_a_copying_map_and_not_for_a_shift():
    rng = np.random.default_rng(6)
    embedding = np.linalg.qr(rng.normal(size=(16, 16)))[0][:10]  # 10 orthonormal tokens
    ids = np.arange(10)
    assert (ov_copying_ranks(embedding, np.eye(16), embedding, ids) == 0).all()
    shift = embedding.T @ np.roll(np.eye(10), 1, axis=1) @ embedding  # token k -> k + 1
    assert (ov_copying_ranks(embedding, shift, embedding, ids) > 0).all()


def test_logit_difference_takes_the_last_position():
    logits = np.zeros((2, 3, 5))
    logits[0, -1, 1], logits[1, -1, 4], logits[1, 0, 2] = 2.0, 3.0, 9.0
    np.testing.assert_allclose(logit_difference(logits, np.array([1, 2]), np.array([0, 4])),
                               [2.0, -3.0])


def small_lm(seed=0):
    rng = np.random.default_rng(seed)
    model = DecoderOnlyLM.init(23, 16, 4, 32, 3, rng, num_kv_heads=2, dtype=np.float64)
    return randomize(model, rng)


def test_forward_from_layer_equals_the_forward_pass():
    model, tokens = small_lm(), np.random.default_rng(7).integers(0, 23, (2, 6))
    with capture(model, "blocks.*.resid_pre") as recording:
        logits = model(tokens)
    for layer in range(3):
        start = recording[f"blocks.{layer}.resid_pre"]
        np.testing.assert_allclose(forward_from_layer(model, start, layer), logits,
                                   rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(forward_from_layer(model, start, 2, positions=-1),
                               logits[:, -1], rtol=1e-12, atol=1e-12)
    with intervene(model, {"blocks.1.attn.head_out": zero_ablate(3)}):
        ablated = model(tokens)
        partial = forward_from_layer(model, recording["blocks.1.resid_pre"], 1)
    np.testing.assert_allclose(partial, ablated, rtol=1e-12, atol=1e-12)
    assert not np.allclose(ablated, logits)


def test_direct_logit_attributions_sum_to_the_logit_difference():
    # A stand-in for RMSNorm's final norm: DecoderOnlyLM's is a LayerNorm, so the test swaps
    # in an RMSNorm to match SmolLM2.
    from attention_lib.layers import RMSNorm

    model, rng = small_lm(1), np.random.default_rng(8)
    model.norm = RMSNorm(1.0 + 0.3 * rng.normal(size=16), 1e-5)
    tokens = rng.integers(0, 23, (3, 5))
    with capture(model) as recording:
        logits = model(tokens)
    correct, wrong = np.array([1, 2, 3]), np.array([4, 5, 6])
    terms = [model.embed(tokens)[:, -1, None]]  # (B, 1, d)
    for layer, block in enumerate(model.blocks):
        heads = recording[f"blocks.{layer}.attn.head_out"]
        per_head = head_contributions(heads, block.self_attn.W_o)  # (B, H, T, d)
        np.testing.assert_allclose(per_head.sum(axis=1) + block.self_attn.b_o,
                                   recording[f"blocks.{layer}.attn_out"], atol=1e-12)
        terms += [per_head[:, :, -1], np.broadcast_to(block.self_attn.b_o, (3, 1, 16)),
                  recording[f"blocks.{layer}.ff_out"][:, -1, None]]
    terms = np.concatenate(terms, axis=1)  # (B, n, d)
    final = recording["blocks.2.resid_post"][:, -1]
    directions = (model.W_out[:, correct] - model.W_out[:, wrong]).T
    parts = direct_logit_attribution(terms, final, model.norm.gamma, directions, 1e-5)
    np.testing.assert_allclose(parts.sum(axis=-1), logit_difference(logits, correct, wrong),
                               rtol=1e-10)


@pytest.mark.skipif(not (HAVE_SMOLLM2_WEIGHTS and HAVE_TOKENIZERS),
                    reason=f"weights not installed ({SMOLLM2_WEIGHTS_INSTALL})")
def test_the_stored_head_scores_match_a_fresh_smollm2_run():
    """Recompute the four mean score maps of the first 10 of the script's repeated sequences
    (``scores_check`` in attention_lib/data/smollm2_heads.json, one forward pass of 10 short
    sequences: a few seconds), and check that the file's parts agree with each other."""
    from attention_lib.models.smollm2 import load_smollm2

    stored = json.loads(HEADS_JSON.read_text())
    settings, check = stored["settings"], stored["scores_check"]
    model, _ = load_smollm2()
    tokens = repeated_random_tokens(np.random.default_rng(settings["seed"]),
                                    settings["num_sequences"], settings["length"],
                                    model.config.vocab_size, low=settings["low"],
                                    prefix=settings["prefix"])[:check["num_sequences"]]
    period = settings["length"]
    with capture(model, "blocks.*.attn.weights") as recording:
        model(tokens)
    weights = recording.stack("attn.weights")  # (L, 10, H, T, T)
    fresh = [previous_token_score(weights), first_token_score(weights),
             duplicate_token_score(weights, period), induction_score(weights, period)]
    names = ["previous_token", "first_token", "duplicate_token", "induction"]
    for name, scores in zip(names, fresh):  # scores: (L, 10, H); stored to 4 decimals
        np.testing.assert_allclose(scores.mean(axis=1), check[name], atol=2e-4, err_msg=name)
    assert fresh[3].mean(axis=1).max() > 0.5  # an induction head exists: not two maps of zeros
    # The 100-sequence means the chapter and the ablations use: the mean of 10 of those
    # sequences lies within 5 standard errors (std over the 100 / sqrt(10)) of them.
    for name, scores in zip(names, fresh):
        mean, std = (np.array(stored["scores"][name][key]) for key in ("mean", "std"))
        assert np.all(np.abs(scores.mean(axis=1) - mean) <= 5 * std / np.sqrt(10) + 0.01), name
    induction = np.array(stored["scores"]["induction"]["mean"])
    top = [list(divmod(int(i), induction.shape[1])) for i in np.argsort(-induction, axis=None)[:10]]
    assert top == stored["induction_ablation"]["heads"]
