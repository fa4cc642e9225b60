"""Backward passes, written by hand, for the attention variants of chapter 19.

The same pattern as :mod:`attention_lib.training.functional` (chapter 12): ``*_forward``
computes what the library's forward computes and returns ``saved``, what the backward pass
needs; ``*_backward(d_output, saved)`` returns the gradients of the inputs and, for a layer
with parameters, a dict of parameter gradients keyed by the layer's field names. What
chapter 12 already has is reused, not re-derived: softmax attention's backward
(:func:`~attention_lib.training.functional.attention_backward`) serves full, grouped-query,
multi-query, sliding-window and latent attention, since all of them are softmax attention
with other keys, values or masks.

- :func:`grouped_attention_forward`: grouped-query (and multi-query) attention; the gradient
  of a key/value head is the sum over the query heads that share it.
- :func:`gated_attention_output_forward`: the sigmoid output gate of Qiu et al. 2025.
- :func:`attention_layer_forward`: a ``MultiHeadAttention`` layer with grouped heads, an
  output gate and any mask (a sliding window is a mask), without RoPE.
- :func:`mla_forward`: multi-head latent attention, the naive path (DeepSeek trains with
  it), with the RMSNorms on the latents and the decoupled RoPE key.
- :func:`linear_attention_forward`: causal linear attention with ``elu + 1`` features.
- :func:`delta_rule_forward`: the delta rule and the gated delta rule, through the
  recurrence, every state kept for the backward pass.
- helpers: :func:`rms_norm_forward`, :func:`rope_backward`, :func:`l2_normalize_forward`.

Each is tested against PyTorch's autograd and against finite differences
(``tests/test_variants_backward.py``).
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from ..attention import _attend
from ..multihead import _heads_mask, _merge_heads, _split_heads
from ..positional import apply_rope
from ..variants import MultiHeadLatentAttention, _divide, _elu_plus_one
from .functional import attention_backward, linear_backward, linear_forward, sum_to_shape

__all__ = [
    "rms_norm_forward", "rms_norm_backward",
    "rope_backward",
    "l2_normalize_forward", "l2_normalize_backward",
    "grouped_attention_forward", "grouped_attention_backward",
    "gated_attention_output_forward", "gated_attention_output_backward",
    "attention_layer_forward", "attention_layer_backward",
    "mla_forward", "mla_backward",
    "linear_attention_forward", "linear_attention_backward",
    "delta_rule_forward", "delta_rule_backward",
]


# ---------------------------------------------------------------------------------------------
# Small pieces: RMSNorm, RoPE, L2 normalization
# ---------------------------------------------------------------------------------------------

def rms_norm_forward(norm, x):
    """``x / sqrt(mean(x^2) + eps) * gamma`` with the weights of ``norm`` (an ``RMSNorm``).

    Shapes
    ------
    x : (..., d) -> y : (..., d)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + norm.eps)  # (..., 1)
    normalized = x * rstd
    return normalized * norm.gamma, (normalized, rstd, norm.gamma)


def rms_norm_backward(dy, saved):
    """Gradients of RMSNorm: ``(dx, {"gamma": ...})``.

    With ``n = x / rms`` and ``g = dy * gamma``: ``dx = (g - n * mean(g * n)) / rms``
    (layer norm's formula without the mean term) and ``dgamma = sum(dy * n)``.

    Shapes
    ------
    dy : (..., d) -> dx : (..., d), grads : (d,)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    normalized, rstd, gamma = saved
    d = normalized.shape[-1]
    g = dy * gamma
    dx = (g - normalized * (g * normalized).mean(axis=-1, keepdims=True)) * rstd
    return dx, {"gamma": (dy * normalized).reshape(-1, d).sum(axis=0)}


def rope_backward(dy, positions, base: float = 10000.0):
    """The gradient through :func:`~attention_lib.positional.apply_rope`: rotate back.

    RoPE rotates each feature pair by an angle; a rotation's transpose is the rotation by
    the opposite angle, so the gradient is ``apply_rope(dy, -positions)``.

    Shapes
    ------
    dy : (..., T, d), positions : (T,) -> (..., T, d)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    return apply_rope(dy, -np.asarray(positions), base)


