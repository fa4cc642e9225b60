"""SelfAttention and init_linear_weight (chapter 05): equality with project-then-attend, shapes,
dtypes, bad input, the 1/sqrt(d_in) initial scale, and permutation equivariance."""

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import (
    SelfAttention,
    causal_mask,
    init_linear_weight,
)


def random_layer(d_model, d_k, d_v, seed=0, dtype=np.float64):
    return SelfAttention.init(d_model, d_k, d_v, np.random.default_rng(seed), dtype=dtype)


# --------------------------------------------------------------------------- values


def test_self_attention_on_a_hand_worked_example():
    # Two orthogonal tokens, identity projections (d = 2): scores = x x^T / sqrt(2) is
    # diag(1/sqrt 2), so each token keeps weight sigma = 1 / (1 + e^(-1/sqrt 2)) on itself and
    # 1 - sigma on the other; with W_v the identity, the output rows are the weight rows.
    layer = SelfAttention(W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2))
    x = np.eye(2)
    sigma = 1 / (1 + math.exp(-1 / math.sqrt(2)))  # 0.6698...
    expected = np.array([[sigma, 1 - sigma], [1 - sigma, sigma]])
    output, weights = layer(x)
    np.testing.assert_allclose(weights, expected, rtol=1e-15)
    np.testing.assert_allclose(output, expected, rtol=1e-15)
    # W_v picks what is passed on: swapping its columns swaps the output's
    output_swapped, _ = SelfAttention(W_q=np.eye(2), W_k=np.eye(2), W_v=np.eye(2)[:, ::-1])(x)
    np.testing.assert_allclose(output_swapped, expected[:, ::-1], rtol=1e-15)


def test_self_attention_matches_the_formula_written_out():
    rng = np.random.default_rng(3)
    W_q, W_k, W_v = rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    layer = SelfAttention(W_q=W_q, W_k=W_k, W_v=W_v)
    x = rng.normal(size=(5, 3))
    scores = (x @ W_q) @ (x @ W_k).T / math.sqrt(4)  # (T, T)
    expected_weights = np.exp(scores) / np.exp(scores).sum(axis=-1, keepdims=True)
    output, weights = layer(x)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-12)
    np.testing.assert_allclose(output, expected_weights @ (x @ W_v), rtol=1e-12)


def test_the_mask_is_passed_on_to_attention():
    rng = np.random.default_rng(4)
    layer = random_layer(6, 4, 4, seed=5)
    x = rng.normal(size=(2, 5, 6))
    mask = causal_mask(5)
    output, weights = layer(x, mask=mask)
    # the formula written out: masked scores set to -inf before the softmax
    scores = (x @ layer.W_q) @ np.swapaxes(x @ layer.W_k, -1, -2) / math.sqrt(4)  # (2, 5, 5)
    exp = np.exp(np.where(mask, scores, -np.inf))
    expected_weights = exp / exp.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-12)
    np.testing.assert_allclose(output, expected_weights @ (x @ layer.W_v), rtol=1e-12)
    assert np.all(weights[..., ~mask] == 0)
    np.testing.assert_array_equal(weights[:, 0, 0], 1.0)  # the first token sees only itself


def test_a_fully_masked_token_gets_a_zero_output_row_and_zero_weights():
    layer = random_layer(4, 4, 3, seed=6)
    x = np.random.default_rng(7).normal(size=(3, 4))
    mask = np.ones((3, 3), dtype=bool)
    mask[1] = False
    output, weights = layer(x, mask=mask)
    assert not np.isnan(output).any()
    np.testing.assert_array_equal(weights[1], 0.0)
    np.testing.assert_array_equal(output[1], 0.0)


# --------------------------------------------------------------------------- shapes and dtypes


