"""Every hand-written backward pass of attention_lib.training against centred finite differences
in float64 (relative error < 1e-6), the functional forward passes against the library's layers,
and the gradient facts the chapter states (masked pairs pass no gradient, b_k's is zero).

Each check turns a layer's output into a scalar with a fixed random projection,
loss = sum(output * R), so every output entry matters; then dL/doutput = R is what the
backward pass receives.
"""

import dataclasses
import math

import numpy as np
import pytest
from model_helpers import randomize_parameters as randomize

from attention_lib import (
    EncoderBlock,
    FeedForward,
    LayerNorm,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)
from attention_lib.training import (
    EncoderModel,
    activation_backward,
    activation_forward,
    attention_backward,
    attention_forward,
    check_gradients,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    encoder_block_backward,
    encoder_block_forward,
    feed_forward_backward,
    feed_forward_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    loss_and_grads,
    mha_backward,
    mha_forward,
    model_forward,
    named_parameters,
    numerical_gradient,
    relative_error,
    softmax_backward,
    softmax_forward,
    sum_to_shape,
)

TOLERANCE = 1e-6  # relative error of analytic vs finite-difference gradients, float64



def assert_gradients_match(loss_fn, params, grads):
    errors = check_gradients(loss_fn, params, grads)
    worst = max(errors, key=errors.get)
    assert errors[worst] < TOLERANCE, errors


def projection_loss(output, R):
    return float(np.sum(output * R))


# --------------------------------------------------------------------------- helpers


def test_relative_error_is_zero_for_equal_and_one_for_opposite_arrays():
    a = np.array([1.0, -2.0, 3.0])
    assert relative_error(a, a) == 0.0
    assert relative_error(a, -a) == pytest.approx(1.0)


def test_numerical_gradient_of_a_cubic_and_restores_its_input():
    x = np.array([[1.0, -2.0], [0.5, 3.0]])
    before = x.copy()
    grad = numerical_gradient(lambda: float(np.sum(x**3)), x)
    np.testing.assert_allclose(grad, 3 * before**2, rtol=1e-8)
    np.testing.assert_array_equal(x, before)


def test_numerical_gradient_refuses_float32():
    with pytest.raises(TypeError, match="float64"):
        numerical_gradient(lambda: 0.0, np.zeros(3, dtype=np.float32))


def test_sum_to_shape_sums_over_broadcast_axes():
    grad = np.arange(24.0).reshape(2, 3, 4)
    np.testing.assert_array_equal(sum_to_shape(grad, (4,)), grad.sum(axis=(0, 1)))
    np.testing.assert_array_equal(sum_to_shape(grad, (1, 3, 1)),
                                  grad.sum(axis=(0, 2))[None, :, None])
    np.testing.assert_array_equal(sum_to_shape(grad, grad.shape), grad)


# --------------------------------------------------------------------------- linear, activations


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_backward_matches_finite_differences(with_bias):
    rng = np.random.default_rng(0)
    x, W = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 5))
    b = rng.normal(size=5) if with_bias else None
    R = rng.normal(size=(2, 3, 5))
    y, saved = linear_forward(x, W, b)
    np.testing.assert_array_equal(y, x @ W + (0 if b is None else b))
    dx, dW, db = linear_backward(R, saved)
    params, grads = {"x": x, "W": W}, {"x": dx, "W": dW}
    if with_bias:
        params["b"], grads["b"] = b, db
    else:
        assert db is None
    assert_gradients_match(lambda: projection_loss(linear_forward(x, W, b)[0], R), params, grads)


@pytest.mark.parametrize("name", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activation_backward_matches_finite_differences(name):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 7)) * 2
    x[np.abs(x) < 1e-3] = 0.5  # keep relu's kink out of the finite-difference step
    R = rng.normal(size=x.shape)
    _, saved = activation_forward(x, name)
    dx = activation_backward(R, saved)
    assert_gradients_match(lambda: projection_loss(activation_forward(x, name)[0], R),
                           {"x": x}, {"x": dx})


def test_unknown_activation_is_refused():
    with pytest.raises(ValueError, match="activation must be one of"):
        activation_forward(np.zeros(2), "tanh")


