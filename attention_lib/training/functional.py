"""Forward and backward passes, written by hand, for every layer of a transformer (chapter 12).

Every layer comes as a pair. ``*_forward`` computes what the library's layer computes (and
gives the same numbers) and also returns ``saved``: the inputs and intermediate arrays it
saves for the backward pass (PyTorch's autograd calls them "saved tensors"; the name *cache*
is kept for the KV cache of chapter 10). ``*_backward(d_output, saved)`` takes the gradient
of the loss with respect to the layer's output and returns the gradient with respect to its
input and, for a layer with parameters, a dict of parameter gradients keyed by the library's
field names (``"W_q"``, ``"gamma"``, ``"ff.W1"``, ...). A gradient always has the shape of
what it is the gradient of.

The composite layers read their parameters from the library's own dataclasses
(``MultiHeadAttention``, ``LayerNorm``, ``FeedForward``, ``EncoderBlock``), so a model trained
here runs unchanged through the library's forward code.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf

from .._checks import as_float_array, check_token_ids
from ..attention import scaled_dot_product_attention
from ..layers import ACTIVATIONS
from ..multihead import _heads_mask, merge_heads, split_heads
from ..softmax import log_softmax, softmax

__all__ = [
    "sum_to_shape",
    "linear_forward", "linear_backward",
    "activation_forward", "activation_backward",
    "softmax_forward", "softmax_backward",
    "attention_forward", "attention_backward",
    "mha_forward", "mha_backward",
    "layer_norm_forward", "layer_norm_backward",
    "feed_forward_forward", "feed_forward_backward",
    "encoder_block_forward", "encoder_block_backward",
    "embedding_forward", "embedding_backward",
    "cross_entropy_forward", "cross_entropy_backward",
    "dropout_forward", "dropout_backward",
]


def sum_to_shape(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a gradient over the axes along which its array was broadcast in the forward pass.

    If ``a`` of shape ``shape`` was broadcast to ``grad.shape`` (a bias added to every token,
    one query shared by a batch), every copy received a gradient and ``a``'s gradient is
    their sum.

    Shapes
    ------
    grad : (...) -> shape

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> sum_to_shape(np.ones((4, 3)), (3,))
    array([4., 4., 4.])
    """
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    broadcast = tuple(axis for axis, size in enumerate(shape)
                      if size == 1 and grad.shape[axis] != 1)  # axes of size 1 that grew
    if broadcast:
        grad = grad.sum(axis=broadcast, keepdims=True)
    return grad


# ---------------------------------------------------------------------------------------------
# Linear map and activations
# ---------------------------------------------------------------------------------------------

def _matmul_rows(x, W):
    """``x @ W`` as one 2-d product: NumPy runs ``(B, T, d) @ (d, e)`` as B separate products,
    and one product of all ``B T`` rows is about twice as fast (see ``attention.project``)."""
    if x.ndim <= 2:
        return x @ W
    return (x.reshape(-1, x.shape[-1]) @ W).reshape(*x.shape[:-1], W.shape[-1])


def linear_forward(x, W, b=None):
    """``y = x @ W + b``, and what :func:`linear_backward` needs (``saved``).

    Shapes
    ------
    x : (..., d_in), W : (d_in, d_out), b : (d_out,) or None -> y : (..., d_out)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> y, saved = linear_forward(np.ones((2, 3)), np.ones((3, 4)), np.zeros(4))
    >>> y.shape
    (2, 4)
    """
    x = as_float_array(x, "x", min_ndim=1)
    y = _matmul_rows(x, W)  # (..., d_out)
    if b is not None:
        y += b
    return y, (x, W, b is not None)


