"""Exact attention in tiles with the online softmax: no (Tq, Tk) matrix (chapter 11).

The score matrix of ordinary attention has ``Tq * Tk`` entries: 1 GiB in float32 at
``T = 16384``. Tiled attention visits the keys a block at a time and keeps, per query, a
running maximum ``m``, a running sum ``l`` of ``exp(score - m)`` and a running weighted sum
of values; when a new block raises the maximum, the old sums are rescaled by
``exp(m_old - m_new)``. At the end ``output = acc / l``: the same numbers as softmax
attention, with memory for one tile instead of the whole matrix. This is the idea of
FlashAttention (Dao et al., 2022); on a GPU the tiles live in fast on-chip memory, here
they only keep NumPy's temporaries small.

The backward pass (chapter 13) never stores the weights either: it recomputes each tile of
weights from the scores and the saved log-sum-exp, ``P = exp(S - lse)``, and needs one more
number per query, ``D = rowsum(dO * O)``, to make the softmax backward local to a tile.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np

from ._checks import as_float_array, broadcasts_to, check_mask, check_positive_int, check_scale
from .attention import check_attention_inputs
from .softmax import _max_along
from .training.functional import sum_to_shape

__all__ = ["online_softmax", "tiled_attention", "tiled_attention_backward", "peak_extra_bytes"]


def online_softmax(x, block_size: int = 4) -> np.ndarray:
    """Softmax of a 1-d row computed block by block with a running max and sum.

    The teaching version of the idea, for one row: after each block, ``m`` is the max so
    far and ``l = sum(exp(x_seen - m))``. Equal to :func:`~attention_lib.softmax.softmax`.

    Parameters
    ----------
    x : array_like
        One row of logits (``-inf`` allowed).
    block_size : int, default 4
        How many entries each step reads.

    Returns
    -------
    numpy.ndarray

    Shapes
    ------
    x : (n,) -> (n,)

    Notes
    -----
    Derived in chapter 11, *Attention at scale*.

    Examples
    --------
    >>> online_softmax([1.0, 2.0, 3.0], block_size=2).round(4)
    array([0.09  , 0.2447, 0.6652])
    """
    x = as_float_array(x, "x", min_ndim=1)
    if x.ndim != 1:
        raise ValueError(f"online_softmax takes one row; got shape {x.shape}")
    block_size = check_positive_int(block_size, "block_size")
    running_max, running_sum = -np.inf, 0.0
    for start in range(0, x.shape[0], block_size):
        block = x[start:start + block_size]
        new_max = max(running_max, float(block.max()))
        if new_max == -np.inf:
            continue  # nothing but -inf so far: no mass yet
        running_sum = running_sum * math.exp(running_max - new_max) + float(
            np.exp(block - new_max).sum())
        running_max = new_max
    if running_sum == 0.0:
        return np.zeros_like(x)
    return np.exp(x - running_max) / running_sum


def peak_extra_bytes(function, *args, **kwargs) -> int:
    """Peak memory, in bytes, that one call allocates above what was in use when it started.

    Runs ``function(*args, **kwargs)`` once under ``tracemalloc``, Python's memory tracer,
    which also sees NumPy's array buffers, and returns the highest traced memory during the
    call minus the traced memory at its start: every temporary and the result, not the
    inputs. The result of the call is discarded. If ``tracemalloc`` was not tracing, it is
    started and stopped again; if it was, it keeps tracing, with its peak reset.

    Parameters
    ----------
    function : callable
        The computation to measure.
    *args, **kwargs
        Passed to ``function``.

    Returns
    -------
    int
        Bytes, never negative.

    Shapes
    ------
    N/A (any arguments that ``function`` takes).

    Raises
    ------
    TypeError
        If ``function`` is not callable.

    Notes
    -----
    Derived in chapter 11, *Attention at scale*.

    Examples
    --------
    >>> extra = peak_extra_bytes(np.ones, 2**20)  # one array of 2**20 float64
    >>> 8 * 2**20 <= extra < 8 * 2**20 + 2**16
    True
    """
    if not callable(function):
        raise TypeError(f"function must be callable; got {type(function).__name__}")
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        before, _ = tracemalloc.get_traced_memory()
        function(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(peak - before, 0)


def _product(a, b):
    """``a @ b`` for the tiles, without NumPy's report of a floating-point 'invalid' flag.

    NumPy reports the floating-point flags it finds set after the BLAS call. On finite float32
    tiles the course's test runs saw OpenBLAS leave the 'invalid' flag set, at random (once in
    five full runs; the same seeded inputs pass every other time), so here the flag is not
    evidence of a NaN. An overflow is still reported, and a real NaN reaches the output.
    """
    with np.errstate(invalid="ignore"):
        return a @ b


def tiled_attention(q, k, v, *, causal: bool = False, key_lengths=None,
                    window: int | None = None, mask=None, scale=None,
                    block_q: int = 256, block_k: int = 512, return_lse: bool = False):
    """Exact scaled dot-product attention computed tile by tile with the online softmax.

    Gives the output of :func:`~attention_lib.attention.scaled_dot_product_attention`
    without ever building the ``(Tq, Tk)`` score matrix: memory per step is one
    ``(block_q, block_k)`` tile. Tiles that the causal or sliding-window structure
    blocks entirely are skipped without computing them; tiles that the causal, window and
    padding structure allows entirely are computed without a mask.

    Parameters
    ----------
    q, k, v : array_like
        Queries, keys, values (any leading batch dimensions, broadcast).
    causal : bool, default False
        Hide future keys (queries are the last ``Tq`` of the ``Tk`` positions).
    key_lengths : array_like of int, optional
        Number of real keys per sequence (a padding mask), shape ``batch_shape``.
    window : int, optional
        Sliding window: with ``causal``, each query sees only the last ``window`` keys.
    mask : array_like of bool, optional
        A general boolean mask broadcastable to ``(..., Tq, Tk)`` (True = may attend),
        sliced per tile; it costs ``Tq * Tk`` bytes, so prefer the structured options.
    scale : float, optional
        Defaults to ``1 / sqrt(d_k)``.
    block_q, block_k : int
        Tile sizes; need not divide ``Tq`` or ``Tk``.
    return_lse : bool, default False
        Also return the log-sum-exp of each query's scaled scores (``-inf`` for a query
        that may attend to nothing), what a backward pass would need.

    Returns
    -------
    output : numpy.ndarray
        ``(..., Tq, d_v)``; zero rows for fully masked queries.
    lse : numpy.ndarray, only if ``return_lse``
        ``(..., Tq)``.

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v) -> (..., Tq, d_v)

    Raises
    ------
    ValueError
        On mismatched shapes (as scaled_dot_product_attention), ``window`` without
        ``causal``, bad ``key_lengths`` or block sizes.

    Notes
    -----
    Derived in chapter 11, *Attention at scale*. Equal to the naive computation to
    1e-10 in float64 and 1e-5 in float32 (tested).

    Examples
    --------
    >>> q = np.random.default_rng(0).standard_normal((5, 4))
    >>> out = tiled_attention(q, q, q, causal=True, block_q=2, block_k=3)
    >>> out.shape
    (5, 4)
    """
    q, k, v, batch = check_attention_inputs(q, k, v)
    block_q, block_k, window, key_lengths, mask, scale = _check_tiled_options(
        q, k, batch, causal, key_lengths, window, mask, scale, block_q, block_k)
    Tq, Tk = q.shape[-2], k.shape[-2]
    dtype = np.result_type(q, k, v)

    output = np.zeros((*batch, Tq, v.shape[-1]), dtype=dtype)
    lse = np.full((*batch, Tq), -np.inf, dtype=dtype)
    shift = Tk - Tq  # query i sits at key position i + shift
    for q_start in range(0, Tq, block_q):
        q_end = min(q_start + block_q, Tq)
        q_tile = q[..., q_start:q_end, :] * scale  # (..., bq, d_k)
        running_max = np.full((*batch, q_end - q_start, 1), -np.inf, dtype=dtype)
        running_sum = np.zeros((*batch, q_end - q_start, 1), dtype=dtype)
        accumulated = np.zeros((*batch, q_end - q_start, v.shape[-1]), dtype=dtype)
        query_positions = np.arange(q_start, q_end)[:, None] + shift  # (bq, 1)
        for k_start in range(0, Tk, block_k):
            k_end = min(k_start + block_k, Tk)
            # Skip tiles that are entirely in the future or entirely outside the window.
            if causal and k_start > query_positions[-1, 0]:
                break
            if window is not None and k_end - 1 <= query_positions[0, 0] - window:
                continue
            k_tile = k[..., k_start:k_end, :]  # (..., bk, d_k)
            scores = _product(q_tile, np.swapaxes(k_tile, -1, -2))  # (..., bq, bk)
            allowed = _tile_mask(query_positions, k_start, k_end, causal, window,
                                 key_lengths, mask, q_start, q_end)
            if allowed is not None:
                scores = np.where(allowed, scores, -np.inf)
            tile_max = _max_along(scores, -1)
            new_max = np.maximum(running_max, tile_max)
            # Rows that have seen only -inf so far keep a finite shift of 0 (no NaN).
            safe_max = np.where(np.isneginf(new_max), 0, new_max)
            probabilities = np.exp(scores - safe_max)  # (..., bq, bk); 0 where masked
            correction = np.exp(running_max - safe_max)  # rescales the old sums
            running_sum = running_sum * correction + probabilities.sum(axis=-1, keepdims=True)
            accumulated = (accumulated * correction
                           + _product(probabilities, v[..., k_start:k_end, :]))
            running_max = new_max
        has_mass = running_sum > 0
        output[..., q_start:q_end, :] = np.where(
            has_mass, accumulated / np.where(has_mass, running_sum, 1), 0)
        with np.errstate(divide="ignore"):
            lse[..., q_start:q_end] = np.where(
                has_mass, running_max + np.log(np.where(has_mass, running_sum, 1)), -np.inf
            )[..., 0]
    return (output, lse) if return_lse else output


def tiled_attention_backward(d_output, q, k, v, output, lse, *, causal: bool = False,
                             key_lengths=None, window: int | None = None, mask=None,
                             scale=None, block_q: int = 256, block_k: int = 512):
    """Gradients of tiled attention with respect to ``q``, ``k`` and ``v``, tile by tile.

    Takes what the forward pass saved (the inputs, the output and the per-query
    log-sum-exp from ``tiled_attention(..., return_lse=True)``), never the ``(Tq, Tk)``
    weights. Each tile of weights is recomputed, ``P = exp(S - lse)``; then
    ``dV += P^T dO``, ``dP = dO V^T``, ``dS = P * (dP - D)`` with ``D = rowsum(dO * O)``
    (one number per query, computed once before the loop), ``dQ += scale * dS K`` and
    ``dK += scale * dS^T Q``. The outer loop runs over key/value blocks, as in the backward
    passes of FlashAttention and FlashAttention-2, so each block's ``dK`` and ``dV`` are
    finished in one pass and only ``dQ`` is accumulated across the outer loop. Tiles that
    the causal or window structure blocks entirely are skipped, and tiles that the causal,
    window and padding structure allows entirely are not masked, as in the forward pass.

    Parameters
    ----------
    d_output : array_like
        Gradient of the loss with respect to the output.
    q, k, v : array_like
        The inputs of the forward pass (batch dimensions may broadcast, e.g. grouped-query
        heads as ``(..., H_kv, group, T, d)`` against ``(..., H_kv, 1, T, d)``).
    output, lse : array_like
        The forward pass's output and log-sum-exp (``-inf`` for a fully masked query).
    causal, key_lengths, window, mask, scale, block_q, block_k
        Exactly as given to :func:`tiled_attention` (the masks must be the same; the tile
        sizes need not be).

    Returns
    -------
    dq, dk, dv : numpy.ndarray
        Shaped like ``q``, ``k``, ``v``; summed over the batch axes along which an input was
        broadcast. Zero for a fully masked query and for keys no query may see (no NaN).

    Shapes
    ------
    d_output, output : (..., Tq, d_v), lse : (..., Tq), q : (..., Tq, d_k),
    k : (..., Tk, d_k), v : (..., Tk, d_v) -> dq, dk, dv like q, k, v

    Raises
    ------
    ValueError
        As :func:`tiled_attention`, and if ``d_output``, ``output`` or ``lse`` do not have
        the shapes of the forward pass's results.

    Notes
    -----
    Derived in chapter 13, *Attention at scale II: the backward pass of tiled attention*.
    Equal to the dense backward pass to 1e-10 in float64 and to PyTorch's autograd to 1e-5
    (relative) in float32 (tested). Extra memory: the three gradients, ``D`` and a few
    ``(block_q, block_k)`` tiles.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.standard_normal((3, 6, 4))
    >>> out, lse = tiled_attention(q, k, v, causal=True, block_q=2, block_k=4, return_lse=True)
    >>> dq, dk, dv = tiled_attention_backward(np.ones_like(out), q, k, v, out, lse,
    ...                                       causal=True, block_q=2, block_k=4)
    >>> dq.shape, dk.shape, dv.shape
    ((6, 4), (6, 4), (6, 4))
    """
    q, k, v, batch = check_attention_inputs(q, k, v)
    block_q, block_k, window, key_lengths, mask, scale = _check_tiled_options(
        q, k, batch, causal, key_lengths, window, mask, scale, block_q, block_k)
    Tq, Tk, d_v = q.shape[-2], k.shape[-2], v.shape[-1]
    d_output = _check_saved(d_output, "d_output", (*batch, Tq, d_v))
    output = _check_saved(output, "output", (*batch, Tq, d_v))
    lse = _check_saved(lse, "lse", (*batch, Tq), allow_neg_inf=True)
    dtype = np.result_type(q, k, v, d_output)

    # D_i = dO_i . O_i = sum_j P_ij dP_ij: the softmax backward's row sum, from O alone.
    D = np.sum(d_output * output, axis=-1, keepdims=True, dtype=dtype)  # (..., Tq, 1)
    # A fully masked query has lse = -inf and only -inf scores: shift by 0 to get P = 0.
    lse = np.where(np.isneginf(lse), 0, lse)[..., None].astype(dtype)  # (..., Tq, 1)
    dq = np.zeros((*batch, Tq, q.shape[-1]), dtype=dtype)
    dk = np.zeros(k.shape, dtype=dtype)
    dv = np.zeros(v.shape, dtype=dtype)
    shift = Tk - Tq  # query i sits at key position i + shift
    for k_start in range(0, Tk, block_k):
        k_end = min(k_start + block_k, Tk)
        k_tile, v_tile = k[..., k_start:k_end, :], v[..., k_start:k_end, :]
        dk_tile = np.zeros((*batch, k_end - k_start, k.shape[-1]), dtype=dtype)
        dv_tile = np.zeros((*batch, k_end - k_start, d_v), dtype=dtype)
        for q_start in range(0, Tq, block_q):
            q_end = min(q_start + block_q, Tq)
            query_positions = np.arange(q_start, q_end)[:, None] + shift  # (bq, 1)
            # Skip tiles entirely in the future or (all later ones too) outside the window.
            if causal and k_start > query_positions[-1, 0]:
                continue
            if window is not None and k_end - 1 <= query_positions[0, 0] - window:
                break
            q_tile = q[..., q_start:q_end, :] * scale  # (..., bq, d_k)
            scores = _product(q_tile, np.swapaxes(k_tile, -1, -2))  # (..., bq, bk)
            allowed = _tile_mask(query_positions, k_start, k_end, causal, window,
                                 key_lengths, mask, q_start, q_end)
            if allowed is not None:
                scores = np.where(allowed, scores, -np.inf)
            weights = np.exp(scores - lse[..., q_start:q_end, :])  # P, recomputed
            d_out_tile = d_output[..., q_start:q_end, :]  # (..., bq, d_v)
            dv_tile += _product(np.swapaxes(weights, -1, -2), d_out_tile)  # (..., bk, d_v)
            d_weights = _product(d_out_tile, np.swapaxes(v_tile, -1, -2))  # dP, (..., bq, bk)
            d_scores = weights * (d_weights - D[..., q_start:q_end, :])  # dS
            dq[..., q_start:q_end, :] += scale * _product(d_scores, k_tile)  # (..., bq, d_k)
            dk_tile += _product(np.swapaxes(d_scores, -1, -2), q_tile)  # scale is in q_tile
        dk[..., k_start:k_end, :] = sum_to_shape(dk_tile, dk[..., k_start:k_end, :].shape)
        dv[..., k_start:k_end, :] = sum_to_shape(dv_tile, dv[..., k_start:k_end, :].shape)
    return sum_to_shape(dq, q.shape), dk, dv


def _check_saved(array, name, shape, *, allow_neg_inf=False):
    """A saved forward result or upstream gradient, checked against the shape it must have."""
    array = as_float_array(array, name)
    if array.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} (from q, k, v); "
                         f"got {array.shape}")
    bad = np.isnan(array) | (np.isinf(array) & ~(allow_neg_inf & np.isneginf(array)))
    if bad.any():
        raise ValueError(f"{name} contains NaN or inf (shape {array.shape})")
    return array


def _check_tiled_options(q, k, batch, causal, key_lengths, window, mask, scale, block_q,
                         block_k):
    """Check the options shared by the tiled forward and backward passes; return them
    normalized: ``block_q, block_k, window, key_lengths (..., 1, 1), mask, scale``."""
    block_q = check_positive_int(block_q, "block_q")
    block_k = check_positive_int(block_k, "block_k")
    if window is not None:
        window = check_positive_int(window, "window")
        if not causal:
            raise ValueError("window needs causal=True (a sliding window looks back only)")
    Tq, Tk, d_k = q.shape[-2], k.shape[-2], q.shape[-1]
    if causal and Tq > Tk:
        raise ValueError(f"causal needs Tq <= Tk; got Tq={Tq}, Tk={Tk}")
    scale = check_scale(scale, d_k)
    if key_lengths is not None:
        key_lengths = np.asarray(key_lengths)
        if not np.issubdtype(key_lengths.dtype, np.integer):
            raise TypeError(f"key_lengths must be integers; got dtype {key_lengths.dtype}")
        if key_lengths.size and (key_lengths.min() < 0 or key_lengths.max() > Tk):
            raise ValueError(f"key_lengths must be in [0, Tk={Tk}]; got {key_lengths.tolist()}")
        if not broadcasts_to(key_lengths.shape, batch):
            raise ValueError(f"key_lengths must hold one count per sequence, shape {batch} "
                             f"(the batch shape of q, k, v); got shape {key_lengths.shape}")
        key_lengths = key_lengths[..., None, None]  # (..., 1, 1) against a tile
    if mask is not None:
        mask = check_mask(mask, (*batch, Tq, Tk), may_add_dims=False)
        mask = mask.reshape((1,) * max(0, 2 - mask.ndim) + mask.shape)  # (Tk,) -> (1, Tk)
    return block_q, block_k, window, key_lengths, mask, scale


def _tile_mask(query_positions, k_start, k_end, causal, window, key_lengths, mask,
               q_start, q_end):
    """The boolean mask of one tile, or None if every entry is allowed.

    The causal, window and padding structure is left out of a tile that it allows in
    full, so such a tile is computed with no ``np.where`` at all, as FlashAttention-2 masks
    only the causal tiles on the diagonal; a general ``mask`` is sliced for every tile.
    """
    allowed = None
    key_positions = np.arange(k_start, k_end)[None, :]  # (1, bk)
    first_query, last_query = query_positions[0, 0], query_positions[-1, 0]
    # In full: no key after the first query and (window) none out of the last one's reach.
    causal_in_full = k_end - 1 <= first_query and (
        window is None or k_start > last_query - window)
    if causal and not causal_in_full:
        allowed = key_positions <= query_positions  # (bq, bk)
        if window is not None:
            allowed = allowed & (key_positions > query_positions - window)
    if key_lengths is not None and not (key_lengths >= k_end).all():
        real = key_positions < key_lengths  # (..., 1, bk)
        allowed = real if allowed is None else allowed & real
    if mask is not None:
        tile = mask[..., q_start:q_end, k_start:k_end] if mask.shape[-2] > 1 else \
            mask[..., :, k_start:k_end]
        if mask.shape[-1] == 1:
            tile = mask[..., q_start:q_end, :] if mask.shape[-2] > 1 else mask
        allowed = tile if allowed is None else allowed & tile
    return allowed
