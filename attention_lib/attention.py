"""Scaled dot-product attention (chapter 03) with boolean masks (chapter 04), and
self-attention with learned projections (chapter 05)."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, check_mask, check_positive_int, check_scale
from .softmax import _max_along, _softmax_in_place

__all__ = ["scaled_dot_product_attention", "check_attention_inputs", "SelfAttention",
           "init_linear_weight"]


def check_attention_inputs(q, k, v):
    """Check queries, keys and values for attention; return them as float arrays and the
    broadcast batch shape.

    Shared by :func:`scaled_dot_product_attention` and
    :func:`~attention_lib.flash.tiled_attention`, so both reject bad input with the same
    messages, each naming the argument and the shapes.

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v) -> batch shape (...)

    Notes
    -----
    Derived in chapter 03, *Scaled dot-product attention*.
    """
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q has d_k={q.shape[-1]} but k has d_k={k.shape[-1]} "
            f"(q.shape={q.shape}, k.shape={k.shape}); queries and keys must have the same dimension"
        )
    if q.shape[-1] == 0:
        raise ValueError(f"q and k have d_k=0 features (q.shape={q.shape}); nothing to compare")
    if k.shape[-2] == 0:
        raise ValueError(f"k has Tk=0 keys (k.shape={k.shape}); attention needs at least one key")
    for name, array in (("q", q), ("k", k), ("v", v)):
        if not np.isfinite(array).all():
            raise ValueError(f"{name} contains NaN or inf (shape {array.shape})")
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
    return q, k, v, batch_shape


def scaled_dot_product_attention(q, k, v, mask=None, *, scale=None, bias=None):
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
        ``attn_mask`` convention); must broadcast with ``(..., Tq, Tk)`` (see Shapes).
        Blocked entries get score ``-inf`` and weight 0. A query that may attend to
        nothing gets zero weights and a zero output row, not NaN.
    scale : float, optional
        Multiplies the scores; defaults to ``1 / sqrt(d_k)``.
    bias : array_like, optional
        Added to the scaled scores before masking and softmax; must broadcast with
        ``(..., Tq, Tk)`` (see Shapes): a position-dependent preference such as ALiBi
        (chapter 07). Finite, or ``-inf`` where a key is blocked.

    Returns
    -------
    output : numpy.ndarray
        The weighted averages of the values.
    weights : numpy.ndarray
        The attention weights; each row sums to 1 (or is all 0 if fully masked).

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v), mask and bias :
    broadcast with (..., Tq, Tk) -> output : (..., Tq, d_v), weights : (..., Tq, Tk).
    Leading batch dimensions broadcast, those of ``mask`` and ``bias`` included: a mask
    with more batch dimensions than ``q``, ``k`` and ``v`` adds them to the output and
    the weights (``padding_mask([5, 3], 5)``, shape (2, 1, 5), with unbatched ``q`` of
    shape (5, d_k) gives outputs of shape (2, 5, d_v), one per mask).
    Float inputs keep their dtype (float32 stays float32, float16 stays float16, so
    scores must fit it); integer inputs give float64.

    Raises
    ------
    ValueError
        If an input has fewer than 2 dimensions, ``q`` and ``k`` differ in ``d_k``,
        ``d_k = 0``, ``Tk = 0`` (no keys), ``q``, ``k`` or ``v`` contains NaN or
        ``inf``, ``k`` and ``v`` differ in ``Tk``, the batch dimensions do not
        broadcast, the mask or bias does not broadcast with the scores, ``bias``
        contains NaN or ``+inf``, ``scale`` is not a finite real number (a bool
        included), or the scores (before or after adding the bias) overflow the dtype
        (float16 above 65504: scale ``q``, ``k`` or the bias down, or compute in
        float32).
    TypeError
        If ``mask`` is not boolean, or ``q``, ``k``, ``v`` or ``bias`` does not hold
        real numbers (a complex or string dtype, say).

    Notes
    -----
    Derived in chapter 03, *Scaled dot-product attention*; masks in chapter 04,
    *Masking*. Equal to ``torch.nn.functional.scaled_dot_product_attention`` with a
    boolean ``attn_mask`` (tested), including zeros for fully masked rows (PyTorch 2.5 and
    later; ``torch.nn.MultiheadAttention`` with ``need_weights=True``, its default, still
    gives NaN there).

    Examples
    --------
    >>> q = k = v = np.eye(2)
    >>> output, weights = scaled_dot_product_attention(q, k, v)
    >>> weights.round(4)
    array([[0.6698, 0.3302],
           [0.3302, 0.6698]])
    """
    q, k, v, batch_shape = check_attention_inputs(q, k, v)
    # A Python float (check_scale returns one) keeps float32 inputs in float32.
    scale = check_scale(scale, q.shape[-1])
    scores_shape = (*batch_shape, q.shape[-2], k.shape[-2])
    if bias is not None:
        bias = _check_bias(bias, scores_shape)
    if mask is not None:
        mask = check_mask(mask, scores_shape)
    return _attend(q, k, v, scale, mask, bias)