def linear_backward(dy, saved):
    """Gradients of ``y = x @ W + b``: ``dx = dy W^T``, ``dW = x^T dy``, ``db = sum(dy)``.

    ``dW`` and ``db`` add up the contributions of every token of every batch entry (the
    same ``W`` was used for all of them). ``db`` is None for a map without bias.

    Shapes
    ------
    dy : (..., d_out) -> dx : (..., d_in), dW : (d_in, d_out), db : (d_out,)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    x, W, has_bias = saved
    d_in, d_out = W.shape
    dx = _matmul_rows(dy, W.T)  # (..., d_in)
    dy_rows = dy.reshape(-1, d_out)  # all N tokens of all batch entries as rows
    dW = x.reshape(-1, d_in).T @ dy_rows  # (d_in, N) @ (N, d_out) -> (d_in, d_out)
    db = dy_rows.sum(axis=0) if has_bias else None  # (d_out,)
    return dx, dW, db


def activation_forward(x, name: str = "relu"):
    """Apply the activation ``name`` (a key of ``attention_lib.layers.ACTIVATIONS``).

    Shapes
    ------
    x : (...) -> (...)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}; got {name!r}")
    if name == "gelu":  # keep Phi(x), the costly part, for the backward pass
        x = as_float_array(x, "x")
        cdf = (0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))).astype(x.dtype, copy=False)
        return x * cdf, (x, name, cdf)
    return ACTIVATIONS[name](x), (x, name, None)