def l2_normalize_forward(x, eps: float = 1e-6):
    """``x / sqrt(|x|^2 + eps)`` over the last axis (fla's ``l2norm``, used on the delta
    rule's queries and keys), and ``saved``.

    Shapes
    ------
    x : (..., d) -> y : (..., d)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    rnorm = 1.0 / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)  # (..., 1)
    y = x * rnorm
    return y, (y, rnorm)


def l2_normalize_backward(dy, saved):
    """``dx = (dy - y (y . dy)) / |x|``: only the part of ``dy`` orthogonal to ``y`` moves
    the direction.

    Shapes
    ------
    dy : (..., d) -> dx : (..., d)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    y, rnorm = saved
    return (dy - y * (dy * y).sum(axis=-1, keepdims=True)) * rnorm


# ---------------------------------------------------------------------------------------------
# Grouped-query attention, the output gate, and a MultiHeadAttention layer with both
# ---------------------------------------------------------------------------------------------

def grouped_attention_forward(q, k, v, mask=None, *, scale=None):
    """Softmax attention where ``H / H_kv`` query heads share each key/value head, with what
    :func:`grouped_attention_backward` needs: ``(output, weights, saved)``.

    The query heads are viewed as ``(H_kv, group)`` and the key/value heads broadcast
    against them (no copy), as :func:`~attention_lib.multihead.grouped_attention` does.
    ``H_kv = 1`` is multi-query attention, ``H_kv = H`` multi-head attention.

    Shapes
    ------
    q : (..., H, T, d), k : (..., H_kv, T, d), v : (..., H_kv, T, d_v), mask : broadcastable
    to (..., T, T) (every head) -> output : (..., H, T, d_v), weights : (..., H, T, T)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*; the forward pass is chapter 11's.
    """
    H, H_kv = q.shape[-3], k.shape[-3]
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else float(scale)
    group = H // H_kv
    q_grouped = q.reshape(*q.shape[:-3], H_kv, group, *q.shape[-2:])  # (..., H_kv, g, T, d)
    k_grouped, v_grouped = k[..., None, :, :], v[..., None, :, :]  # (..., H_kv, 1, T, d)
    grouped_mask = None if mask is None else _heads_mask(_heads_mask(mask))  # (..., 1, 1, T, T)
    output, weights = _attend(q_grouped, k_grouped, v_grouped, scale, grouped_mask)
    saved = (q_grouped, k_grouped, v_grouped, weights, scale)  # attention_backward's saved
    return (output.reshape(q.shape[:-1] + v.shape[-1:]), weights.reshape(*q.shape[:-1], -1),
            (saved, q.shape, k.shape, v.shape))


