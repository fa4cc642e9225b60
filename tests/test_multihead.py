"""split_heads, merge_heads and MultiHeadAttention (chapter 06): values against a per-head loop,
cross-attention, masks, fully masked rows, dtypes, bad input, and permutation equivariance."""

import math
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import (
    MultiHeadAttention,
    causal_mask,
    init_linear_weight,
    merge_heads,
    padding_mask,
    split_heads,
)

WEIGHT_NAMES = ("W_q", "W_k", "W_v", "W_o")
BIAS_NAMES = ("b_q", "b_k", "b_v", "b_o")


def random_parameters(d_model, rng):
    """Random weights AND non-zero biases, so a test notices a bias that is dropped."""
    parameters = {name: rng.normal(size=(d_model, d_model)) / math.sqrt(d_model)
                  for name in WEIGHT_NAMES}
    parameters.update({name: rng.normal(size=d_model) for name in BIAS_NAMES})
    return parameters


def random_mha(d_model, num_heads, seed=0):
    return MultiHeadAttention(**random_parameters(d_model, np.random.default_rng(seed)),
                              num_heads=num_heads)


def reference_one_sequence(mha, x, context, mask):
    """Multi-head attention for one (T, d_model) sequence, one head at a time in a Python loop.

    Head h uses columns h*d_head:(h+1)*d_head of W_q, W_k, W_v (project, then split), its own
    softmax over the allowed keys, and the heads' outputs are concatenated before W_o.
    """
    d_model, num_heads = mha.W_q.shape[0], mha.num_heads
    d_head = d_model // num_heads
    Tq, Tk = x.shape[0], context.shape[0]
    head_outputs, head_weights = [], []
    for h in range(num_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        q = x @ mha.W_q[:, cols] + mha.b_q[cols]  # (Tq, d_head)
        k = context @ mha.W_k[:, cols] + mha.b_k[cols]  # (Tk, d_head)
        v = context @ mha.W_v[:, cols] + mha.b_v[cols]  # (Tk, d_head)
        weights = np.zeros((Tq, Tk))
        for i in range(Tq):
            allowed = np.flatnonzero(mask[i])
            if allowed.size == 0:
                continue  # a query that may attend to nothing: zero weights
            scores = q[i] @ k[allowed].T / math.sqrt(d_head)
            exps = np.exp(scores - scores.max())
            weights[i, allowed] = exps / exps.sum()
        head_outputs.append(weights @ v)
        head_weights.append(weights)
    output = np.concatenate(head_outputs, axis=-1) @ mha.W_o + mha.b_o  # (Tq, d_model)
    return output, np.stack(head_weights)  # (H, Tq, Tk)


def reference_mha(mha, x, context=None, mask=None):
    """The per-head loop reference, looped over the leading batch dims of x too."""
    context = x if context is None else context
    batch = x.shape[:-2]
    Tq, Tk = x.shape[-2], context.shape[-2]
    mask = np.ones((Tq, Tk), dtype=bool) if mask is None else np.asarray(mask)
    mask = np.broadcast_to(mask, (*batch, Tq, Tk))
    output = np.zeros((*batch, Tq, mha.W_o.shape[1]))
    weights = np.zeros((*batch, mha.num_heads, Tq, Tk))
    for index in np.ndindex(*batch):
        output[index], weights[index] = reference_one_sequence(
            mha, x[index], context[index], mask[index]
        )
    return output, weights


# --------------------------------------------------------------------------- split / merge


def test_split_heads_moves_the_head_axis_before_the_sequence_axis():
    assert split_heads(np.zeros((5, 12)), 3).shape == (3, 5, 4)
    assert split_heads(np.zeros((2, 7, 5, 12)), 4).shape == (2, 7, 4, 5, 3)


def test_head_h_gets_features_h_times_d_head_to_h_plus_1_times_d_head():
    x = np.arange(2 * 5 * 12, dtype=float).reshape(2, 5, 12)
    heads = split_heads(x, 3)  # (2, 3, 5, 4)
    for h in range(3):
        np.testing.assert_array_equal(heads[:, h], x[..., h * 4:(h + 1) * 4])


def test_one_head_is_the_input_with_a_head_axis():
    x = np.random.default_rng(0).normal(size=(2, 5, 6))
    np.testing.assert_array_equal(split_heads(x, 1), x[:, None])


def test_merge_heads_concatenates_the_heads_features_in_order():
    heads = np.random.default_rng(1).normal(size=(2, 3, 5, 4))  # (B, H, T, d_head)
    np.testing.assert_array_equal(merge_heads(heads), np.concatenate(list(heads.swapaxes(0, 1)),
                                                                      axis=-1))


@given(
    batch=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    T=st.integers(1, 6),
    num_heads=st.integers(1, 6),
    d_head=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_split_then_merge_is_identity(batch, T, num_heads, d_head, seed):
    x = np.random.default_rng(seed).normal(size=(*batch, T, num_heads * d_head))
    np.testing.assert_array_equal(merge_heads(split_heads(x, num_heads)), x)


@given(
    batch=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    T=st.integers(1, 6),
    num_heads=st.integers(1, 6),
    d_head=st.integers(1, 5),
    seed=st.integers(0, 2**32 - 1),
)
def test_merge_then_split_is_identity(batch, T, num_heads, d_head, seed):
    heads = np.random.default_rng(seed).normal(size=(*batch, num_heads, T, d_head))
    np.testing.assert_array_equal(split_heads(merge_heads(heads), num_heads), heads)


def test_split_heads_keeps_float32():
    assert split_heads(np.zeros((3, 8), dtype=np.float32), 2).dtype == np.float32
    assert merge_heads(np.zeros((2, 3, 4), dtype=np.float32)).dtype == np.float32


def test_split_heads_raises_naming_d_model_and_num_heads_when_they_do_not_divide():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        split_heads(np.zeros((3, 10)), 4)


@pytest.mark.parametrize(
    ("num_heads", "error", "pattern"),
    [(0, ValueError, "num_heads must be >= 1"), (2.0, TypeError, "num_heads must be an integer")],
)
def test_split_heads_rejects_a_bad_number_of_heads_naming_it(num_heads, error, pattern):
    with pytest.raises(error, match=pattern):
        split_heads(np.zeros((3, 8)), num_heads)


def test_split_heads_of_a_one_dimensional_input_raises_naming_x():
    with pytest.raises(ValueError, match=r"x must have at least 2 dimensions"):
        split_heads(np.zeros(8), 2)


def test_merge_heads_of_a_two_dimensional_input_raises_naming_x():
    with pytest.raises(ValueError, match=r"x must have at least 3 dimensions"):
        merge_heads(np.zeros((3, 8)))


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize(("d_model", "num_heads"), [(8, 1), (8, 2), (12, 3), (16, 8), (6, 6)])
def test_multi_head_attention_equals_a_per_head_loop(d_model, num_heads):
    rng = np.random.default_rng(2)
    mha = random_mha(d_model, num_heads, seed=3)
    x = rng.normal(size=(2, 5, d_model))
    output, weights = mha(x)
    expected_output, expected_weights = reference_mha(mha, x)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)


def test_eight_heads_with_two_batch_dims_equal_the_loop_over_heads_and_batch():
    rng = np.random.default_rng(4)
    mha = random_mha(32, 8, seed=5)
    x = rng.normal(size=(2, 3, 6, 32))
    output, weights = mha(x, mask=causal_mask(6))
    expected_output, expected_weights = reference_mha(mha, x, mask=causal_mask(6))
    assert output.shape == (2, 3, 6, 32)
    assert weights.shape == (2, 3, 8, 6, 6)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)


