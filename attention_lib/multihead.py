"""Multi-head attention: project, split into heads, attend in parallel, merge (chapter 06)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from ._checks import as_float_array, check_mask, check_positive_int
from .attention import (
    _attend,
    _attend_by_query_blocks,
    init_linear_weight,
    project,
    scaled_dot_product_attention,
)
from .hooks import unhooked
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
    if x.shape[-1] % num_heads != 0:
        raise ValueError(
            f"d_model={x.shape[-1]} is not divisible by num_heads={num_heads} (x.shape={x.shape})"
        )
    return _split_heads(x, num_heads)


def _split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """The kernel of :func:`split_heads` (no checks)."""
    *batch, T, d_model = x.shape
    x = x.reshape(*batch, T, num_heads, d_model // num_heads)  # (..., T, H, d_head)
    return x.swapaxes(-2, -3)  # (..., H, T, d_head)


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
    return _merge_heads(as_float_array(x, "x", min_ndim=3))


def _merge_heads(x: np.ndarray) -> np.ndarray:
    """The kernel of :func:`merge_heads` (no checks)."""
    *batch, num_heads, T, d_head = x.shape
    x = x.swapaxes(-2, -3)  # (..., T, H, d_head)
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
    if mask is not None:
        mask = np.asarray(mask)
        Tq, Tk = q.shape[-2], k.shape[-2]
        padded = (1,) * max(0, 3 - mask.ndim) + mask.shape
        if not all(size in (1, full) for size, full in zip(padded[-3:], (H, Tq, Tk))):
            raise ValueError(f"mask of shape {mask.shape} does not broadcast to the scores' "
                             f"shape (..., H, Tq, Tk) = (..., {H}, {Tq}, {Tk})")
    # The grouped view's shapes are checked by scaled_dot_product_attention.
    q_grouped, k_grouped, v_grouped, mask_grouped = _group_query_heads(q, k, v, mask)
    output, weights = scaled_dot_product_attention(q_grouped, k_grouped, v_grouped,
                                                   mask=mask_grouped, scale=scale)
    return _ungroup(output, H), _ungroup(weights, H)


def _group_query_heads(q, k, v, mask):
    """View the H query heads as (H_kv, group), and give k, v and the mask a group axis.

    No data is copied: each key/value head broadcasts against its ``group`` query heads.

    Shapes
    ------
    q : (..., H, Tq, d), k : (..., H_kv, Tk, d), v : (..., H_kv, Tk, d_v), mask : (..., H|1,
    Tq, Tk) -> q (..., H_kv, group, Tq, d), k (..., H_kv, 1, Tk, d), v (..., H_kv, 1, Tk,
    d_v), mask (..., H_kv|1, group|1, Tq, Tk)
    """
    H, H_kv = q.shape[-3], k.shape[-3]
    group = H // H_kv
    q_grouped = q.reshape(*q.shape[:-3], H_kv, group, *q.shape[-2:])
    if mask is not None:
        mask = mask.reshape((1,) * max(0, 3 - mask.ndim) + mask.shape)  # (..., H|1, Tq, Tk)
        by_head = mask.shape[-3] == H
        mask = mask.reshape(*mask.shape[:-3], H_kv if by_head else 1, group if by_head else 1,
                            *mask.shape[-2:])
    return q_grouped, k[..., None, :, :], v[..., None, :, :], mask


def _ungroup(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(..., H_kv, group, T, n) -> (..., H, T, n): the inverse of the grouped view."""
    return x.reshape(*x.shape[:-4], num_heads, *x.shape[-2:])