@pytest.mark.parametrize("batch", [(), (2,), (2, 3)], ids=["no-batch", "B", "B1xB2"])
def test_output_and_weights_keep_the_leading_batch_dims(batch):
    layer = random_layer(8, 4, 6)
    x = np.random.default_rng(8).normal(size=(*batch, 5, 8))
    output, weights = layer(x)
    assert output.shape == (*batch, 5, 6)
    assert weights.shape == (*batch, 5, 5)


def test_init_makes_weights_of_the_requested_shapes():
    layer = random_layer(8, 3, 5)
    assert layer.W_q.shape == (8, 3)
    assert layer.W_k.shape == (8, 3)
    assert layer.W_v.shape == (8, 5)


def test_float32_weights_and_inputs_give_float32_output_and_weights():
    layer = random_layer(8, 4, 4, dtype=np.float32)
    assert layer.W_q.dtype == layer.W_k.dtype == layer.W_v.dtype == np.float32
    x = np.random.default_rng(9).normal(size=(2, 5, 8)).astype(np.float32)
    output, weights = layer(x, mask=causal_mask(5))
    assert output.dtype == np.float32
    assert weights.dtype == np.float32
    expected_output, _ = random_layer(8, 4, 4)(x.astype(np.float64), mask=causal_mask(5))
    np.testing.assert_allclose(output, expected_output, rtol=1e-4, atol=1e-5)


def test_integer_weights_and_inputs_give_float64():
    layer = SelfAttention(W_q=np.eye(3, dtype=int), W_k=np.eye(3, dtype=int),
                          W_v=np.eye(3, dtype=int))
    output, weights = layer(np.eye(3, dtype=int))
    assert layer.W_q.dtype == np.float64
    assert output.dtype == weights.dtype == np.float64


# --------------------------------------------------------------------------- bad input


def test_w_q_and_w_k_with_different_dk_raise_naming_both():
    rng = np.random.default_rng(10)
    with pytest.raises(ValueError, match=r"W_q makes d_k=4 but W_k makes d_k=3"):
        SelfAttention(W_q=rng.normal(size=(6, 4)), W_k=rng.normal(size=(6, 3)),
                      W_v=rng.normal(size=(6, 5)))


@pytest.mark.parametrize("odd_one", ["W_q", "W_k", "W_v"])
def test_weights_with_different_d_model_raise_naming_the_shapes(odd_one):
    rng = np.random.default_rng(11)
    weights = {name: rng.normal(size=(6, 4)) for name in ("W_q", "W_k", "W_v")}
    weights[odd_one] = rng.normal(size=(7, 4))
    with pytest.raises(ValueError, match=r"W_q, W_k and W_v must all take d_model.*\(7, 4\)"):
        SelfAttention(**weights)


@pytest.mark.parametrize("name", ["W_q", "W_k", "W_v"])
@pytest.mark.parametrize("bad_shape", [(6,), (2, 6, 4)], ids=["1-d", "3-d"])
def test_weights_that_are_not_2d_raise_naming_the_weight(name, bad_shape):
    rng = np.random.default_rng(12)
    weights = {other: rng.normal(size=(6, 4)) for other in ("W_q", "W_k", "W_v")}
    weights[name] = rng.normal(size=bad_shape)
    with pytest.raises(ValueError, match=rf"{name} must .*{re.escape(str(bad_shape))}"):
        SelfAttention(**weights)


def test_input_with_the_wrong_feature_size_raises_naming_x_and_both_sizes():
    layer = random_layer(8, 4, 4)
    with pytest.raises(ValueError, match=r"x has d_model=7 features but the projections expect 8"):
        layer(np.ones((3, 7)))


def test_one_dimensional_input_raises_naming_x():
    layer = random_layer(8, 4, 4)
    with pytest.raises(ValueError, match=r"x must have at least 2 dimensions; got shape \(8,\)"):
        layer(np.ones(8))


def test_non_numeric_weights_raise_type_error_naming_the_weight():
    with pytest.raises(TypeError, match="W_v"):
        SelfAttention(W_q=np.eye(2), W_k=np.eye(2), W_v=np.array([["a", "b"], ["c", "d"]]))


