"""A character-level language model whose attention is pluggable (chapter 19).

Chapter 14's model (token embeddings plus learned positions, pre-LN blocks
``x = x + mixer(norm1(x))``, ``x = x + ff(norm2(x))``, a final ``LayerNorm``, an untied
read-out) with the block's attention, the *mixer*, chosen per layer:

- a ``MultiHeadAttention``: multi-head, grouped-query, multi-query, with a sliding window
  (the block's ``window``) or with Qiu et al.'s output gate (``W_g``);
- a ``MultiHeadLatentAttention`` (MLA, naive path);
- a :class:`LinearAttentionLayer` (causal, ``elu + 1`` features);
- a :class:`DeltaRuleLayer` (the gated delta rule).

:data:`VARIANTS` names the models the comparison of chapter 19 trains
(``scripts/compare_attention_variants.py``); :func:`train_variant` trains one with the same
data order and schedule as every other. The backward passes are
:mod:`attention_lib.training.variant_grads` and chapter 12's; chapter 14's ``GPT`` is not
touched.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.special import expit

from .._checks import check_positive_int
from ..layers import FeedForward, LayerNorm, RMSNorm
from ..masks import causal_mask, sliding_window_mask
from ..multihead import MultiHeadAttention, _merge_heads, _split_heads
from ..variants import MultiHeadLatentAttention
from .functional import (
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    feed_forward_backward,
    feed_forward_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)
from .gpt import random_windows, repeated_random_sequences
from .models import named_parameters
from .optim import AdamW, clip_grad_norm, warmup_cosine_lr
from .variant_grads import (
    attention_layer_backward,
    attention_layer_forward,
    delta_rule_backward,
    delta_rule_forward,
    l2_normalize_backward,
    l2_normalize_forward,
    linear_attention_backward,
    linear_attention_forward,
    mla_backward,
    mla_forward,
)

__all__ = [
    "VARIANTS",
    "LinearAttentionLayer",
    "DeltaRuleLayer",
    "VariantBlock",
    "VariantLM",
    "variant_lm_forward",
    "variant_lm_backward",
    "variant_lm_loss_and_grads",
    "cache_bytes",
    "validation_loss",
    "first_token_weight",
    "copy_probe",
    "train_variant",
]

VARIANTS = {
    "mha": "multi-head attention (H key/value heads)",
    "gqa": "grouped-query attention (H/2 key/value heads)",
    "mqa": "multi-query attention (1 key/value head)",
    "mla": "multi-head latent attention (latent 24 + RoPE key 8 per token)",
    "sliding_window": "multi-head attention over the last 16 tokens",
    "linear": "linear attention (elu + 1 features)",
    "gated": "multi-head attention with an elementwise sigmoid output gate",
    "delta": "gated delta rule",
    "hybrid": "3 gated-delta-rule layers : 1 multi-head attention layer",
}
"""The variants of the comparison, by name, with what each layer's mixer is."""

WINDOW = 16
"""The sliding window of the ``"sliding_window"`` variant."""

MLA_SIZES = {"d_latent": 24, "d_rope": 8}
"""MLA's cached widths: 32 numbers per token and layer, as many as multi-query attention's."""


# ---------------------------------------------------------------------------------------------
# The two mixers that are not in the library as layers
# ---------------------------------------------------------------------------------------------

@dataclass
class LinearAttentionLayer:
    """Causal linear attention with projections: ``W_o`` applied to the merged heads of
    ``linear_attention(split(x W_q), split(x W_k), split(x W_v))`` (Katharopoulos et al.
    2020, ``phi = elu + 1``). No biases.

    Shapes
    ------
    W_q, W_k, W_v, W_o : (d_model, d_model)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """

    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    W_o: np.ndarray
    num_heads: int


