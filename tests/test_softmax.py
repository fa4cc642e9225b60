"""softmax and log_softmax (chapter 02): values, shapes, dtypes, bad input, numerics, properties."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays

from attention_lib import log_softmax, softmax, softmax_jacobian
from attention_lib.training import softmax_backward, softmax_forward

BOTH = pytest.mark.parametrize("func", [softmax, log_softmax])
LN2 = math.log(2.0)


def no_warnings(func, *args, **kwargs):
    """Call ``func`` with every warning turned into an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return func(*args, **kwargs)


# --------------------------------------------------------------------------- hand-worked values


def test_softmax_of_zero_and_ln2_is_one_third_two_thirds():
    # exp(0) = 1, exp(ln 2) = 2, total 3.
    np.testing.assert_allclose(softmax([0.0, LN2]), [1 / 3, 2 / 3], rtol=1e-15)


def test_log_softmax_of_zero_and_ln2_is_log_of_one_third_two_thirds():
    np.testing.assert_allclose(
        log_softmax([0.0, LN2]), [math.log(1 / 3), math.log(2 / 3)], rtol=1e-15
    )


def test_softmax_of_one_two_three_matches_exp_over_sum():
    e1, e2, e3 = math.exp(1), math.exp(2), math.exp(3)
    total = e1 + e2 + e3
    np.testing.assert_allclose(softmax([1.0, 2.0, 3.0]), [e1 / total, e2 / total, e3 / total])


def test_equal_logits_give_uniform_weights():
    np.testing.assert_allclose(softmax([5.0, 5.0, 5.0, 5.0]), [0.25] * 4, rtol=1e-15)
    np.testing.assert_allclose(log_softmax([-3.0] * 4), [-math.log(4)] * 4, rtol=1e-15)


def test_a_single_logit_gets_all_the_weight():
    assert softmax([-7.5]).tolist() == [1.0]
    assert log_softmax([123.0]).tolist() == [0.0]


# --------------------------------------------------------------------------- shapes and axis


@BOTH
def test_output_has_the_shape_of_the_input(func):
    x = np.random.default_rng(0).normal(size=(2, 3, 5))
    assert func(x).shape == (2, 3, 5)


@BOTH
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_axis_picks_the_normalized_dimension(func, axis):
    x = np.random.default_rng(1).normal(size=(2, 3, 4))
    moved = np.moveaxis(x, axis, -1)
    expected = np.moveaxis(func(moved, axis=-1), -1, axis)
    np.testing.assert_allclose(func(x, axis=axis), expected, rtol=1e-15)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_rows_of_weights_sum_to_one_along_the_chosen_axis(axis):
    x = np.random.default_rng(2).normal(size=(3, 4, 5))
    np.testing.assert_allclose(softmax(x, axis=axis).sum(axis=axis), 1.0, rtol=1e-14)


def test_rows_are_normalized_independently():
    x = np.array([[0.0, LN2], [1.0, 1.0], [-np.inf, 0.0]])
    np.testing.assert_allclose(softmax(x), [[1 / 3, 2 / 3], [0.5, 0.5], [0.0, 1.0]], rtol=1e-15)


# --------------------------------------------------------------------------- dtypes


@BOTH
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_float_inputs_keep_their_dtype(func, dtype):
    x = np.array([[0.5, -1.0, 2.0], [-np.inf, 0.0, 1.0]], dtype=dtype)
    result = func(x)
    assert result.dtype == dtype
    np.testing.assert_allclose(result, func(x.astype(np.float64)), rtol=2e-3)


@BOTH
def test_integer_inputs_give_float64(func):
    result = func(np.array([1, 2, 3], dtype=np.int32))
    assert result.dtype == np.float64
    np.testing.assert_allclose(result, func([1.0, 2.0, 3.0]), rtol=1e-15)


# --------------------------------------------------------------------------- bad input


@BOTH
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_plus_inf_logits_raise_naming_x_its_shape_and_the_function(func, bad):
    message = rf"^x contains NaN or \+inf \(shape \(2, 2\)\); {func.__name__} is defined"
    with pytest.raises(ValueError, match=message):
        func([[0.0, 1.0], [bad, 2.0]])


@BOTH
def test_a_scalar_raises_naming_x(func):
    with pytest.raises(ValueError, match=r"^x must have at least 1 dimensions; got shape \(\)"):
        func(3.0)


@BOTH
def test_axis_of_size_0_raises_naming_x(func):
    with pytest.raises(ValueError, match=r"^x has size 0 along axis 1"):
        func(np.zeros((3, 0)))


