"""Cosine similarity and the angle between vectors (chapter 01)."""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_axis

__all__ = ["cosine_similarity", "angle_degrees"]


def _unit_vectors(x: np.ndarray, axis: int, name: str, axis_given: int) -> np.ndarray:
    # Dividing by the largest absolute entry first keeps the squares finite for huge entries
    # (1e200**2 overflows), non-zero for tiny ones (1e-170**2 underflows to 0), and makes
    # "is this a zero vector" an exact question.
    largest = np.max(np.abs(x), axis=axis, keepdims=True)
    if np.any(largest == 0):
        raise ValueError(
            f"{name} contains a zero vector along axis {axis_given} (shape {x.shape}); "
            "a zero vector has no direction, so its cosine similarity is undefined"
        )
    scaled = x / largest
    return scaled / np.sqrt(np.sum(scaled * scaled, axis=axis, keepdims=True))


def _unit_pair(a, b, axis: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Check ``a`` and ``b`` and return their unit vectors along ``axis``."""
    a = as_float_array(a, "a", min_ndim=1)
    b = as_float_array(b, "b", min_ndim=1)
    for name, array in (("a", a), ("b", b)):
        if not np.isfinite(array).all():
            raise ValueError(f"{name} contains NaN or inf (shape {array.shape})")
    # Broadcasting aligns shapes from the right, so the vector axis must be the same axis
    # counted from the right in both arrays: compare (and reduce over) negative indices.
    axis_a = check_axis(axis, a.ndim, "a") - a.ndim
    axis_b = check_axis(axis, b.ndim, "b") - b.ndim
    if axis_a != axis_b:
        raise ValueError(
            f"axis={axis} is axis {axis_a} of a (shape {a.shape}) but axis {axis_b} of b "
            f"(shape {b.shape}) counted from the right, where broadcasting lines arrays up; "
            "use a negative axis or give a and b the same number of dimensions"
        )
    for name, array, array_axis in (("a", a, axis_a), ("b", b, axis_b)):
        if array.shape[array_axis] == 0:
            raise ValueError(
                f"{name} has 0 components along axis {axis} (shape {array.shape}); "
                "a vector with no components has no direction"
            )
    if a.shape[axis_a] != b.shape[axis_b]:
        raise ValueError(
            f"a has {a.shape[axis_a]} components along axis {axis} but b has "
            f"{b.shape[axis_b]} (a.shape={a.shape}, b.shape={b.shape})"
        )
    unit_a = _unit_vectors(a, axis_a, "a", axis)
    unit_b = _unit_vectors(b, axis_b, "b", axis)
    try:
        np.broadcast_shapes(unit_a.shape, unit_b.shape)
    except ValueError:
        raise ValueError(
            f"a and b must broadcast outside axis {axis}; got a.shape={a.shape}, b.shape={b.shape}"
        ) from None
    return unit_a, unit_b, axis_a


def cosine_similarity(a, b, axis: int = -1) -> np.ndarray:
    """Cosine of the angle between the vectors of ``a`` and ``b`` along ``axis``.

    ``cos(a, b) = a . b / (|a| |b|)``: 1 for the same direction, 0 for orthogonal
    vectors, -1 for opposite ones. Only direction matters, never length.

    Parameters
    ----------
    a, b : array_like
        Vectors stored along ``axis``; all other dimensions broadcast against each other
        (NumPy lines shapes up from the right).
    axis : int, default -1
        The axis that holds the vector components. It must be the same axis of ``a`` and
        ``b`` counted from the right; a non-negative ``axis`` therefore needs ``a`` and
        ``b`` to have the same number of dimensions.

    Returns
    -------
    numpy.ndarray
        The cosines, clipped to ``[-1, 1]`` (rounding can step just outside it); a NumPy
        scalar when ``a`` and ``b`` are single vectors.
        Float inputs keep their dtype; integer inputs give float64.

    Shapes
    ------
    a : (..., d), b : (..., d) -> (...)  (shown for ``axis=-1``)

    Raises
    ------
    ValueError
        If a vector is all zeros (its direction is undefined) or has no components (size 0
        along ``axis``), an entry is NaN or inf, an argument is a scalar, ``axis`` is out of
        range or names different axes of ``a`` and ``b`` counted from the right, the vectors
        of ``a`` and ``b`` have different dimensions (numbers of components along ``axis``),
        or their other dimensions do not broadcast.
    TypeError
        If ``axis`` is not an integer or an argument does not hold real numbers.

    Notes
    -----
    Derived in chapter 01, *Vectors and cosine similarity*.

    Examples
    --------
    >>> float(cosine_similarity([1.0, 0.0], [1.0, 1.0]).round(4))
    0.7071
    """
    unit_a, unit_b, axis = _unit_pair(a, b, axis)
    cosines = np.sum(unit_a * unit_b, axis=axis)
    return np.clip(cosines, -1.0, 1.0)


def angle_degrees(a, b, axis: int = -1) -> np.ndarray:
    """Angle in degrees between the vectors of ``a`` and ``b`` along ``axis``.

    Mathematically ``degrees(arccos(cosine_similarity(a, b)))``: 0 for the same direction,
    90 for orthogonal vectors, 180 for opposite ones. ``arccos`` is badly conditioned near
    1 and -1 (angles near 0 and 180 degrees), though: a rounding error of 1e-16 in the cosine
    moves the angle by about 1e-6 degrees (1e-2 in float32). So the angle is computed from
    the unit vectors as ``2 * arctan2(|a_hat - b_hat|, |a_hat + b_hat|)``, which is accurate
    for every angle and exactly 0 for a vector with itself.

    Parameters
    ----------
    a, b : array_like
        Vectors stored along ``axis``; other dimensions broadcast.
    axis : int, default -1
        The axis that holds the vector components, as in :func:`cosine_similarity`.

    Returns
    -------
    numpy.ndarray
        Angles in ``[0, 180]``, with the dtype rules of :func:`cosine_similarity`.

    Shapes
    ------
    a : (..., d), b : (..., d) -> (...)  (shown for ``axis=-1``)

    Raises
    ------
    ValueError, TypeError
        As :func:`cosine_similarity` (zero vectors, vectors with no components, mismatched
        dimensions, axes or shapes, non-integer ``axis``, non-real input).

    Notes
    -----
    Derived in chapter 01, *Vectors and cosine similarity*.

    Examples
    --------
    >>> float(angle_degrees([1.0, 0.0], [0.0, 2.0]).round(4))
    90.0
    """
    unit_a, unit_b, axis = _unit_pair(a, b, axis)
    difference = np.linalg.norm(unit_a - unit_b, axis=axis)
    total = np.linalg.norm(unit_a + unit_b, axis=axis)
    return np.degrees(2 * np.arctan2(difference, total))