@dataclass
class DeltaRuleLayer:
    """A gated-delta-rule layer: queries and keys L2-normalized (queries also scaled by
    ``d_head ** -0.5``, as flash-linear-attention does), a step ``b_t = sigmoid(x W_beta +
    b_beta)`` and a decay ``a_t = sigmoid(x W_decay + b_decay)`` per head and token, the
    rule of :func:`~attention_lib.variants.delta_rule`, then ``W_o`` on the merged heads.

    Simpler than Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024): no short convolution, no
    SiLU on queries and keys, no output norm and gate, and the decay a sigmoid rather than
    ``exp(-exp(A) softplus(.))``.

    Shapes
    ------
    W_q, W_k, W_v, W_o : (d_model, d_model); W_beta, W_decay : (d_model, H); b_beta,
    b_decay : (H,)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """

    W_q: np.ndarray
    W_k: np.ndarray
    W_v: np.ndarray
    W_o: np.ndarray
    W_beta: np.ndarray
    b_beta: np.ndarray
    W_decay: np.ndarray
    b_decay: np.ndarray
    num_heads: int


def _linear_layer_forward(layer, x):
    H = layer.num_heads
    (q, q_saved), (k, k_saved), (v, v_saved) = (linear_forward(x, W)
                                                for W in (layer.W_q, layer.W_k, layer.W_v))
    heads, weights, attn_saved = linear_attention_forward(_split_heads(q, H), _split_heads(k, H),
                                                          _split_heads(v, H))
    output, o_saved = linear_forward(_merge_heads(heads), layer.W_o)
    return output, weights, (q_saved, k_saved, v_saved, attn_saved, o_saved, H)


def _linear_layer_backward(d_output, saved):
    q_saved, k_saved, v_saved, attn_saved, o_saved, H = saved
    grads = {}
    d_heads, grads["W_o"], _ = linear_backward(d_output, o_saved)
    dq, dk, dv = linear_attention_backward(_split_heads(d_heads, H), attn_saved)
    dx = 0
    for name, d_part, part_saved in (("q", dq, q_saved), ("k", dk, k_saved), ("v", dv, v_saved)):
        dx_part, grads[f"W_{name}"], _ = linear_backward(_merge_heads(d_part), part_saved)
        dx = dx + dx_part
    return dx, grads


def _delta_layer_forward(layer, x):
    H = layer.num_heads
    (q, q_saved), (k, k_saved), (v, v_saved) = (linear_forward(x, W)
                                                for W in (layer.W_q, layer.W_k, layer.W_v))
    q, q_norm_saved = l2_normalize_forward(_split_heads(q, H))  # (..., H, T, d_head)
    scale = q.shape[-1] ** -0.5
    k, k_norm_saved = l2_normalize_forward(_split_heads(k, H))
    beta_pre, beta_saved = linear_forward(x, layer.W_beta, layer.b_beta)  # (..., T, H)
    decay_pre, decay_saved = linear_forward(x, layer.W_decay, layer.b_decay)
    beta = expit(beta_pre).astype(x.dtype, copy=False)
    decay = expit(decay_pre).astype(x.dtype, copy=False)
    heads, rule_saved = delta_rule_forward(q * scale, k, _split_heads(v, H),
                                           beta.swapaxes(-1, -2), decay.swapaxes(-1, -2))
    output, o_saved = linear_forward(_merge_heads(heads), layer.W_o)
    return output, None, (q_saved, k_saved, v_saved, q_norm_saved, k_norm_saved, scale,
                          beta_saved, beta, decay_saved, decay, rule_saved, o_saved, H)