# --------------------------------------------------------------------------- softmax, attention


def test_softmax_backward_matches_finite_differences_and_the_jacobian():
    rng = np.random.default_rng(2)
    x, R = rng.normal(size=(4, 6)), rng.normal(size=(4, 6))
    p, saved = softmax_forward(x)
    dx = softmax_backward(R, saved)
    assert_gradients_match(lambda: projection_loss(softmax_forward(x)[0], R), {"x": x}, {"x": dx})
    jacobian = np.einsum("bi,ij->bij", p, np.eye(6)) - p[:, :, None] * p[:, None, :]
    np.testing.assert_allclose(dx, np.einsum("bij,bi->bj", jacobian, R), atol=1e-14)


def test_softmax_backward_gives_zero_at_minus_infinity_and_for_an_all_blocked_row():
    x = np.array([[0.5, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    _, saved = softmax_forward(x)
    dx = softmax_backward(np.ones((2, 3)) * [[1.0, 2.0, 3.0]], saved)
    assert np.isfinite(dx).all()
    assert dx[0, 1] == 0.0
    np.testing.assert_array_equal(dx[1], 0.0)


def attention_inputs(seed, batch=(2,), Tq=4, Tk=5, d_k=3, d_v=2):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(*batch, Tq, d_k)), rng.normal(size=(*batch, Tk, d_k)),
            rng.normal(size=(*batch, Tk, d_v)), rng.normal(size=(*batch, Tq, d_v)))


def attention_masks():
    causal = causal_mask(4, 5)  # (4, 5)
    padding = padding_mask([3, 5], 5)  # (2, 1, 5)
    fully_masked = np.ones((2, 4, 5), dtype=bool)
    fully_masked[0, 1] = False  # query 1 of sequence 0 may attend to nothing
    return {"none": None, "causal": causal, "padding": padding,
            "causal+padding": causal & padding, "fully masked row": fully_masked}


@pytest.mark.parametrize("mask_name", list(attention_masks()))
def test_attention_backward_matches_finite_differences(mask_name):
    mask = attention_masks()[mask_name]
    q, k, v, R = attention_inputs(3)
    output, weights, saved = attention_forward(q, k, v, mask=mask)
    expected_output, expected_weights = scaled_dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(output, expected_output)
    np.testing.assert_array_equal(weights, expected_weights)
    dq, dk, dv = attention_backward(R, saved)
    assert_gradients_match(lambda: projection_loss(attention_forward(q, k, v, mask=mask)[0], R),
                           {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv})


def test_a_fully_masked_query_sends_no_gradient_and_no_nan():
    q, k, v, R = attention_inputs(4)
    mask = attention_masks()["fully masked row"]
    _, _, saved = attention_forward(q, k, v, mask=mask)
    dq, dk, dv = attention_backward(R, saved)
    assert all(np.isfinite(grad).all() for grad in (dq, dk, dv))
    np.testing.assert_array_equal(dq[0, 1], 0.0)
    # Changing that query's output gradient changes nothing upstream.
    R_changed = R.copy()
    R_changed[0, 1] += 10.0
    for grad, changed in zip((dq, dk, dv), attention_backward(R_changed, saved)):
        np.testing.assert_array_equal(grad, changed)


def test_keys_hidden_from_every_query_get_zero_gradient():
    q, k, v, R = attention_inputs(5)
    mask = padding_mask([3, 5], 5)  # keys 3 and 4 of sequence 0 are padding
    _, _, saved = attention_forward(q, k, v, mask=mask)
    _, dk, dv = attention_backward(R, saved)
    np.testing.assert_array_equal(dk[0, 3:], 0.0)
    np.testing.assert_array_equal(dv[0, 3:], 0.0)
    assert np.abs(dk[1, 3:]).min() > 0  # sequence 1 has no padding


def test_attention_backward_sums_the_gradient_of_a_query_shared_by_the_batch():
    q, k, v, R = attention_inputs(6, Tq=1)
    shared_query = q[:1]  # (1, 1, d_k), broadcast over the batch of 2
    _, _, saved = attention_forward(shared_query, k, v)
    dq, dk, dv = attention_backward(R, saved)
    assert dq.shape == shared_query.shape
    assert_gradients_match(
        lambda: projection_loss(attention_forward(shared_query, k, v)[0], R),
        {"q": shared_query, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv})


def test_attention_backward_with_a_custom_scale():
    q, k, v, R = attention_inputs(7)
    _, _, saved = attention_forward(q, k, v, scale=0.3)
    dq, dk, dv = attention_backward(R, saved)
    assert_gradients_match(
        lambda: projection_loss(attention_forward(q, k, v, scale=0.3)[0], R),
        {"q": q, "k": k, "v": v}, {"q": dq, "k": dk, "v": dv})


# --------------------------------------------------------------------------- layers


def random_mha(seed, d_model=8, num_heads=2):
    rng = np.random.default_rng(seed)
    return randomize(MultiHeadAttention.init(d_model, num_heads, rng), rng)


@pytest.mark.parametrize("mask_name", ["none", "causal", "padding"])
def test_mha_backward_matches_finite_differences(mask_name):
    mha = random_mha(8)
    rng = np.random.default_rng(9)
    x, R = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 8))
    mask = {"none": None, "causal": causal_mask(5), "padding": padding_mask([5, 2], 5)}[mask_name]
    output, weights, saved = mha_forward(mha, x, mask)
    expected_output, expected_weights = mha(x, mask=mask)
    np.testing.assert_allclose(output, expected_output, atol=1e-14)
    np.testing.assert_allclose(weights, expected_weights, atol=1e-14)
    dx, grads = mha_backward(R, saved)
    params = {"x": x} | named_parameters(mha)
    assert_gradients_match(lambda: projection_loss(mha_forward(mha, x, mask)[0], R),
                           params, {"x": dx} | grads)


