"""Softmax, log-softmax and the softmax Jacobian, numerically stable (chapter 02)."""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_axis

__all__ = ["softmax", "log_softmax", "softmax_jacobian"]


def _check_logits(x, axis: int, caller: str) -> tuple[np.ndarray, int]:
    """Return ``x`` as a float array and ``axis`` as an index, or raise naming ``caller``.

    The public functions check here, once; the kernels below trust their input.
    """
    x = as_float_array(x, "x", min_ndim=1)
    axis = check_axis(axis, x.ndim, "x")
    if x.shape[axis] == 0:
        raise ValueError(f"x has size 0 along axis {axis} (shape {x.shape}); nothing to normalize")
    # The maximum is NaN if the row holds a NaN and +inf if it holds +inf: checking the
    # (small) array of maxima checks every entry.
    row_max = np.max(x, axis=axis)
    if np.isnan(row_max).any() or np.isposinf(row_max).any():
        raise ValueError(
            f"x contains NaN or +inf (shape {x.shape}); {caller} is defined for finite "
            "logits and -inf"
        )
    return x, axis


def _max_along(x: np.ndarray, axis: int) -> np.ndarray:
    """``x.max(axis=axis, keepdims=True)``, the same numbers (NaN included), faster.

    Given an initial value, NumPy's maximum reduction takes a quicker loop: 2 to 2.5 times
    faster on attention's short rows (16 to 64 keys), 1.7 times on float32 rows of 512.
    """
    return np.maximum.reduce(x, axis=axis, keepdims=True, initial=-np.inf)


def _row_max(x: np.ndarray, axis: int) -> np.ndarray:
    """Each row's maximum (kept as an axis of size 1), with 0 for a row that is all ``-inf``.

    Subtracting it leaves the largest logit of every row at 0, so no ``exp`` can overflow.
    A row of ``-inf`` is shifted by 0 instead (``-inf - -inf`` is NaN); the callers give such
    rows zero weight.
    """
    row_max = _max_along(x, axis)
    if not np.isfinite(row_max).all():  # only rows of -inf (fully masked) get here
        row_max[np.isneginf(row_max)] = 0
    return row_max


def _shift_by_row_max(x: np.ndarray, axis: int, row_max=None,
                      out: np.ndarray | None = None) -> np.ndarray:
    """``x`` minus each row's maximum (into ``out``, a new array if None). Kernel: no checks.

    Logits spread wider than the float range (1e308 and -1e308) overflow to -inf here, which
    is right (their weight underflows to 0 anyway): call it under
    ``np.errstate(over="ignore")``, so that this overflow is silent.
    """
    row_max = _row_max(x, axis) if row_max is None else row_max
    if out is None:
        return np.subtract(x, row_max, dtype=x.dtype)
    return np.subtract(x, row_max, out=out)


def _softmax_in_place(scores: np.ndarray, axis: int = -1, row_max=None) -> np.ndarray:
    """The kernel of :func:`softmax`: overwrite ``scores`` with their softmax and return it.

    It trusts its input (a float array of finite scores and ``-inf``, as attention makes
    after checking its own inputs) and checks nothing; call :func:`softmax` on anything
    else. ``row_max`` may be given if the caller has it (from :func:`_row_max`). Call it
    under ``np.errstate(over="ignore")`` (see :func:`_shift_by_row_max`).
    """
    exps = _shift_by_row_max(scores, axis, row_max, out=scores)
    np.exp(exps, out=exps)
    sums = exps.sum(axis=axis, keepdims=True)
    if not sums.all():
        sums[sums == 0] = 1  # an all -inf row has exps == 0, so it stays 0
    exps /= sums
    return exps


