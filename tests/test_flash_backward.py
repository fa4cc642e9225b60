"""tiled_attention_backward (chapter 13): the gradients of tiled attention, tile by tile.

The central claim: the tiled backward pass, which never holds the (Tq, Tk) weights, gives the
gradients of the dense backward pass of chapter 12 (``attention_backward``, which keeps them),
with causal, sliding-window, padding and general masks, grouped-query heads, tile sizes that
do not divide the lengths, fully masked rows and large logits. Agreement is measured as
``max |ours - dense| / max |dense|`` for each of dq, dk, dv: at most 1e-10 in float64, 1e-5 in
float32. A finite-difference check of the tiled forward pass ties the gradients to the
definition, independently of the dense code. Then: no NaN and no warning for queries that may
attend to nothing, dtypes kept, only the tiles that the causal, window or padding structure
cuts through masked (in both passes), bad input rejected naming the argument.
"""

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from model_helpers import allowed_pairs

from attention_lib import (
    flash,
    tiled_attention,
    tiled_attention_backward,
)
from attention_lib.training import attention_backward, attention_forward, numerical_gradient

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}


def relative_difference(ours, reference) -> float:
    """max |ours - reference| / max |reference| (0 if both are exactly zero)."""
    ours, reference = np.asarray(ours, np.float64), np.asarray(reference, np.float64)
    largest = np.abs(reference).max()
    difference = np.abs(ours - reference).max()
    return float(difference / largest) if largest > 0 else float(difference)




def dense_gradients(d_output, q, k, v, scale=None, **options):
    """Chapter 12's backward pass, which keeps the (Tq, Tk) weights."""
    allowed = allowed_pairs(q.shape[-2], k.shape[-2], **options)
    _, _, saved = attention_forward(q, k, v, mask=allowed, scale=scale)
    return attention_backward(d_output, saved)


def tiled_gradients(d_output, q, k, v, *, blocks=(4, 3), backward_blocks=None, **options):
    output, lse = tiled_attention(q, k, v, return_lse=True, block_q=blocks[0],
                                  block_k=blocks[1], **options)
    block_q, block_k = backward_blocks or blocks
    return tiled_attention_backward(d_output, q, k, v, output, lse, block_q=block_q,
                                    block_k=block_k, **options)


def problem(seed, batch=(2,), Tq=9, Tk=13, d_k=5, d_v=3, dtype=np.float64, kv_batch=None):
    rng = np.random.default_rng(seed)
    kv_batch = batch if kv_batch is None else kv_batch
    q = rng.standard_normal((*batch, Tq, d_k)).astype(dtype)
    k = rng.standard_normal((*kv_batch, Tk, d_k)).astype(dtype)
    v = rng.standard_normal((*kv_batch, Tk, d_v)).astype(dtype)
    d_output = rng.standard_normal((*batch, Tq, d_v)).astype(dtype)
    return d_output, q, k, v


def general_mask(seed, shape):
    mask = np.random.default_rng(seed).random(shape) > 0.5
    mask[..., 0, :] = False  # the first query of every sequence may attend to nothing
    return mask


OPTIONS = {
    "none": {},
    "causal": {"causal": True},
    "sliding window": {"causal": True, "window": 4},
    "window of 1": {"causal": True, "window": 1},
    "padding": {"key_lengths": np.array([13, 6])},
    "padding, a sequence with no keys": {"key_lengths": np.array([0, 7])},
    "causal + padding": {"causal": True, "key_lengths": np.array([5, 13])},
    "general mask": {"mask": general_mask(3, (2, 9, 13))},
    "general mask + window": {"causal": True, "window": 6, "mask": general_mask(4, (9, 13))},
    "scale": {"scale": 0.9},
}


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("blocks", [(4, 3), (1, 13), (16, 2)])
def test_tiled_backward_equals_the_dense_backward_in_float64(name, blocks):
    options = OPTIONS[name]
    d_output, q, k, v = problem(0)
    dense = dense_gradients(d_output, q, k, v, **options)
    tiled = tiled_gradients(d_output, q, k, v, blocks=blocks, **options)
    for ours, reference, array in zip(tiled, dense, (q, k, v)):
        assert ours.shape == array.shape and ours.dtype == np.float64
        assert relative_difference(ours, reference) <= TOLERANCE[np.float64]