def test_init_gives_zero_biases_and_weights_of_scale_one_over_sqrt_d_model():
    mha = MultiHeadAttention.init(256, 4, np.random.default_rng(6))
    for name in BIAS_NAMES:
        np.testing.assert_array_equal(getattr(mha, name), np.zeros(256))
    for name in WEIGHT_NAMES:
        weight = getattr(mha, name)
        assert weight.shape == (256, 256)
        assert abs(weight.std() * math.sqrt(256) - 1) < 0.05
    assert mha.num_heads == 4 and mha.d_model == 256


def test_the_four_projections_are_independent_draws():
    mha = MultiHeadAttention.init(8, 2, np.random.default_rng(7))
    for first, second in [("W_q", "W_k"), ("W_k", "W_v"), ("W_v", "W_o")]:
        assert not np.allclose(getattr(mha, first), getattr(mha, second))


def test_each_weight_row_sums_to_one_in_every_head():
    mha = random_mha(12, 3, seed=8)
    _, weights = mha(np.random.default_rng(9).normal(size=(2, 4, 12)))
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-12)


# --------------------------------------------------------------------------- cross-attention


@pytest.mark.parametrize(("Tq", "Tk"), [(3, 7), (7, 3), (1, 5), (4, 1)])
def test_cross_attention_takes_keys_and_values_from_the_context(Tq, Tk):
    rng = np.random.default_rng(10)
    mha = random_mha(12, 4, seed=11)
    x, context = rng.normal(size=(2, Tq, 12)), rng.normal(size=(2, Tk, 12))
    output, weights = mha(x, context=context)
    assert output.shape == (2, Tq, 12)
    assert weights.shape == (2, 4, Tq, Tk)
    expected_output, expected_weights = reference_mha(mha, x, context=context)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)