def _check_bias(bias, scores_shape: tuple[int, ...]) -> np.ndarray:
    bias = as_float_array(bias, "bias")
    try:
        np.broadcast_shapes(bias.shape, scores_shape)
    except ValueError:
        raise ValueError(
            f"bias of shape {bias.shape} does not broadcast to the scores' shape "
            f"{scores_shape} (..., Tq, Tk)"
        ) from None
    # -inf is allowed (it blocks like a mask); NaN and +inf have no meaning as a bias.
    if np.isnan(bias).any() or np.isposinf(bias).any():
        raise ValueError(
            f"bias contains NaN or +inf (shape {bias.shape}); a bias must be finite, "
            "or -inf where it blocks a key"
        )
    return bias


# ----------------------------------------------------------------------------- kernels
# The functions below trust their inputs: the public functions (and the layers' __call__)
# check once, at the door, then call these. Internal calls (block -> attention -> softmax)
# go straight from kernel to kernel.


def _attend(q, k, v, scale: float, mask=None, bias=None):
    """The kernel of :func:`scaled_dot_product_attention`: (output, weights), no checks.

    Scores that overflow the dtype are caught for free: a +inf or NaN score makes its row's
    maximum +inf or NaN, and that maximum is needed for the softmax anyway.
    """
    # Scaling q (Tq x d_k multiplications) rather than the scores (Tq x Tk) is cheaper
    # when d_k < Tk, the usual case; both give the same scores up to rounding.
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is checked below, by name
        scores = (q * scale) @ k.swapaxes(-1, -2)  # (..., Tq, Tk)
        if bias is not None:
            scores = np.add(scores, bias, dtype=scores.dtype)
        if mask is not None:
            if np.broadcast_shapes(mask.shape, scores.shape) == scores.shape:
                np.copyto(scores, -np.inf, where=np.logical_not(mask))  # in place
            else:  # the mask adds batch dimensions
                scores = np.where(mask, scores, -np.inf).astype(scores.dtype, copy=False)
        row_max = _max_along(scores, -1)  # (..., Tq, 1)
        if not np.isfinite(row_max).all():  # fully masked rows, or an overflow
            _raise_if_overflowed(row_max, q, k, scale, mask, bias)
            row_max[np.isneginf(row_max)] = 0
        weights = _softmax_in_place(scores, row_max=row_max)  # (..., Tq, Tk)
    return weights @ v, weights  # (..., Tq, d_v)


def _raise_if_overflowed(row_max, q, k, scale, mask, bias) -> None:
    """Raise if a row's maximum score shows an overflow: NaN or +inf, or -inf in a row where
    the mask and bias allow a key (a fully masked row is -inf by design)."""
    overflowed = np.isnan(row_max) | np.isposinf(row_max)
    empty = np.isneginf(row_max)[..., 0]  # (..., Tq)
    if empty.any():
        allowed = np.ones(q.shape[-2:-1] + k.shape[-2:-1], dtype=bool)  # (Tq, Tk)
        if mask is not None:
            allowed = allowed & mask
        if bias is not None:
            allowed = allowed & np.isfinite(bias)
        overflowed = overflowed | (empty & allowed.any(axis=-1))[..., None]
    if not overflowed.any():
        return
    largest = float(np.finfo(row_max.dtype).max)
    if bias is None:
        raise ValueError(
            f"the scores q @ k^T * scale overflowed {row_max.dtype} (largest finite "
            f"{largest:.6g}; q.shape={q.shape}, k.shape={k.shape}, scale={scale:.6g}): "
            "scale q or k down, or compute in float32"
        )
    finite_bias = bias[np.isfinite(bias)]
    raise ValueError(
        f"the scores q @ k^T * scale + bias overflowed {row_max.dtype} (largest finite "
        f"{largest:.6g}; bias.shape={bias.shape}, largest |finite bias| "
        f"{float(np.abs(finite_bias).max(initial=0)):.6g}): scale the bias down, or compute "
        "in float32"
    )