def _delta_layer_backward(d_output, saved):
    (q_saved, k_saved, v_saved, q_norm_saved, k_norm_saved, scale, beta_saved, beta,
     decay_saved, decay, rule_saved, o_saved, H) = saved
    grads = {}
    d_heads, grads["W_o"], _ = linear_backward(d_output, o_saved)
    dq, dk, dv, dbeta, ddecay = delta_rule_backward(_split_heads(d_heads, H), rule_saved)
    dq = l2_normalize_backward(dq * scale, q_norm_saved)
    dk = l2_normalize_backward(dk, k_norm_saved)
    dx = 0
    for name, d_part, part_saved in (("q", dq, q_saved), ("k", dk, k_saved), ("v", dv, v_saved)):
        dx_part, grads[f"W_{name}"], _ = linear_backward(_merge_heads(d_part), part_saved)
        dx = dx + dx_part
    for name, d_gate, gate, gate_saved in (("beta", dbeta, beta, beta_saved),
                                           ("decay", ddecay, decay, decay_saved)):
        d_pre = d_gate.swapaxes(-1, -2) * gate * (1 - gate)  # through the sigmoid
        dx_part, grads[f"W_{name}"], grads[f"b_{name}"] = linear_backward(d_pre, gate_saved)
        dx = dx + dx_part
    return dx, grads


# ---------------------------------------------------------------------------------------------
# Blocks and the model
# ---------------------------------------------------------------------------------------------

@dataclass
class VariantBlock:
    """A pre-LN block ``x = x + mixer(norm1(x))``, ``x = x + ff(norm2(x))`` with any mixer.

    ``window`` (a ``MultiHeadAttention`` mixer only): each token attends to itself and the
    ``window - 1`` tokens before it; None: to every earlier token.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """

    norm1: LayerNorm
    mixer: object
    norm2: LayerNorm
    ff: FeedForward
    window: int | None = None

    @property
    def kind(self) -> str:
        """``"attention"``, ``"mla"``, ``"linear"`` or ``"delta"``."""
        return {MultiHeadAttention: "attention", MultiHeadLatentAttention: "mla",
                LinearAttentionLayer: "linear", DeltaRuleLayer: "delta"}[type(self.mixer)]


def _mixer_forward(block, x):
    kind, T = block.kind, x.shape[-2]
    if kind == "attention":
        mask = causal_mask(T) if block.window is None else sliding_window_mask(
            T, window=block.window)
        return attention_layer_forward(block.mixer, x, mask)
    if kind == "mla":
        return mla_forward(block.mixer, x, causal_mask(T))
    if kind == "linear":
        return _linear_layer_forward(block.mixer, x)
    return _delta_layer_forward(block.mixer, x)


_MIXER_BACKWARD = {"attention": attention_layer_backward, "mla": mla_backward,
                   "linear": _linear_layer_backward, "delta": _delta_layer_backward}