def test_the_key_bias_gets_exactly_zero_gradient():
    # b_k adds q . b_k to every score of a query's row, which softmax ignores.
    mha = random_mha(10)
    rng = np.random.default_rng(11)
    x, R = rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 8))
    _, _, saved = mha_forward(mha, x, causal_mask(5))
    _, grads = mha_backward(R, saved)
    assert np.abs(grads["b_k"]).max() < 1e-12
    assert np.abs(grads["b_q"]).max() > 1e-3


def test_mha_forward_refuses_grouped_query_attention():
    mha = MultiHeadAttention.init(8, 4, np.random.default_rng(0), num_kv_heads=2)
    with pytest.raises(ValueError, match="plain multi-head attention"):
        mha_forward(mha, np.ones((3, 8)))


def test_mha_forward_refuses_an_output_gate_it_has_no_backward_pass_for():
    # A gated layer trained as if ungated would silently learn the wrong function.
    mha = MultiHeadAttention.init(8, 4, np.random.default_rng(0), gate="headwise")
    with pytest.raises(ValueError, match=r"output gate W_g of shape \(8, 4\)"):
        mha_forward(mha, np.ones((3, 8)))


def test_layer_norm_backward_matches_finite_differences():
    rng = np.random.default_rng(12)
    norm = LayerNorm(1.0 + 0.3 * rng.normal(size=6), 0.3 * rng.normal(size=6), eps=1e-5)
    x, R = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6))
    y, saved = layer_norm_forward(norm, x)
    np.testing.assert_array_equal(y, norm(x))
    dx, grads = layer_norm_backward(R, saved)
    assert_gradients_match(lambda: projection_loss(layer_norm_forward(norm, x)[0], R),
                           {"x": x, "gamma": norm.gamma, "beta": norm.beta},
                           {"x": dx} | grads)