def test_context_none_is_self_attention():
    mha = random_mha(8, 2, seed=12)
    x = np.random.default_rng(13).normal(size=(4, 8))
    np.testing.assert_array_equal(mha(x)[0], mha(x, context=x)[0])


def test_cross_attention_treats_the_context_as_a_set_and_each_query_on_its_own():
    rng = np.random.default_rng(14)
    mha = random_mha(8, 2, seed=15)
    x, context = rng.normal(size=(3, 8)), rng.normal(size=(5, 8))
    output, weights = mha(x, context=context)
    # reordering the context's tokens reorders the weights and leaves the output unchanged
    order = np.array([3, 0, 4, 1, 2])
    reordered_output, reordered_weights = mha(x, context=context[order])
    np.testing.assert_allclose(reordered_output, output, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(reordered_weights, weights[..., order], rtol=1e-12, atol=1e-15)
    # a query's output does not depend on the other queries
    np.testing.assert_allclose(mha(x[1:2], context=context)[0], output[1:2], rtol=1e-12,
                               atol=1e-14)


def test_unbatched_context_is_shared_by_every_batch_of_queries():
    rng = np.random.default_rng(16)
    mha = random_mha(8, 4, seed=17)
    x, context = rng.normal(size=(3, 2, 8)), rng.normal(size=(5, 8))
    output, weights = mha(x, context=context)
    assert output.shape == (3, 2, 8) and weights.shape == (3, 4, 2, 5)
    for b in range(3):
        np.testing.assert_allclose(output[b], mha(x[b], context=context)[0], rtol=1e-12)


# --------------------------------------------------------------------------- masks


def test_a_tq_by_tk_mask_applies_to_every_head_and_every_batch():
    rng = np.random.default_rng(18)
    mha = random_mha(12, 3, seed=19)
    x, context = rng.normal(size=(2, 4, 12)), rng.normal(size=(2, 6, 12))
    mask = rng.random((4, 6)) < 0.6
    mask[:, 0] = True
    output, weights = mha(x, context=context, mask=mask)
    expected_output, expected_weights = reference_mha(mha, x, context=context, mask=mask)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)
    assert np.all(weights[:, :, ~mask] == 0)


def test_a_padding_mask_hides_the_padded_keys_of_each_sequence_in_every_head():
    rng = np.random.default_rng(20)
    mha = random_mha(16, 4, seed=21)
    x = rng.normal(size=(3, 5, 16))
    mask = padding_mask([5, 2, 3], 5)  # (B, 1, Tk)
    output, weights = mha(x, mask=mask)
    expected_output, expected_weights = reference_mha(mha, x, mask=mask)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(weights[1, :, :, 2:], 0.0)
    np.testing.assert_array_equal(weights[2, :, :, 3:], 0.0)


def test_the_output_at_a_real_token_ignores_what_the_padding_holds():
    rng = np.random.default_rng(22)
    mha = random_mha(8, 2, seed=23)
    x = rng.normal(size=(1, 5, 8))
    noisy = x.copy()
    noisy[0, 3:] = rng.normal(size=(2, 8)) * 100  # the padding changes wildly
    mask = padding_mask([3], 5)
    np.testing.assert_allclose(mha(noisy, mask=mask)[0][0, :3], mha(x, mask=mask)[0][0, :3],
                               rtol=1e-12, atol=1e-12)