def _grouped_attention(q, k, v, mask, scale: float, need_weights: bool = True):
    """The kernel of :func:`grouped_attention`; without the weights (None) if
    ``need_weights`` is False, computed a block of queries at a time then, so the
    (..., H, Tq, Tk) weights are never stored whole."""
    H = q.shape[-3]
    grouped = H != k.shape[-3]
    if grouped:
        q, k, v, mask = _group_query_heads(q, k, v, mask)
    if need_weights:
        output, weights = _attend(q, k, v, scale, mask)
    else:
        output, weights = _attend_by_query_blocks(q, k, v, scale, mask), None
    if grouped:
        output = _ungroup(output, H)
        weights = None if weights is None else _ungroup(weights, H)
    return output, weights


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

    With ``W_g`` set it is gated attention (Qiu et al. 2025, arXiv:2505.06708; Qwen3-Next's
    attention): each head's attention output is multiplied by ``sigmoid(x W_g + b_g)`` before
    the heads are concatenated and mixed by ``W_o`` (chapter 19).

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
    W_g : numpy.ndarray, optional
        Output gate projection: ``(d_model, d_model)`` for an elementwise gate (one value per
        head and channel, as Qwen3-Next) or ``(d_model, num_heads)`` for a head-wise gate (one
        value per head). ``None`` (the default): no gate.
    b_g : numpy.ndarray, optional
        Output gate bias, ``(W_g.shape[1],)``; ``None``: no gate bias. Needs ``W_g``.

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
    where PyTorch gives NaN. The gate is computed from ``x``, the input the queries come
    from, also in cross-attention and for the new tokens of a cached pass; with a gate,
    ``W_g.size + b_g.size`` parameters are added. :meth:`forward` has two hook points
    (chapter 18, :mod:`attention_lib.hooks`): ``weights`` ``(..., H, Tq, Tk)``, computed for
    a hook only when one asks for them, and ``head_out`` ``(..., H, Tq, d_head)``, each
    head's output (gated, if there is a gate) before ``W_o``.

    Examples
    --------
    >>> mha = MultiHeadAttention.init(16, 4, np.random.default_rng(0))
    >>> output, weights = mha(np.ones((2, 5, 16)))
    >>> output.shape, weights.shape
    ((2, 5, 16), (2, 4, 5, 5))
    >>> gated = MultiHeadAttention.init(16, 4, np.random.default_rng(0), gate="headwise")
    >>> gated.W_g.shape, gated.gate(np.ones((5, 16))).shape  # one gate per head and token
    ((16, 4), (4, 5, 1))
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
    W_g: np.ndarray | None = None
    b_g: np.ndarray | None = None
    # Not a field: the hook points' functions, set only while attention_lib.hooks.capture()
    # or intervene() is active (chapter 18).
    _hooks = None

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
        self._check_gate()

    def _check_gate(self):
        """Check the optional output gate ``W_g``, ``b_g`` (chapter 19)."""
        if self.W_g is None:
            if self.b_g is not None:
                raise ValueError(f"b_g of shape {np.shape(self.b_g)} is given but W_g is None: "
                                 "a gate bias needs a gate projection W_g")
            return
        d_model, H = self.d_model, self.num_heads
        self.W_g = as_float_array(self.W_g, "W_g")
        if self.W_g.shape not in ((d_model, d_model), (d_model, H)):
            raise ValueError(f"W_g must have shape ({d_model}, {d_model}) (elementwise gate) or "
                             f"({d_model}, {H}) (head-wise gate); got {self.W_g.shape} "
                             f"(d_model={d_model}, num_heads={H})")
        if self.b_g is not None:
            self.b_g = as_float_array(self.b_g, "b_g")
            if self.b_g.shape != (self.W_g.shape[1],):
                raise ValueError(f"b_g must have shape ({self.W_g.shape[1]},) to match W_g of "
                                 f"shape {self.W_g.shape}; got {self.b_g.shape}")

    @property
    def d_model(self) -> int:
        return self.W_q.shape[0]

    @classmethod
    def init(cls, d_model: int, num_heads: int, rng: np.random.Generator,
             dtype=np.float64, *, num_kv_heads: int | None = None,
             gate: str | None = None) -> MultiHeadAttention:
        """Random weights with entries of standard deviation ``1/sqrt(d_model)``, zero biases.

        The weights come from :func:`~attention_lib.attention.init_linear_weight`. Only the zero
        biases match ``torch.nn.MultiheadAttention``, which draws its weights differently
        (Xavier-uniform for the input projections, ``nn.Linear``'s Kaiming-uniform for ``W_o``).

        ``num_kv_heads`` below ``num_heads`` gives grouped-query attention (1: multi-query).
        ``gate="elementwise"`` adds an output gate ``W_g`` of shape ``(d_model, d_model)``,
        ``gate="headwise"`` one of shape ``(d_model, num_heads)`` (chapter 19), drawn like the
        other weights after them (so the other weights are those drawn without a gate), with
        a zero ``b_g``: the gate starts near ``sigmoid(0) = 1/2``.
        Raises ``ValueError`` if ``num_heads`` does not divide ``d_model``,
        ``num_kv_heads`` does not divide ``num_heads`` or ``gate`` is another value.
        """
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        gate_widths = {None: None, "elementwise": d_model, "headwise": num_heads}
        if not isinstance(gate, str | None) or gate not in gate_widths:
            raise ValueError(f"gate must be None, 'elementwise' or 'headwise'; got {gate!r}")
        kv_dim = num_kv_heads * (d_model // num_heads)
        weights = {
            "W_q": init_linear_weight(d_model, d_model, rng, dtype),
            "W_k": init_linear_weight(d_model, kv_dim, rng, dtype),
            "W_v": init_linear_weight(d_model, kv_dim, rng, dtype),
            "W_o": init_linear_weight(d_model, d_model, rng, dtype),
        }
        if gate is not None:  # drawn last, so the weights above do not depend on the gate
            weights["W_g"] = init_linear_weight(d_model, gate_widths[gate], rng, dtype)
            weights["b_g"] = np.zeros(gate_widths[gate], dtype=dtype)
        return cls(
            **weights,
            b_q=np.zeros(d_model, dtype=dtype), b_k=np.zeros(kv_dim, dtype=dtype),
            b_v=np.zeros(kv_dim, dtype=dtype), b_o=np.zeros(d_model, dtype=dtype),
            num_heads=num_heads, num_kv_heads=num_kv_heads,
        )

    def gate(self, x) -> np.ndarray:
        """The output gate's values ``sigmoid(x W_g + b_g)`` for the input ``x``, per head.

        Shapes
        ------
        x : (..., T, d_model) -> (..., H, T, d_head) for an elementwise gate,
        (..., H, T, 1) for a head-wise one

        Raises
        ------
        ValueError
            If the layer has no gate (``W_g`` is None) or ``x`` has not ``d_model`` features.

        Notes
        -----
        Derived in chapter 19, *Attention in today's models*.
        """
        if self.W_g is None:
            raise ValueError("this layer has no output gate (W_g is None); "
                             "see MultiHeadAttention.init(..., gate='elementwise')")
        x = as_float_array(x, "x", min_ndim=2)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has {x.shape[-1]} features but the layer has "
                             f"d_model={self.d_model} (x.shape={x.shape})")
        return _gate_values(x, self.W_g, self.b_g, self.num_heads)

    def __call__(self, x, context=None, mask=None, cache=None, *, need_weights: bool = True):
        """Attend from ``x`` to ``context`` (to ``x`` itself if ``context`` is None).

        Checks the inputs, then runs :meth:`forward`. With ``cache`` (a
        :class:`~attention_lib.cache.LayerCache`, self-attention only), the keys and values
        of ``x`` are appended to the cache and the queries attend to every cached position;
        ``mask`` must then cover all of them, ``(..., Tq, cache length)``. With
        ``need_weights=False`` the weights are not returned (None) and never stored whole:
        the output is computed a block of queries at a time (equal to the default path up to
        rounding).
        """
        x, context, mask = self.check_inputs(x, context, mask, cache)
        return self.forward(x, context, mask, cache, need_weights=need_weights)

    def check_inputs(self, x, context=None, mask=None, cache=None):
        """Return ``x``, ``context`` and ``mask`` as arrays :meth:`forward` can trust, or raise
        an error that names the argument and the shapes."""
        x = as_float_array(x, "x", min_ndim=2)
        context = x if context is None else as_float_array(context, "context", min_ndim=2)
        for name, array in (("x", x), ("context", context)):
            if array.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} has {array.shape[-1]} features but the layer has "
                    f"d_model={self.d_model} ({name}.shape={array.shape})"
                )
            if not np.isfinite(array).all():
                raise ValueError(f"{name} contains NaN or inf (shape {array.shape})")
        if cache is not None and context is not x:
            raise ValueError("a KV cache is for self-attention; pass context=None with cache")
        if mask is not None:
            Tk = context.shape[-2] + (0 if cache is None else cache.length)
            scores_shape = (*np.broadcast_shapes(x.shape[:-2], context.shape[:-2]),
                            x.shape[-2], Tk)
            mask = check_mask(mask, scores_shape, may_add_dims=False)
        return x, context, mask

    def forward(self, x, context=None, mask=None, cache=None, *, need_weights: bool = True):
        """Multi-head attention on inputs already checked (by :meth:`check_inputs`, or by a
        block that checked its own): the blocks call this, not ``__call__``.

        The hook points ``weights`` and ``head_out`` (:mod:`attention_lib.hooks`, chapter 18)
        pass their arrays to whatever :func:`~attention_lib.hooks.capture` or
        :func:`~attention_lib.hooks.intervene` installed; with nothing installed they return
        them unchanged. The weights are computed for a hook only if one asks for them.
        """
        context = x if context is None else context
        hooks = self._hooks  # None unless capture() or intervene() is active (chapter 18)
        at = unhooked if hooks is None else hooks  # at(point, value) -> value
        # 1. Project, then cut the features into heads (chapter 06).
        q = _split_heads(project(x, self.W_q, self.b_q), self.num_heads)  # (..., H, Tq, d_head)
        k = _split_heads(project(context, self.W_k, self.b_k), self.num_kv_heads)
        v = _split_heads(project(context, self.W_v, self.b_v), self.num_kv_heads)
        # k, v : (..., H_kv, Tk, d_head)
        # 2. Positions: rotate queries and keys by their position (RoPE, chapter 07).
        start = 0 if cache is None else cache.length  # position of the first new token
        if self.rope_base is not None:
            q = apply_rope(q, start + np.arange(q.shape[-2]), base=self.rope_base)
            k = apply_rope(k, start + np.arange(k.shape[-2]), base=self.rope_base)
        # 3. Cache: keep the new keys and values, attend to every cached one (chapter 10).
        if cache is not None:
            k, v = cache.append(k, v)  # (..., H_kv, cached + Tq, d_head)
        # 4. Attend in every head at once; with fewer key/value heads, each serves a group
        #    of query heads (chapter 11).
        store_weights = need_weights or (hooks is not None and hooks.wants("weights"))
        heads, weights = _grouped_attention(q, k, v, _heads_mask(mask),
                                            1.0 / math.sqrt(q.shape[-1]),
                                            store_weights)  # (..., H, Tq, d_head)
        weights = at("weights", weights)  # hook point: (..., H, Tq, Tk), None if not stored
        # 5. Output gate, if any: scale each head's output by sigmoid(x W_g + b_g).
        if self.W_g is not None:
            heads = _gate(heads, x, self.W_g, self.b_g)  # output gate (chapter 19)
        heads = at("head_out", heads)  # hook point: each head's output before W_o
        # 6. Concatenate the heads and mix them (chapter 06).
        output = project(_merge_heads(heads), self.W_o, self.b_o)  # (..., Tq, d_model)
        return output, (weights if need_weights else None)


