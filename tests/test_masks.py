"""causal_mask and padding_mask (chapter 04): values, shapes, bad input, how they combine."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import causal_mask, padding_mask, scaled_dot_product_attention

# --------------------------------------------------------------------------- causal_mask


def test_causal_mask_of_three_is_the_lower_triangle():
    expected = np.array(
        [
            [True, False, False],
            [True, True, False],
            [True, True, True],
        ]
    )
    mask = causal_mask(3)
    assert mask.dtype == bool
    np.testing.assert_array_equal(mask, expected)


def test_causal_mask_with_fewer_queries_aligns_queries_with_the_last_keys():
    # Queries are positions 2 and 3 of keys 0..3.
    expected = np.array([[True, True, True, False], [True, True, True, True]])
    np.testing.assert_array_equal(causal_mask(2, 4), expected)


def test_one_new_query_sees_every_key():
    np.testing.assert_array_equal(causal_mask(1, 5), np.ones((1, 5), dtype=bool))


def test_causal_mask_of_one_is_a_single_true():
    np.testing.assert_array_equal(causal_mask(1), [[True]])


@pytest.mark.parametrize(("Tq", "Tk"), [(1, 1), (4, 4), (3, 7), (np.int64(2), np.int32(5))])
def test_causal_mask_entry_is_true_exactly_when_key_is_not_in_the_future(Tq, Tk):
    mask = causal_mask(Tq, Tk)
    assert mask.shape == (Tq, Tk)
    offset = Tk - Tq  # query i sits at key position i + offset
    for i in range(Tq):
        for j in range(Tk):
            assert mask[i, j] == (j <= i + offset)


def test_tk_none_means_square():
    np.testing.assert_array_equal(causal_mask(4, None), causal_mask(4, 4))


@pytest.mark.parametrize("Tq", [0, -2])
def test_causal_mask_rejects_non_positive_tq_naming_tq(Tq):
    with pytest.raises(ValueError, match=rf"^Tq must be >= 1; got {Tq}"):
        causal_mask(Tq)


@pytest.mark.parametrize("Tq", [2.0, "3", True, None])
def test_causal_mask_rejects_non_integer_tq_naming_tq(Tq):
    with pytest.raises(TypeError, match=r"^Tq must be an integer"):
        causal_mask(Tq)


@pytest.mark.parametrize(("Tk", "error"), [(0, ValueError), (-1, ValueError), (4.0, TypeError)])
def test_causal_mask_rejects_bad_tk_naming_tk(Tk, error):
    with pytest.raises(error, match=r"^Tk must be"):
        causal_mask(2, Tk)


def test_causal_mask_rejects_more_queries_than_keys():
    with pytest.raises(ValueError, match=r"^Tq=3 > Tk=2"):
        causal_mask(3, 2)


# --------------------------------------------------------------------------- padding_mask


def test_padding_mask_hides_the_padded_keys():
    expected = np.array([[[True, True, False]], [[True, True, True]], [[False, False, False]]])
    mask = padding_mask([2, 3, 0], 3)
    assert mask.dtype == bool
    assert mask.shape == (3, 1, 3)
    np.testing.assert_array_equal(mask, expected)


def test_padding_mask_accepts_numpy_integer_lengths_and_t():
    mask = padding_mask(np.array([1, 4], dtype=np.uint8), np.int64(4))
    np.testing.assert_array_equal(mask[:, 0], [[True, False, False, False], [True] * 4])


def test_padding_mask_keeps_extra_leading_dims_of_lengths():
    lengths = np.array([[1, 2], [3, 0]])
    mask = padding_mask(lengths, 3)
    assert mask.shape == (2, 2, 1, 3)
    np.testing.assert_array_equal(mask[1, 0, 0], [True, True, True])
    np.testing.assert_array_equal(mask[1, 1, 0], [False, False, False])


def test_padding_mask_broadcasts_over_the_query_axis_of_the_scores():
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 4, 3))
    _, weights = scaled_dot_product_attention(q, q, q, padding_mask([2, 4], 4))
    assert weights.shape == (2, 4, 4)
    np.testing.assert_array_equal(weights[0, :, 2:], 0.0)
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-14)


def test_attention_with_a_padding_mask_equals_attention_on_the_unpadded_sequence():
    rng = np.random.default_rng(1)
    lengths = [3, 5, 1]
    q = rng.normal(size=(3, 2, 4))
    k = rng.normal(size=(3, 5, 4))
    v = rng.normal(size=(3, 5, 6))
    output, _ = scaled_dot_product_attention(q, k, v, padding_mask(lengths, 5))
    for b, length in enumerate(lengths):
        expected, _ = scaled_dot_product_attention(q[b], k[b, :length], v[b, :length])
        np.testing.assert_allclose(output[b], expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("lengths", [[2, 4], [5], [[1], [9]]])
def test_lengths_longer_than_t_raise_naming_lengths(lengths):
    with pytest.raises(ValueError, match=r"every length must be between 0 and T=3; got lengths="):
        padding_mask(lengths, 3)


@pytest.mark.parametrize("lengths", [[-1, 2], [-5]])
def test_negative_lengths_raise_naming_lengths(lengths):
    with pytest.raises(ValueError, match=r"every length must be between 0 and T=3; got lengths="):
        padding_mask(lengths, 3)


@pytest.mark.parametrize("lengths", [[1.0, 2.0], [True, False], ["1"]])
def test_non_integer_lengths_raise_type_error_naming_lengths(lengths):
    with pytest.raises(TypeError, match=r"^lengths must be integers"):
        padding_mask(lengths, 3)


@pytest.mark.parametrize(("T", "error"), [(0, ValueError), (-3, ValueError), (3.0, TypeError)])
def test_bad_t_raises_naming_t(T, error):
    with pytest.raises(error, match=r"^T must be"):
        padding_mask([1, 2], T)


# --------------------------------------------------------------------------- combining


@given(
    T=st.integers(1, 7),
    data=st.data(),
)
def test_padding_mask_combined_with_causal_is_the_elementwise_and(T, data):
    lengths = data.draw(st.lists(st.integers(0, T), min_size=1, max_size=4))
    combined = padding_mask(lengths, T) & causal_mask(T)
    assert combined.shape == (len(lengths), T, T)
    for b, length in enumerate(lengths):
        for i in range(T):
            for j in range(T):
                assert combined[b, i, j] == (j < length and j <= i)


@given(T=st.integers(1, 6), data=st.data())
def test_attention_under_padding_and_causal_masks_weights_only_allowed_keys(T, data):
    lengths = data.draw(st.lists(st.integers(0, T), min_size=1, max_size=3))
    seed = data.draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).normal(size=(len(lengths), T, 3))
    mask = padding_mask(lengths, T) & causal_mask(T)
    output, weights = scaled_dot_product_attention(x, x, x, mask)
    np.testing.assert_array_equal(weights[~mask], 0.0)
    rows_with_keys = mask.any(axis=-1)
    np.testing.assert_allclose(weights.sum(axis=-1)[rows_with_keys], 1.0, rtol=1e-14)
    np.testing.assert_array_equal(output[~rows_with_keys], 0.0)
