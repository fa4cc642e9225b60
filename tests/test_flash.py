"""online_softmax, sliding_window_mask and tiled_attention (chapter 11).

The central claim: tiled attention with the online softmax is *exact*. Over random shapes,
tile sizes that do not divide the lengths, causal / sliding-window / padding / general masks,
fully masked rows and extreme logits it gives the output of scaled_dot_product_attention
(float64: 1e-10, float32: 1e-5), and its log-sum-exp is that of the masked scaled scores
(-inf for a query that may attend to nothing). Then: tiles that the causal or window structure
blocks are not computed, dtypes are kept, and bad input raises naming the argument.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from model_helpers import allowed_pairs
from scipy.special import logsumexp

import attention_lib.flash as flash
from attention_lib import (
    causal_mask,
    online_softmax,
    peak_extra_bytes,
    scaled_dot_product_attention,
    sliding_window_mask,
    softmax,
    tiled_attention,
    tiled_attention_backward,
)

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}


def naive_reference(q, k, v, *, causal=False, key_lengths=None, window=None, mask=None,
                    scale=None):
    """The whole (Tq, Tk) matrix: build the combined mask, run scaled_dot_product_attention,
    and take scipy's logsumexp of the masked, scaled scores (-inf where nothing is allowed)."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    allowed = allowed_pairs(Tq, Tk, causal=causal, window=window, key_lengths=key_lengths,
                            mask=mask)
    output, _ = scaled_dot_product_attention(q, k, v, mask=allowed, scale=scale)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * (q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64))
    masked = np.where(allowed, scores, -np.inf)
    lse = logsumexp(masked, axis=-1)  # -inf for a fully masked row, no warning
    return output, lse


def assert_close(actual, expected, dtype):
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance)


# --------------------------------------------------------------------------- online_softmax


@given(
    row=st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=30),
    block_size=st.integers(1, 12),
)
def test_online_softmax_equals_softmax_for_every_block_size(row, block_size):
    row = np.array(row)
    np.testing.assert_allclose(online_softmax(row, block_size), softmax(row),
                               rtol=1e-12, atol=1e-300)


@given(
    row=st.lists(st.one_of(st.floats(-50, 50), st.just(-np.inf)), min_size=1, max_size=20),
    block_size=st.integers(1, 6),
)
def test_online_softmax_treats_minus_infinity_as_weight_zero(row, block_size):
    row = np.array(row)
    result = online_softmax(row, block_size)
    assert np.isfinite(result).all()
    assert (result[np.isneginf(row)] == 0).all()
    if np.isneginf(row).all():
        np.testing.assert_array_equal(result, np.zeros_like(row))  # the masked-row rule
    else:
        np.testing.assert_allclose(result, softmax(row), rtol=1e-12, atol=1e-300)


def test_online_softmax_of_a_row_whose_maximum_comes_last_rescales_the_early_blocks():
    # The first block's sum is computed against max 1, then rescaled by exp(1 - 1000).
    row = np.array([0.0, 1.0, 1000.0, 2.0])
    np.testing.assert_allclose(online_softmax(row, block_size=2), softmax(row), rtol=1e-14)
    assert online_softmax(row, block_size=2)[2] == pytest.approx(1.0)


def test_online_softmax_rejects_a_two_dimensional_input_and_a_bad_block_size():
    with pytest.raises(ValueError, match=r"one row.*\(2, 3\)"):
        online_softmax(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"^block_size must be >= 1; got 0"):
        online_softmax([1.0, 2.0], block_size=0)
    with pytest.raises(TypeError, match=r"^block_size must be an integer"):
        online_softmax([1.0, 2.0], block_size=2.0)


# --------------------------------------------------------------------------- sliding windows


@pytest.mark.parametrize(("Tq", "Tk", "window"), [(6, 6, 1), (6, 6, 3), (4, 9, 2), (5, 5, 5),
                                                  (3, 3, 10), (1, 7, 4)])
def test_sliding_window_mask_lets_query_i_see_keys_i_minus_window_plus_1_to_i(Tq, Tk, window):
    mask = sliding_window_mask(Tq, Tk, window=window)
    assert mask.shape == (Tq, Tk) and mask.dtype == bool
    for row in range(Tq):
        i = row + Tk - Tq  # queries are the last Tq positions, as in causal_mask
        expected = [i - window < j <= i for j in range(Tk)]
        np.testing.assert_array_equal(mask[row], expected)