def _gate(heads: np.ndarray, x: np.ndarray, W_g: np.ndarray, b_g: np.ndarray | None) -> np.ndarray:
    """Gated attention's output gate (no checks): ``heads * sigmoid(x W_g + b_g)``.

    The kernel of :meth:`MultiHeadAttention.forward`'s gate and of
    :func:`~attention_lib.variants.gated_attention_output` (chapter 19).

    Shapes
    ------
    heads : (..., H, T, d_head), x : (..., T, d_model), W_g : (d_model, H * d_head) or
    (d_model, H), b_g : (W_g.shape[1],) -> (..., H, T, d_head)
    """
    gate = _gate_values(x, W_g, b_g, heads.shape[-3])
    return (heads * gate).astype(np.result_type(heads, x, W_g), copy=False)


def _gate_values(x: np.ndarray, W_g: np.ndarray, b_g: np.ndarray | None,
                 num_heads: int) -> np.ndarray:
    """``sigmoid(x W_g + b_g)`` laid out per head (no checks).

    Shapes
    ------
    x : (..., T, d_model) -> (..., H, T, d_head) if ``W_g`` is ``(d_model, H * d_head)``
    (elementwise), (..., H, T, 1) if it is ``(d_model, H)`` (head-wise)
    """
    gate = expit(project(x, W_g, b_g))  # (..., T, H * d_head) or (..., T, H)
    if W_g.shape[1] == num_heads:  # head-wise: one number per head and token
        return gate.swapaxes(-1, -2)[..., None]
    return _split_heads(gate, num_heads)
