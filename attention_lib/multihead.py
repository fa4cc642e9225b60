"""Multi-head attention: project, split into heads, attend in parallel, merge (chapter 06)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, check_positive_int
from .attention import init_linear_weight, scaled_dot_product_attention

__all__ = ["split_heads", "merge_heads", "MultiHeadAttention"]


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
        A view when possible, no copy of the data.

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
    self-attention and ``context`` for cross-attention. The per-head projections ``W_q^h``
    are the column blocks of one ``(d_model, d_model)`` matrix ``W_q``: project once, then
    split the result into heads.

    Attributes
    ----------
    W_q : numpy.ndarray
        Projections, each ``(d_model, d_model)``; ``y = x @ W + b``.
    W_k : numpy.ndarray
        Projections, each ``(d_model, d_model)``; ``y = x @ W + b``.
    W_v : numpy.ndarray
        Projections, each ``(d_model, d_model)``; ``y = x @ W + b``.
    W_o : numpy.ndarray
        Projections, each ``(d_model, d_model)``; ``y = x @ W + b``.
    b_q : numpy.ndarray
        Biases, each ``(d_model,)`` (zeros for a layer without bias).
    b_k : numpy.ndarray
        Biases, each ``(d_model,)`` (zeros for a layer without bias).
    b_v : numpy.ndarray
        Biases, each ``(d_model,)`` (zeros for a layer without bias).
    b_o : numpy.ndarray
        Biases, each ``(d_model,)`` (zeros for a layer without bias).
    num_heads : int
        Number of heads ``H``; ``d_head = d_model // H``.

    Shapes
    ------
    x : (..., Tq, d_model), context : (..., Tk, d_model), mask : broadcastable to
    (..., Tq, Tk) (it is applied to every head) -> output : (..., Tq, d_model),
    weights : (..., H, Tq, Tk)

    Notes
    -----
    Derived in chapter 06, *Multi-head attention*. Equal to ``torch.nn.MultiheadAttention``
    (``batch_first=True``) with the same weights, transposed (tested); a fully masked query
    gets a zero attention output (so its output is ``b_o``) where PyTorch gives NaN.

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

    def __post_init__(self):
        self.num_heads = check_positive_int(self.num_heads, "num_heads")
        self.W_q = as_float_array(self.W_q, "W_q")
        if self.W_q.ndim != 2:
            raise ValueError(f"W_q must be 2-d (d_model, d_model); got shape {self.W_q.shape}")
        d_model = self.W_q.shape[0]
        for name in ("W_q", "W_k", "W_v", "W_o"):
            weight = as_float_array(getattr(self, name), name)
            if weight.shape != (d_model, d_model):
                raise ValueError(
                    f"{name} must have shape (d_model, d_model) = ({d_model}, {d_model}); "
                    f"got {weight.shape}"
                )
            setattr(self, name, weight)
        for name in ("b_q", "b_k", "b_v", "b_o"):
            bias = as_float_array(getattr(self, name), name)
            if bias.shape != (d_model,):
                raise ValueError(f"{name} must have shape ({d_model},); got {bias.shape}")
            setattr(self, name, bias)
        if d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model={d_model} is not divisible by num_heads={self.num_heads}"
            )

    @property
    def d_model(self) -> int:
        return self.W_q.shape[0]

    @classmethod
    def init(cls, d_model: int, num_heads: int, rng: np.random.Generator,
             dtype=np.float64) -> MultiHeadAttention:
        """Random weights of scale ``1/sqrt(d_model)`` and zero biases (as PyTorch starts them).

        Raises ``ValueError`` if ``num_heads`` does not divide ``d_model``.
        """
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        weights = {name: init_linear_weight(d_model, d_model, rng, dtype)
                   for name in ("W_q", "W_k", "W_v", "W_o")}
        biases = {name: np.zeros(d_model, dtype=dtype) for name in ("b_q", "b_k", "b_v", "b_o")}
        return cls(**weights, **biases, num_heads=num_heads)

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
        if cache is not None and context is not x:
            raise ValueError("a KV cache is for self-attention; pass context=None with cache")
        q = split_heads(x @ self.W_q + self.b_q, self.num_heads)  # (..., H, Tq, d_head)
        k = split_heads(context @ self.W_k + self.b_k, self.num_heads)  # (..., H, Tk, d_head)
        v = split_heads(context @ self.W_v + self.b_v, self.num_heads)  # (..., H, Tk, d_head)
        if cache is not None:
            k, v = cache.append(k, v)  # (..., H, cached + Tq, d_head)
        heads, weights = scaled_dot_product_attention(q, k, v, mask=_heads_mask(mask))
        output = merge_heads(heads) @ self.W_o + self.b_o  # (..., Tq, d_model)
        return output, weights