@pytest.mark.parametrize("name", ["none", "causal", "sliding window", "general mask"])
def test_tiled_backward_equals_the_dense_backward_in_float32_and_keeps_float32(name):
    options = OPTIONS[name]
    d_output, q, k, v = problem(1, dtype=np.float32)
    dense = dense_gradients(*(a.astype(np.float64) for a in (d_output, q, k, v)), **options)
    tiled = tiled_gradients(d_output, q, k, v, **options)
    for ours, reference in zip(tiled, dense):
        assert ours.dtype == np.float32
        assert relative_difference(ours, reference) <= TOLERANCE[np.float32]


def test_the_backward_tile_sizes_need_not_be_those_of_the_forward():
    d_output, q, k, v = problem(2, Tq=20, Tk=20)
    reference = tiled_gradients(d_output, q, k, v, causal=True, blocks=(20, 20))
    for backward_blocks in [(3, 7), (1, 1), (32, 5)]:
        tiled = tiled_gradients(d_output, q, k, v, causal=True, blocks=(6, 4),
                                backward_blocks=backward_blocks)
        for ours, theirs in zip(tiled, reference):
            assert relative_difference(ours, theirs) <= 1e-12


def test_tiled_backward_matches_finite_differences_of_the_tiled_forward():
    # Independent of the dense code: the definition of the derivative, in float64.
    d_output, q, k, v = problem(3, batch=(), Tq=5, Tk=7, d_k=3, d_v=2)
    options = {"causal": True, "window": 3, "block_q": 2, "block_k": 3}

    def loss():
        return float(np.sum(tiled_attention(q, k, v, **options) * d_output))

    gradients = tiled_gradients(d_output, q, k, v, blocks=(2, 3), causal=True, window=3)
    for analytic, array in zip(gradients, (q, k, v)):
        numeric = numerical_gradient(loss, array)
        assert relative_difference(analytic, numeric) <= 1e-7