@dataclass
class VariantLM:
    """Chapter 14's character-level model with a pluggable mixer in each block.

    Attributes
    ----------
    embedding : numpy.ndarray
        ``(V, d_model)``.
    positions : numpy.ndarray
        ``(context_len, d_model)``, learned.
    blocks : list of VariantBlock
    norm : LayerNorm
    W_out : numpy.ndarray
        ``(d_model, V)``, not tied to the embedding.
    variant : str
        A key of :data:`VARIANTS` (not a parameter).

    Shapes
    ------
    ids : (B, T) int, T <= context_len -> logits (B, T, V)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> model = VariantLM.init("gqa", 65, 16, 32, 4, 2, np.random.default_rng(0))
    >>> model.forward(np.zeros((2, 5), dtype=int)).shape
    (2, 5, 65)
    """

    embedding: np.ndarray
    positions: np.ndarray
    blocks: list[VariantBlock]
    norm: LayerNorm
    W_out: np.ndarray
    variant: str = "mha"

    @classmethod
    def init(cls, variant: str, vocab_size: int, context_len: int, d_model: int,
             num_heads: int, num_layers: int, rng: np.random.Generator, *,
             d_ff: int | None = None, dtype=np.float32) -> VariantLM:
        """Random weights drawn as chapter 14's ``GPT.init`` draws them (nanoGPT's scheme).

        Every matrix has normal entries of standard deviation 0.02, the matrices that write
        into the residual stream (each mixer's ``W_o``, ``ff.W2``) ``0.02 / sqrt(2 L)``;
        biases 0, norms the identity. The delta rule's step bias starts at 0
        (``b_t`` near 1/2) and its decay bias at ``linspace(1, 5, H)`` over the heads
        (``a_t`` from about 0.73 to 0.99: each head starts with another memory length).
        """
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {sorted(VARIANTS)}; got {variant!r}")
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        context_len = check_positive_int(context_len, "context_len")
        num_layers = check_positive_int(num_layers, "num_layers")
        d_model = check_positive_int(d_model, "d_model")
        H = check_positive_int(num_heads, "num_heads")
        if d_model % H:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={H}")
        d_ff = 4 * d_model if d_ff is None else d_ff
        d_head = d_model // H
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * num_layers)

        def normal(*shape, scale=std):
            return (rng.standard_normal(shape) * scale).astype(dtype)

        def zeros(n):
            return np.zeros(n, dtype=dtype)

        def attention(num_kv_heads=H, gate=False):
            kv = num_kv_heads * d_head
            return MultiHeadAttention(
                W_q=normal(d_model, d_model), W_k=normal(d_model, kv), W_v=normal(d_model, kv),
                W_o=normal(d_model, d_model, scale=residual_std), b_q=zeros(d_model),
                b_k=zeros(kv), b_v=zeros(kv), b_o=zeros(d_model), num_heads=H,
                num_kv_heads=num_kv_heads, W_g=normal(d_model, d_model) if gate else None,
                b_g=zeros(d_model) if gate else None)

        def mla():
            d_c, d_r = MLA_SIZES["d_latent"], MLA_SIZES["d_rope"]
            d_cq = 2 * d_c
            return MultiHeadLatentAttention(
                W_dq=normal(d_model, d_cq), W_uq=normal(d_cq, H * d_head),
                W_qr=normal(d_cq, H * d_r), W_dkv=normal(d_model, d_c),
                W_uk=normal(d_c, H * d_head), W_uv=normal(d_c, H * d_head),
                W_kr=normal(d_model, d_r), W_o=normal(H * d_head, d_model, scale=residual_std),
                q_norm=RMSNorm.init(d_cq, dtype=dtype), kv_norm=RMSNorm.init(d_c, dtype=dtype),
                num_heads=H)

        def linear():
            return LinearAttentionLayer(*(normal(d_model, d_model) for _ in range(3)),
                                        W_o=normal(d_model, d_model, scale=residual_std),
                                        num_heads=H)

        def delta():
            return DeltaRuleLayer(*(normal(d_model, d_model) for _ in range(3)),
                                  W_o=normal(d_model, d_model, scale=residual_std),
                                  W_beta=normal(d_model, H), b_beta=zeros(H),
                                  W_decay=normal(d_model, H),
                                  b_decay=np.linspace(1.0, 5.0, H).astype(dtype), num_heads=H)

        def mixer(layer):
            if variant in ("mha", "sliding_window"):
                return attention()
            if variant in ("gqa", "mqa"):
                return attention(num_kv_heads=max(H // 2, 1) if variant == "gqa" else 1)
            if variant == "gated":
                return attention(gate=True)
            if variant == "hybrid":  # Qwen3-Next's order: three linear-time layers, then one
                return attention() if layer % 4 == 3 else delta()
            return {"mla": mla, "linear": linear, "delta": delta}[variant]()

        embedding, positions = normal(vocab_size, d_model), normal(context_len, d_model)
        blocks = []
        for layer in range(num_layers):
            block_mixer = mixer(layer)
            ff = FeedForward(W1=normal(d_model, d_ff), b1=zeros(d_ff),
                             W2=normal(d_ff, d_model, scale=residual_std), b2=zeros(d_model),
                             activation="gelu_tanh")
            blocks.append(VariantBlock(LayerNorm.init(d_model, dtype=dtype), block_mixer,
                                       LayerNorm.init(d_model, dtype=dtype), ff,
                                       window=WINDOW if variant == "sliding_window" else None))
        return cls(embedding=embedding, positions=positions, blocks=blocks,
                   norm=LayerNorm.init(d_model, dtype=dtype), W_out=normal(d_model, vocab_size),
                   variant=variant)

    @property
    def context_len(self) -> int:
        return self.positions.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.embedding.shape[0]

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable arrays by dotted name (``"blocks.0.mixer.W_q"``)."""
        return named_parameters(self)

    def no_decay_names(self) -> list[str]:
        """Exempt from weight decay, as chapter 14's GPT: 1-d arrays and the embeddings."""
        return [name for name, param in self.parameters().items()
                if param.ndim == 1 or name in ("embedding", "positions")]

    def forward(self, ids, return_weights: bool = False):
        """Logits ``(B, T, V)`` (and each block's weights, None for a delta-rule block)."""
        logits, weights, _ = variant_lm_forward(self, ids)
        return (logits, weights) if return_weights else logits

    __call__ = forward


def variant_lm_forward(model: VariantLM, ids):
    """The forward pass, keeping what :func:`variant_lm_backward` needs:
    ``(logits, weights, saved)``; ``weights`` holds each block's attention weights
    ``(B, H, T, T)`` (the normalized similarities for linear attention, None for the delta
    rule).

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    ids = np.asarray(ids)
    if ids.ndim != 2 or not 1 <= ids.shape[1] <= model.context_len:
        raise ValueError(f"ids must be (B, T) with 1 <= T <= {model.context_len}; got shape "
                         f"{ids.shape}")
    T = ids.shape[1]
    x, embedding_saved = embedding_forward(model.embedding, ids)  # (B, T, d_model)
    x = x + model.positions[:T]
    weights, blocks_saved = [], []
    for block in model.blocks:
        normed, norm1_saved = layer_norm_forward(block.norm1, x)
        mixed, block_weights, mixer_saved = _mixer_forward(block, normed)
        x = x + mixed
        normed, norm2_saved = layer_norm_forward(block.norm2, x)
        transformed, ff_saved = feed_forward_forward(block.ff, normed)
        x = x + transformed
        weights.append(block_weights)
        blocks_saved.append((block.kind, norm1_saved, mixer_saved, norm2_saved, ff_saved))
    x, norm_saved = layer_norm_forward(model.norm, x)
    logits, out_saved = linear_forward(x, model.W_out)  # (B, T, V)
    saved = (embedding_saved, model.positions.shape, T, blocks_saved, norm_saved, out_saved)
    return logits, weights, saved


def variant_lm_backward(d_logits, saved) -> dict[str, np.ndarray]:
    """Every parameter's gradient, keyed as ``model.parameters()``.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    embedding_saved, positions_shape, T, blocks_saved, norm_saved, out_saved = saved
    grads = {}
    dx, grads["W_out"], _ = linear_backward(d_logits, out_saved)
    dx, norm_grads = layer_norm_backward(dx, norm_saved)
    grads |= {f"norm.{name}": grad for name, grad in norm_grads.items()}
    for index in reversed(range(len(blocks_saved))):
        kind, norm1_saved, mixer_saved, norm2_saved, ff_saved = blocks_saved[index]
        prefix = f"blocks.{index}."
        d_normed, ff_grads = feed_forward_backward(dx, ff_saved)
        d_in, norm2_grads = layer_norm_backward(d_normed, norm2_saved)
        dx = dx + d_in
        d_normed, mixer_grads = _MIXER_BACKWARD[kind](dx, mixer_saved)
        d_in, norm1_grads = layer_norm_backward(d_normed, norm1_saved)
        dx = dx + d_in
        for part, part_grads in (("ff", ff_grads), ("norm2", norm2_grads),
                                 ("mixer", mixer_grads), ("norm1", norm1_grads)):
            grads |= {f"{prefix}{part}.{name}": grad for name, grad in part_grads.items()
                      if grad is not None}
    d_positions = np.zeros(positions_shape, dtype=dx.dtype)
    d_positions[:T] = dx.sum(axis=0)
    grads["positions"] = d_positions
    grads["embedding"] = embedding_backward(dx, embedding_saved)
    return grads


def variant_lm_loss_and_grads(model: VariantLM, ids, targets):
    """Mean next-character cross-entropy (nats) and every parameter's gradient.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    logits, _, saved = variant_lm_forward(model, ids)
    loss, loss_saved = cross_entropy_forward(logits, targets)
    return loss, variant_lm_backward(cross_entropy_backward(1.0, loss_saved), saved)


# ---------------------------------------------------------------------------------------------
# What the comparison measures
# ---------------------------------------------------------------------------------------------

def cache_bytes(model: VariantLM, num_tokens: int, itemsize: int = 4) -> int:
    """Bytes a decoder keeps, over all layers, after ``num_tokens`` tokens (``itemsize``
    bytes per number: 4 for float32).

    Attention: keys and values of ``H_kv`` heads for every token (the last ``window``
    only, with a sliding window); MLA: the latent and the RoPE key per token; linear
    attention: its state ``d_head x d_head`` and normalizer ``d_head`` per head; the delta
    rule: its state ``d_head x d_head`` per head, whatever ``num_tokens``.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    total = 0
    for block in model.blocks:
        mixer, kind = block.mixer, block.kind
        d_head = model.embedding.shape[1] // mixer.num_heads
        if kind == "attention":
            kept = num_tokens if block.window is None else min(block.window, num_tokens)
            total += 2 * mixer.num_kv_heads * d_head * kept
        elif kind == "mla":
            total += (mixer.d_latent + mixer.d_rope) * num_tokens
        elif kind == "linear":
            total += mixer.num_heads * (d_head * d_head + d_head)
        else:
            total += mixer.num_heads * d_head * d_head
    return total * itemsize


def validation_loss(model: VariantLM, data, batch_size: int = 128) -> float:
    """Mean next-character loss, in nats, accumulated in float64.

    ``data`` 1-d: cut into consecutive windows of ``model.context_len`` (every character
    once; a last partial window dropped), as chapter 14's ``evaluate_loss``. ``data`` 2-d,
    ``(N, context_len + 1)``: N windows, each predicting its characters 2 .. T + 1.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    data = np.asarray(data)
    T = model.context_len
    if data.ndim == 2:
        if data.shape[1] != T + 1:
            raise ValueError(f"windows must be (N, context_len + 1) = (N, {T + 1}); got "
                             f"{data.shape}")
        inputs, targets = data[:, :-1], data[:, 1:]
    else:
        num_windows = (data.size - 1) // T
        inputs = data[:num_windows * T].reshape(num_windows, T)
        targets = data[1:num_windows * T + 1].reshape(num_windows, T)
    num_windows = len(inputs)
    total = 0.0
    for start in range(0, num_windows, batch_size):
        logits = model.forward(inputs[start:start + batch_size]).astype(np.float64)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=-1))
        picked = np.take_along_axis(shifted, targets[start:start + batch_size, :, None],
                                    axis=-1)[..., 0]
        total += float((log_norm - picked).sum())
    return total / (num_windows * T)


def first_token_weight(model: VariantLM, windows) -> dict:
    """How much attention goes to the first token of the window (an *attention sink*).

    For each block with weights (not the delta rule), the mean weight on key 0 over the
    windows, heads and every query that may see key 0 other than key 0 itself
    (queries ``1 .. T-1``; ``1 .. window-1`` with a sliding window), and the same mean
    for uniform attention over the visible keys (``1 / (number of visible keys)``), the
    value with no preference for the first token.

    Returns
    -------
    dict
        ``per_layer`` and ``uniform_per_layer`` (None for delta-rule layers), ``mean`` and
        ``uniform_mean`` over the layers that have weights (None if none has).

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. Qiu et al. 2025 (arXiv:2505.06708)
    measure the first token's share averaged over layers and heads, with and without the
    output gate, in models of 1.7B and 15B parameters trained on 3.5T tokens.
    """
    _, weights = model.forward(windows, return_weights=True)
    per_layer, uniform = [], []
    for block, block_weights in zip(model.blocks, weights):
        if block_weights is None:
            per_layer.append(None)
            uniform.append(None)
            continue
        T = block_weights.shape[-1]
        last = T if block.window is None else min(block.window, T)
        queries = np.arange(1, last)
        per_layer.append(float(block_weights[..., queries, 0].astype(np.float64).mean()))
        uniform.append(float(np.mean(1.0 / (queries + 1))))
    measured = [value for value in per_layer if value is not None]
    reference = [value for value in uniform if value is not None]
    return {"per_layer": per_layer, "uniform_per_layer": uniform,
            "mean": float(np.mean(measured)) if measured else None,
            "uniform_mean": float(np.mean(reference)) if reference else None}


def copy_probe(model: VariantLM, rng: np.random.Generator, num_sequences: int = 64) -> dict:
    """Copying as associative recall: loss on a random string and on its repetition.

    Each sequence is ``half = context_len // 2`` distinct random characters followed by the
    same characters again (chapter 14's ``repeated_random_sequences``). In the second copy
    every next character is recallable: it followed the current one in the first copy (the
    current character is the key, the next one the value). A model that recalls predicts
    the second copy much better than the first; one that does not, equally badly.

    Returns
    -------
    dict
        ``loss_first`` (predictions of characters 2 .. half of the first copy) and
        ``loss_second`` (of the second copy's characters 2 .. half), nats per character.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*; the same measure as chapter 14's
    ``induction_probe``.
    """
    half = min(model.context_len // 2, model.vocab_size)
    ids = repeated_random_sequences(rng, num_sequences, half, model.vocab_size)
    logits = model.forward(ids).astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    losses = -np.take_along_axis(log_probs[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
    return {"loss_first": float(losses[:, :half - 1].mean()),
            "loss_second": float(losses[:, half:].mean())}


def train_variant(variant: str, seed: int, train_data, *, vocab_size: int, steps: int,
                  batch_size: int, context_len: int, d_model: int, num_heads: int,
                  num_layers: int, lr: float, min_lr: float, warmup_steps: int,
                  weight_decay: float, beta2: float, clip_norm: float,
                  stop_after: int | None = None):
    """Train one variant from ``seed``: ``(model, step_losses, cpu_seconds)``.

    ``np.random.SeedSequence(seed)`` gives two streams: the initial weights and the
    training windows (:func:`~attention_lib.training.gpt.random_windows`). The windows do
    not depend on the variant, so every variant of a seed sees the same characters in the
    same order. AdamW with the warm-up and cosine schedule of chapter 14, gradient clipping,
    no dropout. ``stop_after`` runs only the first steps of the same schedule.
    ``cpu_seconds`` is the process's CPU time for the training steps (wall time depends on
    what else runs on the machine).

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.
    """
    init_seed, batch_seed = np.random.SeedSequence(seed).spawn(2)
    model = VariantLM.init(variant, vocab_size, context_len, d_model, num_heads, num_layers,
                           np.random.default_rng(init_seed))
    batch_rng = np.random.default_rng(batch_seed)
    params = model.parameters()
    optimizer = AdamW(params, lr=lr, betas=(0.9, beta2), weight_decay=weight_decay,
                      no_decay=model.no_decay_names())
    losses = []
    start = time.process_time()
    for step in range(steps if stop_after is None else min(stop_after, steps)):
        optimizer.lr = warmup_cosine_lr(step, max_lr=lr, min_lr=min_lr,
                                        warmup_steps=warmup_steps, decay_steps=steps)
        inputs, targets = random_windows(train_data, batch_size, context_len, batch_rng)
        loss, grads = variant_lm_loss_and_grads(model, inputs, targets)
        clip_grad_norm(grads, clip_norm)
        optimizer.step(grads)
        losses.append(loss)
    return model, losses, time.process_time() - start