def activation_backward(dy, saved):
    """``dx = dy * f'(x)`` for the activation ``f`` of the forward pass.

    relu: ``f'(x) = [x > 0]`` (0 at the kink, as PyTorch); gelu: ``Phi(x) + x phi(x)``;
    gelu_tanh: the derivative of the tanh form; silu: ``s(x) (1 + x (1 - s(x)))`` with
    ``s`` the logistic sigmoid.

    Shapes
    ------
    dy : (...) -> dx : (...)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    x, name, cdf = saved
    if name == "relu":
        return dy * (x > 0)
    if name == "gelu":
        pdf = np.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))
        return dy * (cdf + x * pdf)
    if name == "gelu_tanh":
        c = math.sqrt(2.0 / math.pi)
        t = np.tanh(c * (x + 0.044715 * x**3))
        return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x))
    # silu
    sigmoid = 0.5 * (1.0 + np.tanh(0.5 * x))  # the logistic function, without overflow
    return dy * sigmoid * (1.0 + x * (1.0 - sigmoid))


# ---------------------------------------------------------------------------------------------
# Softmax and scaled dot-product attention
# ---------------------------------------------------------------------------------------------

def softmax_forward(x, axis: int = -1):
    """``p = softmax(x)`` along ``axis`` (the library's stable softmax), and ``saved``.

    Shapes
    ------
    x : (..., n) -> p : (..., n)  (for ``axis=-1``)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    p = softmax(x, axis=axis)
    return p, (p, axis)


def softmax_backward(dp, saved):
    """``dx = p * (dp - sum(dp * p))``: the softmax Jacobian ``diag(p) - p p^T`` applied to ``dp``.

    Entries with ``p = 0`` (masked, ``-inf`` logits) get zero gradient, and a row that is
    entirely 0 (fully masked) gets a zero row: no NaN.

    Shapes
    ------
    dp : (..., n) -> dx : (..., n)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> p, saved = softmax_forward(np.zeros(2))
    >>> softmax_backward(np.array([1.0, 0.0]), saved)
    array([ 0.25, -0.25])
    """
    p, axis = saved
    return p * (dp - np.sum(dp * p, axis=axis, keepdims=True))


def attention_forward(q, k, v, mask=None, *, scale=None):
    """The library's scaled dot-product attention, returning ``(output, weights, saved)``.

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v), mask : broadcastable to
    (..., Tq, Tk) -> output : (..., Tq, d_v), weights : (..., Tq, Tk)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*. The forward pass is
    ``scaled_dot_product_attention`` (chapters 03 and 04).
    """
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    output, weights = scaled_dot_product_attention(q, k, v, mask=mask, scale=scale)
    return output, weights, (q, k, v, weights, scale)


def attention_backward(d_output, saved):
    """Gradients of ``softmax(q k^T * scale) v`` with respect to ``q``, ``k`` and ``v``.

    With ``P`` the weights and ``S`` the scores: ``dV = P^T dO``, ``dP = dO V^T``,
    ``dS = P * (dP - rowsum(dP * P))`` (the softmax backward), ``dQ = dS K * scale`` and
    ``dK = dS^T Q * scale``. A masked entry has ``P = 0``, so ``dS = 0`` there: no
    gradient flows through a blocked query-key pair, and a fully masked query (a zero row
    of ``P``) sends no gradient anywhere. Inputs that were broadcast over batch
    dimensions get their gradients summed back (:func:`sum_to_shape`).

    Shapes
    ------
    d_output : (..., Tq, d_v) -> dq : q's shape, dk : k's shape, dv : v's shape

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    q, k, v, weights, scale = saved
    dv = np.swapaxes(weights, -1, -2) @ d_output  # (..., Tk, d_v)
    d_weights = d_output @ np.swapaxes(v, -1, -2)  # (..., Tq, Tk)
    d_scores = weights * (d_weights - np.sum(d_weights * weights, axis=-1, keepdims=True))
    dq = (d_scores @ k) * scale  # (..., Tq, d_k)
    dk = (np.swapaxes(d_scores, -1, -2) @ q) * scale  # (..., Tk, d_k)
    return sum_to_shape(dq, q.shape), sum_to_shape(dk, k.shape), sum_to_shape(dv, v.shape)


def dropout_forward(x, p: float, rng: np.random.Generator | None):
    """Inverted dropout: zero each entry with probability ``p``, scale the rest by ``1/(1-p)``.

    The scaling keeps every entry's expected value unchanged, so the trained network is used
    as it is at evaluation time, without dropout (``p = 0`` or ``rng=None``: the identity).
    ``saved`` is the array of multipliers (0 or ``1/(1-p)``), None for the identity.

    Shapes
    ------
    x : (...) -> (...)

    Raises
    ------
    ValueError
        If ``p`` is not in ``[0, 1)``.

    Notes
    -----
    Derived in chapter 08, *The transformer block*; its use in training in chapter 14. As
    ``torch.nn.functional.dropout`` (another random stream, so other entries are dropped).
    Integer input becomes float64, so the kept entries really are scaled by ``1/(1-p)``.

    Examples
    --------
    >>> y, multipliers = dropout_forward(np.ones(4), 0.5, np.random.default_rng(0))
    >>> y  # kept entries doubled, so the mean stays 1 on average
    array([2., 2., 2., 0.])
    """
    x = as_float_array(x, "x")
    p = float(p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability p must lie in [0, 1); got {p!r}")
    if p == 0.0 or rng is None:
        return x, None
    keep = rng.random(np.shape(x), dtype=np.float32) >= p  # float32 draws: half the cost
    multipliers = keep.astype(x.dtype) * np.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    return x * multipliers, multipliers


def dropout_backward(dy, saved):
    """``dx = dy * multipliers``: a dropped entry passes no gradient, a kept one ``1/(1-p)``.

    Shapes
    ------
    dy : (...) -> dx : (...)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    return dy if saved is None else dy * saved


# ---------------------------------------------------------------------------------------------
# Multi-head attention, layer norm, feed-forward network, encoder block
# ---------------------------------------------------------------------------------------------

def mha_forward(mha, x, mask=None):
    """Multi-head self-attention with the weights of ``mha`` (a ``MultiHeadAttention``).

    The same steps as ``MultiHeadAttention.__call__``: project, split into heads, attend,
    merge, project out. Grouped-query attention, RoPE, an output gate and KV caches are not
    supported here.

    Returns
    -------
    output : numpy.ndarray
    weights : numpy.ndarray
    saved : tuple

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, T) -> output : (..., T, d_model),
    weights : (..., H, T, T)

    Raises
    ------
    ValueError
        If ``mha`` uses grouped-query attention, RoPE or an output gate.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    gate = None if mha.W_g is None else mha.W_g.shape
    if mha.num_kv_heads != mha.num_heads or mha.rope_base is not None or gate is not None:
        raise ValueError("mha_forward supports plain multi-head attention only "
                         f"(got num_kv_heads={mha.num_kv_heads}, num_heads={mha.num_heads}, "
                         f"rope_base={mha.rope_base}, an output gate W_g of shape {gate})")
    H = mha.num_heads
    q, q_saved = linear_forward(x, mha.W_q, mha.b_q)  # (..., T, d_model)
    k, k_saved = linear_forward(x, mha.W_k, mha.b_k)
    v, v_saved = linear_forward(x, mha.W_v, mha.b_v)
    heads, weights, attn_saved = attention_forward(
        split_heads(q, H), split_heads(k, H), split_heads(v, H),  # (..., H, T, d_head)
        mask=_heads_mask(mask))
    output, o_saved = linear_forward(merge_heads(heads), mha.W_o, mha.b_o)  # (..., T, d_model)
    return output, weights, (q_saved, k_saved, v_saved, attn_saved, o_saved, H)


def mha_backward(d_output, saved):
    """Gradients of multi-head self-attention: ``(dx, grads)`` with ``grads`` keyed
    ``W_q W_k W_v W_o b_q b_k b_v b_o``.

    ``x`` feeds the queries, the keys and the values, so ``dx`` is the sum of the three
    paths' gradients.

    Shapes
    ------
    d_output : (..., T, d_model) -> dx : (..., T, d_model)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    q_saved, k_saved, v_saved, attn_saved, o_saved, H = saved
    d_merged, grads_W_o, grads_b_o = linear_backward(d_output, o_saved)
    dq, dk, dv = attention_backward(split_heads(d_merged, H), attn_saved)
    dx_q, dW_q, db_q = linear_backward(merge_heads(dq), q_saved)
    dx_k, dW_k, db_k = linear_backward(merge_heads(dk), k_saved)
    dx_v, dW_v, db_v = linear_backward(merge_heads(dv), v_saved)
    grads = {"W_q": dW_q, "W_k": dW_k, "W_v": dW_v, "W_o": grads_W_o,
             "b_q": db_q, "b_k": db_k, "b_v": db_v, "b_o": grads_b_o}
    return dx_q + dx_k + dx_v, grads


def layer_norm_forward(norm, x):
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` with the weights of ``norm``.

    Shapes
    ------
    x : (..., d) -> y : (..., d)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*; the same arithmetic as ``LayerNorm``.
    """
    x = as_float_array(x, "x", min_ndim=1)
    mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, (..., 1)
    std = np.sqrt(variance + norm.eps)  # (..., 1)
    normalized = (x - mean) / std  # (..., d)
    return normalized * norm.gamma + norm.beta, (normalized, std, norm.gamma)


def layer_norm_backward(dy, saved):
    """Gradients of layer norm: ``(dx, {"gamma": ..., "beta": ...})``.

    With ``n = (x - mean) / std`` and ``g = dy * gamma``:
    ``dx = (g - mean(g) - n * mean(g * n)) / std`` (means over the features),
    ``dgamma = sum(dy * n)`` and ``dbeta = sum(dy)`` over every token.

    Shapes
    ------
    dy : (..., d) -> dx : (..., d), grads : (d,) each

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    normalized, std, gamma = saved
    d = normalized.shape[-1]
    d_normalized = dy * gamma  # (..., d)
    dx = (d_normalized
          - d_normalized.mean(axis=-1, keepdims=True)
          - normalized * (d_normalized * normalized).mean(axis=-1, keepdims=True)) / std
    grads = {"gamma": (dy * normalized).reshape(-1, d).sum(axis=0),
             "beta": dy.reshape(-1, d).sum(axis=0)}
    return dx, grads


def feed_forward_forward(ff, x):
    """``activation(x W1 + b1) W2 + b2`` with the weights of ``ff`` (a ``FeedForward``).

    Shapes
    ------
    x : (..., T, d_model) -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    pre_activation, saved1 = linear_forward(x, ff.W1, ff.b1)  # (..., T, d_ff)
    hidden, act_saved = activation_forward(pre_activation, ff.activation)
    output, saved2 = linear_forward(hidden, ff.W2, ff.b2)  # (..., T, d_model)
    return output, (saved1, act_saved, saved2)


def feed_forward_backward(dy, saved):
    """Gradients of the feed-forward network: ``(dx, {"W1", "b1", "W2", "b2"})``.

    Shapes
    ------
    dy : (..., T, d_model) -> dx : (..., T, d_model)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    saved1, act_saved, saved2 = saved
    d_hidden, dW2, db2 = linear_backward(dy, saved2)
    d_pre = activation_backward(d_hidden, act_saved)
    dx, dW1, db1 = linear_backward(d_pre, saved1)
    return dx, {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2}


def _prefixed(prefix: str, grads: dict) -> dict:
    return {f"{prefix}.{name}": grad for name, grad in grads.items()}


def encoder_block_forward(block, x, mask=None, *, dropout: float = 0.0,
                          rng: np.random.Generator | None = None):
    """An ``EncoderBlock``'s forward pass (post-LN or pre-LN), returning ``(y, weights, saved)``.

    A block whose ``self_attn`` is None has no attention sub-layer: it is a per-position
    MLP with a residual connection (the "no attention" baseline of chapter 12); its
    weights are then None. With ``dropout > 0`` and an ``rng``, each sub-layer's output is
    passed through :func:`dropout_forward` before it is added to the residual stream
    (``x + dropout(sublayer(...))``, the paper's residual dropout, section 5.4).

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, T) -> y : (..., T, d_model),
    weights : (..., H, T, T)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*. Equal to ``EncoderBlock.__call__``.
    """
    attn_saved = norm1_saved = drop1_saved = None
    weights = None
    if block.norm_first:  # x = x + attn(norm1(x)); y = x + ff(norm2(x))
        if block.self_attn is not None:
            normed, norm1_saved = layer_norm_forward(block.norm1, x)
            attended, weights, attn_saved = mha_forward(block.self_attn, normed, mask)
            attended, drop1_saved = dropout_forward(attended, dropout, rng)
            x = x + attended
        normed, norm2_saved = layer_norm_forward(block.norm2, x)
        transformed, ff_saved = feed_forward_forward(block.ff, normed)
        transformed, drop2_saved = dropout_forward(transformed, dropout, rng)
        y = x + transformed
    else:  # x = norm1(x + attn(x)); y = norm2(x + ff(x))
        if block.self_attn is not None:
            attended, weights, attn_saved = mha_forward(block.self_attn, x, mask)
            attended, drop1_saved = dropout_forward(attended, dropout, rng)
            x, norm1_saved = layer_norm_forward(block.norm1, x + attended)
        transformed, ff_saved = feed_forward_forward(block.ff, x)
        transformed, drop2_saved = dropout_forward(transformed, dropout, rng)
        y, norm2_saved = layer_norm_forward(block.norm2, x + transformed)
    return y, weights, (block.norm_first, attn_saved, norm1_saved, ff_saved, norm2_saved,
                        drop1_saved, drop2_saved)


def encoder_block_backward(dy, saved):
    """Gradients of an encoder block: ``(dx, grads)``, ``grads`` keyed like
    ``"self_attn.W_q"``, ``"ff.W1"``, ``"norm1.gamma"``.

    A residual connection ``y = x + f(x)`` passes ``dy`` to ``x`` unchanged *and*
    through ``f``: ``dx = dy + f'(x)^T dy``.

    Shapes
    ------
    dy : (..., T, d_model) -> dx : (..., T, d_model)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    (norm_first, attn_saved, norm1_saved, ff_saved, norm2_saved,
     drop1_saved, drop2_saved) = saved
    grads = {}
    if norm_first:
        d_normed, ff_grads = feed_forward_backward(dropout_backward(dy, drop2_saved), ff_saved)
        d_norm2_in, norm2_grads = layer_norm_backward(d_normed, norm2_saved)
        dx = dy + d_norm2_in  # the residual path and the feed-forward path
        if attn_saved is not None:
            d_normed, attn_grads = mha_backward(dropout_backward(dx, drop1_saved), attn_saved)
            d_norm1_in, norm1_grads = layer_norm_backward(d_normed, norm1_saved)
            dx = dx + d_norm1_in
    else:
        d_sum, norm2_grads = layer_norm_backward(dy, norm2_saved)
        d_ff_in, ff_grads = feed_forward_backward(dropout_backward(d_sum, drop2_saved),
                                                  ff_saved)
        dx = d_sum + d_ff_in
        if attn_saved is not None:
            d_sum, norm1_grads = layer_norm_backward(dx, norm1_saved)
            d_attn_in, attn_grads = mha_backward(dropout_backward(d_sum, drop1_saved),
                                                 attn_saved)
            dx = d_sum + d_attn_in
    if attn_saved is not None:
        grads |= _prefixed("self_attn", attn_grads) | _prefixed("norm1", norm1_grads)
    grads |= _prefixed("ff", ff_grads) | _prefixed("norm2", norm2_grads)
    return dx, grads


# ---------------------------------------------------------------------------------------------
# Embeddings and the loss
# ---------------------------------------------------------------------------------------------

def embedding_forward(embedding, tokens):
    """Look up one row of ``embedding`` per token id.

    Shapes
    ------
    embedding : (V, d), tokens : (...) int -> (..., d)

    Raises
    ------
    TypeError, ValueError
        If ``tokens`` are not integers in ``[0, V)``.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    tokens = check_token_ids(tokens, embedding.shape[0])
    return embedding[tokens], (tokens, embedding.shape)


def embedding_backward(dy, saved):
    """The embedding's gradient: row ``i`` is the sum of ``dy`` over every occurrence of
    token ``i`` (rows of tokens that did not occur stay 0).

    Shapes
    ------
    dy : (..., d) -> (V, d)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    tokens, shape = saved
    d_embedding = np.zeros(shape, dtype=dy.dtype)
    np.add.at(d_embedding, tokens.reshape(-1), dy.reshape(-1, shape[1]))  # repeats add up
    return d_embedding


def cross_entropy_forward(logits, targets, ignore_index: int = -100):
    """Mean cross-entropy ``-log softmax(logits)[target]`` over the positions that count.

    Positions whose target is ``ignore_index`` (padding) are left out of the sum and of the
    count. Computed with ``log_softmax``, so large logits cannot overflow. With no position
    that counts the loss is 0 (and so is its gradient), not NaN.

    Returns
    -------
    loss : float
    saved : tuple

    Shapes
    ------
    logits : (..., C), targets : (...) int -> loss : scalar

    Raises
    ------
    TypeError, ValueError
        If ``targets`` are not integers, do not match ``logits.shape[:-1]``, or name a class
        outside ``[0, C)`` (other than ``ignore_index``).

    Notes
    -----
    Derived in chapter 12, *Training a transformer*. Equal to
    ``torch.nn.functional.cross_entropy`` with ``ignore_index`` (tested).

    Examples
    --------
    >>> loss, _ = cross_entropy_forward(np.zeros((2, 4)), np.array([1, 3]))
    >>> round(loss, 4)  # log(4): uniform over 4 classes
    1.3863
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    targets = np.asarray(targets)
    if not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets must be integer class ids; got dtype {targets.dtype}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets of shape {targets.shape} do not match logits of shape "
                         f"{logits.shape} (expected targets of shape {logits.shape[:-1]})")
    num_classes = logits.shape[-1]
    counts = targets != ignore_index  # (...)
    if np.any(counts & ((targets < 0) | (targets >= num_classes))):
        raise ValueError(f"targets must be class ids in [0, {num_classes}) or ignore_index="
                         f"{ignore_index}; got values {np.unique(targets).tolist()}")
    num_counted = max(int(counts.sum()), 1)  # 0 counted positions: loss 0, not 0/0
    log_probs = log_softmax(logits, axis=-1)  # (..., C)
    safe_targets = np.where(counts, targets, 0)
    picked = np.take_along_axis(log_probs, safe_targets[..., None], axis=-1)[..., 0]  # (...)
    loss = -float(np.sum(picked, where=counts)) / num_counted
    return loss, (log_probs, safe_targets, counts, num_counted)


def cross_entropy_backward(d_loss, saved):
    """``dlogits = (softmax(logits) - onehot(target)) / N`` at counted positions, 0 elsewhere.

    ``N`` is the number of counted positions; ``d_loss`` (1.0 for the loss itself) scales
    the result.

    Shapes
    ------
    -> dlogits : (..., C)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    log_probs, safe_targets, counts, num_counted = saved
    d_logits = np.exp(log_probs)  # the probabilities, (..., C)
    np.put_along_axis(d_logits, safe_targets[..., None],
                      np.take_along_axis(d_logits, safe_targets[..., None], axis=-1) - 1.0,
                      axis=-1)
    d_logits *= counts[..., None] * (float(d_loss) / num_counted)
    return d_logits