def grouped_attention_backward(d_output, saved):
    """Gradients of grouped attention: ``(dq, dk, dv)``.

    Chapter 12's attention backward on the grouped view; a key/value head was broadcast to
    its ``group`` query heads, so its gradient is the sum of theirs (``sum_to_shape``).

    Shapes
    ------
    d_output : (..., H, T, d_v) -> dq, dk, dv : the shapes of q, k, v

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    attn_saved, q_shape, k_shape, v_shape = saved
    q_grouped = attn_saved[0]
    dq, dk, dv = attention_backward(d_output.reshape(*q_grouped.shape[:-1], -1), attn_saved)
    return dq.reshape(q_shape), dk.reshape(k_shape), dv.reshape(v_shape)


def gated_attention_output_forward(heads, x, W_g, b_g=None):
    """``heads * sigmoid(x W_g + b_g)`` (Qiu et al. 2025's gate, elementwise or head-wise),
    with what the backward pass needs: ``(output, saved)``.

    The same numbers as :func:`~attention_lib.variants.gated_attention_output`.

    Shapes
    ------
    heads : (..., H, T, d_head), x : (..., T, d_model), W_g : (d_model, H * d_head) or
    (d_model, H) -> (..., H, T, d_head)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    H = heads.shape[-3]
    pre, lin_saved = linear_forward(x, W_g, b_g)  # (..., T, H * d_head) or (..., T, H)
    gate = expit(pre).astype(pre.dtype, copy=False)
    headwise = W_g.shape[1] == H
    laid_out = gate.swapaxes(-1, -2)[..., None] if headwise else _split_heads(gate, H)
    return heads * laid_out, (heads, gate, laid_out, lin_saved, headwise)


def gated_attention_output_backward(d_output, saved):
    """Gradients of the gate: ``(d_heads, dx, {"W_g": ..., "b_g": ...})``.

    ``d_heads = d_output * gate``; the gate's own gradient is ``d_output * heads`` (summed
    over a head's channels for a head-wise gate), times the sigmoid's slope
    ``gate (1 - gate)``, then back through ``x W_g + b_g``. ``b_g`` is None for a gate
    without bias.

    Shapes
    ------
    d_output : (..., H, T, d_head) -> d_heads : (..., H, T, d_head), dx : (..., T, d_model)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    heads, gate, laid_out, lin_saved, headwise = saved
    d_heads = d_output * laid_out
    d_laid_out = d_output * heads
    if headwise:
        d_gate = d_laid_out.sum(axis=-1).swapaxes(-1, -2)  # (..., T, H)
    else:
        d_gate = _merge_heads(d_laid_out)  # (..., T, H * d_head)
    d_pre = d_gate * gate * (1 - gate)
    dx, dW_g, db_g = linear_backward(d_pre, lin_saved)
    return d_heads, dx, {"W_g": dW_g, "b_g": db_g}


def attention_layer_forward(mha, x, mask=None):
    """Self-attention with the weights of ``mha`` (a ``MultiHeadAttention``), grouped-query
    heads and an output gate allowed: ``(output, weights, saved)``.

    The steps of ``MultiHeadAttention.forward``: project, split into ``H`` query heads and
    ``H_kv`` key/value heads, attend (:func:`grouped_attention_forward`), gate each head's
    output if the layer has ``W_g`` (:func:`gated_attention_output_forward`), merge, project
    out. A sliding window is only a mask (``sliding_window_mask``). Chapter 12's
    ``mha_forward`` is the special case ``H_kv = H`` without a gate.

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, T) -> output : (..., T, d_model),
    weights : (..., H, T, T)

    Raises
    ------
    ValueError
        If ``mha`` rotates queries and keys (``rope_base``): not supported here.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    if mha.rope_base is not None:
        raise ValueError(f"attention_layer_forward does not support RoPE (rope_base="
                         f"{mha.rope_base})")
    q, q_saved = linear_forward(x, mha.W_q, mha.b_q)  # (..., T, d_model)
    k, k_saved = linear_forward(x, mha.W_k, mha.b_k)  # (..., T, H_kv * d_head)
    v, v_saved = linear_forward(x, mha.W_v, mha.b_v)
    heads, weights, attn_saved = grouped_attention_forward(
        _split_heads(q, mha.num_heads), _split_heads(k, mha.num_kv_heads),
        _split_heads(v, mha.num_kv_heads), mask)  # (..., H, T, d_head)
    gate_saved = None
    if mha.W_g is not None:
        heads, gate_saved = gated_attention_output_forward(heads, x, mha.W_g, mha.b_g)
    output, o_saved = linear_forward(_merge_heads(heads), mha.W_o, mha.b_o)
    saved = (q_saved, k_saved, v_saved, attn_saved, gate_saved, o_saved, mha.num_heads,
             mha.num_kv_heads)
    return output, weights, saved


