"""Scaled dot-product attention (chapter 03), with boolean masks (chapter 04)."""

from __future__ import annotations

import math

import numpy as np

from ._checks import as_float_array
from .softmax import softmax

__all__ = ["scaled_dot_product_attention"]


def _check_mask(mask, scores_shape: tuple[int, ...]) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(
            f"mask must be boolean with True = may attend; got dtype {mask.dtype}. "
            "A 0/1 mask converts with mask.astype(bool) (if 1 = may attend) or == 0 "
            "(if 1 = blocked); an additive mask with == 0 (chapter 04)"
        )
    try:
        np.broadcast_shapes(mask.shape, scores_shape)
    except ValueError:
        raise ValueError(
            f"mask of shape {mask.shape} does not broadcast to the scores' shape "
            f"{scores_shape} (..., Tq, Tk)"
        ) from None
    return mask


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None):
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, returning the output and weights.

    Each query row is compared with every key row (a dot product), the scores are
    scaled by ``1/sqrt(d_k)`` so their spread does not grow with ``d_k``, softmax turns
    each row of scores into weights, and the output is the weighted average of the
    value rows.

    Parameters
    ----------
    q : array_like
        Queries, one row per position that asks.
    k : array_like
        Keys, one row per position that can be attended to.
    v : array_like
        Values, one row per key: what a position hands over when attended to.
    mask : array_like of bool, optional
        ``True`` where query ``i`` may attend to key ``j`` (PyTorch's boolean
        ``attn_mask`` convention); broadcastable to ``(..., Tq, Tk)``. Blocked entries get
        score ``-inf`` and weight 0. A query that may attend to nothing gets zero weights
        and a zero output row, not NaN.
    scale : float, optional
        Multiplies the scores; defaults to ``1 / sqrt(d_k)``.

    Returns
    -------
    output : numpy.ndarray
        The weighted averages of the values.
    weights : numpy.ndarray
        The attention weights; each row sums to 1 (or is all 0 if fully masked).

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v), mask : broadcastable
    to (..., Tq, Tk) -> output : (..., Tq, d_v), weights : (..., Tq, Tk).
    Leading batch dimensions broadcast. Float inputs keep their dtype (float32 stays
    float32); integer inputs give float64.

    Raises
    ------
    ValueError
        If an input has fewer than 2 dimensions, ``q`` and ``k`` differ in ``d_k``,
        ``k`` and ``v`` differ in ``Tk``, the batch dimensions do not broadcast, the
        mask does not broadcast to the scores, or ``scale`` is not a finite number.
    TypeError
        If ``mask`` is not boolean.

    Notes
    -----
    Derived in chapter 03, *Scaled dot-product attention*; masks in chapter 04,
    *Masking*. Equal to ``torch.nn.functional.scaled_dot_product_attention`` with a
    boolean ``attn_mask`` (tested), including zeros for fully masked rows (PyTorch 2.5 and
    later; ``torch.nn.MultiheadAttention`` still gives NaN there).

    Examples
    --------
    >>> q = k = v = np.eye(2)
    >>> output, weights = scaled_dot_product_attention(q, k, v)
    >>> weights.round(4)
    array([[0.6698, 0.3302],
           [0.3302, 0.6698]])
    """
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q has d_k={q.shape[-1]} but k has d_k={k.shape[-1]} "
            f"(q.shape={q.shape}, k.shape={k.shape}); queries and keys must have the same size"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k has Tk={k.shape[-2]} but v has Tk={v.shape[-2]} "
            f"(k.shape={k.shape}, v.shape={v.shape}); every key needs exactly one value"
        )
    try:
        batch_shape = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(
            f"the batch dimensions of q {q.shape[:-2]}, k {k.shape[:-2]} and v "
            f"{v.shape[:-2]} do not broadcast (shapes {q.shape}, {k.shape}, {v.shape})"
        ) from None
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    elif isinstance(scale, bool) or not np.isscalar(scale) or not np.isfinite(scale):
        raise ValueError(f"scale must be a finite number; got {scale!r}")
    # A Python float keeps float32 inputs in float32 (a NumPy float64 scalar would not).
    scale = float(scale)

    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., Tq, Tk)
    if mask is not None:
        scores_shape = (*batch_shape, q.shape[-2], k.shape[-2])
        mask = _check_mask(mask, scores_shape)
        scores = np.where(mask, scores, -np.inf).astype(scores.dtype)
    weights = softmax(scores, axis=-1)  # (..., Tq, Tk)
    output = weights @ v  # (..., Tq, d_v)
    return output, weights