def test_a_causal_mask_combined_with_padding_matches_the_loop_reference():
    rng = np.random.default_rng(24)
    mha = random_mha(8, 2, seed=25)
    x = rng.normal(size=(2, 6, 8))
    mask = causal_mask(6) & padding_mask([6, 4], 6)  # (B, Tq, Tk)
    output, weights = mha(x, mask=mask)
    expected_output, expected_weights = reference_mha(mha, x, mask=mask)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-10, atol=1e-12)
    assert np.all(weights[:, :, np.triu_indices(6, 1)[0], np.triu_indices(6, 1)[1]] == 0)


def test_causal_output_ignores_future_tokens():
    rng = np.random.default_rng(26)
    mha = random_mha(8, 4, seed=27)
    x = rng.normal(size=(6, 8))
    changed = x.copy()
    changed[4:] = rng.normal(size=(2, 8))
    mask = causal_mask(6)
    np.testing.assert_allclose(mha(changed, mask=mask)[0][:4], mha(x, mask=mask)[0][:4],
                               rtol=1e-12, atol=1e-12)


def test_a_mask_of_keys_only_applies_to_every_query_as_in_scaled_dot_product_attention():
    # The documented contract is "mask broadcastable to (..., Tq, Tk)"; a (Tk,) mask is, and
    # scaled_dot_product_attention accepts it. It must mean the same as the (1, Tk) mask.
    rng = np.random.default_rng(28)
    mha = random_mha(8, 2, seed=29)
    x = rng.normal(size=(2, 4, 8))
    key_mask = np.array([True, False, True, True])
    expected = mha(x, mask=key_mask[None, :])
    actual = mha(x, mask=key_mask)
    np.testing.assert_array_equal(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1], expected[1])


def test_a_fully_masked_query_row_gives_zero_weights_and_output_b_o_without_nan():
    rng = np.random.default_rng(30)
    mha = random_mha(12, 3, seed=31)
    x = rng.normal(size=(2, 4, 12))
    mask = np.ones((2, 4, 4), dtype=bool)
    mask[1, 2] = False  # query 2 of sequence 1 may attend to nothing
    output, weights = mha(x, mask=mask)
    assert not np.isnan(output).any() and not np.isnan(weights).any()
    np.testing.assert_array_equal(weights[1, :, 2], 0.0)
    np.testing.assert_allclose(output[1, 2], mha.b_o, rtol=0, atol=1e-15)
    expected_output, _ = reference_mha(mha, x, mask=mask)
    np.testing.assert_allclose(output, expected_output, rtol=1e-10, atol=1e-12)


def test_an_all_false_mask_gives_b_o_in_every_row():
    mha = random_mha(8, 2, seed=32)
    x = np.random.default_rng(33).normal(size=(3, 8))
    output, weights = mha(x, mask=np.zeros((3, 3), dtype=bool))
    np.testing.assert_array_equal(weights, 0.0)
    np.testing.assert_allclose(output, np.broadcast_to(mha.b_o, (3, 8)), rtol=0, atol=1e-15)


# --------------------------------------------------------------------------- dtypes


def test_float32_layer_and_input_give_float32_output_and_weights():
    mha = MultiHeadAttention.init(16, 4, np.random.default_rng(34), dtype=np.float32)
    for name in (*WEIGHT_NAMES, *BIAS_NAMES):
        assert getattr(mha, name).dtype == np.float32
    x = np.random.default_rng(35).normal(size=(2, 5, 16)).astype(np.float32)
    output, weights = mha(x, mask=causal_mask(5))
    assert output.dtype == np.float32 and weights.dtype == np.float32
    expected_output, expected_weights = MultiHeadAttention.init(
        16, 4, np.random.default_rng(34))(x.astype(np.float64), mask=causal_mask(5))
    np.testing.assert_allclose(output, expected_output, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-4, atol=1e-5)