@BOTH
@pytest.mark.parametrize("axis", [2, -3])
def test_out_of_range_axis_raises_naming_axis(func, axis):
    with pytest.raises(ValueError, match=rf"^axis={axis} is out of range for x with 2 dimensions"):
        func(np.zeros((2, 3)), axis=axis)


@BOTH
@pytest.mark.parametrize("axis", [0.0, "-1", None, False])
def test_non_integer_axis_raises_type_error_naming_axis(func, axis):
    with pytest.raises(TypeError, match=r"^axis must be an integer"):
        func(np.zeros((2, 3)), axis=axis)


@BOTH
def test_non_numeric_input_raises_type_error_naming_x(func):
    with pytest.raises(TypeError, match=r"^x must hold real numbers"):
        func(["a", "b"])


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_of_plus_minus_1e4_give_no_overflow_nan_or_warning(dtype):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, -1e4]], dtype=dtype)
    weights = no_warnings(softmax, x)
    logs = no_warnings(log_softmax, x)
    assert np.isfinite(weights).all() and np.isfinite(logs).all()
    np.testing.assert_allclose(weights, [[1, 0, 0], [1 / 3] * 3, [0.5, 0.5, 0]], rtol=1e-6)
    np.testing.assert_allclose(
        logs,
        [[0.0, -2e4, -1e4], [-math.log(3)] * 3, [-LN2, -LN2, -2e4 - LN2]],
        rtol=1e-6,
        atol=1e-6,
    )


def test_all_minus_inf_rows_give_zero_weights_without_nan_or_warning():
    x = np.array([[-np.inf, -np.inf, -np.inf], [0.0, LN2, -np.inf]])
    weights = no_warnings(softmax, x)
    assert not np.isnan(weights).any()
    np.testing.assert_array_equal(weights[0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(weights[1], [1 / 3, 2 / 3, 0.0], rtol=1e-15)


def test_all_minus_inf_rows_give_minus_inf_log_weights_without_nan_or_warning():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    logs = no_warnings(log_softmax, x)
    assert not np.isnan(logs).any()
    np.testing.assert_array_equal(logs, [[-np.inf, -np.inf], [0.0, -np.inf]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_all_minus_inf_rows_along_axis_zero_give_zeros(dtype):
    x = np.array([[-np.inf, 1.0], [-np.inf, 1.0]], dtype=dtype)
    weights = no_warnings(softmax, x, axis=0)
    np.testing.assert_array_equal(weights, [[0.0, 0.5], [0.0, 0.5]])
    assert weights.dtype == dtype


def test_log_softmax_stays_finite_where_log_of_softmax_underflows():
    x = np.array([0.0, -800.0])  # exp(-800) underflows to 0 in float64
    assert softmax(x)[1] == 0.0
    np.testing.assert_allclose(no_warnings(log_softmax, x), [0.0, -800.0], rtol=1e-15)


# --------------------------------------------------------------------------- properties

_logit_matrices = arrays(
    np.float64,
    array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6),
    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
)


@given(x=_logit_matrices)
def test_weights_are_in_zero_one_and_rows_sum_to_one(x):
    weights = softmax(x)
    assert ((weights >= 0) & (weights <= 1)).all()
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-13)


@given(
    x=arrays(
        np.float64,
        array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=6),
        elements=st.one_of(st.just(-np.inf), st.floats(-50, 50)),
    )
)
def test_rows_with_minus_inf_entries_sum_to_one_or_are_all_zero(x):
    weights = no_warnings(softmax, x)
    assert not np.isnan(weights).any()
    np.testing.assert_array_equal(weights[np.isneginf(x)], 0.0)
    has_mass = ~np.isneginf(x).all(axis=-1)
    np.testing.assert_allclose(weights[has_mass].sum(axis=-1), 1.0, rtol=1e-13)
    np.testing.assert_array_equal(weights[~has_mass], 0.0)


@given(x=_logit_matrices, shift=st.floats(-1e3, 1e3))
def test_softmax_ignores_a_constant_shift(x, shift):
    np.testing.assert_allclose(softmax(x + shift), softmax(x), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(log_softmax(x + shift), log_softmax(x), rtol=1e-9, atol=1e-9)


@given(x=_logit_matrices)
def test_log_softmax_equals_log_of_softmax_where_weights_are_not_tiny(x):
    weights = softmax(x)
    visible = weights > 1e-300
    expected = np.log(np.where(visible, weights, 1.0))
    np.testing.assert_allclose(log_softmax(x)[visible], expected[visible], rtol=1e-12, atol=1e-10)


@given(x=_logit_matrices)
def test_exp_of_log_softmax_is_softmax(x):
    np.testing.assert_allclose(np.exp(log_softmax(x)), softmax(x), rtol=1e-12, atol=1e-300)


@given(x=arrays(np.float64, st.integers(2, 8), elements=st.floats(-30, 30)))
def test_a_larger_logit_never_gets_a_smaller_weight(x):
    weights = softmax(x)
    order = np.argsort(x, kind="stable")
    assert (np.diff(weights[order]) >= 0).all()


@given(
    x=arrays(
        np.float32,
        array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=6),
        elements=st.floats(-1e4, 1e4, width=32),
    )
)
def test_float32_weights_stay_float32_and_sum_to_one(x):
    weights = no_warnings(softmax, x)
    assert weights.dtype == np.float32
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, rtol=1e-5)


