"""The running examples and the notebooks' reproducible check printer."""

from __future__ import annotations

import numpy as np
import pytest

from attention_lib import scaled_dot_product_attention
from attention_lib.examples import (
    SENTENCE_TOKENS,
    difference_below,
    hand_made_query_key,
    sentence_embeddings,
    tokens_2d,
)


def test_running_examples_have_their_documented_shapes_and_values():
    assert sentence_embeddings().shape == (10, 8)
    np.testing.assert_array_equal(tokens_2d()[0], [0.9, 0.1])


def test_difference_below_prints_the_bound_not_the_noise():
    noisy = np.array([1.0, 2.0]) + np.array([3e-16, -7e-17])
    assert difference_below(noisy, [1.0, 2.0], 1e-12) == "largest |difference| below 1e-12"


def test_difference_below_fails_when_the_arrays_differ_by_more_than_the_bound():
    with pytest.raises(AssertionError, match="is 0.001, not below 1e-06"):
        difference_below([1.0], [1.001], 1e-6)


def test_difference_below_treats_nan_as_disagreement():
    with pytest.raises(AssertionError):
        difference_below([np.nan], [1.0], 1e-6)


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan"), float("inf"), True, "1e-6"])
def test_difference_below_rejects_a_bound_that_is_not_a_positive_number(bound):
    with pytest.raises(ValueError, match="bound must be a positive finite number"):
        difference_below([1.0], [1.0], bound)


def test_difference_below_rejects_arrays_of_different_shapes():
    with pytest.raises(ValueError, match=r"actual has shape \(2,\) but expected has shape \(3,\)"):
        difference_below([1.0, 2.0], [1.0, 2.0, 3.0], 1e-6)


def test_hand_made_query_key_makes_it_attend_to_the_fruit_and_less_to_acidic():
    X = sentence_embeddings()
    W_q, W_k = hand_made_query_key()
    assert W_q.shape == W_k.shape == (8, 2)
    assert np.count_nonzero(W_q) == np.count_nonzero(W_k) == 2
    _, weights = scaled_dot_product_attention(X @ W_q, X @ W_k, X)
    tokens = list(SENTENCE_TOKENS)
    it, less = tokens.index("it"), tokens.index("less")
    apple, orange, acidic = (tokens.index(t) for t in ("apple", "orange", "acidic"))
    np.testing.assert_allclose(weights[it, [apple, orange]], 0.49, atol=0.01)
    assert weights[less, acidic] > 0.9
    # The eight tokens with neither pronoun nor degree ask nothing: uniform weights.
    others = [i for i in range(10) if i not in (it, less)]
    np.testing.assert_allclose(weights[others], 0.1)


def test_hand_made_query_key_scales_with_strength_and_returns_fresh_copies():
    W_q, W_k = hand_made_query_key(strength=2.0)
    assert W_q.max() == W_k.max() == 2.0
    W_q[:] = 7.0
    assert hand_made_query_key()[0].max() == 3.0