def test_layer_norm_backward_for_a_nearly_constant_row():
    # var + eps is dominated by eps here: the case std + eps would get wrong.
    rng = np.random.default_rng(13)
    norm = LayerNorm.init(5)
    x = 1.0 + 1e-3 * rng.normal(size=(2, 5))
    R = rng.normal(size=(2, 5))
    _, saved = layer_norm_forward(norm, x)
    dx, _ = layer_norm_backward(R, saved)
    assert_gradients_match(lambda: projection_loss(layer_norm_forward(norm, x)[0], R),
                           {"x": x}, {"x": dx})


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_backward_matches_finite_differences(activation):
    rng = np.random.default_rng(14)
    ff = randomize(FeedForward.init(6, 10, rng, activation=activation), rng)
    x, R = rng.normal(size=(2, 3, 6)), rng.normal(size=(2, 3, 6))
    y, saved = feed_forward_forward(ff, x)
    np.testing.assert_allclose(y, ff(x), atol=1e-14)
    dx, grads = feed_forward_backward(R, saved)
    assert_gradients_match(lambda: projection_loss(feed_forward_forward(ff, x)[0], R),
                           {"x": x} | named_parameters(ff), {"x": dx} | grads)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("with_attention", [True, False], ids=["block", "no-attention"])
def test_encoder_block_backward_matches_finite_differences(norm_first, with_attention):
    rng = np.random.default_rng(15)
    block = randomize(EncoderBlock.init(8, 2, 12, rng, norm_first=norm_first,
                                        attention=with_attention), rng)
    x, R = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 4, 8))
    mask = padding_mask([4, 2], 4)
    y, weights, saved = encoder_block_forward(block, x, mask)
    np.testing.assert_allclose(y, block(x, mask=mask), atol=1e-13)
    if with_attention:
        assert weights.shape == (2, 2, 4, 4)
    else:
        assert weights is None
    dx, grads = encoder_block_backward(R, saved)
    params = named_parameters(block)
    assert grads.keys() == params.keys()
    assert_gradients_match(lambda: projection_loss(encoder_block_forward(block, x, mask)[0], R),
                           {"x": x} | params, {"x": dx} | grads)


# --------------------------------------------------------------------------- embedding, loss


def test_embedding_backward_adds_up_repeated_tokens():
    rng = np.random.default_rng(16)
    embedding = rng.normal(size=(6, 3))
    tokens = np.array([[1, 4, 1], [0, 1, 2]])  # token 1 three times, 3 and 5 never
    R = rng.normal(size=(2, 3, 3))
    x, saved = embedding_forward(embedding, tokens)
    np.testing.assert_array_equal(x, embedding[tokens])
    d_embedding = embedding_backward(R, saved)
    np.testing.assert_array_equal(d_embedding[[3, 5]], 0.0)
    assert_gradients_match(lambda: projection_loss(embedding_forward(embedding, tokens)[0], R),
                           {"embedding": embedding}, {"embedding": d_embedding})


def test_embedding_refuses_out_of_range_tokens():
    with pytest.raises(ValueError, match=r"ids in \[0, 4\)"):
        embedding_forward(np.zeros((4, 2)), np.array([0, 4]))
    with pytest.raises(TypeError, match="integer ids"):
        embedding_forward(np.zeros((4, 2)), np.array([0.0, 1.0]))


def test_cross_entropy_backward_matches_finite_differences_with_ignored_positions():
    rng = np.random.default_rng(17)
    logits = rng.normal(size=(2, 4, 5)) * 3
    targets = rng.integers(0, 5, size=(2, 4))
    targets[1, 2:] = -100  # padding
    loss, saved = cross_entropy_forward(logits, targets)
    d_logits = cross_entropy_backward(1.0, saved)
    np.testing.assert_array_equal(d_logits[1, 2:], 0.0)
    assert_gradients_match(lambda: cross_entropy_forward(logits, targets)[0],
                           {"logits": logits}, {"logits": d_logits})


def test_cross_entropy_is_the_mean_negative_log_probability_of_the_counted_targets():
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]))
    loss, _ = cross_entropy_forward(logits, np.array([0, 1, -100]))
    assert loss == pytest.approx(-(math.log(0.5) + math.log(0.8)) / 2)


def test_cross_entropy_of_huge_logits_is_finite():
    loss, saved = cross_entropy_forward(np.array([[1e4, -1e4, 0.0]]), np.array([1]))
    assert loss == pytest.approx(2e4)
    assert np.isfinite(cross_entropy_backward(1.0, saved)).all()


def test_cross_entropy_with_every_position_ignored_is_zero_not_nan():
    loss, saved = cross_entropy_forward(np.ones((2, 3)), np.array([-100, -100]))
    assert loss == 0.0
    np.testing.assert_array_equal(cross_entropy_backward(1.0, saved), 0.0)