def softmax(x, axis: int = -1) -> np.ndarray:
    """Turn scores into weights that are non-negative and sum to 1 along ``axis``.

    Every finite score gets a positive weight in exact arithmetic; in floating point a score
    far below the row maximum can underflow to weight 0, and a score of ``-inf`` gets exactly 0.

    ``softmax(x)_i = exp(x_i) / sum_j exp(x_j)``, computed as ``exp(x_i - m) / sum_j
    exp(x_j - m)`` with ``m`` the row maximum: the same value (softmax ignores a shift),
    but no ``exp`` of a large number can overflow. Softmax is a smooth arg max: for
    ``softmax(x / tau)`` with ``tau -> 0`` the weights tend to the one-hot vector of the
    largest score (the smooth maximum itself is the log-sum-exp).

    Parameters
    ----------
    x : array_like
        Scores (logits). ``-inf`` marks an entry that must get weight 0.
    axis : int, default -1
        The axis to normalize over.

    Returns
    -------
    numpy.ndarray
        Weights of the same shape. A row that is entirely ``-inf`` (nothing may be
        attended to) gives a row of zeros, not NaN. Float inputs keep their dtype;
        integer inputs give float64.

    Shapes
    ------
    x : (..., n) -> (..., n)  (shown for ``axis=-1``)

    Raises
    ------
    ValueError
        If ``x`` holds NaN or ``+inf``, is a scalar, is empty along ``axis``, or ``axis`` is
        out of range.
    TypeError
        If ``axis`` is not an integer or ``x`` does not hold real numbers.

    Notes
    -----
    Derived in chapter 02, *From scores to weights: softmax*.

    Examples
    --------
    >>> softmax([1.0, 2.0, 3.0]).round(4)
    array([0.09  , 0.2447, 0.6652])
    """
    x, axis = _check_logits(x, axis, "softmax")
    with np.errstate(over="ignore"):
        return _softmax_in_place(x.copy(), axis)


def log_softmax(x, axis: int = -1) -> np.ndarray:
    """The logarithm of :func:`softmax`, computed without forming tiny probabilities.

    ``log_softmax(x)_i = (x_i - m) - log(sum_j exp(x_j - m))`` with ``m`` the row
    maximum. Taking ``np.log(softmax(x))`` instead gives ``-inf`` as soon as a weight
    underflows to 0; this form stays finite for every finite logit as long as ``x_i - m``
    is representable (logits of one row spread wider than the float range, such as
    ``1e308`` and ``-1e308``, give ``-inf``).

    Parameters
    ----------
    x : array_like
        Scores (logits); ``-inf`` entries give ``-inf``.
    axis : int, default -1
        The axis to normalize over.

    Returns
    -------
    numpy.ndarray
        Log-weights of the same shape and dtype rules as :func:`softmax`. A row that is
        entirely ``-inf`` stays ``-inf`` (the log of zero weight), never NaN.

    Shapes
    ------
    x : (..., n) -> (..., n)  (shown for ``axis=-1``)

    Raises
    ------
    ValueError, TypeError
        As :func:`softmax`.

    Notes
    -----
    Derived in chapter 02, *From scores to weights: softmax*.

    Examples
    --------
    >>> log_softmax([0.0, 0.0]).round(4)
    array([-0.6931, -0.6931])
    """
    x, axis = _check_logits(x, axis, "log_softmax")
    with np.errstate(over="ignore"):
        shifted = _shift_by_row_max(x, axis)
    sums = np.sum(np.exp(shifted), axis=axis, keepdims=True)
    has_mass = sums > 0
    log_sums = np.log(np.where(has_mass, sums, 1)).astype(shifted.dtype)
    return np.where(has_mass, shifted - log_sums, -np.inf).astype(shifted.dtype)