# --------------------------------------------------------------------------- softmax_jacobian


def _central_difference_jacobian(x, h=1e-6):
    """d softmax(x)_i / d x_j estimated by central differences, column j from moving x_j."""
    columns = [(softmax(x + h * e) - softmax(x - h * e)) / (2 * h) for e in np.eye(len(x))]
    return np.stack(columns, axis=-1)


def test_jacobian_of_two_equal_scores_by_hand():
    # p = (1/2, 1/2): diag(p) - p p^T = [[1/2 - 1/4, -1/4], [-1/4, 1/2 - 1/4]]
    np.testing.assert_allclose(
        softmax_jacobian([0.5, 0.5]), [[0.25, -0.25], [-0.25, 0.25]], rtol=1e-15
    )


@pytest.mark.parametrize("seed", range(5))
def test_jacobian_matches_central_differences(seed):
    x = np.random.default_rng(seed).normal(scale=2.0, size=6)
    np.testing.assert_allclose(
        softmax_jacobian(softmax(x)), _central_difference_jacobian(x), atol=1e-9
    )


def test_jacobian_times_upstream_gradient_equals_softmax_backward():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3, 4, 5))
    u = rng.normal(size=(3, 4, 5))
    p, saved = softmax_forward(x)
    via_jacobian = np.einsum("...ij,...j->...i", softmax_jacobian(p), u)
    np.testing.assert_allclose(via_jacobian, softmax_backward(u, saved), atol=1e-15)


def test_jacobian_is_symmetric_with_zero_row_and_column_sums():
    p = softmax(np.random.default_rng(8).normal(size=(2, 7)))
    jacobian = softmax_jacobian(p)
    np.testing.assert_array_equal(jacobian, np.swapaxes(jacobian, -1, -2))
    np.testing.assert_allclose(jacobian.sum(axis=-1), 0.0, atol=1e-16)
    np.testing.assert_allclose(jacobian.sum(axis=-2), 0.0, atol=1e-16)


def test_jacobian_of_one_hot_and_of_fully_masked_rows_is_zero():
    one_hot = np.eye(4)[2]
    masked = softmax(np.full(4, -np.inf))  # all zeros
    np.testing.assert_array_equal(softmax_jacobian(np.stack([one_hot, masked])), 0.0)


def test_jacobian_zeros_are_positive_zeros():
    # -(0 * p_j) would be -0.0: equal to 0, but printed as "-0." and with its sign bit set
    one_hot, masked = np.array([0.0, 1.0, 0.0]), np.zeros(3)
    jacobian = softmax_jacobian(np.stack([one_hot, masked]))
    assert not np.signbit(jacobian).any()
    float32_jacobian = softmax_jacobian(np.zeros(3, dtype=np.float32))
    assert float32_jacobian.dtype == np.float32
    assert not np.signbit(float32_jacobian).any()


def test_jacobian_of_a_masked_entry_has_zero_row_and_column():
    jacobian = softmax_jacobian(softmax([1.0, -np.inf, 2.0]))
    np.testing.assert_array_equal(jacobian[1], 0.0)
    np.testing.assert_array_equal(jacobian[:, 1], 0.0)


