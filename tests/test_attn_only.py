"""The attention-only transformer of chapter 18: its two forward passes agree, its gradients
equal PyTorch's autograd and finite differences, its data repeat a segment at varying places,
and scripts/train_induction_formation.py is seeded.
"""

from __future__ import annotations

import importlib.util
import json
import math
import pathlib

import numpy as np
import pytest
from model_helpers import randomize

from attention_lib.training import check_gradients, cross_entropy_forward
from attention_lib.training.attn_only import (
    AttentionOnlyLM,
    attn_only_forward,
    attn_only_loss_and_grads,
    copy_positions,
    head_scores,
    repeated_segment_batch,
    segment_scores,
)
from attention_lib.training.gpt import induction_probe, repeated_random_sequences

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "train_induction_formation.py"
RECORD = ROOT / "attention_lib" / "data" / "induction_formation.json"


def small_model(seed: int = 0, vocab_size: int = 7, context_len: int = 6, d_model: int = 8,
                num_heads: int = 2) -> AttentionOnlyLM:
    """A tiny model with every parameter random (no gamma left at 1, no bias at 0)."""
    rng = np.random.default_rng(seed)
    model = AttentionOnlyLM.init(vocab_size, context_len, d_model, num_heads, 2, rng)
    return randomize(model, rng)


