"""Multi-head attention: project, split into heads, attend in parallel, merge (chapter 06)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, check_positive_int, project
from .attention import init_linear_weight, scaled_dot_product_attention
from .positional import apply_rope

__all__ = ["split_heads", "merge_heads", "grouped_attention", "MultiHeadAttention"]


def split_heads(x, num_heads: int) -> np.ndarray:
    """Cut the features of every token into ``num_heads`` equal slices, one per head.

    Head ``h`` gets features ``h * d_head`` to ``(h + 1) * d_head``. The head axis moves in
    front of the sequence axis so that one batched matmul attends in every head at once.

    Parameters
    ----------
    x : array_like
        Token vectors (already projected).
    num_heads : int
        Number of heads; must divide ``d_model``.

    Returns
    -------
    numpy.ndarray
        For a floating-point array ``x``, a view of it (no data copied: splitting one axis
        in two never needs a copy). Integer, boolean or nested-list input is first
        converted to a new float64 array.

    Shapes
    ------
    x : (..., T, d_model) -> (..., H, T, d_model // H)

    Raises
    ------
    ValueError
        If ``x`` has fewer than 2 dimensions or ``num_heads`` does not divide ``d_model``.

    Notes
    -----
    Derived in chapter 06, *Multi-head attention*. Inverse: :func:`merge_heads`.

    Examples
    --------
    >>> split_heads(np.zeros((5, 12)), 3).shape
    (3, 5, 4)
    """
    x = as_float_array(x, "x", min_ndim=2)
    num_heads = check_positive_int(num_heads, "num_heads")
    *batch, T, d_model = x.shape
    if d_model % num_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads} (x.shape={x.shape})"
        )
    x = x.reshape(*batch, T, num_heads, d_model // num_heads)  # (..., T, H, d_head)
    return np.swapaxes(x, -2, -3)  # (..., H, T, d_head)


def merge_heads(x) -> np.ndarray:
    """Concatenate the heads' features again: the inverse of :func:`split_heads`.

    Parameters
    ----------
    x : array_like
        Per-head vectors.

    Returns
    -------
    numpy.ndarray

    Shapes
    ------
    x : (..., H, T, d_head) -> (..., T, H * d_head)

    Raises
    ------
    ValueError
        If ``x`` has fewer than 3 dimensions.

    Notes
    -----
    Derived in chapter 06, *Multi-head attention*.

    Examples
    --------
    >>> x = np.arange(24.0).reshape(2, 12)
    >>> bool((merge_heads(split_heads(x, 4)) == x).all())
    True
    """
    x = as_float_array(x, "x", min_ndim=3)
    *batch, num_heads, T, d_head = x.shape
    x = np.swapaxes(x, -2, -3)  # (..., T, H, d_head)
    return x.reshape(*batch, T, num_heads * d_head)


def grouped_attention(q, k, v, mask=None, *, scale=None):
    """Attention where groups of query heads share one key/value head (GQA; MQA for 1).

    Query head ``h`` uses key/value head ``h // (H / H_kv)``, as PyTorch's
    ``scaled_dot_product_attention(..., enable_gqa=True)``. No copy of the keys and values
    is made: the query heads are viewed as ``(H_kv, group)`` and broadcast against them.

    Parameters
    ----------
    q : array_like
        Queries of every query head.
    k, v : array_like
        Keys and values of the key/value heads.
    mask : array_like of bool, optional
        Broadcastable to ``(..., H, Tq, Tk)``.
    scale : float, optional
        As in :func:`~attention_lib.attention.scaled_dot_product_attention`.

    Returns
    -------
    output : numpy.ndarray
    weights : numpy.ndarray

    Shapes
    ------
    q : (..., H, Tq, d), k : (..., H_kv, Tk, d), v : (..., H_kv, Tk, d_v) ->
    output (..., H, Tq, d_v), weights (..., H, Tq, Tk)

    Raises
    ------
    ValueError
        If ``H`` is not a multiple of ``H_kv``, or as
        :func:`~attention_lib.attention.scaled_dot_product_attention`.

    Notes
    -----
    Derived in chapter 11, *Attention at scale*.

    Examples
    --------
    >>> q, k = np.ones((4, 3, 2)), np.ones((2, 5, 2))
    >>> grouped_attention(q, k, k)[1].shape
    (4, 3, 5)
    """
    q = as_float_array(q, "q", min_ndim=3)
    k = as_float_array(k, "k", min_ndim=3)
    v = as_float_array(v, "v", min_ndim=3)
    H, H_kv = q.shape[-3], k.shape[-3]
    if v.shape[-3] != H_kv:
        raise ValueError(f"k has {H_kv} heads but v has {v.shape[-3]} (k.shape={k.shape}, "
                         f"v.shape={v.shape})")
    if H % H_kv != 0:
        raise ValueError(f"q has {H} heads, not a multiple of the {H_kv} key/value heads of k "
                         f"(q.shape={q.shape}, k.shape={k.shape})")
    if H == H_kv:
        return scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    group = H // H_kv
    *batch, _, Tq, d = q.shape
    q_grouped = q.reshape(*batch, H_kv, group, Tq, d)  # (..., H_kv, group, Tq, d)
    if mask is not None:
        mask = np.asarray(mask)
        given_shape = mask.shape
        mask = mask.reshape((1,) * max(0, 3 - mask.ndim) + mask.shape)  # (..., H|1, Tq, Tk)
        heads_axis = mask.shape[-3]
        expected = (H, Tq, k.shape[-2])
        if not all(size in (1, full) for size, full in zip(mask.shape[-3:], expected)):
            raise ValueError(f"mask of shape {given_shape} does not broadcast to the scores' "
                             f"shape (..., H, Tq, Tk) = (..., {H}, {Tq}, {k.shape[-2]})")
        mask = mask.reshape(*mask.shape[:-3], heads_axis // group if heads_axis == H else 1,
                            group if heads_axis == H else 1, *mask.shape[-2:])
    output, weights = scaled_dot_product_attention(
        q_grouped, k[..., None, :, :], v[..., None, :, :], mask=mask, scale=scale)
    Tk = k.shape[-2]
    return (output.reshape(*output.shape[:-4], H, Tq, output.shape[-1]),
            weights.reshape(*weights.shape[:-4], H, Tq, Tk))


def _heads_mask(mask):
    """Give a mask for (..., Tq, Tk) scores a head axis, so it applies to every head."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    mask = mask.reshape((1,) * max(0, 2 - mask.ndim) + mask.shape)  # a (Tk,) mask is (1, Tk)
    return mask[..., None, :, :]  # (..., 1, Tq, Tk)


@dataclass
class MultiHeadAttention:
    """Multi-head attention as in "Attention Is All You Need", section 3.2.2.

    ``MultiHead(x) = Concat(head_1, ..., head_H) W_o + b_o`` with
    ``head_h = Attention(x W_q^h, c W_k^h, c W_v^h)``, where ``c`` is ``x`` for
    self-attention and ``context`` for cross-attention (chapter 09). The per-head
    projections ``W_q^h`` are the column blocks of one ``(d_model, d_model)`` matrix ``W_q``:
    project once, then split the result into heads.

    With ``num_kv_heads < num_heads`` it is grouped-query attention (multi-query for 1):
    ``W_k`` and ``W_v`` make only ``num_kv_heads`` heads, each shared by
    ``num_heads // num_kv_heads`` query heads, which shrinks the KV cache by that factor
    (chapter 11).

    Attributes
    ----------
    W_q : numpy.ndarray
        Query projection, ``(d_model, d_model)``; ``y = x @ W + b``.
    W_k : numpy.ndarray
        Key projection, ``(d_model, num_kv_heads * d_head)``: ``(d_model, d_model)``
        unless ``num_kv_heads`` is set.
    W_v : numpy.ndarray
        Value projection, the same shape as ``W_k``.
    W_o : numpy.ndarray
        Output projection, ``(d_model, d_model)``: mixes the concatenated heads.
    b_q : numpy.ndarray
        Query bias, ``(d_model,)`` (zeros for a layer without bias).
    b_k : numpy.ndarray
        Key bias, ``(W_k.shape[1],)``.
    b_v : numpy.ndarray
        Value bias, ``(W_v.shape[1],)``.
    b_o : numpy.ndarray
        Output bias, ``(d_model,)``.
    num_heads : int
        Number of (query) heads ``H``; ``d_head = d_model // H``.
    num_kv_heads : int, optional
        Number of key/value heads; ``None`` (the default) means ``num_heads``. ``W_k``,
        ``W_v`` are then ``(d_model, num_kv_heads * d_head)`` and ``b_k``, ``b_v`` match.
    rope_base : float, optional
        If set, queries and keys are rotated by :func:`~attention_lib.positional.apply_rope`
        with this base after projection (Llama-style positions; chapter 07). Positions count
        from the first cached token when a cache is used.

    Shapes
    ------
    x : (..., Tq, d_model), context : (..., Tk, d_model), mask : broadcastable to
    (..., Tq, Tk) (it is applied to every head) -> output : (..., Tq, d_model),
    weights : (..., H, Tq, Tk)

    Notes
    -----
    Derived in chapter 06, *Multi-head attention*. With ``num_kv_heads`` unset it has
    ``4 d_model**2 + 4 d_model`` parameters for any ``num_heads`` (``4 d_model**2`` without
    the biases, as in the paper). Equal to
    ``torch.nn.MultiheadAttention`` (``batch_first=True``) with the same weights, transposed
    (tested); a fully masked query gets a zero attention output (so its output is ``b_o``)
    where PyTorch gives NaN.

    Examples
    --------
    >>> mha = MultiHeadAttention.init(16, 4, np.random.default_rng(0))
    >>> output, weights = mha(np.ones((2, 5, 16)))
    >>> output.shape, weights.shape
    ((2, 5, 16), (2, 4, 5, 5))
    """

    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    W_o: np.ndarray
    b_q: np.ndarray
    b_k: np.ndarray
    b_v: np.ndarray
    b_o: np.ndarray
    num_heads: int
    num_kv_heads: int | None = None
    rope_base: float | None = None

    def __post_init__(self):
        self.num_heads = check_positive_int(self.num_heads, "num_heads")
        self.W_q = as_float_array(self.W_q, "W_q")
        if self.W_q.ndim != 2:
            raise ValueError(f"W_q must be 2-d (d_model, d_model); got shape {self.W_q.shape}")
        d_model = self.W_q.shape[0]
        if d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={self.num_heads}"
            )
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        self.num_kv_heads = check_positive_int(self.num_kv_heads, "num_kv_heads")
        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads="
                f"{self.num_kv_heads}: each key/value head must serve the same number of "
                "query heads"
            )
        kv_dim = self.num_kv_heads * (d_model // self.num_heads)
        shapes = {"W_q": (d_model, d_model), "W_k": (d_model, kv_dim), "W_v": (d_model, kv_dim),
                  "W_o": (d_model, d_model), "b_q": (d_model,), "b_k": (kv_dim,),
                  "b_v": (kv_dim,), "b_o": (d_model,)}
        for name, expected in shapes.items():
            array = as_float_array(getattr(self, name), name)
            if array.shape != expected:
                raise ValueError(
                    f"{name} must have shape {expected}; got {array.shape} (d_model={d_model}, "
                    f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads})"
                )
            setattr(self, name, array)

    @property
    def d_model(self) -> int:
        return self.W_q.shape[0]

    @classmethod
    def init(cls, d_model: int, num_heads: int, rng: np.random.Generator,
             dtype=np.float64, *, num_kv_heads: int | None = None) -> MultiHeadAttention:
        """Random weights with entries of standard deviation ``1/sqrt(d_model)``, zero biases.

        The weights come from :func:`~attention_lib.attention.init_linear_weight`. Only the zero
        biases match ``torch.nn.MultiheadAttention``, which draws its weights differently
        (Xavier-uniform for the input projections, ``nn.Linear``'s Kaiming-uniform for ``W_o``).

        ``num_kv_heads`` below ``num_heads`` gives grouped-query attention (1: multi-query).
        Raises ``ValueError`` if ``num_heads`` does not divide ``d_model`` or
        ``num_kv_heads`` does not divide ``num_heads``.
        """
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        kv_dim = num_kv_heads * (d_model // num_heads)
        return cls(
            W_q=init_linear_weight(d_model, d_model, rng, dtype),
            W_k=init_linear_weight(d_model, kv_dim, rng, dtype),
            W_v=init_linear_weight(d_model, kv_dim, rng, dtype),
            W_o=init_linear_weight(d_model, d_model, rng, dtype),
            b_q=np.zeros(d_model, dtype=dtype), b_k=np.zeros(kv_dim, dtype=dtype),
            b_v=np.zeros(kv_dim, dtype=dtype), b_o=np.zeros(d_model, dtype=dtype),
            num_heads=num_heads, num_kv_heads=num_kv_heads,
        )

    def __call__(self, x, context=None, mask=None, cache=None):
        """Attend from ``x`` to ``context`` (to ``x`` itself if ``context`` is None).

        With ``cache`` (a :class:`~attention_lib.cache.LayerCache`, self-attention only), the
        keys and values of ``x`` are appended to the cache and the queries attend to every
        cached position; ``mask`` must then cover all of them, ``(..., Tq, cache length)``.
        """
        x = as_float_array(x, "x", min_ndim=2)
        context = x if context is None else as_float_array(context, "context", min_ndim=2)
        for name, array in (("x", x), ("context", context)):
            if array.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} has {array.shape[-1]} features but the layer has "
                    f"d_model={self.d_model} ({name}.shape={array.shape})"
                )
        if mask is not None:
            mask = np.asarray(mask)
            Tk = context.shape[-2] + (0 if cache is None else cache.length)
            scores_shape = (*np.broadcast_shapes(x.shape[:-2], context.shape[:-2]),
                            x.shape[-2], Tk)
            try:
                fits = np.broadcast_shapes(mask.shape, scores_shape) == scores_shape
            except ValueError:
                fits = False
            if not fits:
                raise ValueError(
                    f"mask of shape {mask.shape} must broadcast to (..., Tq, Tk) = "
                    f"{scores_shape} without adding dimensions; it applies to every head, "
                    "so it has no head axis"
                )
        if cache is not None and context is not x:
            raise ValueError("a KV cache is for self-attention; pass context=None with cache")
        H, H_kv = self.num_heads, self.num_kv_heads
        q = split_heads(project(x, self.W_q, self.b_q), H)  # (..., H, Tq, d_head)
        k = split_heads(project(context, self.W_k, self.b_k), H_kv)  # (..., H_kv, Tk, d_head)
        v = split_heads(project(context, self.W_v, self.b_v), H_kv)  # (..., H_kv, Tk, d_head)
        if self.rope_base is not None:
            start = 0 if cache is None else cache.length  # position of the first new token
            q = apply_rope(q, start + np.arange(q.shape[-2]), base=self.rope_base)
            k = apply_rope(k, start + np.arange(k.shape[-2]), base=self.rope_base)
        if cache is not None:
            k, v = cache.append(k, v)  # (..., H_kv, cached + Tq, d_head)
        heads, weights = grouped_attention(q, k, v, mask=_heads_mask(mask))
        output = project(merge_heads(heads), self.W_o, self.b_o)  # (..., Tq, d_model)
        return output, weights
