"""cosine_similarity and angle_degrees (chapter 01): values, shapes, dtypes, bad input, numerics."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from attention_lib import angle_degrees, cosine_similarity

BOTH = pytest.mark.parametrize("func", [cosine_similarity, angle_degrees])


# --------------------------------------------------------------------------- hand-worked values


def test_cosine_of_the_seed_example_matches_the_hand_computation():
    x = [1.0, 2.0, 3.0, 4.0]
    y = [1.2, 2.1, 2.9, 3.7]
    # x.y = 1.2 + 4.2 + 8.7 + 14.8 = 28.9; |x|^2 = 1 + 4 + 9 + 16 = 30;
    # |y|^2 = 1.44 + 4.41 + 8.41 + 13.69 = 27.95
    expected = 28.9 / (math.sqrt(30.0) * math.sqrt(27.95))
    np.testing.assert_allclose(cosine_similarity(x, y), expected, rtol=1e-14)


@pytest.mark.parametrize(
    ("a", "b", "cosine", "degrees"),
    [
        ([1.0, 0.0], [0.0, 3.0], 0.0, 90.0),  # orthogonal
        ([1.0, 2.0], [-2.0, -4.0], -1.0, 180.0),  # opposite
        ([1.0, 0.0], [1.0, 1.0], 1 / math.sqrt(2), 45.0),
        ([1.0, 0.0], [1.0, math.sqrt(3)], 0.5, 60.0),
        ([2.0, 0.0, 0.0], [0.0, 0.0, -5.0], 0.0, 90.0),
    ],
)
def test_cosine_and_angle_of_hand_worked_pairs(a, b, cosine, degrees):
    np.testing.assert_allclose(cosine_similarity(a, b), cosine, atol=1e-15)
    np.testing.assert_allclose(angle_degrees(a, b), degrees, atol=1e-6)


def test_cosine_ignores_length_only_direction_matters():
    a = np.array([1.0, -2.0, 0.5])
    b = np.array([0.3, 0.7, -1.1])
    np.testing.assert_allclose(cosine_similarity(7.5 * a, 0.01 * b), cosine_similarity(a, b))
    np.testing.assert_allclose(cosine_similarity(a, 3.0 * a), 1.0, rtol=1e-15)


def test_cosine_of_negated_vector_is_negated_exactly():
    a = np.array([0.3, -1.7, 2.2, 0.1])
    b = np.array([1.5, 0.2, -0.4, 0.9])
    assert cosine_similarity(a, -b) == -cosine_similarity(a, b)


# --------------------------------------------------------------------------- shapes


@BOTH
def test_rows_of_a_batch_are_compared_pairwise(func):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 3))
    b = rng.normal(size=(5, 3))
    result = func(a, b)
    assert result.shape == (5,)
    expected = [func(a[i], b[i]) for i in range(5)]
    np.testing.assert_allclose(result, expected, rtol=1e-14)


@BOTH
def test_leading_dims_broadcast_like_numpy(func):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(2, 1, 4))
    b = rng.normal(size=(3, 4))
    result = func(a, b)
    assert result.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(result[i, j], func(a[i, 0], b[j]), rtol=1e-14)


@BOTH
def test_axis_selects_the_vector_components(func):
    rng = np.random.default_rng(2)
    a = rng.normal(size=(4, 6))
    b = rng.normal(size=(4, 6))
    result = func(a, b, axis=0)
    assert result.shape == (6,)
    np.testing.assert_allclose(result, func(a.T, b.T), rtol=1e-14)


@BOTH
def test_non_negative_axis_with_unequal_numbers_of_dimensions_raises_naming_both_shapes(func):
    # Broadcasting lines a (3,) up with the LAST axis of b (3, 3), so axis=0 would be the
    # components' axis of a but the batch axis of b. (This once returned wrong numbers,
    # [0.267, 0.717, 0.943] instead of the column-wise [0.267, 0.598, 0.839], with no error.)
    a = [1.0, 2.0, 3.0]
    b = [[1.0, 1.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 5.0]]
    message = r"^axis=0 is axis -1 of a \(shape \(3,\)\) but axis -2 of b \(shape \(3, 3\)\)"
    with pytest.raises(ValueError, match=message):
        func(a, b, axis=0)
    message = r"^axis=0 is axis -2 of a \(shape \(3, 3\)\) but axis -1 of b \(shape \(3,\)\)"
    with pytest.raises(ValueError, match=message):
        func(b, a, axis=0)


def test_column_wise_cosines_with_unequal_numbers_of_dimensions_match_the_hand_values():
    # Column j of b against a: b[:, 0] = (1, 0, 0), b[:, 1] = (1, 2, 0), b[:, 2] = (1, 0, 5).
    a = np.array([1.0, 2.0, 3.0])
    b = np.array([[1.0, 1.0, 1.0], [0.0, 2.0, 0.0], [0.0, 0.0, 5.0]])
    expected = np.array([1.0, 5.0, 16.0]) / (math.sqrt(14.0) * np.sqrt([1.0, 5.0, 26.0]))
    np.testing.assert_allclose(cosine_similarity(a[:, None], b, axis=0), expected, rtol=1e-14)
    np.testing.assert_allclose(cosine_similarity(a[:, None], b, axis=-2), expected, rtol=1e-14)
    np.testing.assert_allclose(
        angle_degrees(a[:, None], b, axis=0), np.degrees(np.arccos(expected)), rtol=1e-10
    )


@BOTH
def test_negative_axis_with_unequal_numbers_of_dimensions_broadcasts_from_the_right(func):
    rng = np.random.default_rng(4)
    a = rng.normal(size=(4, 3))  # 3 vectors of dimension 4 along axis -2
    b = rng.normal(size=(2, 4, 3))
    result = func(a, b, axis=-2)
    assert result.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            np.testing.assert_allclose(result[i, j], func(a[:, j], b[i, :, j]), rtol=1e-13)
    # the same axis written non-negatively for each array
    np.testing.assert_allclose(func(a[None], b, axis=1), result, rtol=1e-14)


@BOTH
def test_single_vectors_give_one_float64_number(func):
    result = func([1.0, 2.0], [2.0, 1.0])
    assert np.shape(result) == ()
    assert result.dtype == np.float64


# --------------------------------------------------------------------------- dtypes


@BOTH
def test_float32_inputs_give_float32(func):
    a = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
    b = np.array([[0.5, -1.0, 2.0]], dtype=np.float32)
    result = func(a, b)
    assert result.dtype == np.float32
    np.testing.assert_allclose(result, func(a.astype(np.float64), b.astype(np.float64)), rtol=1e-5)


@BOTH
def test_integer_inputs_give_float64(func):
    result = func(np.array([1, 2, 3]), np.array([3, 2, 1]))
    assert result.dtype == np.float64
    np.testing.assert_allclose(result, func([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]))


# --------------------------------------------------------------------------- bad input


@BOTH
def test_zero_vector_in_a_raises_naming_a(func):
    with pytest.raises(ValueError, match=r"^a contains a zero vector"):
        func([0.0, 0.0], [1.0, 2.0])


@BOTH
def test_zero_vector_in_b_raises_naming_b(func):
    with pytest.raises(ValueError, match=r"^b contains a zero vector"):
        func([[1.0, 1.0], [2.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]])


@BOTH
@pytest.mark.parametrize(
    ("a", "b", "axis", "message"),
    [
        ([], [], -1, r"^a has 0 components along axis -1 \(shape \(0,\)\)"),
        (np.zeros((3, 0)), np.zeros((3, 0)), -1, r"^a has 0 components along axis -1 .*\(3, 0"),
        ([[1.0, 2.0]], np.zeros((2, 0)), -1, r"^b has 0 components along axis -1 \(shape \(2, 0"),
        (np.zeros((0, 4)), np.zeros((0, 4)), 0, r"^a has 0 components along axis 0 \(shape \(0, 4"),
    ],
)
def test_vectors_with_no_components_raise_naming_the_argument_and_shape(func, a, b, axis, message):
    with pytest.raises(ValueError, match=message):
        func(a, b, axis=axis)


@BOTH
def test_empty_batch_of_vectors_gives_an_empty_result(func):
    # no vectors at all (0 rows of 3 components) is fine: zero results, not an error
    assert func(np.zeros((0, 3)), np.ones(3)).shape == (0,)


@BOTH
def test_mismatched_vector_dimensions_raise_naming_both(func):
    with pytest.raises(ValueError, match=r"a has 3 components along axis -1 but b has 2"):
        func([1.0, 2.0, 3.0], [1.0, 2.0])


@BOTH
def test_non_broadcasting_batch_dims_raise_naming_a_and_b(func):
    with pytest.raises(ValueError, match=r"a and b must broadcast.*\(2, 3\).*\(4, 3\)"):
        func(np.ones((2, 3)), np.ones((4, 3)))


@BOTH
@pytest.mark.parametrize(("a", "b", "name"), [(1.0, [1.0, 2.0], "a"), ([1.0, 2.0], 2.0, "b")])
def test_scalars_are_rejected_naming_the_argument(func, a, b, name):
    with pytest.raises(ValueError, match=rf"^{name} must have at least 1 dimensions"):
        func(a, b)


@BOTH
def test_out_of_range_axis_raises_naming_axis(func):
    with pytest.raises(ValueError, match=r"axis=1 is out of range"):
        func([1.0, 2.0], [2.0, 1.0], axis=1)


@BOTH
@pytest.mark.parametrize("axis", [1.0, None, True])
def test_non_integer_axis_raises_type_error_naming_axis(func, axis):
    with pytest.raises(TypeError, match=r"^axis must be an integer"):
        func([1.0, 2.0], [2.0, 1.0], axis=axis)


@BOTH
@pytest.mark.parametrize("bad", [["x", "y"], [1 + 1j, 2.0]])
def test_non_real_input_raises_type_error_naming_the_argument(func, bad):
    with pytest.raises(TypeError, match=r"^a must hold real numbers"):
        func(bad, [1.0, 2.0])
    with pytest.raises(TypeError, match=r"^b must hold real numbers"):
        func([1.0, 2.0], bad)


# --------------------------------------------------------------------------- numerics


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1e200, 2e200], [3e200, 1e200]),  # squares overflow float64
        ([1e-200, 2e-200], [3e-200, 1e-200]),  # squares underflow to 0
        ([1e300, 2e300], [3e300, 1e300]),
        ([1e200, 2e200], [3e-200, 1e-200]),  # huge against tiny
        ([1e-320, 2e-320], [3.0, 1.0]),  # subnormal
    ],
)
def test_huge_and_tiny_entries_give_the_exact_45_degrees(a, b):
    # Every pair is a multiple of (1, 2) against (3, 1): cos = 5 / (sqrt(5) sqrt(10)) = 1/sqrt(2).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cosine = cosine_similarity(a, b)
        angle = angle_degrees(a, b)
    assert np.isfinite(cosine) and np.isfinite(angle)
    np.testing.assert_allclose(cosine, 1 / math.sqrt(2), rtol=1e-15)
    np.testing.assert_allclose(angle, 45.0, rtol=1e-12)


def test_huge_against_tiny_vectors_give_the_exact_cosine():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = cosine_similarity([1e200, 1e200], [1e-200, 0.0])
    np.testing.assert_allclose(result, 1 / math.sqrt(2), rtol=1e-15)


def test_clipping_keeps_self_angle_zero_when_rounding_overshoots_one():
    # For (1, 1, 1) the rounded sum of squared unit components is 1 + 2**-52: without the
    # clip to [-1, 1], arccos would return NaN (and warn).
    x = [1.0, 1.0, 1.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cosine = cosine_similarity(x, x)
        angle = angle_degrees(x, x)
    assert cosine == 1.0
    assert angle == 0.0


def test_cosine_never_leaves_minus_one_to_one_for_parallel_or_antiparallel_vectors():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2000, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = cosine_similarity(x, x)
        opposite = cosine_similarity(x, -x)
        angles = angle_degrees(x, np.concatenate([x[:1000], -x[1000:]]))
    assert same.max() == 1.0 and same.min() >= 1.0 - 4e-16
    assert opposite.min() == -1.0 and opposite.max() <= -1.0 + 4e-16
    assert not np.isnan(angles).any()


@pytest.mark.parametrize(
    "x",
    [
        np.array([1.0, 2.0, 3.0, 4.0]),  # the seed's vector
        np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32),
        np.array([1e200, 1e200]),
        np.array([1e-200, 3e-200]),
        np.array([3.0, 4.0]),
        np.array([1.0, 1.0, 1.0]),
    ],
    ids=["seed-1234", "seed-1234-float32", "huge", "tiny", "3-4", "ones"],
)
def test_angle_of_a_vector_with_itself_is_exactly_zero(x):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        angle = angle_degrees(x, x)
    assert angle == 0.0


# --------------------------------------------------------------------------- properties

_vectors = arrays(
    np.float64,
    st.integers(1, 6),
    elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
)


@given(data=st.data())
def test_cosine_is_symmetric_and_between_minus_one_and_one(data):
    a = data.draw(_vectors)
    b = data.draw(arrays(np.float64, a.shape, elements=st.floats(-1e3, 1e3)))
    assume(np.any(a != 0) and np.any(b != 0))
    ab = cosine_similarity(a, b)
    assert ab == cosine_similarity(b, a)
    assert -1.0 <= ab <= 1.0
    angle = angle_degrees(a, b)
    assert 0.0 <= angle <= 180.0


@given(a=_vectors, scale=st.floats(1e-3, 1e3))
def test_positive_scaling_leaves_cosine_unchanged(a, scale):
    assume(np.any(a != 0) and np.any(scale * a != 0))  # 5e-324 * 0.5 underflows to 0
    b = np.roll(a, 1) + 0.5
    assume(np.any(b != 0))
    np.testing.assert_allclose(
        cosine_similarity(scale * a, b), cosine_similarity(a, b), rtol=1e-12, atol=1e-12
    )