def test_jacobian_axis_is_moved_to_the_end():
    p = softmax(np.random.default_rng(9).normal(size=(3, 5, 2)), axis=1)  # rows along axis 1
    jacobian = softmax_jacobian(p, axis=1)
    assert jacobian.shape == (3, 2, 5, 5)
    np.testing.assert_allclose(jacobian[1, 0], softmax_jacobian(p[1, :, 0]), rtol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_jacobian_keeps_the_float_dtype(dtype):
    assert softmax_jacobian(np.array([0.25, 0.75], dtype=dtype)).dtype == dtype


def test_jacobian_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(10).normal(size=6)
    expected = torch.autograd.functional.jacobian(
        lambda t: torch.softmax(t, dim=-1), torch.tensor(x, dtype=torch.float64)
    ).numpy()
    np.testing.assert_allclose(softmax_jacobian(softmax(x)), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("p", "error", "message"),
    [
        ([1.0, -2.0, 3.0], ValueError, r"^p has entries outside \[0, 1\].*not the scores x"),
        ([0.5, np.nan], ValueError, r"^p contains NaN or inf \(shape \(2,\)\)"),
        (0.5, ValueError, r"^p must have at least 1 dimensions"),
        (np.zeros((2, 0)), ValueError, r"^p has size 0 along axis 1 \(shape \(2, 0\)\)"),
        (["a", "b"], TypeError, r"^p must hold real numbers"),
    ],
)
def test_jacobian_rejects_bad_weights_naming_p(p, error, message):
    with pytest.raises(error, match=message):
        softmax_jacobian(p)


def test_jacobian_rejects_cosine_scores_in_zero_one_that_are_not_weights():
    # The cosine scores of "it" in chapter 02: every entry is in [0, 1], but they sum to 1.94.
    from attention_lib.examples import SENTENCE_TOKENS, sentence_embeddings
    from attention_lib.similarity import cosine_similarity

    embeddings = sentence_embeddings()
    scores = cosine_similarity(embeddings[list(SENTENCE_TOKENS).index("it")], embeddings)
    assert scores.min() >= 0 and scores.max() <= 1
    with pytest.raises(
        ValueError,
        match=r"^p is not normalized along axis 0 \(shape \(10,\)\): a row sums to 1\.93.*"
        r"not the scores x",
    ):
        softmax_jacobian(scores)
    softmax_jacobian(softmax(scores))  # their softmax is accepted


def test_jacobian_error_names_the_worst_row_sum_of_a_batch():
    p = np.array([[0.5, 0.5], [0.0, 0.0], [0.3, 0.3], [0.6, 0.6]])  # sums 1, 0, 0.6, 1.2
    with pytest.raises(
        ValueError,
        match=r"^p is not normalized along axis 1 \(shape \(4, 2\)\): a row sums to 0\.6,",
    ):
        softmax_jacobian(p)
    with pytest.raises(ValueError, match=r"along axis 0 \(shape \(2, 4\)\): a row sums to 0\.6,"):
        softmax_jacobian(p.T, axis=0)


@pytest.mark.parametrize(
    ("dtype", "relative_error"), [(np.float64, 1e-12), (np.float32, 1e-5), (np.float16, 0.2)]
)
def test_jacobian_rejects_rows_off_by_more_than_rounding(dtype, relative_error):
    p = (softmax(np.random.default_rng(11).normal(size=5)) * (1 + relative_error)).astype(dtype)
    with pytest.raises(ValueError, match=r"^p is not normalized along axis 0"):
        softmax_jacobian(p)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n", [2, 7, 100, 4096])
@pytest.mark.parametrize("axis", [0, -1])
def test_jacobian_accepts_softmax_weights_of_every_float_dtype(dtype, n, axis):
    # softmax rounds each weight and the row sum, so rows sum to 1 only within ~n eps
    shape = (n, 8) if axis == 0 else (8, n)
    scores = np.random.default_rng(n).normal(scale=5.0, size=shape).astype(dtype)
    scores[(slice(None), 0) if axis == 0 else (0, slice(None))] = -np.inf  # a masked row
    p = softmax(scores, axis=axis)
    if n <= 100:
        jacobian = softmax_jacobian(p, axis=axis)
        assert jacobian.dtype == dtype
    else:  # check the rows without forming 8 matrices of 4096 x 4096
        from attention_lib.softmax import _check_rows_sum_to_one

        _check_rows_sum_to_one(p, axis % p.ndim)


def test_jacobian_rejects_a_bad_axis():
    with pytest.raises(ValueError, match=r"axis=2 is out of range for p"):
        softmax_jacobian([0.5, 0.5], axis=2)
    with pytest.raises(TypeError, match=r"axis must be an integer"):
        softmax_jacobian([0.5, 0.5], axis=1.0)