def test_float32_cross_attention_stays_float32():
    mha = MultiHeadAttention.init(8, 2, np.random.default_rng(36), dtype=np.float32)
    rng = np.random.default_rng(37)
    x = rng.normal(size=(3, 8)).astype(np.float32)
    context = rng.normal(size=(5, 8)).astype(np.float32)
    output, weights = mha(x, context=context)
    assert output.dtype == weights.dtype == np.float32


# --------------------------------------------------------------------------- bad input


def test_init_raises_naming_d_model_and_num_heads_when_they_do_not_divide():
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        MultiHeadAttention.init(10, 4, np.random.default_rng(0))


def test_direct_construction_raises_naming_d_model_and_num_heads_when_they_do_not_divide():
    parameters = random_parameters(10, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"d_model=10 is not divisible by num_heads=4"):
        MultiHeadAttention(**parameters, num_heads=4)


@pytest.mark.parametrize(
    ("d_model", "num_heads", "error", "pattern"),
    [
        (0, 1, ValueError, "d_model must be >= 1"),
        (8, 0, ValueError, "num_heads must be >= 1"),
        (8, 2.0, TypeError, "num_heads must be an integer"),
    ],
)
def test_init_rejects_bad_sizes_naming_them(d_model, num_heads, error, pattern):
    with pytest.raises(error, match=pattern):
        MultiHeadAttention.init(d_model, num_heads, np.random.default_rng(0))


def test_init_rejects_an_rng_that_is_not_a_generator():
    with pytest.raises(TypeError, match="rng"):
        MultiHeadAttention.init(8, 2, np.random.RandomState(0))


@pytest.mark.parametrize("name", WEIGHT_NAMES[1:])
def test_a_weight_of_the_wrong_shape_raises_naming_it_and_the_expected_shape(name):
    parameters = random_parameters(8, np.random.default_rng(0))
    parameters[name] = np.zeros((8, 6))
    with pytest.raises(ValueError, match=rf"{name} must have shape .*\(8, 8\).*got \(8, 6\)"):
        MultiHeadAttention(**parameters, num_heads=2)


def test_a_w_q_that_is_not_2d_raises_naming_it():
    parameters = random_parameters(8, np.random.default_rng(0))
    parameters["W_q"] = np.zeros(8)
    with pytest.raises(ValueError, match=r"W_q must be 2-d .*got shape \(8,\)"):
        MultiHeadAttention(**parameters, num_heads=2)


def test_a_non_square_w_q_raises_naming_it():
    parameters = random_parameters(8, np.random.default_rng(0))
    parameters["W_q"] = np.zeros((8, 4))
    with pytest.raises(ValueError, match=r"W_q must have shape .*\(8, 8\).*got \(8, 4\)"):
        MultiHeadAttention(**parameters, num_heads=2)


@pytest.mark.parametrize("name", BIAS_NAMES)
@pytest.mark.parametrize("bad_shape", [(6,), (1, 8), ()], ids=["short", "2-d", "scalar"])
def test_a_bias_of_the_wrong_shape_raises_naming_it(name, bad_shape):
    parameters = random_parameters(8, np.random.default_rng(0))
    parameters[name] = np.zeros(bad_shape)
    with pytest.raises(ValueError, match=rf"{name} must have shape \(8,\); got "
                                         rf"{re.escape(str(bad_shape))}"):
        MultiHeadAttention(**parameters, num_heads=2)


def test_input_with_the_wrong_feature_size_raises_naming_x_and_d_model():
    mha = random_mha(8, 2)
    with pytest.raises(ValueError, match=r"x has 6 features but the layer has d_model=8"):
        mha(np.zeros((3, 6)))


def test_context_with_the_wrong_feature_size_raises_naming_context_and_d_model():
    mha = random_mha(8, 2)
    with pytest.raises(ValueError, match=r"context has 5 features but the layer has d_model=8"):
        mha(np.zeros((3, 8)), context=np.zeros((4, 5)))


@pytest.mark.parametrize("name", ["x", "context"])
def test_one_dimensional_x_or_context_raises_naming_it(name):
    mha = random_mha(8, 2)
    arguments = {"x": np.zeros((3, 8)), "context": np.zeros((4, 8))}
    arguments[name] = np.zeros(8)
    with pytest.raises(ValueError, match=rf"{name} must have at least 2 dimensions"):
        mha(**arguments)