def _query_rows(array, rows: slice):
    """The rows of a mask or bias for the queries ``rows``, if it has a query axis."""
    if array is None or array.ndim < 2 or array.shape[-2] == 1:
        return array
    return array[..., rows, :]


def _attend_by_query_blocks(q, k, v, scale: float, mask=None, bias=None,
                            block_q: int = 128) -> np.ndarray:
    """The output of :func:`_attend` without its weights, ``block_q`` queries at a time.

    Each block of queries sees every key, so its softmax is the exact one: no running
    maximum is needed (chapter 11's tiled attention also splits the keys). Only the blocks
    in flight hold their (..., block_q, Tk) weights, never all (..., Tq, Tk). The blocks are
    independent, so they run on as many threads as BLAS has (see :func:`_run_on_threads`).
    """
    Tq = q.shape[-2]
    if Tq <= block_q:
        return _attend(q, k, v, scale, mask, bias)[0]
    # Every block reads all of k and v: lay them out contiguously once (the heads' views
    # from split_heads are strided), not once per block inside matmul.
    k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)

    def block(start: int) -> np.ndarray:  # (..., block_q, d_v)
        rows = slice(start, start + block_q)
        return _attend(q[..., rows, :], k, v, scale, _query_rows(mask, rows),
                       _query_rows(bias, rows))[0]

    return np.concatenate(_run_on_threads(block, range(0, Tq, block_q)), axis=-2)


_blas = None  # threadpoolctl's view of the BLAS library, made on first use


def _run_on_threads(function, items) -> list:
    """``[function(item) for item in items]``, on as many threads as BLAS is allowed.

    NumPy's element-wise functions (the softmax's ``exp``, ``max``, ``sum``) run on one
    core, while BLAS spreads each matrix product over all of them. Here the items go to a
    pool of threads instead (NumPy releases the GIL inside its loops), each BLAS call
    limited to one thread meanwhile so that the threads do not compete for the cores. The
    limit is process-wide while the pool runs.
    """
    global _blas
    items = list(items)
    if _blas is None:
        from threadpoolctl import ThreadpoolController

        _blas = ThreadpoolController()
    threads = max((library["num_threads"] for library in _blas.info()
                   if library["user_api"] == "blas"), default=1)
    if threads == 1 or len(items) == 1:
        return [function(item) for item in items]
    with _blas.limit(limits=1, user_api="blas"), ThreadPoolExecutor(threads) as pool:
        return list(pool.map(function, items))


def project(x: np.ndarray, W: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """``x @ W (+ b)`` over the last axis, as one 2-d matrix product: the learned projection
    of chapter 05, as every layer of the library applies it.

    NumPy runs ``(B, T, d) @ (d, e)`` as B separate products; folding the leading axes
    into one gives BLAS a single large product, several times faster for big batches.
    """
    if x.ndim <= 2 or x.shape[0] == 1 and x.ndim == 3:  # already one product
        y = x @ W
    else:
        y = (x.reshape(-1, x.shape[-1]) @ W).reshape(*x.shape[:-1], W.shape[-1])
    return y if b is None else y + b


def init_linear_weight(d_in: int, d_out: int, rng: np.random.Generator,
                       dtype=np.float64) -> np.ndarray:
    """A random ``(d_in, d_out)`` weight with entries of standard deviation ``1/sqrt(d_in)``.

    With this scale ``x @ W`` has entries of about the same size as those of ``x`` (each
    output sums ``d_in`` products), so scores neither vanish nor blow up as ``d_in`` grows.
    Plain ``rng.standard_normal`` weights make each projection ``sqrt(d_in)`` times larger
    and push softmax into saturation (chapter 05 shows it).

    Parameters
    ----------
    d_in, d_out : int
        Input and output sizes.
    rng : numpy.random.Generator
        The source of randomness (no global state).
    dtype : numpy dtype, default float64

    Returns
    -------
    numpy.ndarray

    Shapes
    ------
    -> (d_in, d_out)

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive integer or ``rng`` is not a Generator.

    Notes
    -----
    Derived in chapter 05, *Self-attention with learned projections*.

    Examples
    --------
    >>> init_linear_weight(4, 2, np.random.default_rng(0)).shape
    (4, 2)
    """
    d_in = check_positive_int(d_in, "d_in")
    d_out = check_positive_int(d_out, "d_out")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}")
    weight = rng.standard_normal((d_in, d_out)) / math.sqrt(d_in)
    return weight.astype(dtype)


