"""Input checks shared by every module: clear errors instead of deep NumPy ones."""

from __future__ import annotations

import math
import numbers

import numpy as np


def as_float_array(x, name: str, *, min_ndim: int = 0) -> np.ndarray:
    """Return ``x`` as a floating array, keeping float dtypes and turning integers into float64.

    Raises ``TypeError`` for non-numeric input and ``ValueError`` when ``x`` has fewer than
    ``min_ndim`` dimensions; both messages name the argument and its shape.
    """
    array = np.asarray(x)
    if array.dtype.kind == "f" and array.ndim >= min_ndim:  # the common case, checked fast
        return array
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        array = array.astype(np.float64)
    elif not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"{name} must hold real numbers; got dtype {array.dtype}")
    if array.ndim < min_ndim:
        raise ValueError(
            f"{name} must have at least {min_ndim} dimensions; got shape {array.shape}"
        )
    return array


def check_axis(axis: int, ndim: int, name: str) -> int:
    """Return ``axis`` as a non-negative index into an array of ``ndim`` dimensions."""
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool):
        raise TypeError(f"axis must be an integer; got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis={axis} is out of range for {name} with {ndim} dimensions")
    return int(axis) % ndim


def check_positive_int(value, name: str, *, allow_zero: bool = False) -> int:
    """Return ``value`` as an int, or raise naming ``name`` if it is not a positive integer."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {value!r}")
    smallest = 0 if allow_zero else 1
    if value < smallest:
        raise ValueError(f"{name} must be >= {smallest}; got {value}")
    return int(value)


def check_scale(scale, d_k: int) -> float:
    """The score scale: ``1/sqrt(d_k)`` for None, else ``scale`` as a float, or a ValueError
    if it is not a finite real number (a bool, NaN or a string is refused, not converted)."""
    if scale is None:
        return 1.0 / math.sqrt(d_k)
    if (isinstance(scale, bool) or not isinstance(scale, numbers.Real)
            or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number; got {scale!r}")
    return float(scale)


def check_token_ids(tokens, vocab_size: int, name: str = "tokens") -> np.ndarray:
    """Return ``tokens`` as an integer array of shape (..., T), T >= 1, with every id in
    ``[0, vocab_size)``, or raise naming ``name``: the one token-id check of the library."""
    tokens = np.asarray(tokens)
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"{name} must be integer ids; got dtype {tokens.dtype}")
    if tokens.ndim < 1 or tokens.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., T) with T >= 1; got {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"{name} must be ids in [0, {vocab_size}); got min {tokens.min()}, "
                         f"max {tokens.max()}")
    return tokens


def broadcasts_to(shape, target) -> bool:
    """Whether an array of ``shape`` broadcasts to ``target`` without changing it."""
    try:
        return np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def check_mask(mask, scores_shape, *, may_add_dims: bool = True) -> np.ndarray:
    """Return ``mask`` as a boolean array that broadcasts to ``scores_shape`` (..., Tq, Tk),
    or raise. With ``may_add_dims=False`` it may not add batch dimensions either (a layer's
    mask, applied to every head). The one mask check of the library (chapter 04)."""
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(
            f"mask must be boolean with True = may attend; got dtype {mask.dtype}. "
            "A 0/1 mask converts with mask.astype(bool) (if 1 = may attend) or == 0 "
            "(if 1 = blocked); an additive mask with == 0 (chapter 04)"
        )
    scores_shape = tuple(scores_shape)
    if may_add_dims:
        try:
            np.broadcast_shapes(mask.shape, scores_shape)
            return mask
        except ValueError:
            pass
    elif broadcasts_to(mask.shape, scores_shape):
        return mask
    raise ValueError(
        f"mask of shape {mask.shape} does not broadcast to the scores' shape "
        f"{scores_shape} (..., Tq, Tk)"
        + ("" if may_add_dims else " without adding dimensions")
    )