@pytest.mark.parametrize("mask_shape", [(3, 4), (2, 3, 1, 3), (4, 1, 3)])
def test_a_mask_that_does_not_broadcast_raises_naming_mask(mask_shape):
    mha = random_mha(8, 2)
    with pytest.raises(ValueError, match="mask"):
        mha(np.zeros((2, 3, 8)), mask=np.ones(mask_shape, dtype=bool))


def test_a_non_boolean_mask_raises_type_error_naming_mask():
    mha = random_mha(8, 2)
    with pytest.raises(TypeError, match="mask must be boolean"):
        mha(np.zeros((3, 8)), mask=np.ones((3, 3)))


# --------------------------------------------------------------------------- properties


@st.composite
def layer_and_tokens(draw):
    d_model, num_heads = draw(st.sampled_from([(4, 1), (6, 2), (8, 4), (12, 3), (16, 8)]))
    T = draw(st.integers(1, 8))
    permutation = np.array(draw(st.permutations(range(T)), label="permutation"))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention(**random_parameters(d_model, rng), num_heads=num_heads)
    return mha, rng.normal(size=(T, d_model)), permutation


@given(case=layer_and_tokens())
def test_permuting_the_tokens_permutes_the_outputs_and_each_heads_weights(case):
    # Without positions, self-attention sees a set of tokens, not a sequence.
    mha, x, permutation = case
    output, weights = mha(x)
    permuted_output, permuted_weights = mha(x[permutation])
    np.testing.assert_allclose(permuted_output, output[permutation], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(
        permuted_weights, weights[:, permutation][:, :, permutation], rtol=1e-10, atol=1e-12
    )


# =============================================================================================
# The optional output gate (gated attention, chapter 19) and the forward pass without it
# =============================================================================================

def forward_before_the_gate(mha, x, context=None, mask=None, cache=None, need_weights=True):
    """``MultiHeadAttention.forward`` as it was before the output gate was added: a verbatim
    copy of its five steps (project, RoPE, cache, attend, merge). Without ``W_g`` the layer
    must compute exactly this, bit for bit, on every path."""
    from attention_lib.attention import project
    from attention_lib.multihead import (
        _grouped_attention,
        _heads_mask,
        _merge_heads,
        _split_heads,
    )
    from attention_lib.positional import apply_rope

    context = x if context is None else context
    q = _split_heads(project(x, mha.W_q, mha.b_q), mha.num_heads)
    k = _split_heads(project(context, mha.W_k, mha.b_k), mha.num_kv_heads)
    v = _split_heads(project(context, mha.W_v, mha.b_v), mha.num_kv_heads)
    start = 0 if cache is None else cache.length
    if mha.rope_base is not None:
        q = apply_rope(q, start + np.arange(q.shape[-2]), base=mha.rope_base)
        k = apply_rope(k, start + np.arange(k.shape[-2]), base=mha.rope_base)
    if cache is not None:
        k, v = cache.append(k, v)
    heads, weights = _grouped_attention(q, k, v, _heads_mask(mask),
                                        1.0 / math.sqrt(q.shape[-1]), need_weights)
    return project(_merge_heads(heads), mha.W_o, mha.b_o), weights


def assert_bit_identical(got, expected):
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("rope_base", [None, 10000.0], ids=["no-rope", "rope"])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_without_a_gate_every_path_is_bit_identical_to_the_layer_before_the_gate(
        num_kv_heads, rope_base, dtype):
    from attention_lib.cache import KVCache

    rng = np.random.default_rng(num_kv_heads)
    mha = MultiHeadAttention.init(16, 4, rng, dtype, num_kv_heads=num_kv_heads)
    mha.rope_base = rope_base
    mha.b_q, mha.b_o = (rng.normal(size=16).astype(dtype) for _ in range(2))
    assert mha.W_g is None and mha.b_g is None
    x = rng.normal(size=(2, 7, 16)).astype(dtype)
    context = rng.normal(size=(2, 5, 16)).astype(dtype)
    padding = padding_mask(np.array([5, 3]), 5).reshape(2, 1, 5)
    for got, expected in [
        (mha(x), forward_before_the_gate(mha, x)),
        (mha(x, mask=causal_mask(7)), forward_before_the_gate(mha, x, mask=causal_mask(7))),
        (mha(x, context, padding), forward_before_the_gate(mha, x, context, padding)),
    ]:
        assert_bit_identical(got[0], expected[0])
        assert_bit_identical(got[1], expected[1])
    assert_bit_identical(mha(x, mask=causal_mask(7), need_weights=False)[0],
                         forward_before_the_gate(mha, x, mask=causal_mask(7),
                                                 need_weights=False)[0])
    caches = [KVCache.init(1, num_kv_heads, 7, 4, batch_shape=(2,), dtype=dtype).layer(0)
              for _ in range(2)]
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, 7)]:
        mask = causal_mask(stop - start, stop)
        got = mha(x[:, start:stop], mask=mask, cache=caches[0])
        expected = forward_before_the_gate(mha, x[:, start:stop], mask=mask, cache=caches[1])
        assert_bit_identical(got[0], expected[0])
        assert_bit_identical(got[1], expected[1])


