"""Activations, LayerNorm, RMSNorm and FeedForward (chapter 08): hand-worked values, the exact
formulas (biased variance, sqrt(var + eps)), parity with PyTorch's functions, dtypes, bad input,
and the position-wise property of the feed-forward network."""

import math
import re
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from attention_lib.layers import (
    ACTIVATIONS,
    FeedForward,
    GatedFeedForward,
    LayerNorm,
    RMSNorm,
    gelu,
    gelu_tanh,
    relu,
    silu,
)


@pytest.fixture
def torch():
    """PyTorch, for the parity checks only (the other tests here run without it)."""
    return pytest.importorskip("torch")


def random_layer_norm(d, rng, eps=1e-5, dtype=np.float64):
    """A LayerNorm whose gamma and beta are random (not the identity 1 and 0)."""
    return LayerNorm(rng.normal(1.0, 0.5, size=d).astype(dtype),
                     rng.normal(size=d).astype(dtype), eps)


def random_feed_forward(d_model, d_ff, rng, activation="relu", dtype=np.float64):
    """A FeedForward with random weights AND non-zero biases."""
    return FeedForward(
        W1=(rng.normal(size=(d_model, d_ff)) / math.sqrt(d_model)).astype(dtype),
        b1=rng.normal(size=d_ff).astype(dtype),
        W2=(rng.normal(size=(d_ff, d_model)) / math.sqrt(d_ff)).astype(dtype),
        b2=rng.normal(size=d_model).astype(dtype),
        activation=activation,
    )


# --------------------------------------------------------------------------- activations


def test_relu_zeroes_negatives_and_keeps_positives():
    np.testing.assert_array_equal(relu(np.array([-2.0, -0.0, 0.0, 0.5, 3.0])),
                                  [0.0, 0.0, 0.0, 0.5, 3.0])


def test_gelu_is_the_exact_erf_form_equal_to_torch_gelu(torch):
    x = np.linspace(-8, 8, 401)
    expected = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(gelu(x), expected, rtol=0, atol=1e-12)


def test_gelu_tanh_equals_torch_gelu_with_tanh_approximation(torch):
    x = np.linspace(-8, 8, 401)
    expected = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    np.testing.assert_allclose(gelu_tanh(x), expected, rtol=0, atol=1e-12)


def test_gelu_and_gelu_tanh_are_different_functions():
    # The approximation is close (the docstring says about 5e-4) but not equal: a library that
    # used one for the other would fail the torch comparisons above at atol 1e-12.
    x = np.linspace(-4, 4, 801)
    difference = np.abs(gelu(x) - gelu_tanh(x)).max()
    assert 1e-5 < difference < 1e-3