def attention_layer_backward(d_output, saved):
    """Gradients of :func:`attention_layer_forward`: ``(dx, grads)`` keyed ``W_q W_k W_v W_o
    b_q b_k b_v b_o`` (and ``W_g``, ``b_g`` for a gated layer).

    Shapes
    ------
    d_output : (..., T, d_model) -> dx : (..., T, d_model)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    q_saved, k_saved, v_saved, attn_saved, gate_saved, o_saved, H, H_kv = saved
    d_merged, dW_o, db_o = linear_backward(d_output, o_saved)
    d_heads = _split_heads(d_merged, H)
    grads = {"W_o": dW_o, "b_o": db_o}
    dx = 0
    if gate_saved is not None:
        d_heads, dx, gate_grads = gated_attention_output_backward(d_heads, gate_saved)
        grads |= {name: grad for name, grad in gate_grads.items() if grad is not None}
    dq, dk, dv = grouped_attention_backward(d_heads, attn_saved)
    for name, d_part, part_saved in (("q", dq, q_saved), ("k", dk, k_saved),
                                     ("v", dv, v_saved)):
        dx_part, grads[f"W_{name}"], grads[f"b_{name}"] = linear_backward(_merge_heads(d_part),
                                                                          part_saved)
        dx = dx + dx_part
    return dx, grads


# ---------------------------------------------------------------------------------------------
# Multi-head latent attention, the naive (training) path
# ---------------------------------------------------------------------------------------------

def mla_forward(mla: MultiHeadLatentAttention, x, mask=None):
    """Multi-head latent attention's naive path with the weights of ``mla``:
    ``(output, weights, saved)``, the same numbers as ``mla(x, mask, absorb=False)``.

    Queries: ``c_q = RMSNorm(x W_dq)``, ``q^h = [c_q W_uq^h, RoPE(c_q W_qr^h)]``; keys and
    values from one latent ``c = RMSNorm(x W_dkv)``: ``k^h = [c W_uk^h, RoPE(x W_kr)]`` (the
    RoPE key shared by every head), ``v^h = c W_uv^h``; softmax attention with scale
    ``1/sqrt(d_head + d_rope)``; merge; ``W_o``. Positions count from 0.

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, T) -> output : (..., T, d_model),
    weights : (..., H, T, T)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. The naive path is the one to train
    with: the absorbed path saves cache memory at decoding, not work on a whole sequence.
    """
    H, T = mla.num_heads, x.shape[-2]
    positions = np.arange(T)
    # Queries through their latent.
    cq_pre, dq_saved = linear_forward(x, mla.W_dq)  # (..., T, d_query_latent)
    c_q, q_norm_saved = rms_norm_forward(mla.q_norm, cq_pre)
    q_content, uq_saved = linear_forward(c_q, mla.W_uq)  # (..., T, H * d_head)
    q_rope_pre, qr_saved = linear_forward(c_q, mla.W_qr)  # (..., T, H * d_rope)
    q_rope = apply_rope(_split_heads(q_rope_pre, H), positions, mla.rope_base)
    # One latent per token, and the RoPE key shared by the heads.
    ckv_pre, dkv_saved = linear_forward(x, mla.W_dkv)  # (..., T, d_latent)
    c_kv, kv_norm_saved = rms_norm_forward(mla.kv_norm, ckv_pre)
    k_rope_pre, kr_saved = linear_forward(x, mla.W_kr)  # (..., T, d_rope)
    k_rope = apply_rope(k_rope_pre, positions, mla.rope_base)
    k_content, uk_saved = linear_forward(c_kv, mla.W_uk)  # (..., T, H * d_head)
    values, uv_saved = linear_forward(c_kv, mla.W_uv)  # (..., T, H * d_v)
    # Per-head queries and keys of width d_head + d_rope, then softmax attention.
    k_content = _split_heads(k_content, H)  # (..., H, T, d_head)
    queries = np.concatenate([_split_heads(q_content, H), q_rope], axis=-1)
    keys = np.concatenate([k_content, np.broadcast_to(k_rope[..., None, :, :],
                                                      (*k_content.shape[:-1], mla.d_rope))],
                          axis=-1)  # (..., H, T, d_head + d_rope)
    values = _split_heads(values, H)  # (..., H, T, d_v)
    heads, weights = _attend(queries, keys, values, mla.scale, _heads_mask(mask))
    attn_saved = (queries, keys, values, weights, mla.scale)
    output, o_saved = linear_forward(_merge_heads(heads), mla.W_o)
    saved = (dq_saved, q_norm_saved, uq_saved, qr_saved, dkv_saved, kv_norm_saved, kr_saved,
             uk_saved, uv_saved, attn_saved, o_saved, positions, mla.rope_base, mla.d_head, H)
    return output, weights, saved


def mla_backward(d_output, saved):
    """Gradients of :func:`mla_forward`: ``(dx, grads)`` keyed ``W_dq W_uq W_qr W_dkv W_uk
    W_uv W_kr W_o q_norm.gamma kv_norm.gamma``.

    The shared RoPE key's gradient is the sum over the heads that read it; ``x`` feeds three
    paths (query latent, KV latent, RoPE key) and ``c_kv`` two (keys, values), so their
    gradients add.

    Shapes
    ------
    d_output : (..., T, d_model) -> dx : (..., T, d_model)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    (dq_saved, q_norm_saved, uq_saved, qr_saved, dkv_saved, kv_norm_saved, kr_saved, uk_saved,
     uv_saved, attn_saved, o_saved, positions, base, d_head, H) = saved
    grads = {}
    d_merged, grads["W_o"], _ = linear_backward(d_output, o_saved)
    d_queries, d_keys, d_values = attention_backward(_split_heads(d_merged, H), attn_saved)
    # Keys: content part per head, RoPE part summed over the heads that shared it.
    d_k_rope = rope_backward(d_keys[..., d_head:].sum(axis=-3), positions, base)  # (..., T, dr)
    d_c_kv, grads["W_uk"], _ = linear_backward(_merge_heads(d_keys[..., :d_head]), uk_saved)
    d_c_kv_v, grads["W_uv"], _ = linear_backward(_merge_heads(d_values), uv_saved)
    d_ckv_pre, kv_norm_grads = rms_norm_backward(d_c_kv + d_c_kv_v, kv_norm_saved)
    dx, grads["W_dkv"], _ = linear_backward(d_ckv_pre, dkv_saved)
    dx_kr, grads["W_kr"], _ = linear_backward(d_k_rope, kr_saved)
    # Queries: content and RoPE parts, both from the query latent.
    d_q_rope = rope_backward(d_queries[..., d_head:], positions, base)  # (..., H, T, d_rope)
    d_c_q, grads["W_uq"], _ = linear_backward(_merge_heads(d_queries[..., :d_head]), uq_saved)
    d_c_q_r, grads["W_qr"], _ = linear_backward(_merge_heads(d_q_rope), qr_saved)
    d_cq_pre, q_norm_grads = rms_norm_backward(d_c_q + d_c_q_r, q_norm_saved)
    dx_q, grads["W_dq"], _ = linear_backward(d_cq_pre, dq_saved)
    grads["q_norm.gamma"], grads["kv_norm.gamma"] = q_norm_grads["gamma"], kv_norm_grads["gamma"]
    return dx + dx_kr + dx_q, grads


