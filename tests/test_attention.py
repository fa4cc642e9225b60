"""scaled_dot_product_attention (chapters 03-04): values, shapes, dtypes, bad input, properties."""

import math
import re
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attention_lib import causal_mask, scaled_dot_product_attention, softmax

attend = scaled_dot_product_attention


def no_warnings(func, *args, **kwargs):
    """Call ``func`` with every warning turned into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return func(*args, **kwargs)


def reference_attention(q, k, v, mask=None, scale=None):
    """Attention written out with Python loops and ``math.exp``, one query at a time."""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    Tq, Tk, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    if mask is None:
        mask = np.ones((Tq, Tk), dtype=bool)
    mask = np.broadcast_to(mask, (*batch, Tq, Tk))
    batch = mask.shape[:-2]
    q = np.broadcast_to(q, (*batch, *q.shape[-2:]))
    k = np.broadcast_to(k, (*batch, *k.shape[-2:]))
    v = np.broadcast_to(v, (*batch, *v.shape[-2:]))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    output = np.zeros((*batch, Tq, d_v))
    weights = np.zeros((*batch, Tq, Tk))
    for index in np.ndindex(*batch):
        for i in range(Tq):
            allowed = [j for j in range(Tk) if mask[index][i, j]]
            if not allowed:
                continue  # a query that may attend to nothing: zero weights, zero output
            scores = {
                j: scale * sum(a * b for a, b in zip(q[index][i], k[index][j])) for j in allowed
            }
            top = max(scores.values())
            exps = {j: math.exp(s - top) for j, s in scores.items()}
            total = sum(exps.values())
            for j in allowed:
                weights[index][i, j] = exps[j] / total
                output[index][i] += weights[index][i, j] * v[index][j]
    return output, weights


# --------------------------------------------------------------------------- hand-worked values


def test_identity_queries_keys_values_give_softmax_of_scaled_identity_rows():
    eye = np.eye(2)
    output, weights = attend(eye, eye, eye)
    # q k^T = I, scaled by 1/sqrt(2): row 0 is softmax([1/sqrt2, 0]).
    big, small = math.exp(1 / math.sqrt(2)), 1.0
    row0 = [big / (big + small), small / (big + small)]
    np.testing.assert_allclose(weights, [row0, row0[::-1]], rtol=1e-15)
    np.testing.assert_allclose(output, weights, rtol=1e-15)  # v = I hands the weights over


def test_hand_worked_example_with_scale_one():
    q = [[1.0, 0.0]]
    k = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    v = [[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]
    # scores [1, 0, 1]; weights [e, 1, e] / (2e + 1); output (e[1,0] + [0,1] + e[2,2]) / (2e + 1)
    e = math.e
    output, weights = attend(q, k, v, scale=1.0)
    np.testing.assert_allclose(weights, [[e / (2 * e + 1), 1 / (2 * e + 1), e / (2 * e + 1)]])
    np.testing.assert_allclose(output, [[3 * e / (2 * e + 1), (1 + 2 * e) / (2 * e + 1)]])


def test_default_scale_is_one_over_sqrt_dk():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 4, 9))
    default = attend(q, k, v)
    explicit = attend(q, k, v, scale=1 / 3)
    unscaled = attend(q, k, v, scale=1.0)
    np.testing.assert_array_equal(default[1], explicit[1])
    np.testing.assert_array_equal(default[0], explicit[0])
    assert not np.allclose(default[1], unscaled[1])


def test_scale_zero_gives_uniform_weights_and_the_mean_value():
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 3, 4))
    v = rng.normal(size=(5, 2))[:3]
    output, weights = attend(q, k, v, scale=0.0)
    np.testing.assert_allclose(weights, np.full((3, 3), 1 / 3), rtol=1e-15)
    np.testing.assert_allclose(output, np.tile(v.mean(axis=0), (3, 1)), rtol=1e-14)


def test_a_single_key_gets_all_the_weight():
    q = np.array([[1.0, -2.0], [0.5, 3.0]])
    output, weights = attend(q, [[4.0, 1.0]], [[7.0, -1.0, 2.0]])
    np.testing.assert_array_equal(weights, [[1.0], [1.0]])
    np.testing.assert_array_equal(output, [[7.0, -1.0, 2.0], [7.0, -1.0, 2.0]])


def test_a_large_scale_makes_each_query_pick_its_best_key():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    k = np.array([[0.9, 0.1], [0.1, 0.9], [0.5, 0.5]])
    v = np.array([[10.0], [20.0], [30.0]])
    output, weights = no_warnings(attend, q, k, v, scale=1e4)
    np.testing.assert_allclose(weights, [[1, 0, 0], [0, 1, 0]], atol=1e-300)
    np.testing.assert_allclose(output, [[10.0], [20.0]])


def test_matches_a_loop_reference_on_random_inputs_with_a_mask():
    rng = np.random.default_rng(2)
    q = rng.normal(size=(2, 3, 4))
    k = rng.normal(size=(2, 5, 4))
    v = rng.normal(size=(2, 5, 3))
    mask = rng.random((2, 3, 5)) < 0.6
    mask[:, :, 0] = True
    output, weights = attend(q, k, v, mask, scale=0.7)
    expected_output, expected_weights = reference_attention(q, k, v, mask, scale=0.7)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(output, expected_output, rtol=1e-13, atol=1e-14)


def test_weights_are_softmax_of_scaled_scores():
    rng = np.random.default_rng(3)
    q, k = rng.normal(size=(2, 4, 6))
    _, weights = attend(q, k, k)
    np.testing.assert_allclose(weights, softmax(q @ k.T / math.sqrt(6)), rtol=1e-14)


# --------------------------------------------------------------------------- shapes


def test_tq_tk_dk_dv_can_all_differ():
    rng = np.random.default_rng(4)
    q = rng.normal(size=(3, 4))
    k = rng.normal(size=(5, 4))
    v = rng.normal(size=(5, 6))
    output, weights = attend(q, k, v)
    assert output.shape == (3, 6)
    assert weights.shape == (3, 5)
    expected_output, expected_weights = reference_attention(q, k, v)
    np.testing.assert_allclose(output, expected_output, rtol=1e-13)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-13)


def test_leading_batch_dims_are_kept():
    rng = np.random.default_rng(5)
    q = rng.normal(size=(2, 3, 4, 5))
    k = rng.normal(size=(2, 3, 6, 5))
    v = rng.normal(size=(2, 3, 6, 7))
    output, weights = attend(q, k, v)
    assert output.shape == (2, 3, 4, 7)
    assert weights.shape == (2, 3, 4, 6)
    for index in np.ndindex(2, 3):
        single_output, single_weights = attend(q[index], k[index], v[index])
        np.testing.assert_allclose(output[index], single_output, rtol=1e-14)
        np.testing.assert_allclose(weights[index], single_weights, rtol=1e-14)


def test_batch_dims_of_q_k_v_broadcast():
    rng = np.random.default_rng(6)
    q = rng.normal(size=(2, 1, 3, 4))
    k = rng.normal(size=(3, 5, 4))
    v = rng.normal(size=(1, 5, 6))
    output, weights = attend(q, k, v)
    assert output.shape == (2, 3, 3, 6)
    assert weights.shape == (2, 3, 3, 5)
    for a in range(2):
        for b in range(3):
            single_output, single_weights = attend(q[a, 0], k[b], v[0])
            np.testing.assert_allclose(output[a, b], single_output, rtol=1e-14)
            np.testing.assert_allclose(weights[a, b], single_weights, rtol=1e-14)


def test_unbatched_keys_are_shared_by_every_batch_of_queries():
    rng = np.random.default_rng(7)
    q = rng.normal(size=(4, 2, 3))
    k = rng.normal(size=(5, 3))
    v = rng.normal(size=(5, 2))
    output, _ = attend(q, k, v)
    assert output.shape == (4, 2, 2)
    np.testing.assert_allclose(output[2], attend(q[2], k, v)[0], rtol=1e-14)


@pytest.mark.parametrize(
    "mask_shape", [(3, 5), (2, 3, 5), (2, 1, 5), (1, 5), (5,), (3, 1), (1, 1, 1)]
)
def test_masks_of_every_broadcastable_shape_match_the_loop_reference(mask_shape):
    rng = np.random.default_rng(8)
    q = rng.normal(size=(2, 3, 4))
    k = rng.normal(size=(2, 5, 4))
    v = rng.normal(size=(2, 5, 2))
    mask = rng.random(mask_shape) < 0.5
    mask[..., 0] = True  # every query keeps at least one key
    output, weights = attend(q, k, v, mask)
    expected_output, expected_weights = reference_attention(q, k, v, mask)
    assert weights.shape == (2, 3, 5)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(output, expected_output, rtol=1e-13, atol=1e-14)


def test_an_all_true_mask_changes_nothing():
    rng = np.random.default_rng(9)
    q, k, v = rng.normal(size=(3, 2, 4, 3))
    unmasked = attend(q, k, v)
    masked = attend(q, k, v, np.ones((4, 4), dtype=bool))
    np.testing.assert_array_equal(masked[0], unmasked[0])
    np.testing.assert_array_equal(masked[1], unmasked[1])


def test_a_nested_list_of_bools_is_accepted_as_a_mask():
    eye = np.eye(2)
    _, weights = attend(eye, eye, eye, [[True, False], [True, True]])
    np.testing.assert_allclose(weights[0], [1.0, 0.0])


def test_masked_keys_get_exactly_zero_weight():
    rng = np.random.default_rng(10)
    q, k, v = rng.normal(size=(3, 4, 2))
    _, weights = attend(q, k, v, causal_mask(4))
    assert (weights[~causal_mask(4)] == 0.0).all()


# --------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("scale", [None, 0.5, np.float64(0.5), 2])
def test_float_inputs_keep_their_dtype_for_output_and_weights(dtype, scale):
    rng = np.random.default_rng(11)
    q = rng.normal(size=(2, 3, 4)).astype(dtype)
    k = rng.normal(size=(2, 5, 4)).astype(dtype)
    v = rng.normal(size=(2, 5, 6)).astype(dtype)
    output, weights = attend(q, k, v, causal_mask(3, 5), scale=scale)
    assert output.dtype == dtype
    assert weights.dtype == dtype
    expected_output, expected_weights = attend(
        q.astype(np.float64),
        k.astype(np.float64),
        v.astype(np.float64),
        causal_mask(3, 5),
        scale=scale,
    )
    tolerance = 1e-5 if dtype == np.float32 else 2e-2
    np.testing.assert_allclose(output, expected_output, atol=tolerance)
    np.testing.assert_allclose(weights, expected_weights, atol=tolerance)


def test_integer_inputs_give_float64_output_and_weights():
    q = np.array([[1, 0], [0, 1]])
    output, weights = attend(q, q, np.array([[1, 2], [3, 4]], dtype=np.int8))
    assert output.dtype == np.float64
    assert weights.dtype == np.float64
    expected = attend(q.astype(float), q.astype(float), np.array([[1.0, 2.0], [3.0, 4.0]]))
    np.testing.assert_allclose(output, expected[0], rtol=1e-15)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("shapes", "name"),
    [(((4,), (3, 4), (3, 2)), "q"), (((2, 4), (4,), (3, 2)), "k"), (((2, 4), (3, 4), (3,)), "v")],
)
def test_one_dimensional_inputs_raise_naming_the_argument(shapes, name):
    q, k, v = (np.ones(shape) for shape in shapes)
    with pytest.raises(ValueError, match=rf"^{name} must have at least 2 dimensions"):
        attend(q, k, v)


def test_mismatched_dk_raises_naming_q_and_k():
    with pytest.raises(ValueError, match=r"^q has d_k=3 but k has d_k=4"):
        attend(np.ones((2, 3)), np.ones((5, 4)), np.ones((5, 2)))


def test_mismatched_tk_of_k_and_v_raises_naming_k_and_v():
    with pytest.raises(ValueError, match=r"^k has Tk=5 but v has Tk=4"):
        attend(np.ones((2, 3)), np.ones((5, 3)), np.ones((4, 2)))


def test_non_broadcasting_batch_dims_raise_naming_q_k_v():
    with pytest.raises(ValueError, match=r"^the batch dimensions of q \(2,\), k \(3,\) and v"):
        attend(np.ones((2, 4, 3)), np.ones((3, 5, 3)), np.ones((3, 5, 2)))


@pytest.mark.parametrize("mask_shape", [(3, 4), (2,), (4, 3, 5)])
def test_a_mask_that_does_not_broadcast_raises_naming_mask(mask_shape):
    q = np.ones((2, 3, 4))
    k = v = np.ones((2, 5, 4))
    with pytest.raises(ValueError, match=r"^mask of shape .* does not broadcast .*\(2, 3, 5\)"):
        attend(q, k, v, np.ones(mask_shape, dtype=bool))


@pytest.mark.parametrize(
    "mask",
    [np.ones((2, 2), dtype=int), np.zeros((2, 2)), np.array([[0.0, -np.inf], [0.0, 0.0]])],
    ids=["zero-one-ints", "floats", "additive"],
)
def test_a_non_boolean_mask_raises_type_error_naming_mask(mask):
    eye = np.eye(2)
    with pytest.raises(TypeError, match=r"^mask must be boolean with True = may attend"):
        attend(eye, eye, eye, mask)


@pytest.mark.parametrize(
    "scale", [np.nan, np.inf, -np.inf, np.array([0.5]), [0.5], True, np.array(0.5)]
)
def test_a_bad_scale_raises_naming_scale(scale):
    eye = np.eye(2)
    with pytest.raises(ValueError, match=r"^scale must be a finite number"):
        attend(eye, eye, eye, scale=scale)


@pytest.mark.parametrize("scale", ["0.5", 1j], ids=["string", "complex"])
def test_a_non_real_scale_raises_naming_scale(scale):
    eye = np.eye(2)
    with pytest.raises((TypeError, ValueError), match=r"scale"):
        attend(eye, eye, eye, scale=scale)


def test_non_numeric_queries_raise_type_error_naming_q():
    with pytest.raises(TypeError, match=r"^q must hold real numbers"):
        attend([["a", "b"]], np.eye(2), np.eye(2))


def test_zero_width_queries_and_keys_raise_value_error_naming_dk():
    with pytest.raises(ValueError, match=r"d_k"):
        attend(np.ones((2, 0)), np.ones((3, 0)), np.ones((3, 2)))


def test_zero_keys_raise_value_error_naming_k_and_its_shape():
    with pytest.raises(ValueError, match=r"^k has Tk=0 keys \(k.shape=\(0, 3\)\)"):
        attend(np.ones((2, 3)), np.ones((0, 3)), np.ones((0, 4)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_a_non_finite_query_key_or_value_raises_naming_it(name, bad):
    inputs = {"q": np.ones((2, 3)), "k": np.ones((4, 3)), "v": np.ones((4, 5))}
    inputs[name][1, 2] = bad
    shape = re.escape(str(inputs[name].shape))
    with pytest.raises(ValueError, match=rf"^{name} contains NaN or inf \(shape {shape}\)"):
        attend(inputs["q"], inputs["k"], inputs["v"])


def test_attention_over_zero_keys_gives_zero_rows_or_an_error_naming_k():
    # Tk = 0: every query may attend to nothing. Either the fully-masked-row convention
    # applies (zero output rows, (Tq, 0) weights) or the error must name k, not an internal x.
    q = np.ones((2, 3))
    try:
        output, weights = attend(q, np.ones((0, 3)), np.ones((0, 4)))
    except ValueError as error:
        assert re.search(r"\b(k|Tk)\b", str(error)), f"the error does not name k: {error}"
    else:
        assert output.shape == (2, 4) and weights.shape == (2, 0)
        np.testing.assert_array_equal(output, 0.0)


# --------------------------------------------------------------------------- numerics


def test_a_fully_masked_query_row_gives_zero_weights_and_a_zero_output_row():
    rng = np.random.default_rng(12)
    q = rng.normal(size=(3, 4))
    k = rng.normal(size=(5, 4))
    v = rng.normal(size=(5, 2))
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    output, weights = no_warnings(attend, q, k, v, mask)
    assert not np.isnan(output).any() and not np.isnan(weights).any()
    np.testing.assert_array_equal(weights[1], 0.0)
    np.testing.assert_array_equal(output[1], 0.0)
    rows_alone = attend(q[[0, 2]], k, v)
    np.testing.assert_allclose(output[[0, 2]], rows_alone[0], rtol=1e-14)
    np.testing.assert_allclose(weights[[0, 2]], rows_alone[1], rtol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_all_false_mask_gives_all_zeros_without_warnings(dtype):
    rng = np.random.default_rng(13)
    q, k, v = rng.normal(size=(3, 2, 4, 3)).astype(dtype)
    output, weights = no_warnings(attend, q, k, v, np.zeros((4, 4), dtype=bool))
    assert output.dtype == dtype and weights.dtype == dtype
    np.testing.assert_array_equal(output, 0.0)
    np.testing.assert_array_equal(weights, 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scores_of_order_1e4_give_no_nan_and_no_warning(dtype):
    q = np.array([[100.0, 0.0], [-100.0, 0.0]], dtype=dtype)
    k = np.array([[100.0, 0.0], [-100.0, 0.0], [0.0, 100.0]], dtype=dtype)
    v = np.array([[1.0], [2.0], [3.0]], dtype=dtype)
    output, weights = no_warnings(attend, q, k, v, scale=1.0)  # scores +-1e4 and 0
    assert np.isfinite(output).all() and np.isfinite(weights).all()
    np.testing.assert_allclose(weights, [[1, 0, 0], [0, 1, 0]], atol=1e-6)
    np.testing.assert_allclose(output, [[1.0], [2.0]], rtol=1e-6)


def test_float16_scores_that_overflow_raise_naming_q_k_and_the_limit_without_warnings():
    q = k = v = np.full((2, 4), 300, np.float16)  # scores 4 * 300**2 / 2 = 180000 > 65504
    with pytest.raises(ValueError, match=r"^the scores q @ k\^T \* scale overflowed float16 "
                       r"\(largest finite 65504; q.shape=\(2, 4\), k.shape=\(2, 4\)"):
        no_warnings(attend, q, k, v)


def test_float16_scores_just_below_the_limit_are_kept_in_float16():
    q = np.full((2, 4), 180, np.float16)  # scores 4 * 180**2 / 2 = 64800 < 65504
    output, weights = no_warnings(attend, q, q, q)
    assert output.dtype == weights.dtype == np.float16
    np.testing.assert_array_equal(weights, 0.5)
    np.testing.assert_array_equal(output, 180)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_plus_inf_bias_raises_naming_bias_and_its_shape(bad):
    q = k = v = np.ones((2, 3))
    bias = np.zeros((1, 2, 2))
    bias[0, 1, 0] = bad
    with pytest.raises(ValueError, match=r"^bias contains NaN or \+inf \(shape \(1, 2, 2\)\)"):
        no_warnings(attend, q, k, v, bias=bias)


def test_a_minus_inf_bias_blocks_a_key_like_a_mask():
    rng = np.random.default_rng(14)
    q, k, v = rng.normal(size=(3, 3, 2))
    blocked = np.array([[True, False, True], [False, False, True], [True, True, True]])
    bias = np.where(blocked, 0.0, -np.inf)
    output, weights = no_warnings(attend, q, k, v, bias=bias)
    expected_output, expected_weights = attend(q, k, v, mask=blocked)
    np.testing.assert_array_equal(weights, expected_weights)
    np.testing.assert_array_equal(output, expected_output)


@pytest.mark.parametrize("bias_value", [1e5, -1e5, 6e4])
def test_a_float16_bias_that_overflows_the_scores_raises_naming_bias_without_warnings(
        bias_value):
    q = np.full((2, 4), 100, np.float16)  # scores 4 * 100**2 / 2 = 20000: fit float16
    bias = np.full((2, 2), bias_value, np.float16 if abs(bias_value) < 65504 else np.float64)
    with pytest.raises(ValueError, match=r"^the scores q @ k\^T \* scale \+ bias overflowed "
                       r"float16 \(largest finite 65504; bias.shape=\(2, 2\)"):
        no_warnings(attend, q, q, q, bias=bias)


def test_a_mask_with_more_batch_dimensions_than_q_k_v_adds_them_to_the_output():
    rng = np.random.default_rng(12)
    q, k = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    v = rng.normal(size=(5, 2))
    mask = np.arange(5)[None, None, :] < np.array([5, 3])[:, None, None]  # (2, 1, 5)
    output, weights = attend(q, k, v, mask=mask)
    assert output.shape == (2, 5, 2) and weights.shape == (2, 5, 5)
    for b in range(2):
        np.testing.assert_array_equal(output[b], attend(q, k, v, mask=mask[b])[0])


# --------------------------------------------------------------------------- properties

_values = st.floats(-5, 5, allow_nan=False, allow_infinity=False)


@st.composite
def qkv_and_mask(draw):
    """q, k, v with 0-2 batch dims, Tq, Tk in 1..5, d_k, d_v in 1..4, and a random mask."""
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    Tq, Tk = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    d_k, d_v = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    q = draw(arrays(np.float64, (*batch, Tq, d_k), elements=_values))
    k = draw(arrays(np.float64, (*batch, Tk, d_k), elements=_values))
    v = draw(arrays(np.float64, (*batch, Tk, d_v), elements=_values))
    mask = draw(arrays(np.bool_, (Tq, Tk)))
    return q, k, v, mask


@given(inputs=qkv_and_mask())
def test_rows_of_weights_sum_to_one_unless_fully_masked(inputs):
    q, k, v, mask = inputs
    output, weights = no_warnings(attend, q, k, v, mask)
    assert ((weights >= 0) & (weights <= 1)).all()
    row_sums = weights.sum(axis=-1)
    has_keys = np.broadcast_to(mask.any(axis=-1), row_sums.shape)
    np.testing.assert_allclose(row_sums[has_keys], 1.0, rtol=1e-13)
    np.testing.assert_array_equal(row_sums[~has_keys], 0.0)
    np.testing.assert_array_equal(output[~has_keys], 0.0)


@given(inputs=qkv_and_mask())
def test_each_output_row_lies_between_the_smallest_and_largest_value(inputs):
    q, k, v, _ = inputs
    output, _ = attend(q, k, v)
    low = v.min(axis=-2, keepdims=True)
    high = v.max(axis=-2, keepdims=True)
    assert (output >= low - 1e-12).all() and (output <= high + 1e-12).all()


@given(inputs=qkv_and_mask(), data=st.data())
def test_permuting_keys_and_values_together_leaves_the_output_unchanged(inputs, data):
    q, k, v, mask = inputs
    perm = np.array(data.draw(st.permutations(range(k.shape[-2]))))
    output, weights = attend(q, k, v, mask)
    permuted_output, permuted_weights = attend(q, k[..., perm, :], v[..., perm, :], mask[:, perm])
    np.testing.assert_allclose(permuted_output, output, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(permuted_weights, weights[..., perm], rtol=1e-12, atol=1e-15)


@given(inputs=qkv_and_mask(), data=st.data())
def test_permuting_queries_permutes_the_output_rows(inputs, data):
    q, k, v, mask = inputs
    perm = np.array(data.draw(st.permutations(range(q.shape[-2]))))
    output, weights = attend(q, k, v, mask)
    permuted_output, permuted_weights = attend(q[..., perm, :], k, v, mask[perm])
    np.testing.assert_allclose(permuted_output, output[..., perm, :], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(permuted_weights, weights[..., perm, :], rtol=1e-12, atol=1e-15)


@given(
    data=st.data(),
    T=st.integers(2, 7),
    d=st.integers(1, 4),
)
def test_causal_output_ignores_future_tokens(data, T, d):
    x = data.draw(arrays(np.float64, (T, d), elements=_values))
    t = data.draw(st.integers(1, T - 1))  # rows t.. are the future of rows ..t-1
    future = data.draw(arrays(np.float64, (T - t, d), elements=_values))
    changed = x.copy()
    changed[t:] = future
    output, weights = attend(x, x, x, causal_mask(T))
    changed_output, changed_weights = attend(changed, changed, changed, causal_mask(T))
    np.testing.assert_allclose(changed_output[:t], output[:t], rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(changed_weights[:t], weights[:t], rtol=1e-13, atol=1e-15)


def test_without_a_causal_mask_a_future_token_does_change_earlier_outputs():
    # The counterpart of the causal property: it is the mask, not the data, that hides the future.
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    changed = x.copy()
    changed[2] = [5.0, -3.0]
    assert not np.allclose(attend(x, x, x)[0][0], attend(changed, changed, changed)[0][0])
    causal = causal_mask(3)
    np.testing.assert_array_equal(
        attend(x, x, x, causal)[0][0], attend(changed, changed, changed, causal)[0][0]
    )