def test_silu_equals_torch_silu(torch):
    x = np.linspace(-30, 30, 601)
    expected = torch.nn.functional.silu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(silu(x), expected, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_silu_has_no_overflow_warning_at_plus_minus_1000(dtype):
    x = np.array([-1000.0, 1000.0], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = silu(x)
    assert np.isfinite(result).all()
    np.testing.assert_allclose(result, [0.0, 1000.0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_keep_float32_and_turn_integers_into_float64(name):
    activation = ACTIVATIONS[name]
    assert activation(np.array([-1.0, 0.5], dtype=np.float32)).dtype == np.float32
    assert activation(np.array([-1, 2])).dtype == np.float64


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_reject_non_numeric_input_naming_x(name):
    with pytest.raises(TypeError, match=r"\bx\b"):
        ACTIVATIONS[name](np.array(["a", "b"]))


# --------------------------------------------------------------------------- LayerNorm


def test_layer_norm_maps_1_3_to_minus_1_plus_1():
    layer_norm = LayerNorm(np.ones(2), np.zeros(2), eps=1e-300)
    np.testing.assert_allclose(layer_norm(np.array([1.0, 3.0])), [-1.0, 1.0], rtol=0, atol=1e-15)


def test_layer_norm_hand_worked_values_with_gamma_and_beta():
    # x = [2, 4, 6, 8]: mean 5, biased variance (9 + 1 + 1 + 9) / 4 = 5.
    layer_norm = LayerNorm(np.array([1.0, 2.0, 0.5, -1.0]), np.array([0.0, 1.0, -1.0, 3.0]),
                           eps=1e-300)
    normalized = np.array([-3.0, -1.0, 1.0, 3.0]) / math.sqrt(5.0)
    expected = normalized * [1.0, 2.0, 0.5, -1.0] + [0.0, 1.0, -1.0, 3.0]
    np.testing.assert_allclose(layer_norm(np.array([2.0, 4.0, 6.0, 8.0])), expected,
                               rtol=1e-14, atol=1e-14)


def test_layer_norm_uses_the_biased_variance_not_ddof_1():
    x = np.array([[0.0, 1.0, 5.0]])
    result = LayerNorm.init(3, eps=1e-300)(x)
    biased = (x - x.mean()) / x.std(ddof=0)
    unbiased = (x - x.mean()) / x.std(ddof=1)
    np.testing.assert_allclose(result, biased, rtol=1e-14, atol=1e-14)
    assert not np.allclose(result, unbiased, rtol=1e-3, atol=0)
    # and so the output has (biased) variance 1
    np.testing.assert_allclose(result.var(axis=-1), 1.0, rtol=1e-14)


def test_layer_norm_divides_by_sqrt_of_variance_plus_eps_not_std_plus_eps():
    # A low-variance input: var = 1e-6, eps = 1e-5, so sqrt(var + eps) = sqrt(1.1e-5) ~ 3.317e-3
    # while std + eps = 1.01e-3: the two formulas differ by a factor of about 3.3.
    x = np.array([[1.0 - 1e-3, 1.0 + 1e-3]])
    eps = 1e-5
    result = LayerNorm(np.ones(2), np.zeros(2), eps)(x)
    centred = x - x.mean(axis=-1, keepdims=True)
    variance = (centred**2).mean(axis=-1, keepdims=True)
    sqrt_var_plus_eps = centred / np.sqrt(variance + eps)
    std_plus_eps = centred / (np.sqrt(variance) + eps)
    np.testing.assert_allclose(result, sqrt_var_plus_eps, rtol=1e-9)
    assert not np.allclose(result, std_plus_eps, rtol=0.1)
    np.testing.assert_allclose(np.abs(result), 1e-3 / math.sqrt(1.1e-5), rtol=1e-9)


@pytest.mark.parametrize("eps", [1e-5, 1e-12, 0.5])
def test_layer_norm_equals_torch_layer_norm(eps, torch):
    rng = np.random.default_rng(0)
    layer_norm = random_layer_norm(6, rng, eps)
    x = rng.normal(size=(2, 3, 6)) * 3 + 1
    torch_norm = torch.nn.LayerNorm(6, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        torch_norm.weight.copy_(torch.from_numpy(layer_norm.gamma))
        torch_norm.bias.copy_(torch.from_numpy(layer_norm.beta))
        expected = torch_norm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(layer_norm(x), expected, rtol=1e-12, atol=1e-12)


def test_layer_norm_normalizes_over_the_last_axis_only():
    rng = np.random.default_rng(1)
    layer_norm = random_layer_norm(5, rng)
    x = rng.normal(size=(2, 4, 5))
    changed = x.copy()
    changed[1, 2] = rng.normal(size=5) * 100  # one token of one sequence
    before, after = layer_norm(x), layer_norm(changed)
    untouched = np.ones((2, 4), dtype=bool)
    untouched[1, 2] = False
    np.testing.assert_array_equal(after[untouched], before[untouched])
    assert not np.allclose(after[1, 2], before[1, 2])


def test_layer_norm_of_a_batch_equals_layer_norm_of_each_row():
    rng = np.random.default_rng(2)
    layer_norm = random_layer_norm(4, rng)
    x = rng.normal(size=(3, 4))
    rows = np.stack([layer_norm(row) for row in x])
    np.testing.assert_allclose(layer_norm(x), rows, rtol=1e-14, atol=1e-14)


def test_layer_norm_keeps_float32():
    rng = np.random.default_rng(3)
    layer_norm = random_layer_norm(4, rng, dtype=np.float32)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    result = layer_norm(x)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, random_layer_norm(4, np.random.default_rng(3))(
        x.astype(np.float64)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norms_of_float16_entries_beyond_256_are_float64_results_rounded(norm):
    # float16 squares overflow beyond ~256 (65504 is its largest number): the statistics are
    # computed in float32, and the result rounded once to float16.
    rng = np.random.default_rng(16)
    x = (rng.normal(size=(3, 8)) * 1000).astype(np.float16)
    make = LayerNorm.init if norm == "layer" else RMSNorm.init
    result = make(8, dtype=np.float16)(x)
    expected = make(8)(x.astype(np.float64))
    assert result.dtype == np.float16
    eps16 = float(np.finfo(np.float16).eps)
    assert (np.abs(result - expected) <= eps16 * np.maximum(1.0, np.abs(expected))).all()
    np.testing.assert_allclose(make(4, dtype=np.float16)(np.float16([300, -300, 10, 5])),
                               make(4)(np.array([300.0, -300.0, 10.0, 5.0])), atol=2e-3)


def test_layer_norm_init_is_gamma_one_beta_zero():
    layer_norm = LayerNorm.init(3, eps=1e-6, dtype=np.float32)
    np.testing.assert_array_equal(layer_norm.gamma, np.ones(3))
    np.testing.assert_array_equal(layer_norm.beta, np.zeros(3))
    assert layer_norm.gamma.dtype == layer_norm.beta.dtype == np.float32
    assert layer_norm.eps == 1e-6


def test_layer_norm_rejects_gamma_and_beta_of_different_shapes():
    with pytest.raises(ValueError, match=r"gamma and beta.*\(4,\).*\(3,\)"):
        LayerNorm(np.ones(4), np.zeros(3))


def test_layer_norm_rejects_a_2d_gamma():
    with pytest.raises(ValueError, match=r"gamma"):
        LayerNorm(np.ones((2, 2)), np.zeros((2, 2)))


def test_layer_norm_rejects_x_with_the_wrong_feature_count_naming_x_and_the_expected_size():
    layer_norm = LayerNorm.init(4)
    with pytest.raises(ValueError, match=r"\bx\b.*\b3\b.*expects 4") as info:
        layer_norm(np.ones((2, 3)))
    assert "(2, 3)" in str(info.value)


@pytest.mark.parametrize("eps", [0.0, -1e-5, float("nan")])
def test_layer_norm_rejects_eps_that_is_not_positive(eps):
    with pytest.raises(ValueError, match=r"eps"):
        LayerNorm(np.ones(2), np.zeros(2), eps)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_norms_reject_an_infinite_eps_naming_eps(norm):
    # eps = inf would divide every token by infinity and return beta (or 0) silently.
    with pytest.raises(ValueError, match=r"eps.*inf"):
        if norm == "layer":
            LayerNorm(np.ones(2), np.zeros(2), float("inf"))
        else:
            RMSNorm(np.ones(2), float("inf"))


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("eps", ["a", None, True])
def test_norms_reject_a_non_numeric_eps_with_a_type_error_naming_eps(norm, eps):
    with pytest.raises(TypeError, match=r"^eps must be a real number"):
        if norm == "layer":
            LayerNorm(np.ones(2), np.zeros(2), eps)
        else:
            RMSNorm(np.ones(2), eps)


def test_layer_norm_init_rejects_a_non_positive_size():
    with pytest.raises(ValueError, match=r"\bd\b"):
        LayerNorm.init(0)


# --------------------------------------------------------------------------- RMSNorm


def test_rms_norm_hand_worked_values():
    # x = [3, 4]: mean square (9 + 16) / 2 = 12.5, so y = x / sqrt(12.5) * gamma.
    rms_norm = RMSNorm(np.array([1.0, -2.0]), eps=1e-300)
    expected = np.array([3.0, 4.0]) / math.sqrt(12.5) * [1.0, -2.0]
    np.testing.assert_allclose(rms_norm(np.array([3.0, 4.0])), expected, rtol=1e-15)


def test_rms_norm_does_not_centre():
    # A constant vector: LayerNorm gives 0, RMSNorm gives gamma (the rms of [c, c] is c).
    rms_norm = RMSNorm.init(3, eps=1e-300)
    np.testing.assert_allclose(rms_norm(np.full(3, 7.0)), np.ones(3), rtol=1e-15)


@pytest.mark.parametrize("eps", [1e-6, 0.25])
def test_rms_norm_equals_torch_rms_norm(eps, torch):
    rng = np.random.default_rng(4)
    rms_norm = RMSNorm(rng.normal(1.0, 0.5, size=6), eps)
    x = rng.normal(size=(2, 3, 6)) * 2 + 0.5
    torch_norm = torch.nn.RMSNorm(6, eps=eps, dtype=torch.float64)
    with torch.no_grad():
        torch_norm.weight.copy_(torch.from_numpy(rms_norm.gamma))
        expected = torch_norm(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(rms_norm(x), expected, rtol=1e-12, atol=1e-12)


def test_rms_norm_keeps_float32():
    rms_norm = RMSNorm.init(4, dtype=np.float32)
    assert rms_norm(np.ones((2, 4), dtype=np.float32)).dtype == np.float32


def test_rms_norm_rejects_bad_input():
    with pytest.raises(ValueError, match=r"gamma"):
        RMSNorm(np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"eps"):
        RMSNorm(np.ones(2), eps=0.0)
    with pytest.raises(ValueError, match=r"\bx\b.*\b5\b.*expects 2"):
        RMSNorm.init(2)(np.ones((3, 5)))


# --------------------------------------------------------------------------- FeedForward


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_feed_forward_equals_a_manual_computation(activation):
    rng = np.random.default_rng(5)
    ff = random_feed_forward(4, 10, rng, activation)
    x = rng.normal(size=(2, 3, 4))
    pre = np.einsum("btd,df->btf", x, ff.W1) + ff.b1
    hidden = {
        "relu": np.where(pre > 0, pre, 0.0),
        "gelu": 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2))),
        "gelu_tanh": 0.5 * pre * (1 + np.tanh(math.sqrt(2 / math.pi) * (pre + 0.044715 * pre**3))),
        "silu": pre / (1.0 + np.exp(-pre)),
    }[activation]
    expected = np.einsum("btf,fd->btd", hidden, ff.W2) + ff.b2
    np.testing.assert_allclose(ff(x), expected, rtol=1e-12, atol=1e-12)


def test_feed_forward_hand_worked_value():
    # W1 picks x0 and -x0; relu keeps the positive one; W2 sums them: y = |x0| * [1, 1] + b2.
    ff = FeedForward(W1=np.array([[1.0, -1.0], [0.0, 0.0]]), b1=np.zeros(2),
                     W2=np.ones((2, 2)), b2=np.array([0.5, -0.5]))
    np.testing.assert_allclose(ff(np.array([[-3.0, 9.0], [2.0, 1.0]])),
                               [[3.5, 2.5], [2.5, 1.5]], rtol=0, atol=1e-15)


def test_feed_forward_init_shapes_and_zero_biases():
    ff = FeedForward.init(6, 24, np.random.default_rng(6), activation="gelu", dtype=np.float32)
    assert (ff.W1.shape, ff.b1.shape, ff.W2.shape, ff.b2.shape) == ((6, 24), (24,), (24, 6), (6,))
    assert ff.W1.dtype == ff.W2.dtype == np.float32
    np.testing.assert_array_equal(ff.b1, 0.0)
    np.testing.assert_array_equal(ff.b2, 0.0)
    assert ff.activation == "gelu"


def test_feed_forward_keeps_float32():
    ff = random_feed_forward(4, 8, np.random.default_rng(7), "gelu", dtype=np.float32)
    assert ff(np.ones((2, 4), dtype=np.float32)).dtype == np.float32


@pytest.mark.parametrize(
    ("shapes", "pattern"),
    [
        (((4, 8), (8,), (8, 4), (3,)), r"b2 \(4,\)"),  # b2 has the wrong size
        (((4, 8), (7,), (8, 4), (4,)), r"b1 \(8,\)"),  # b1 has the wrong size
        (((4, 8), (8,), (4, 8), (4,)), r"W2 \(8, 4\)"),  # W2 not transposed
        (((4,), (8,), (8, 4), (4,)), r"W1 and W2 must be 2-d"),
    ],
    ids=["b2", "b1", "W2", "W1-1d"],
)
def test_feed_forward_rejects_inconsistent_shapes_naming_what_it_expected(shapes, pattern):
    w1, b1, w2, b2 = (np.zeros(shape) for shape in shapes)
    with pytest.raises(ValueError, match=pattern):
        FeedForward(w1, b1, w2, b2)


@pytest.mark.parametrize(
    "shapes",
    [((2, 3, 4), (4, 3), (3, 4)), ((4, 3), (4, 3), (3,)), ((4, 3), (1, 4, 3), (3, 4))],
    ids=["W_gate-3d", "W_down-1d", "W_up-3d"],
)
def test_gated_feed_forward_rejects_matrices_that_are_not_2d_naming_all_three(shapes):
    w_gate, w_up, w_down = (np.ones(shape) for shape in shapes)
    with pytest.raises(ValueError, match=re.escape(
            f"W_gate, W_up and W_down must be 2-d; got W_gate {shapes[0]}, "
            f"W_up {shapes[1]}, W_down {shapes[2]}")):
        GatedFeedForward(w_gate, w_up, w_down)


def test_gated_feed_forward_rejects_inconsistent_shapes_naming_what_it_expected():
    with pytest.raises(ValueError, match=r"expected W_up \(4, 3\) and W_down \(3, 4\)"):
        GatedFeedForward(np.ones((4, 3)), np.ones((4, 3)), np.ones((4, 3)))


def test_feed_forward_rejects_x_with_the_wrong_feature_count():
    ff = FeedForward.init(4, 8, np.random.default_rng(8))
    with pytest.raises(ValueError, match=r"\bx\b.*\b5\b.*expects 4"):
        ff(np.ones((3, 5)))


def test_feed_forward_rejects_an_unknown_activation_naming_activation():
    with pytest.raises(ValueError, match=r"activation.*'tanh'") as info:
        FeedForward.init(4, 8, np.random.default_rng(9), activation="tanh")
    for name in ACTIVATIONS:
        assert re.search(rf"'{name}'", str(info.value))


@settings(max_examples=25, deadline=None)
@given(
    x=hnp.arrays(np.float64, st.tuples(st.integers(2, 6), st.just(4)),
                 elements=st.floats(-10, 10)),
    data=st.data(),
)
def test_feed_forward_is_position_wise(x, data):
    """FF(x)[t] depends only on x[t]: changing every other token leaves it unchanged, and it
    equals FF applied to that one token alone."""
    ff = random_feed_forward(4, 8, np.random.default_rng(10), "gelu")
    t = data.draw(st.integers(0, x.shape[0] - 1), label="t")
    other = data.draw(hnp.arrays(np.float64, x.shape, elements=st.floats(-10, 10)), label="other")
    changed = other.copy()
    changed[t] = x[t]
    np.testing.assert_allclose(ff(changed)[t], ff(x)[t], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ff(x[t : t + 1])[0], ff(x)[t], rtol=1e-12, atol=1e-12)