def test_grouped_query_heads_sum_the_key_and_value_gradients_over_their_group():
    # 6 query heads share 2 key/value heads: queries viewed as (H_kv, group) = (2, 3).
    d_output, q, k, v = problem(4, batch=(2, 2, 3), kv_batch=(2, 2, 1), Tq=7, Tk=7)
    dq, dk, dv = tiled_gradients(d_output, q, k, v, causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    # The same as repeating each key/value head for its group and summing the copies' grads.
    repeated = [np.repeat(a, 3, axis=-3) for a in (k, v)]
    dense = dense_gradients(d_output, q, *repeated, causal=True)
    assert relative_difference(dq, dense[0]) <= 1e-10
    for ours, copies in zip((dk, dv), dense[1:]):
        assert relative_difference(ours, copies.sum(axis=-3, keepdims=True)) <= 1e-10


def test_fully_masked_queries_and_unseen_keys_get_exactly_zero_gradients_without_warnings():
    d_output, q, k, v = problem(5)
    mask = np.ones((2, 9, 13), dtype=bool)
    mask[0, 4] = False  # query 4 of sequence 0 may attend to nothing
    mask[1, :, 10:] = False  # keys 10-12 of sequence 1 are seen by no query
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning (0 * inf, exp overflow) fails
        dq, dk, dv = tiled_gradients(d_output, q, k, v, mask=mask)
    for gradient in (dq, dk, dv):
        assert np.isfinite(gradient).all()
    assert (dq[0, 4] == 0).all()
    assert (dk[1, 10:] == 0).all() and (dv[1, 10:] == 0).all()
    assert np.abs(dq[0, 3]).min() > 0  # its neighbour does get a gradient


def test_a_sequence_with_no_keys_at_all_gets_zero_gradients():
    d_output, q, k, v = problem(6)
    dq, dk, dv = tiled_gradients(d_output, q, k, v, key_lengths=np.array([0, 13]))
    assert (dq[0] == 0).all() and (dk[0] == 0).all() and (dv[0] == 0).all()
    assert np.abs(dq[1]).max() > 0


def test_huge_logits_give_finite_gradients_equal_to_the_dense_ones():
    d_output, q, k, v = problem(7)
    q = 300.0 * q  # scores of several hundred: exp would overflow without the shift
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiled = tiled_gradients(d_output, q, k, v, causal=True)
    dense = dense_gradients(d_output, q, k, v, causal=True)
    for ours, reference in zip(tiled, dense):
        assert np.isfinite(ours).all()
        assert relative_difference(ours, reference) <= 1e-10


def test_keys_after_every_query_are_skipped_and_get_zero_gradients():
    # Causal with Tq < Tk: the queries are the last Tq positions, so every key is seen.
    # With a window, the first keys are seen by no query: their tiles are skipped.
    d_output, q, k, v = problem(8, Tq=4, Tk=12)
    dq, dk, dv = tiled_gradients(d_output, q, k, v, causal=True, window=3, blocks=(2, 2))
    assert (dk[:, :6] == 0).all() and (dv[:, :6] == 0).all()  # keys 0-5: outside every window
    assert np.abs(dv[:, 6:]).min() > 0


def record_tile_masks(monkeypatch):
    """For each tile the kernels compute: (q_start, k_start, whether it was masked)."""
    records = []
    original = flash._tile_mask

    def recording(*args):
        allowed = original(*args)
        records.append((args[7], args[1], allowed is not None))  # q_start, k_start
        return allowed

    monkeypatch.setattr(flash, "_tile_mask", recording)
    return records


def tile_masks_of_a_pass(monkeypatch, which, d_output, q, k, v, block, **options):
    """Run the forward or the backward pass with square tiles; return its tile records."""
    if which == "forward":
        records = record_tile_masks(monkeypatch)
        tiled_attention(q, k, v, block_q=block, block_k=block, **options)
    else:
        output, lse = tiled_attention(q, k, v, return_lse=True, **options)
        records = record_tile_masks(monkeypatch)  # from here on: the backward pass only
        tiled_attention_backward(d_output, q, k, v, output, lse, block_q=block,
                                 block_k=block, **options)
    return records


@pytest.mark.parametrize("which", ["forward", "backward"])
@pytest.mark.parametrize(("options", "T", "block"), [
    ({"causal": True}, 16, 4),
    ({"causal": True, "window": 16}, 64, 8),
    ({"causal": True, "window": 13}, 50, 7),
    ({"key_lengths": np.array([40, 24])}, 50, 8),
    ({"causal": True, "key_lengths": np.array([50, 30])}, 50, 8),
])
def test_only_tiles_that_the_structure_cuts_through_are_masked(monkeypatch, which, options,
                                                               T, block):
    d_output, q, k, v = problem(10, Tq=T, Tk=T)
    records = tile_masks_of_a_pass(monkeypatch, which, d_output, q, k, v, block, **options)
    allowed = np.broadcast_to(allowed_pairs(T, T, **options), (2, T, T))
    full, masked = 0, 0
    for q_start, k_start, was_masked in records:
        tile = allowed[:, q_start:q_start + block, k_start:k_start + block]
        # Skipping is by the causal and window structure; a tile of padding is masked.
        assert tile.any() or "key_lengths" in options
        assert was_masked == (not tile.all())  # masked exactly when some pair is blocked
        full, masked = full + (not was_masked), masked + was_masked
    assert full > 0 and masked > 0


def test_causal_attention_masks_only_the_tiles_on_the_diagonal(monkeypatch):
    d_output, q, k, v = problem(11, Tq=16, Tk=16)
    records = tile_masks_of_a_pass(monkeypatch, "backward", d_output, q, k, v, 4, causal=True)
    assert len(records) == 4 + 3 + 2 + 1  # of 16: the 6 above the diagonal are skipped
    assert sorted((q_start, k_start) for q_start, k_start, was_masked in records
                  if was_masked) == [(0, 0), (4, 4), (8, 8), (12, 12)]


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_tiles_that_padding_blocks_entirely_are_computed_with_a_mask_not_skipped(monkeypatch,
                                                                                which):
    # Chapter 13 says so: the kernels skip tiles by the causal and window structure only.
    d_output, q, k, v = problem(13, Tq=12, Tk=12)
    records = tile_masks_of_a_pass(monkeypatch, which, d_output, q, k, v, 4,
                                   key_lengths=np.array([4, 4]))  # keys 4-11: padding
    assert len(records) == 9  # every tile of the 3 x 3 grid
    assert sorted(k_start for _, k_start, was_masked in records if was_masked) == [4] * 3 + [8] * 3


@pytest.mark.parametrize("which", ["forward", "backward"])
def test_a_general_mask_is_applied_on_every_computed_tile(monkeypatch, which):
    d_output, q, k, v = problem(12, Tq=12, Tk=12)
    records = tile_masks_of_a_pass(monkeypatch, which, d_output, q, k, v, 4,
                                   mask=np.ones((12, 12), dtype=bool))
    assert len(records) == 9 and all(was_masked for *_, was_masked in records)


def test_bad_saved_tensors_are_rejected_naming_them():
    d_output, q, k, v = problem(9)
    output, lse = tiled_attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match=r"^d_output must have shape \(2, 9, 3\).*got \(9, 3\)"):
        tiled_attention_backward(d_output[0], q, k, v, output, lse)
    with pytest.raises(ValueError, match=r"^output must have shape"):
        tiled_attention_backward(d_output, q, k, v, output[..., :2], lse)
    with pytest.raises(ValueError, match=r"^lse must have shape \(2, 9\)"):
        tiled_attention_backward(d_output, q, k, v, output, lse[..., None])
    bad_lse = lse.copy()
    bad_lse[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^lse contains NaN"):
        tiled_attention_backward(d_output, q, k, v, output, bad_lse)
    bad_output = output.copy()
    bad_output[0, 0, 0] = -np.inf  # -inf is allowed in lse only
    with pytest.raises(ValueError, match=r"^output contains NaN or inf"):
        tiled_attention_backward(d_output, q, k, v, bad_output, lse)
    with pytest.raises(TypeError, match=r"^d_output must hold real numbers"):
        tiled_attention_backward(d_output.astype(str), q, k, v, output, lse)


def test_bad_options_are_rejected_as_in_the_forward_pass():
    d_output, q, k, v = problem(10)
    output, lse = tiled_attention(q, k, v, return_lse=True)
    arguments = (d_output, q, k, v, output, lse)
    with pytest.raises(ValueError, match=r"^window needs causal=True"):
        tiled_attention_backward(*arguments, window=3)
    with pytest.raises(ValueError, match=r"^block_k must be >= 1; got 0"):
        tiled_attention_backward(*arguments, block_k=0)
    with pytest.raises(TypeError, match=r"^mask must be boolean"):
        tiled_attention_backward(*arguments, mask=np.ones((9, 13)))
    with pytest.raises(ValueError, match=r"^key_lengths must be in \[0, Tk=13\]"):
        tiled_attention_backward(*arguments, key_lengths=np.array([3, 14]))
    with pytest.raises(ValueError, match=r"q has d_k=5 but k has d_k=4"):
        tiled_attention_backward(d_output, q, k[..., :4], v, output, lse)


# --------------------------------------------------------------------------- the benchmark file

ROOT = Path(__file__).resolve().parent.parent


def test_the_stored_benchmark_file_says_how_it_was_made_and_has_the_scripts_default_lengths():
    # Chapter 13 reads benchmarks/results/flash_backward_memory.json and prints its record.
    script = (ROOT / "benchmarks" / "flash_backward_memory.py").read_text()
    defaults = re.search(r'"--lengths", type=int, nargs="\+", default=\[([\d, ]+)\]', script)
    record = json.loads((ROOT / "benchmarks" / "results" / "flash_backward_memory.json")
                        .read_text())
    for field in ("command", "threads", "repeat", "single_run_from_T", "numpy", "system",
                  "processor", "cpu_count", "date_utc", "load_average_before",
                  "load_average_after", "matmul_gflops"):
        assert record[field] is not None, field
    assert [row["T"] for row in record["rows"]] == [int(n) for n in defaults[1].split(",")]
    tiled_bytes = [row["tiled_bytes"] for row in record["rows"]]
    dense_bytes = [row["dense_bytes"] for row in record["rows"]]
    assert all(dense >= 3 * row["T"] ** 2 * 4 for dense, row in zip(dense_bytes, record["rows"]))
    assert tiled_bytes[-1] < dense_bytes[-1] / 100  # the chapter's "158 times less"