def test_cross_entropy_refuses_bad_targets():
    with pytest.raises(ValueError, match=r"class ids in \[0, 3\)"):
        cross_entropy_forward(np.zeros((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match="do not match logits"):
        cross_entropy_forward(np.zeros((2, 3)), np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integer class ids"):
        cross_entropy_forward(np.zeros((2, 3)), np.array([0.0, 1.0]))


# --------------------------------------------------------------------------- the whole model


MODEL_CONFIGS = {  # one block each (two for the first) keeps the finite differences fast
    "pre-LN, learned positions, two blocks": {"num_layers": 2},
    "post-LN": {"norm_first": False},
    "sinusoidal positions, gelu": {"positions": "sinusoidal", "activation": "gelu"},
    "no positions": {"positions": None},
    "no attention": {"attention": False},
    "attention pooling": {"pooling": True},
}


def tiny_model_and_batch(config, seed=18):
    """A model with d_model=4, 2 heads, d_ff=6, vocabulary 5, and a batch of 3 sequences of 5."""
    rng = np.random.default_rng(seed)
    config = dict(config)
    num_layers = config.pop("num_layers", 1)
    pooling = config.get("pooling", False)
    model = EncoderModel.init(5, 5, 4, 2, 6, num_layers, 2 if pooling else 5, rng, **config)
    randomize(model, rng)
    tokens = rng.integers(0, 5, size=(3, 5))
    if pooling:
        lengths, targets = np.array([5, 3, 4]), rng.integers(0, 2, size=3)
    else:
        lengths, targets = None, rng.integers(0, 5, size=(3, 5))
        targets[1, 3:] = -100
    return model, tokens, targets, lengths


@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
def test_whole_model_gradient_matches_finite_differences(config):
    model, tokens, targets, lengths = tiny_model_and_batch(MODEL_CONFIGS[config])
    loss, grads = loss_and_grads(model, tokens, targets, lengths)
    params = model.parameters()
    assert grads.keys() == params.keys()
    assert_gradients_match(lambda: loss_and_grads(model, tokens, targets, lengths)[0],
                           params, grads)


@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
def test_model_forward_equals_the_library_layers(config):
    model, tokens, _, lengths = tiny_model_and_batch(MODEL_CONFIGS[config])
    logits, weights, _ = model_forward(model, tokens, lengths)
    np.testing.assert_allclose(logits, model(tokens, lengths), atol=1e-12)
    assert len(weights) == len(model.blocks) + (model.pool_query is not None)


def test_model_refuses_sequences_longer_than_its_positions():
    model, _, _, _ = tiny_model_and_batch({})
    with pytest.raises(ValueError, match="max_len=5"):
        model_forward(model, np.zeros((1, 6), dtype=int))


def test_named_parameters_are_the_model_arrays_themselves():
    model, _, _, _ = tiny_model_and_batch({"num_layers": 2})
    params = model.parameters()
    assert params["blocks.1.ff.W2"] is model.blocks[1].ff.W2
    assert params["blocks.0.self_attn.W_q"] is model.blocks[0].self_attn.W_q
    assert params["embedding"] is model.embedding
    assert "blocks.0.norm1.eps" not in params
    copy = dataclasses.replace(model)
    assert copy.parameters().keys() == params.keys()


def test_dropout_scales_integer_input_by_one_over_keep_probability():
    # An integer array used to keep its dtype, truncating the 1/(1-p) scale to 1.
    from attention_lib.training.functional import dropout_forward

    y, _ = dropout_forward(np.ones(1000, dtype=int), 0.1, np.random.default_rng(0))
    kept = y[y != 0]
    assert y.dtype == np.float64
    np.testing.assert_allclose(kept, 1 / 0.9)


def test_dropout_accepts_a_list_and_names_bad_input():
    from attention_lib.training.functional import dropout_forward

    y, _ = dropout_forward([1.0, 2.0], 0.0, None)
    np.testing.assert_array_equal(y, [1.0, 2.0])
    with pytest.raises((TypeError, ValueError), match="x"):
        dropout_forward(["a", "b"], 0.5, np.random.default_rng(0))