# --------------------------------------------------------------------------- init_linear_weight


def test_init_linear_weight_has_std_one_over_sqrt_d_in():
    # 262144 draws: the sample std is within about 0.15% of the true one (one standard error),
    # so 5% is a tolerance of ~35 standard errors; the seed makes it deterministic anyway.
    weight = init_linear_weight(512, 512, np.random.default_rng(13))
    assert weight.shape == (512, 512)
    assert abs(weight.std() * math.sqrt(512) - 1) < 0.05
    assert abs(weight.mean()) < 0.05 / math.sqrt(512)


@pytest.mark.parametrize(("d_in", "d_out"), [(64, 4096), (4096, 64)])
def test_init_linear_weight_scale_depends_on_d_in_not_d_out(d_in, d_out):
    weight = init_linear_weight(d_in, d_out, np.random.default_rng(14))
    assert weight.shape == (d_in, d_out)
    assert abs(weight.std() * math.sqrt(d_in) - 1) < 0.05


def test_init_linear_weight_keeps_projections_at_the_scale_of_the_input():
    rng = np.random.default_rng(15)
    x = rng.normal(size=(256, 512))  # unit-variance features
    projected = x @ init_linear_weight(512, 512, rng)
    assert abs(projected.std() - 1) < 0.05


def test_init_linear_weight_is_reproducible_from_the_seed():
    first = init_linear_weight(5, 3, np.random.default_rng(16))
    second = init_linear_weight(5, 3, np.random.default_rng(16))
    np.testing.assert_array_equal(first, second)


def test_init_linear_weight_makes_the_requested_dtype():
    weight = init_linear_weight(4, 3, np.random.default_rng(17), dtype=np.float32)
    assert weight.dtype == np.float32


@pytest.mark.parametrize(
    "rng", [None, 0, np.random.RandomState(0)], ids=["None", "int-seed", "RandomState"]
)
def test_init_linear_weight_rejects_an_rng_that_is_not_a_generator(rng):
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        init_linear_weight(4, 3, rng)


@pytest.mark.parametrize(
    ("d_in", "d_out", "name"), [(0, 3, "d_in"), (-2, 3, "d_in"), (4, 0, "d_out"), (4, -1, "d_out")]
)
def test_init_linear_weight_rejects_non_positive_sizes_naming_them(d_in, d_out, name):
    with pytest.raises(ValueError, match=rf"{name} must be >= 1"):
        init_linear_weight(d_in, d_out, np.random.default_rng(0))


@pytest.mark.parametrize(("d_in", "d_out", "name"), [(4.0, 3, "d_in"), (4, "3", "d_out")])
def test_init_linear_weight_rejects_non_integer_sizes_naming_them(d_in, d_out, name):
    with pytest.raises(TypeError, match=rf"{name} must be an integer"):
        init_linear_weight(d_in, d_out, np.random.default_rng(0))


# --------------------------------------------------------------------------- properties


@given(
    T=st.integers(1, 8),
    d_model=st.integers(1, 8),
    d_k=st.integers(1, 6),
    d_v=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_permuting_the_tokens_permutes_output_rows_and_weight_rows_and_columns(
    T, d_model, d_k, d_v, seed, data
):
    # Without positional information, self-attention cannot tell where a token sits.
    permutation = np.array(data.draw(st.permutations(range(T)), label="permutation"))
    rng = np.random.default_rng(seed)
    layer = SelfAttention.init(d_model, d_k, d_v, rng)
    x = rng.normal(size=(T, d_model))
    output, weights = layer(x)
    permuted_output, permuted_weights = layer(x[permutation])
    np.testing.assert_allclose(permuted_output, output[permutation], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        permuted_weights, weights[permutation][:, permutation], rtol=1e-10, atol=1e-12
    )