@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_init_draws_the_gate_after_the_other_weights_so_they_do_not_change(num_kv_heads):
    def layer(gate):
        return MultiHeadAttention.init(16, 4, np.random.default_rng(7), gate=gate,
                                       num_kv_heads=num_kv_heads)

    plain, elementwise, headwise = layer(None), layer("elementwise"), layer("headwise")
    for name in WEIGHT_NAMES + BIAS_NAMES:
        np.testing.assert_array_equal(getattr(elementwise, name), getattr(plain, name))
        np.testing.assert_array_equal(getattr(headwise, name), getattr(plain, name))
    assert elementwise.W_g.shape == (16, 16) and headwise.W_g.shape == (16, 4)
    assert elementwise.b_g.shape == (16,) and headwise.b_g.shape == (4,)
    assert not elementwise.b_g.any() and not headwise.b_g.any()
    # The next draw of the same generator, drawn as the other weights are.
    rng = np.random.default_rng(7)
    layer_without_gate = MultiHeadAttention.init(16, 4, rng, num_kv_heads=num_kv_heads)
    np.testing.assert_array_equal(elementwise.W_g, init_linear_weight(16, 16, rng))
    assert layer_without_gate.W_g is None


def logit(p):
    return np.log(p) - np.log1p(-p)


@pytest.mark.parametrize("kind", ["headwise", "elementwise"])
def test_a_constant_gate_scales_the_rows_of_w_o_that_read_each_head(kind):
    # With W_g = 0 the gate is sigmoid(b_g) for every token: head h (elementwise: feature j
    # of the merged heads) is multiplied by a constant, which is the same as multiplying the
    # rows of W_o that read it. Checks that the gate's layout matches the heads'.
    rng = np.random.default_rng(8)
    mha = random_mha(12, 3, seed=8)
    factors = rng.uniform(0.05, 0.95, size=3 if kind == "headwise" else 12)
    rows = np.repeat(factors, 4) if kind == "headwise" else factors
    gated = MultiHeadAttention(**{name: getattr(mha, name) for name in WEIGHT_NAMES + BIAS_NAMES},
                               num_heads=3, W_g=np.zeros((12, factors.size)),
                               b_g=logit(factors))
    scaled = MultiHeadAttention(**{name: getattr(mha, name) for name in WEIGHT_NAMES[:3]
                                   + BIAS_NAMES}, W_o=rows[:, None] * mha.W_o, num_heads=3)
    x, mask = rng.normal(size=(2, 5, 12)), causal_mask(5)
    output, weights = gated(x, mask=mask)
    np.testing.assert_allclose(output, scaled(x, mask=mask)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(weights, mha(x, mask=mask)[1])  # the gate leaves weights be
    assert not np.allclose(output, mha(x, mask=mask)[0])


def test_the_gate_is_computed_from_x_in_cross_attention():
    rng = np.random.default_rng(9)
    mha = MultiHeadAttention.init(8, 2, rng, gate="elementwise")
    mha.b_g = rng.normal(size=8)
    x, context = rng.normal(size=(3, 8)), rng.normal(size=(5, 8))
    plain = MultiHeadAttention(**{name: getattr(mha, name) for name in WEIGHT_NAMES
                                  + BIAS_NAMES}, num_heads=2)
    gate = 1 / (1 + np.exp(-(x @ mha.W_g + mha.b_g)))  # (Tq, d_model): one row per query
    _, weights = plain(x, context)
    values = context @ mha.W_v + mha.b_v  # (Tk, d_model), heads side by side
    heads = np.concatenate([weights[h] @ values[:, 4 * h:4 * h + 4] for h in range(2)], axis=-1)
    np.testing.assert_allclose(mha(x, context)[0], (heads * gate) @ mha.W_o + mha.b_o,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(mha.gate(x)[1], gate[:, 4:], rtol=1e-15)


def test_a_gate_adds_its_parameters_to_the_count():
    from attention_lib import count_parameters

    d, H = 16, 4
    plain = 4 * d * d + 4 * d
    for gate, extra in [(None, 0), ("headwise", d * H + H), ("elementwise", d * d + d)]:
        mha = MultiHeadAttention.init(d, H, np.random.default_rng(0), gate=gate)
        assert count_parameters(mha) == plain + extra


@pytest.mark.parametrize(("W_g_shape", "b_g_shape", "pattern"), [
    ((8, 3), (3,), r"W_g must have shape \(8, 8\) \(elementwise gate\) or \(8, 2\) \(head-wise "
                   r"gate\); got \(8, 3\) \(d_model=8, num_heads=2\)"),
    ((2, 8), (8,), r"W_g must have shape .*; got \(2, 8\)"),
    ((8,), (8,), r"W_g must have shape .*; got \(8,\)"),
    ((8, 2), (8,), r"b_g must have shape \(2,\) to match W_g of shape \(8, 2\); got \(8,\)"),
    ((8, 8), (1, 8), r"b_g must have shape \(8,\) to match W_g of shape \(8, 8\); got \(1, 8\)"),
])
def test_a_gate_of_the_wrong_shape_raises_naming_it_and_the_shapes(W_g_shape, b_g_shape,
                                                                    pattern):
    mha = random_mha(8, 2)
    parameters = {name: getattr(mha, name) for name in WEIGHT_NAMES + BIAS_NAMES}
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(**parameters, num_heads=2, W_g=np.zeros(W_g_shape),
                           b_g=np.zeros(b_g_shape))


def test_a_gate_bias_without_a_gate_raises_naming_both():
    parameters = {name: getattr(random_mha(8, 2), name) for name in WEIGHT_NAMES + BIAS_NAMES}
    with pytest.raises(ValueError, match=r"b_g of shape \(8,\) is given but W_g is None"):
        MultiHeadAttention(**parameters, num_heads=2, b_g=np.zeros(8))


def test_a_gate_without_a_bias_has_no_bias():
    parameters = {name: getattr(random_mha(8, 2), name) for name in WEIGHT_NAMES + BIAS_NAMES}
    W_g = np.random.default_rng(1).normal(size=(8, 2))
    x = np.random.default_rng(2).normal(size=(4, 8))
    without = MultiHeadAttention(**parameters, num_heads=2, W_g=W_g)
    zero = MultiHeadAttention(**parameters, num_heads=2, W_g=W_g, b_g=np.zeros(2))
    np.testing.assert_array_equal(without(x)[0], zero(x)[0])


@pytest.mark.parametrize("gate", ["Elementwise", "head-wise", True, 1])
def test_init_rejects_an_unknown_gate_naming_it(gate):
    with pytest.raises(ValueError, match="gate must be None, 'elementwise' or 'headwise'; got"):
        MultiHeadAttention.init(8, 2, np.random.default_rng(0), gate=gate)


def test_gate_values_of_a_layer_without_a_gate_raise():
    mha = MultiHeadAttention.init(8, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"no output gate \(W_g is None\)"):
        mha.gate(np.zeros((3, 8)))
    with pytest.raises(ValueError, match=r"x has 7 features but the layer has d_model=8"):
        MultiHeadAttention.init(8, 2, np.random.default_rng(0), gate="headwise").gate(
            np.zeros((3, 7)))