def _check_rows_sum_to_one(p: np.ndarray, axis: int) -> None:
    """Raise unless every row of ``p`` along ``axis`` sums to 1 (up to rounding) or is all 0.

    Softmax rounds each of the ``n`` weights of a row and their sum, so a row of weights sums
    to 1 only within a few ``n eps``; the allowance is ``8 n eps`` (``16 n eps`` for float16,
    whose weights often come from a float32 computation rounded entry by entry). The sums
    are taken in float64, so the check adds no rounding of its own.
    """
    n = p.shape[axis]
    factor = 16 if p.dtype == np.float16 else 8
    tolerance = factor * n * float(np.finfo(p.dtype).eps)
    row_sums = np.sum(p, axis=axis, dtype=np.float64)
    # Entries are in [0, 1], so a row sums to 0 exactly when it is all zeros (fully masked).
    off_by = np.where(row_sums == 0, 0.0, np.abs(row_sums - 1))
    worst = np.unravel_index(np.argmax(off_by), off_by.shape)
    if off_by[worst] > tolerance:
        raise ValueError(
            f"p is not normalized along axis {axis} (shape {p.shape}): a row sums to "
            f"{row_sums[worst]:.6g}, not 1 (tolerance {tolerance:.1e}) nor 0 (fully masked); "
            "softmax_jacobian takes the weights softmax(x), not the scores x"
        )


def softmax_jacobian(p, axis: int = -1) -> np.ndarray:
    """The Jacobian of softmax, ``J = diag(p) - p p^T``, from the weights ``p = softmax(x)``.

    ``J[..., i, j] = d p_i / d x_j = p_i ([i = j] - p_j)``: it depends on the scores only
    through the weights, so it takes the weights. ``J`` is symmetric, every row and column sums
    to 0, and it is 0 for a one-hot ``p`` (a saturated softmax passes back no gradient). For an
    upstream gradient ``u = dL/dp``, ``J @ u = p * (u - sum(p * u))`` is the gradient with
    respect to the scores; training computes that product directly, without forming ``J``.

    Parameters
    ----------
    p : array_like
        Softmax weights, each in ``[0, 1]``, every row along ``axis`` summing to 1 up to the
        rounding of the dtype (``8 n eps`` for ``n`` weights per row, ``16 n eps`` for
        float16). A row of zeros (a fully masked row of :func:`softmax`) gives a zero matrix.
    axis : int, default -1
        The axis along which ``p`` was normalized. It is moved to the end, and the Jacobian's
        two axes are the last two of the result; the other axes keep their order.

    Returns
    -------
    numpy.ndarray
        One ``n x n`` matrix per row of weights. Float inputs keep their dtype; integer
        inputs give float64.

    Shapes
    ------
    p : (..., n) -> J : (..., n, n)  (shown for ``axis=-1``)

    Raises
    ------
    ValueError
        If ``p`` is a scalar, is empty along ``axis``, holds NaN or inf or an entry outside
        ``[0, 1]``, has a row along ``axis`` that neither sums to 1 nor is all zeros (scores
        passed instead of weights, for example), or ``axis`` is out of range.
    TypeError
        If ``axis`` is not an integer or ``p`` does not hold real numbers.

    Notes
    -----
    Derived in chapter 02, *From scores to weights: softmax*.

    Examples
    --------
    >>> softmax_jacobian(softmax([0.0, 0.0]))
    array([[ 0.25, -0.25],
           [-0.25,  0.25]])
    """
    p = as_float_array(p, "p", min_ndim=1)
    axis = check_axis(axis, p.ndim, "p")
    if p.shape[axis] == 0:
        raise ValueError(f"p has size 0 along axis {axis} (shape {p.shape}); no weights")
    if not np.isfinite(p).all():
        raise ValueError(f"p contains NaN or inf (shape {p.shape}); it must hold weights")
    if (p < 0).any() or (p > 1).any():
        raise ValueError(
            f"p has entries outside [0, 1] (shape {p.shape}, smallest {p.min()}, largest "
            f"{p.max()}); softmax_jacobian takes the weights softmax(x), not the scores x"
        )
    _check_rows_sum_to_one(p, axis)
    p = np.moveaxis(p, axis, -1)
    # -p_i p_j, (..., n, n); 0 - x rather than -x, so that a product of 0 gives +0, not -0
    jacobian = 0.0 - p[..., :, None] * p[..., None, :]
    diagonal = np.arange(p.shape[-1])
    jacobian[..., diagonal, diagonal] += p  # + p_i where i = j
    return jacobian