# ---------------------------------------------------------------------------------------------
# Causal linear attention (Katharopoulos et al. 2020)
# ---------------------------------------------------------------------------------------------

def linear_attention_forward(q, k, v):
    """Causal linear attention with ``phi = elu + 1``, in its quadratic form:
    ``(output, weights, saved)``.

    ``A = tril(phi(Q) phi(K)^T)``, ``weights = A / rowsum(A)``, ``output = weights V``: the
    numbers of :func:`~attention_lib.variants.linear_attention` (``causal=True``). The
    quadratic form is the cheap one to differentiate at training lengths (T = 64 here);
    ``weights`` are the normalized similarities, comparable with softmax weights.

    Shapes
    ------
    q, k : (..., T, d_k), v : (..., T, d_v) -> output : (..., T, d_v), weights : (..., T, T)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    phi_q, phi_k = _elu_plus_one(q), _elu_plus_one(k)
    similarities = np.tril(phi_q @ phi_k.swapaxes(-1, -2))  # (..., T, T), >= 0
    denominator = similarities.sum(axis=-1, keepdims=True)  # (..., T, 1)
    weights = _divide(similarities, denominator)
    output = weights @ v  # (..., T, d_v)
    return output, weights, (q, k, v, phi_q, phi_k, weights, denominator, output)


def linear_attention_backward(d_output, saved):
    """Gradients of causal linear attention: ``(dq, dk, dv)``.

    With ``W = A / rowsum(A)``: ``dV = W^T dO``, ``dW = dO V^T``, and through the
    normalization ``dA = (dW - D) / rowsum(A)`` with ``D = rowsum(dO * O)`` (one number per
    query, as in FlashAttention's backward), kept lower-triangular; then
    ``dphi(Q) = dA phi(K)``, ``dphi(K) = dA^T phi(Q)`` and ``phi'(x) = 1`` for ``x > 0``,
    ``exp(x)`` otherwise.

    Shapes
    ------
    d_output : (..., T, d_v) -> dq, dk, dv like q, k, v

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    q, k, v, phi_q, phi_k, weights, denominator, output = saved
    dv = weights.swapaxes(-1, -2) @ d_output  # (..., T, d_v)
    D = (d_output * output).sum(axis=-1, keepdims=True)  # (..., T, 1)
    d_similarities = np.tril(_divide(d_output @ v.swapaxes(-1, -2) - D, denominator))
    d_phi_q = d_similarities @ phi_k
    d_phi_k = d_similarities.swapaxes(-1, -2) @ phi_q
    dq = d_phi_q * np.where(q > 0, 1, phi_q)
    dk = d_phi_k * np.where(k > 0, 1, phi_k)
    return sum_to_shape(dq, q.shape), sum_to_shape(dk, k.shape), sum_to_shape(dv, v.shape)


# ---------------------------------------------------------------------------------------------
# The (gated) delta rule, through its recurrence
# ---------------------------------------------------------------------------------------------

def delta_rule_forward(q, k, v, beta, decay=None):
    """The (gated) delta rule, one token at a time, keeping every state: ``(output, saved)``.

    ``P_t = a_t S_{t-1}``, ``S_t = P_t + b_t (v_t - P_t k_t) k_t^T``, ``o_t = S_t q_t``, from
    ``S_0 = 0``: the numbers of :func:`~attention_lib.variants.delta_rule`. The backward pass
    needs every ``S_{t-1}``: ``T`` states of ``d_v x d_k`` per sequence and head (the
    chunkwise form would recompute them chunk by chunk instead; at T = 64 keeping them
    costs a few MB).

    Shapes
    ------
    q, k : (..., T, d_k), v : (..., T, d_v), beta and decay : (..., T) -> output (..., T, d_v)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    *batch, T, d_k = k.shape
    d_v = v.shape[-1]
    states = np.zeros((T + 1, *batch, d_v, d_k), dtype=v.dtype)  # states[t] = S_t
    output = np.empty_like(v)
    for t in range(T):
        state = states[t] if decay is None else states[t] * decay[..., t, None, None]  # P_t
        key = k[..., t, :]
        error = v[..., t, :] - (state @ key[..., None])[..., 0]  # (..., d_v): v - P k
        states[t + 1] = state + beta[..., t, None, None] * error[..., :, None] * key[..., None, :]
        output[..., t, :] = (states[t + 1] @ q[..., t, :, None])[..., 0]
    return output, (q, k, v, beta, decay, states)


def delta_rule_backward(d_output, saved):
    """Gradients of the (gated) delta rule: ``(dq, dk, dv, dbeta, ddecay)`` (``ddecay`` None
    without decay), by running the recurrence backwards.

    ``G`` is the gradient of the loss with respect to ``S_t`` (from every later token). At
    token ``t``, with ``u = v_t - P_t k_t`` and ``g = G k_t``::

        G      += do_t q_t^T             dq_t = S_t^T do_t
        dv_t    = b_t g                  db_t = u . g
        dk_t    = b_t (G^T u - P_t^T g)  dP_t = G - b_t g k_t^T
        da_t    = <dP_t, S_{t-1}>        G    = a_t dP_t  (the gradient of S_{t-1})

    Shapes
    ------
    d_output : (..., T, d_v) -> dq, dk like q, k; dv like v; dbeta, ddecay : (..., T)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    q, k, v, beta, decay, states = saved
    T = k.shape[-2]
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dbeta = np.empty(beta.shape, dtype=v.dtype)
    ddecay = None if decay is None else np.empty(decay.shape, dtype=v.dtype)
    G = np.zeros_like(states[0])  # (..., d_v, d_k)
    for t in reversed(range(T)):
        d_out, query, key = d_output[..., t, :], q[..., t, :], k[..., t, :]
        G += d_out[..., :, None] * query[..., None, :]
        dq[..., t, :] = (states[t + 1].swapaxes(-1, -2) @ d_out[..., None])[..., 0]
        previous = states[t]
        P = previous if decay is None else previous * decay[..., t, None, None]
        u = v[..., t, :] - (P @ key[..., None])[..., 0]  # (..., d_v)
        g = (G @ key[..., None])[..., 0]  # (..., d_v)
        b = beta[..., t, None]
        dv[..., t, :] = b * g
        dbeta[..., t] = (u * g).sum(axis=-1)
        dk[..., t, :] = b * ((G.swapaxes(-1, -2) @ u[..., None])[..., 0]
                             - (P.swapaxes(-1, -2) @ g[..., None])[..., 0])
        G -= b[..., None] * g[..., :, None] * key[..., None, :]  # now dP_t
        if decay is not None:
            ddecay[..., t] = (G * previous).sum(axis=(-1, -2))
            G *= decay[..., t, None, None]
    return dq, dk, dv, dbeta, ddecay