@pytest.mark.parametrize("T", [1, 4, 9])
def test_a_window_as_long_as_the_sequence_is_the_causal_mask_and_window_1_the_diagonal(T):
    np.testing.assert_array_equal(sliding_window_mask(T, window=T), causal_mask(T))
    np.testing.assert_array_equal(sliding_window_mask(T, window=T + 5), causal_mask(T))
    np.testing.assert_array_equal(sliding_window_mask(T, window=1), np.eye(T, dtype=bool))


def test_every_query_of_a_sliding_window_sees_at_most_window_keys():
    mask = sliding_window_mask(12, window=4)
    np.testing.assert_array_equal(mask.sum(axis=-1), np.minimum(np.arange(1, 13), 4))


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [({"Tq": 4, "window": 0}, ValueError, r"^window must be >= 1"),
     ({"Tq": 4, "window": 2.5}, TypeError, r"^window must be an integer"),
     ({"Tq": 0, "window": 2}, ValueError, r"^Tq must be >= 1"),
     ({"Tq": 5, "Tk": 3, "window": 2}, ValueError, r"^Tq=5 > Tk=3")],
)
def test_sliding_window_mask_rejects_bad_sizes_naming_them(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        sliding_window_mask(**kwargs)


# --------------------------------------------------------------------------- tiled == naive


@st.composite
def attention_problems(draw, dtype=np.float64):
    """Random q, k, v with batch dims, lengths, tile sizes and any combination of masks."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    Tq = draw(st.integers(1, 17))
    Tk = draw(st.integers(1, 17))
    d_k, d_v = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    causal = draw(st.booleans()) and Tq <= Tk
    window = draw(st.one_of(st.none(), st.integers(1, Tk + 2))) if causal else None
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spread = draw(st.sampled_from([1.0, 10.0]))  # 10: sharp, nearly one-hot rows
    q = (spread * rng.standard_normal((*batch, Tq, d_k))).astype(dtype)
    k = rng.standard_normal((*batch, Tk, d_k)).astype(dtype)
    v = rng.standard_normal((*batch, Tk, d_v)).astype(dtype)
    key_lengths = None
    if draw(st.booleans()):
        key_lengths = rng.integers(0, Tk + 1, size=batch)  # 0: a fully padded sequence
    mask = None
    if draw(st.booleans()):
        mask_shape = draw(st.sampled_from([(Tq, Tk), (*batch, Tq, Tk), (Tq, 1), (1, Tk)]))
        mask = rng.random(mask_shape) < draw(st.sampled_from([0.3, 0.8]))
    kwargs = {"causal": causal, "window": window, "key_lengths": key_lengths, "mask": mask,
              "scale": draw(st.sampled_from([None, 0.5]))}
    blocks = {"block_q": draw(st.integers(1, 8)), "block_k": draw(st.integers(1, 8))}
    return q, k, v, kwargs, blocks


@given(problem=attention_problems())
def test_tiled_attention_equals_naive_attention_in_float64(problem):
    q, k, v, kwargs, blocks = problem
    output, lse = tiled_attention(q, k, v, **kwargs, **blocks, return_lse=True)
    expected_output, expected_lse = naive_reference(q, k, v, **kwargs)
    assert output.shape == expected_output.shape and output.dtype == np.float64
    assert lse.shape == expected_lse.shape == output.shape[:-1]
    assert_close(output, expected_output, np.float64)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(expected_lse))
    finite = np.isfinite(expected_lse)
    assert_close(lse[finite], expected_lse[finite], np.float64)


@given(problem=attention_problems(dtype=np.float32))
def test_tiled_attention_equals_naive_attention_in_float32(problem):
    q, k, v, kwargs, blocks = problem
    output, lse = tiled_attention(q, k, v, **kwargs, **blocks, return_lse=True)
    expected_output, expected_lse = naive_reference(q, k, v, **kwargs)
    assert output.dtype == lse.dtype == np.float32
    assert_close(output, expected_output, np.float32)
    finite = np.isfinite(expected_lse)
    np.testing.assert_array_equal(np.isneginf(lse), ~finite)
    assert_close(lse[finite], expected_lse[finite], np.float32)


@pytest.mark.parametrize(("Tq", "Tk", "block_q", "block_k"),
                         [(10, 10, 3, 4), (13, 29, 5, 7), (29, 29, 8, 6), (7, 7, 100, 100),
                          (9, 11, 1, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_tile_sizes_need_not_divide_the_lengths(Tq, Tk, block_q, block_k, causal):
    rng = np.random.default_rng(Tq * Tk)
    q, k, v = (rng.standard_normal((2, T, 8)) for T in (Tq, Tk, Tk))
    output = tiled_attention(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
    expected, _ = naive_reference(q, k, v, causal=causal)
    assert_close(output, expected, np.float64)


@pytest.mark.parametrize("window", [1, 2, 5, 16, 40])
@pytest.mark.parametrize(("block_q", "block_k"), [(4, 4), (3, 5), (16, 2)])
def test_sliding_window_in_the_kernel_equals_the_sliding_window_mask(window, block_q, block_k):
    rng = np.random.default_rng(window)
    q, k, v = (rng.standard_normal((3, 33, 4)) for _ in range(3))
    output = tiled_attention(q, k, v, causal=True, window=window, block_q=block_q,
                             block_k=block_k)
    expected, _ = scaled_dot_product_attention(q, k, v,
                                               mask=sliding_window_mask(33, window=window))
    assert_close(output, expected, np.float64)


# --------------------------------------------------------------------------- masked rows, lse


def test_a_fully_padded_sequence_gives_zero_output_and_minus_infinite_lse():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((3, 6, 4)) for _ in range(3))
    output, lse = tiled_attention(q, k, v, key_lengths=[0, 6, 2], block_q=4, block_k=4,
                                  return_lse=True)
    np.testing.assert_array_equal(output[0], 0.0)
    assert np.isneginf(lse[0]).all() and np.isfinite(lse[1:]).all()
    expected, _ = naive_reference(q, k, v, key_lengths=np.array([0, 6, 2]))
    assert_close(output, expected, np.float64)


def test_an_all_false_mask_row_gives_a_zero_row_and_minus_infinite_lse_without_warnings():
    # pytest turns RuntimeWarnings (log(0), 0/0) into errors, so this also checks "no warning".
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((5, 3)) for _ in range(3))
    mask = np.ones((5, 5), dtype=bool)
    mask[2] = False
    output, lse = tiled_attention(q, k, v, mask=mask, block_q=2, block_k=2, return_lse=True)
    np.testing.assert_array_equal(output[2], 0.0)
    assert np.isneginf(lse[2]) and np.isfinite(np.delete(lse, 2)).all()
    assert np.isfinite(output).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("size", [1e2, 1e4])
def test_extreme_logits_give_no_overflow_and_the_naive_output(dtype, size):
    # Scores of +-size: exp overflows unless every tile subtracts its running maximum.
    rng = np.random.default_rng(3)
    q = np.sign(rng.standard_normal((9, 2))).astype(dtype) * size
    k = np.eye(2, dtype=dtype)[rng.integers(0, 2, 9)] * np.sqrt(2)  # scale cancels sqrt(2)
    v = rng.standard_normal((9, 3)).astype(dtype)
    output, lse = tiled_attention(q, k, v, block_q=2, block_k=4, return_lse=True)
    expected, expected_lse = naive_reference(q, k, v)
    assert np.isfinite(output).all() and np.isfinite(lse).all()
    assert_close(output, expected, dtype)
    np.testing.assert_allclose(lse, expected_lse, rtol=TOLERANCE[dtype])


def test_the_lse_of_one_query_is_log_sum_exp_of_its_scaled_scores():
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    _, lse = tiled_attention(q, k, k, scale=1.0, block_k=2, return_lse=True)
    assert lse.shape == (1,)
    assert lse[0] == pytest.approx(math.log(math.exp(1) + math.exp(0) + math.exp(2)), rel=1e-14)


# --------------------------------------------------------------------------- skipped tiles


def count_computed_tiles(monkeypatch):
    """Count tiles the kernel computes: it builds one tile mask per computed tile."""
    calls = []
    original = flash._tile_mask

    def counting(*args):
        calls.append(args[1])  # k_start
        return original(*args)

    monkeypatch.setattr(flash, "_tile_mask", counting)
    return calls


def test_causal_attention_computes_only_the_tiles_on_or_below_the_diagonal(monkeypatch):
    calls = count_computed_tiles(monkeypatch)
    q = np.random.default_rng(4).standard_normal((16, 4))
    tiled_attention(q, q, q, causal=True, block_q=4, block_k=4)
    assert len(calls) == 4 + 3 + 2 + 1  # of 16: the 6 tiles above the diagonal are skipped


@pytest.mark.parametrize(("T", "block", "window"), [(64, 8, 8), (64, 8, 17), (50, 7, 3)])
def test_a_sliding_window_computes_only_the_tiles_that_touch_the_band(monkeypatch, T, block,
                                                                      window):
    calls = count_computed_tiles(monkeypatch)
    q = np.random.default_rng(5).standard_normal((T, 4))
    output = tiled_attention(q, q, q, causal=True, window=window, block_q=block, block_k=block)
    band = sliding_window_mask(T, window=window)
    starts = range(0, T, block)
    touching = sum(band[i:i + block, j:j + block].any() for i in starts for j in starts)
    assert len(calls) == touching < len(starts) ** 2
    expected, _ = scaled_dot_product_attention(q, q, q, mask=band)
    assert_close(output, expected, np.float64)


# --------------------------------------------------------------------------- dtypes, errors


def test_float32_in_gives_float32_out_and_integers_give_float64():
    q32 = np.ones((4, 2), dtype=np.float32)
    output, lse = tiled_attention(q32, q32, q32, return_lse=True)
    assert output.dtype == lse.dtype == np.float32
    assert tiled_attention(np.ones((3, 2), dtype=int), np.ones((3, 2)), np.ones((3, 2))
                           ).dtype == np.float64


def test_return_lse_false_returns_only_the_output():
    q = np.ones((3, 2))
    assert isinstance(tiled_attention(q, q, q), np.ndarray)


def test_a_key_only_mask_of_shape_tk_hides_those_keys_from_every_query():
    # scaled_dot_product_attention accepts a (Tk,) mask (it broadcasts to (Tq, Tk)).
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((5, 3)) for _ in range(3))
    keys = np.array([True, False, True, True, False])
    expected, _ = scaled_dot_product_attention(q, k, v, mask=keys)
    assert_close(tiled_attention(q, k, v, mask=keys, block_q=2, block_k=2), expected,
                 np.float64)


def test_window_without_causal_raises_naming_window():
    q = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"^window needs causal=True"):
        tiled_attention(q, q, q, window=2)


@pytest.mark.parametrize(("window", "error"), [(0, ValueError), (1.5, TypeError)])
def test_a_window_that_is_not_a_positive_integer_raises_naming_it(window, error):
    q = np.ones((4, 2))
    with pytest.raises(error, match=r"^window must be"):
        tiled_attention(q, q, q, causal=True, window=window)


@pytest.mark.parametrize(("name", "value", "error"),
                         [("block_q", 0, ValueError), ("block_k", -3, ValueError),
                          ("block_k", 2.0, TypeError)])
def test_a_bad_block_size_raises_naming_it(name, value, error):
    q = np.ones((4, 2))
    with pytest.raises(error, match=rf"^{name} must be"):
        tiled_attention(q, q, q, **{name: value})


@pytest.mark.parametrize(
    ("key_lengths", "error", "pattern"),
    [([1.0, 2.0], TypeError, r"^key_lengths must be integers"),
     ([1, 6], ValueError, r"^key_lengths must be in \[0, Tk=5\]"),
     ([-1, 2], ValueError, r"^key_lengths must be in \[0, Tk=5\]")],
)
def test_key_lengths_that_are_not_counts_of_keys_raise_naming_key_lengths(key_lengths, error,
                                                                          pattern):
    q = np.ones((2, 5, 3))
    with pytest.raises(error, match=pattern):
        tiled_attention(q, q, q, key_lengths=key_lengths)


@pytest.mark.parametrize(("batch", "lengths_shape"), [((3,), (2,)), ((), (2,)), ((3,), (3, 1)),
                                                      ((2, 3), (2,))])
def test_key_lengths_of_the_wrong_shape_raise_naming_key_lengths(batch, lengths_shape):
    # key_lengths holds one count per sequence: its shape must be the batch shape (or
    # broadcast to it without adding dimensions), else NumPy fails deep inside or the output
    # silently gains dimensions.
    q = np.ones((*batch, 5, 3))
    with pytest.raises(ValueError, match=r"^key_lengths"):
        tiled_attention(q, q, q, key_lengths=np.ones(lengths_shape, dtype=int), block_q=2)


def test_a_non_boolean_mask_raises_type_error_naming_mask():
    q = np.ones((4, 2))
    with pytest.raises(TypeError, match=r"^mask must be boolean"):
        tiled_attention(q, q, q, mask=np.ones((4, 4)))


@pytest.mark.parametrize("mask_shape", [(3, 4), (2, 4, 4)])
def test_a_mask_of_the_wrong_shape_raises_naming_mask(mask_shape):
    # (3, 4) does not broadcast to (Tq, Tk) = (4, 4); (2, 4, 4) would add a batch dimension.
    q = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"^mask"):
        tiled_attention(q, q, q, mask=np.ones(mask_shape, dtype=bool))


def test_mismatched_shapes_raise_as_scaled_dot_product_attention_does():
    with pytest.raises(ValueError, match=r"^q has d_k=3 but k has d_k=4"):
        tiled_attention(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"^k has Tk=5 but v has Tk=4"):
        tiled_attention(np.ones((2, 3)), np.ones((5, 3)), np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"^causal needs Tq <= Tk; got Tq=5, Tk=3"):
        tiled_attention(np.ones((5, 3)), np.ones((3, 3)), np.ones((3, 3)), causal=True)


def test_batch_dimensions_that_do_not_broadcast_raise_naming_q_k_and_v():
    with pytest.raises(ValueError, match=r"^the batch dimensions of q \(2,\), k \(3,\) and v"):
        tiled_attention(np.ones((2, 4, 3)), np.ones((3, 4, 3)), np.ones((3, 4, 3)))


MIB = 2**20


def test_peak_extra_bytes_counts_an_array_the_call_allocates_and_not_the_inputs():
    inputs = np.ones(4 * MIB // 8)  # 4 MiB that exist before the call: not counted
    extra = peak_extra_bytes(lambda x: x * 2.0, inputs)  # a 4 MiB result
    assert 4 * MIB <= extra < 4 * MIB + 2**16


def test_peak_extra_bytes_is_the_peak_not_the_sum_of_temporaries_freed_in_between():
    def two_temporaries_one_at_a_time():
        for _ in range(2):
            temporary = np.ones(MIB // 8)  # 1 MiB, freed before the next one
            del temporary

    def two_temporaries_at_once():
        first, second = np.ones(MIB // 8), np.ones(MIB // 8)  # noqa: F841

    one_at_a_time = peak_extra_bytes(two_temporaries_one_at_a_time)
    at_once = peak_extra_bytes(two_temporaries_at_once)
    assert MIB <= one_at_a_time < MIB + 2**16
    assert 2 * MIB <= at_once < 2 * MIB + 2**16


def test_peak_extra_bytes_passes_keyword_arguments_and_leaves_tracing_as_it_found_it():
    import tracemalloc

    assert not tracemalloc.is_tracing()
    extra = peak_extra_bytes(np.zeros, shape=(MIB // 4,), dtype=np.float32)
    assert MIB <= extra < MIB + 2**16
    assert not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        assert MIB <= peak_extra_bytes(np.ones, MIB // 8) < MIB + 2**16
        assert tracemalloc.is_tracing()  # an outer trace keeps running
    finally:
        tracemalloc.stop()


def test_peak_extra_bytes_rejects_a_function_that_is_not_callable_naming_it():
    with pytest.raises(TypeError, match=r"^function must be callable; got ndarray"):
        peak_extra_bytes(np.ones(3))


@pytest.mark.parametrize("scale", [np.nan, np.inf, True, "0.5", np.array([0.5])])
def test_a_bad_scale_raises_naming_scale_in_both_passes(scale):
    # NaN once gave an all-zero output and True was taken as 1.0.
    q = np.ones((4, 2))
    with pytest.raises(ValueError, match=r"^scale must be a finite number"):
        tiled_attention(q, q, q, scale=scale)
    with pytest.raises(ValueError, match=r"^scale must be a finite number"):
        tiled_attention_backward(q, q, q, q, q, np.zeros(4), scale=scale)