def load_script():
    spec = importlib.util.spec_from_file_location("train_induction_formation", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the model


def test_parameters_are_named_by_layer():
    names = set(small_model().parameters())
    assert {"embedding", "positions", "W_out", "final_norm.gamma", "layers.0.W_q",
            "layers.1.W_o", "norms.1.beta"} <= names
    assert not any(name.startswith(("ff", "blocks")) for name in names)  # no feed-forward


def test_functional_forward_equals_the_library_layers():
    model = small_model()
    ids = np.random.default_rng(1).integers(0, 7, size=(3, 6))
    logits, weights = model.forward(ids, return_weights=True)
    functional_logits, functional_weights, _ = attn_only_forward(model, ids)
    np.testing.assert_allclose(functional_logits, logits, rtol=1e-12, atol=1e-12)
    for ours, library in zip(functional_weights, weights):
        np.testing.assert_allclose(ours, library, rtol=1e-12, atol=1e-12)


def test_the_model_is_causal():
    model = small_model()
    ids = np.random.default_rng(2).integers(0, 7, size=(1, 6))
    changed = ids.copy()
    changed[0, 4] = (ids[0, 4] + 1) % 7
    np.testing.assert_allclose(model.forward(changed)[0, :4], model.forward(ids)[0, :4],
                               rtol=1e-12, atol=1e-12)
    assert not np.allclose(model.forward(changed)[0, 4], model.forward(ids)[0, 4])


@pytest.mark.parametrize("ids, message", [
    (np.zeros(6, dtype=int), "integer array"),
    (np.zeros((2, 7), dtype=int), "context_len=6"),
    (np.full((2, 3), 7), r"\[0, 7\)"),
])
def test_bad_ids_are_named(ids, message):
    with pytest.raises(ValueError, match=message):
        small_model().forward(ids)


def test_gradients_match_finite_differences():
    model = small_model(3)
    rng = np.random.default_rng(4)
    ids, targets = rng.integers(0, 7, size=(2, 6)), rng.integers(0, 7, size=(2, 6))
    _, grads = attn_only_loss_and_grads(model, ids, targets)
    params = model.parameters()
    assert grads.keys() == params.keys()

    def loss():
        return cross_entropy_forward(model.forward(ids), targets)[0]

    errors = check_gradients(loss, params, grads)
    assert max(errors.values()) < 1e-6, {k: v for k, v in errors.items() if v >= 1e-6}


def test_gradients_equal_torch_autograd():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    model = small_model(5, vocab_size=11, context_len=9, d_model=12, num_heads=3)
    rng = np.random.default_rng(6)
    ids, targets = rng.integers(0, 11, size=(3, 9)), rng.integers(0, 11, size=(3, 9))
    loss, grads = attn_only_loss_and_grads(model, ids, targets)

    leaves = {name: torch.tensor(param, dtype=torch.float64, requires_grad=True)
              for name, param in model.parameters().items()}
    T, d, H = 9, 12, 3
    x = leaves["embedding"][torch.from_numpy(ids)] + leaves["positions"][:T]
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    for index in range(2):
        p = {name.split(".", 2)[2]: leaf for name, leaf in leaves.items()
             if name.startswith(f"layers.{index}.")}
        normed = F.layer_norm(x, (d,), leaves[f"norms.{index}.gamma"],
                              leaves[f"norms.{index}.beta"], eps=model.norms[index].eps)

        def heads(W, b, normed=normed):  # (B, T, d) -> (B, H, T, d / H)
            return (normed @ W + b).reshape(3, T, H, d // H).transpose(1, 2)

        q, k, v = (heads(p[f"W_{n}"], p[f"b_{n}"]) for n in "qkv")
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d // H)).masked_fill(~allowed,
                                                                           float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(3, T, d)
        x = x + attended @ p["W_o"] + p["b_o"]
    x = F.layer_norm(x, (d,), leaves["final_norm.gamma"], leaves["final_norm.beta"],
                     eps=model.final_norm.eps)
    t_loss = F.cross_entropy((x @ leaves["W_out"]).reshape(-1, 11),
                             torch.from_numpy(targets).reshape(-1))
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-12)
    for name, leaf in leaves.items():
        np.testing.assert_allclose(grads[name], leaf.grad.numpy(), rtol=1e-9, atol=1e-12,
                                   err_msg=name)


def test_float32_model_keeps_its_dtype_and_agrees_with_float64():
    model64 = small_model(9)
    model32 = AttentionOnlyLM.init(7, 6, 8, 2, 2, np.random.default_rng(0), dtype=np.float32)
    for name, param in model32.parameters().items():
        param[...] = model64.parameters()[name]
    rng = np.random.default_rng(10)
    ids, targets = rng.integers(0, 7, size=(2, 6)), rng.integers(0, 7, size=(2, 6))
    loss64, grads64 = attn_only_loss_and_grads(model64, ids, targets)
    loss32, grads32 = attn_only_loss_and_grads(model32, ids, targets)
    assert loss32 == pytest.approx(loss64, rel=1e-5)
    for name, grad in grads32.items():
        assert grad.dtype == np.float32, name
        scale = np.abs(grads64[name]).max()
        np.testing.assert_allclose(grad, grads64[name], atol=1e-4 * scale + 1e-7, err_msg=name)


# --------------------------------------------------------------------------- data and scores


def test_each_row_repeats_a_segment_of_distinct_tokens_at_a_varying_offset():
    ids, sources, copies, lengths = repeated_segment_batch(
        np.random.default_rng(0), 64, 47, 32, 4, 24, return_positions=True)
    assert ids.shape == (64, 48) and ids.min() >= 0 and ids.max() < 32
    assert lengths.min() >= 4 and lengths.max() <= 24
    assert np.all(copies >= sources + lengths) and np.all(copies + lengths <= 48)
    for row, start, copy, length in zip(ids, sources, copies, lengths):
        segment = row[start:start + length]
        assert len(set(segment)) == length  # distinct: each token's successor is unique
        np.testing.assert_array_equal(row[copy:copy + length], segment)
    # No fixed offset finds the copy: the offsets of the 64 rows take many values.
    assert len(set(copies - sources)) >= 15
    np.testing.assert_array_equal(
        ids, repeated_segment_batch(np.random.default_rng(0), 64, 47, 32, 4, 24))


def test_background_follows_the_rule_two_tokens_back():
    follow = np.random.default_rng(1).permutation(20)
    ids, sources, copies, lengths = repeated_segment_batch(
        np.random.default_rng(2), 16, 23, 20, 2, 4, follow=follow, follow_prob=1.0,
        return_positions=True)
    positions = np.arange(24)
    in_segment = (((positions >= sources[:, None]) & (positions < (sources + lengths)[:, None]))
                  | ((positions >= copies[:, None]) & (positions < (copies + lengths)[:, None])))
    background = ~in_segment[:, 2:] & ~in_segment[:, :-2]  # t and t - 2 outside the segments
    assert background.sum() > 100
    np.testing.assert_array_equal(ids[:, 2:][background], follow[ids[:, :-2]][background])
    # With probability 0 the rule is never used: the tokens are those drawn without it
    # (the same generator draws, plus one uniform draw per token).
    plain = repeated_segment_batch(np.random.default_rng(2), 16, 23, 20, 2, 4, follow=follow,
                                   follow_prob=0.0)
    agree = (plain[:, 2:] == follow[plain[:, :-2]]).mean()
    assert agree < 0.2


@pytest.mark.parametrize("follow, follow_prob, message", [
    (np.arange(19), 0.5, "follow must hold"), (np.arange(20) + 1, 0.5, "follow must hold"),
    (np.arange(20), 1.5, "follow_prob")])
def test_bad_follow_rules_are_named(follow, follow_prob, message):
    with pytest.raises(ValueError, match=message):
        repeated_segment_batch(np.random.default_rng(0), 2, 23, 20, 2, 4, follow=follow,
                               follow_prob=follow_prob)


def test_segment_batch_is_seeded():
    first = repeated_segment_batch(np.random.default_rng(3), 4, 19, 10, 2, 10)
    np.testing.assert_array_equal(first,
                                  repeated_segment_batch(np.random.default_rng(3), 4, 19, 10,
                                                         2, 10))


@pytest.mark.parametrize("seq_len, vocab_size, min_segment, max_segment", [
    (20, 32, 4, 11), (47, 16, 4, 24), (47, 32, 10, 8)])
def test_segment_batch_rejects_segments_that_cannot_fit(seq_len, vocab_size, min_segment,
                                                        max_segment):
    with pytest.raises(ValueError, match="max_segment"):
        repeated_segment_batch(np.random.default_rng(0), 2, seq_len, vocab_size, min_segment,
                               max_segment)


def test_head_scores_of_hand_made_patterns():
    half, T = 4, 8
    previous_head = np.eye(T, k=-1)
    previous_head[0, 0] = 1.0
    induction_head = np.eye(T)
    queries = np.arange(half, T)
    induction_head[queries] = 0.0
    induction_head[queries, queries - half + 1] = 1.0
    weights = [np.stack([previous_head, induction_head])[None]]  # one layer of two heads
    previous, induction = head_scores(weights, half)
    np.testing.assert_allclose(previous, [[1.0, 0.0]])
    np.testing.assert_allclose(induction, [[0.0, 1.0]])


def test_head_scores_equal_the_chapter_14_probe():
    model = AttentionOnlyLM.init(16, 12, 8, 2, 2, np.random.default_rng(7))
    probe = induction_probe(model, np.random.default_rng(8), num_sequences=5)
    ids = repeated_random_sequences(np.random.default_rng(8), 5, 6, 16)
    _, weights = model.forward(ids, return_weights=True)
    previous, induction = head_scores(weights, 6)
    np.testing.assert_allclose(previous, probe["previous_token_scores"], rtol=1e-12)
    np.testing.assert_allclose(induction, probe["induction_scores"], rtol=1e-12)


def test_copy_positions_point_from_the_copy_to_the_token_after_the_first_occurrence():
    ids, sources, copies, lengths = repeated_segment_batch(
        np.random.default_rng(11), 32, 47, 32, 4, 12, return_positions=True)
    rows, queries, keys = copy_positions(sources, copies, lengths, 47)
    assert len(rows) == (lengths - 1).sum()
    # the query's token occurred at key - 1; the token after it (the key) is the next token
    np.testing.assert_array_equal(ids[rows, queries], ids[rows, keys - 1])
    np.testing.assert_array_equal(ids[rows, queries + 1], ids[rows, keys])
    assert np.all(keys <= queries)  # causal: the answer is visible to the query


def test_copy_positions_reject_mismatched_rows():
    with pytest.raises(ValueError, match="one entry per row"):
        copy_positions(np.array([0, 1]), np.array([5]), np.array([3]), 10)


def test_segment_scores_of_hand_made_patterns():
    T = 10
    rows, queries, keys = copy_positions(np.array([1, 0]), np.array([6, 5]), np.array([3, 4]), T)
    previous_head = np.eye(T, k=-1)
    previous_head[0, 0] = 1.0
    induction_head = np.tile(np.eye(T), (2, 1, 1))  # (B, T, T)
    induction_head[rows, queries] = 0.0
    induction_head[rows, queries, keys] = 1.0
    weights = [np.stack([np.tile(previous_head, (2, 1, 1)), induction_head], axis=1)]
    previous, induction = segment_scores(weights, rows, queries, keys)
    np.testing.assert_allclose(previous, [[1.0, 0.0]])
    np.testing.assert_allclose(induction, [[0.0, 1.0]])


# --------------------------------------------------------------------------- the training script


def test_the_training_script_reproduces_the_first_steps_of_its_record():
    """The first steps of the first seed, re-run, give the losses and the step-0 probe the
    committed JSON holds; they start near ln V (an untrained model guesses uniformly)."""
    script = load_script()
    record = json.loads(RECORD.read_text())
    config = record["config"]
    assert config == script.CONFIG  # the record was made with the script's settings
    seed = record["seeds"][0]
    stored = record["runs"][str(seed)]
    short = script.run(seed, config, num_steps=config["exact_steps"])
    np.testing.assert_allclose(short["first_step_losses"], stored["first_step_losses"],
                               rtol=1e-4)
    assert short["probes"][0]["step"] == stored["probes"][0]["step"] == 0
    for key in ("loss_copy", "loss_other", "previous_token_scores", "induction_scores",
                "repeat_induction_scores"):
        np.testing.assert_allclose(short["probes"][0][key], stored["probes"][0][key],
                                   atol=2e-4, err_msg=key)
    assert abs(short["first_step_losses"][0] - math.log(config["vocab_size"])) < 0.05
    assert abs(short["probes"][0]["loss_copy"] - math.log(config["vocab_size"])) < 0.05


def test_the_record_shows_the_formation_it_is_cited_for():
    """In every seed of the record: a layer-0 previous-token head forms before a layer-1
    induction head, and by the end the second-copy loss is far below the rest."""
    record = json.loads(RECORD.read_text())
    assert len(record["seeds"]) >= 3
    for seed in record["seeds"]:
        run = record["runs"][str(seed)]
        assert run["previous_token_step"] is not None and run["induction_step"] is not None
        assert run["previous_token_step"] < run["induction_step"]
        last = run["probes"][-1]
        assert max(last["induction_scores"][1]) > record["config"]["score_threshold"]
        assert last["loss_copy"] < last["loss_other"] - 1.0


def test_phase_change_and_threshold_steps():
    script = load_script()
    assert script.phase_change_step([0, 50, 100, 150, 200], [4.0, 3.9, 2.9, 1.0, 0.5]) == 150
    assert script.first_step_above([0, 50, 100], [0.1, 0.6, 0.9], 0.5) == 50
    assert script.first_step_above([0, 50, 100], [0.1, 0.2, 0.3], 0.5) is None