@dataclass
class SelfAttention:
    """Self-attention with learned projections: ``attention(x W_q, x W_k, x W_v)``.

    Each token's vector ``x`` is projected three ways: ``W_q`` makes the query (what this
    token asks for), ``W_k`` the key (what it offers to be matched on) and ``W_v`` the value
    (what it hands over when attended to). Part I used identity projections; here they are
    parameters a model learns.

    Attributes
    ----------
    W_q : numpy.ndarray
        Query projection, ``(d_model, d_k)``.
    W_k : numpy.ndarray
        Key projection, ``(d_model, d_k)``.
    W_v : numpy.ndarray
        Value projection, ``(d_model, d_v)``. The layer has no biases (as in the paper's
        formulas) and ``2 d_model d_k + d_model d_v`` parameters (counted in chapter 06).

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, T) -> output : (..., T, d_v),
    weights : (..., T, T)

    Notes
    -----
    Derived in chapter 05, *Self-attention with learned projections*.

    Examples
    --------
    >>> layer = SelfAttention.init(8, 4, 6, np.random.default_rng(0))
    >>> output, weights = layer(np.ones((2, 3, 8)))
    >>> output.shape, weights.shape
    ((2, 3, 6), (2, 3, 3))
    """

    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray

    def __post_init__(self):
        self.W_q = as_float_array(self.W_q, "W_q", min_ndim=2)
        self.W_k = as_float_array(self.W_k, "W_k", min_ndim=2)
        self.W_v = as_float_array(self.W_v, "W_v", min_ndim=2)
        for name, weight in (("W_q", self.W_q), ("W_k", self.W_k), ("W_v", self.W_v)):
            if weight.ndim != 2:
                raise ValueError(f"{name} must be 2-d (d_model, d_out); got shape {weight.shape}")
        if not self.W_q.shape[0] == self.W_k.shape[0] == self.W_v.shape[0]:
            raise ValueError(
                f"W_q, W_k and W_v must all take d_model inputs; got shapes {self.W_q.shape}, "
                f"{self.W_k.shape}, {self.W_v.shape}"
            )
        if self.W_q.shape[1] != self.W_k.shape[1]:
            raise ValueError(
                f"W_q makes d_k={self.W_q.shape[1]} but W_k makes d_k={self.W_k.shape[1]}; "
                "queries and keys must have the same size"
            )

    @classmethod
    def init(cls, d_model: int, d_k: int, d_v: int, rng: np.random.Generator,
             dtype=np.float64) -> SelfAttention:
        """Random projections scaled by ``1/sqrt(d_model)`` (see :func:`init_linear_weight`)."""
        return cls(
            W_q=init_linear_weight(d_model, d_k, rng, dtype),
            W_k=init_linear_weight(d_model, d_k, rng, dtype),
            W_v=init_linear_weight(d_model, d_v, rng, dtype),
        )

    def __call__(self, x, mask=None):
        """Attend from every token of ``x`` to every token of ``x``; return (output, weights)."""
        x = as_float_array(x, "x", min_ndim=2)
        if x.shape[-1] != self.W_q.shape[0]:
            raise ValueError(
                f"x has d_model={x.shape[-1]} features but the projections expect "
                f"{self.W_q.shape[0]} (x.shape={x.shape}, W_q.shape={self.W_q.shape})"
            )
        q = x @ self.W_q  # (..., T, d_k)
        k = x @ self.W_k  # (..., T, d_k)
        v = x @ self.W_v  # (..., T, d_v)
        return scaled_dot_product_attention(q, k, v, mask=mask)
