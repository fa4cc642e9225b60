"""Parity with the reference code, transcribed in PyTorch: the attention variants of chapter 19.

Transcribed (float64 throughout; tensor parallelism, FP8/BF16 and YaRN left out):
DeepSeek-V3 ``inference/model.py`` class ``MLA`` (both ``attn_impl`` paths, commit 9b4e978);
DeepSeek-V3.2-Exp ``inference/model.py`` class ``Indexer`` (without the Hadamard rotation and
FP8) and the top-k masking of its ``MLA`` (commit 3b99a53); flash-linear-attention
``fla/ops/delta_rule/naive.py`` (``delta_rule_recurrence``, ``delta_rule_chunkwise``) and
``fla/ops/gated_delta_rule/naive.py`` (both functions; commit bc3b101). Written from the papers:
elu+1 linear attention as running sums (Katharopoulos et al. 2020) and a Qwen3-Next-style
sigmoid gate between attention and the output projection (Qiu et al. 2025). Conventions: the
library stores linear maps as (d_in, d_out), PyTorch as (d_out, d_in); fla keeps the delta-rule
state as (d_k, d_v), the library as (d_v, d_k), and scales queries by d_k ** -0.5 inside.
"""

import math

import numpy as np
import pytest
from variants_helpers import DTYPES, TOLERANCE, delta_inputs, small_mla

from attention_lib import MultiHeadAttention, causal_mask
from attention_lib.layers import LayerNorm
from attention_lib.variants import (
    LightningIndexer,
    delta_rule,
    linear_attention,
    topk_sparse_attention,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional


def t(array):
    """A torch tensor of the same values (float64 stays float64)."""
    return torch.from_numpy(np.ascontiguousarray(array))


# =============================================================================================
# Multi-head latent attention
# =============================================================================================

class ReferenceMLA:
    """DeepSeek-V3's MLA.forward (inference/model.py), transcribed: bf16/fp8, world size and
    YaRN (max_seq_len <= original_seq_len here) left out, float64 kept in the rotary step."""

    def __init__(self, mla, attn_impl, max_batch_size=4, max_seq_len=32):
        H, dn, dr, dv, dc = mla.num_heads, mla.d_head, mla.d_rope, mla.d_v, mla.d_latent
        dcq = mla.W_dq.shape[1]
        self.attn_impl, self.n_local_heads = attn_impl, H
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = dn, dr, dv
        self.kv_lora_rank, self.qk_head_dim = dc, dn + dr
        # nn.Linear stores (d_out, d_in); per head, wq_b gives [nope, rope], wkv_b [nope, v].
        wq_b = np.concatenate([mla.W_uq.reshape(dcq, H, dn), mla.W_qr.reshape(dcq, H, dr)], -1)
        wkv_b = np.concatenate([mla.W_uk.reshape(dc, H, dn), mla.W_uv.reshape(dc, H, dv)], -1)
        self.wq_a, self.wq_b = t(mla.W_dq.T), t(wq_b.reshape(dcq, -1).T)
        self.wkv_a = t(np.concatenate([mla.W_dkv, mla.W_kr], axis=1).T)
        self.wkv_b, self.wo = t(wkv_b.reshape(dc, -1).T), t(mla.W_o.T)
        self.q_norm, self.kv_norm = t(mla.q_norm.gamma), t(mla.kv_norm.gamma)
        self.softmax_scale = self.qk_head_dim ** -0.5
        freqs = 1.0 / (mla.rope_base ** (torch.arange(0, dr, 2, dtype=torch.float64) / dr))
        freqs = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), freqs)
        self.freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
        if attn_impl == "naive":
            self.k_cache = torch.zeros(max_batch_size, max_seq_len, H, dn + dr, dtype=torch.float64)
            self.v_cache = torch.zeros(max_batch_size, max_seq_len, H, dv, dtype=torch.float64)
        else:
            self.kv_cache = torch.zeros(max_batch_size, max_seq_len, dc, dtype=torch.float64)
            self.pe_cache = torch.zeros(max_batch_size, max_seq_len, dr, dtype=torch.float64)

    @staticmethod
    def apply_rotary_emb(x, freqs_cis):
        x = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
        return torch.view_as_real(x * freqs_cis).flatten(3)

    def forward(self, x, start_pos, mask):
        bsz, seqlen, _ = x.size()
        end_pos = start_pos + seqlen
        freqs_cis = self.freqs_cis[start_pos:end_pos]
        q = F.linear(F.rms_norm(F.linear(x, self.wq_a), (self.wq_a.shape[0],), self.q_norm,
                                1e-6), self.wq_b)
        q = q.view(bsz, seqlen, self.n_local_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = self.apply_rotary_emb(q_pe, freqs_cis)
        kv = F.linear(x, self.wkv_a)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = self.apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)
        kv_norm = lambda c: F.rms_norm(c, (self.kv_lora_rank,), self.kv_norm, 1e-6)  # noqa: E731
        if self.attn_impl == "naive":
            q = torch.cat([q_nope, q_pe], dim=-1)
            kv = F.linear(kv_norm(kv), self.wkv_b)
            kv = kv.view(bsz, seqlen, self.n_local_heads, self.qk_nope_head_dim + self.v_head_dim)
            k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_local_heads, -1)], dim=-1)
            self.k_cache[:bsz, start_pos:end_pos] = k
            self.v_cache[:bsz, start_pos:end_pos] = v
            scores = torch.einsum("bshd,bthd->bsht", q,
                                  self.k_cache[:bsz, :end_pos]) * self.softmax_scale
        else:
            wkv_b = self.wkv_b.view(self.n_local_heads, -1, self.kv_lora_rank)
            q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :self.qk_nope_head_dim])
            self.kv_cache[:bsz, start_pos:end_pos] = kv_norm(kv)
            self.pe_cache[:bsz, start_pos:end_pos] = k_pe.squeeze(2)
            scores = (torch.einsum("bshc,btc->bsht", q_nope, self.kv_cache[:bsz, :end_pos])
                      + torch.einsum("bshr,btr->bsht", q_pe, self.pe_cache[:bsz, :end_pos])
                      ) * self.softmax_scale
        if mask is not None:
            scores += mask.unsqueeze(1)
        scores = scores.softmax(dim=-1)
        if self.attn_impl == "naive":
            x = torch.einsum("bsht,bthd->bshd", scores, self.v_cache[:bsz, :end_pos])
        else:
            x = torch.einsum("bsht,btc->bshc", scores, self.kv_cache[:bsz, :end_pos])
            x = torch.einsum("bshc,hdc->bshd", x, wkv_b[:, -self.v_head_dim:])
        return F.linear(x.flatten(2), self.wo)


@pytest.mark.parametrize("attn_impl", ["naive", "absorb"])
def test_mla_prefill_and_decode_equal_deepseek_v3_reference(attn_impl):
    rng = np.random.default_rng(0)
    mla = small_mla(rng)
    x = rng.normal(size=(2, 8, 24))
    reference = ReferenceMLA(mla, attn_impl)
    cache = mla.new_cache(16, batch_shape=(2,))
    prefill = 5
    additive = torch.full((prefill, prefill), float("-inf"), dtype=torch.float64).triu_(1)
    expected = [reference.forward(t(x[:, :prefill]), 0, additive).numpy()]
    ours = [mla(x[:, :prefill], causal_mask(prefill), cache=cache,
                absorb=attn_impl == "absorb")[0]]
    for step in range(prefill, 8):
        expected.append(reference.forward(t(x[:, step:step + 1]), step, None).numpy())
        ours.append(mla(x[:, step:step + 1], cache=cache, absorb=attn_impl == "absorb")[0])
    np.testing.assert_allclose(np.concatenate(ours, 1), np.concatenate(expected, 1),
                               rtol=1e-10, atol=1e-10)


# =============================================================================================
# Linear attention
# =============================================================================================

def torch_linear_attention(q, k, v):
    """Causal elu+1 linear attention as running sums (Katharopoulos et al. 2020):
    S_i = cumsum_j phi(k_j) v_j^T, z_i = cumsum_j phi(k_j), o_i = phi(q_i)^T S_i /
    phi(q_i)^T z_i."""
    phi_q, phi_k = F.elu(t(q)) + 1, F.elu(t(k)) + 1
    state = torch.cumsum(phi_k[..., :, :, None] * t(v)[..., :, None, :], dim=-3)
    normalizer = torch.cumsum(phi_k, dim=-2)
    numerator = torch.einsum("...tf,...tfv->...tv", phi_q, state)
    return (numerator / (phi_q * normalizer).sum(-1, keepdim=True)).numpy()


@DTYPES
@pytest.mark.parametrize("chunk_size", [None, 1, 4, 7, 64])
def test_linear_attention_forms_equal_the_running_sum_reference(dtype, chunk_size):
    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(size=(2, 3, 30, 8)).astype(dtype) for _ in range(3))
    output = linear_attention(q, k, v, chunk_size=chunk_size)
    assert output.dtype == dtype
    expected = torch_linear_attention(q.astype(np.float64), k.astype(np.float64),
                                      v.astype(np.float64))
    np.testing.assert_allclose(output, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


# =============================================================================================
# Delta rule and gated delta rule
# =============================================================================================

def fla_delta_rule_recurrence(q, k, v, beta, initial_state=None):
    """fla/ops/delta_rule/naive.py, delta_rule_recurrence (state (d_k, d_v), q scaled)."""
    q, k, v, beta = map(t, (q, k, v, beta))
    b, h, length, d_k = q.shape
    o = torch.zeros_like(v)
    S = torch.zeros(b, h, d_k, v.shape[-1]).to(v)
    q = q * (d_k ** -0.5)
    beta = beta[..., None]
    if initial_state is not None:
        S += t(initial_state)
    for i in range(length):
        _k, _q, _v = k[:, :, i], q[:, :, i], v[:, :, i].clone()
        _v = _v - (S.clone() * _k[..., None]).sum(-2)
        _v = _v * beta[:, :, i]
        S = S.clone() + _k.unsqueeze(-1) * _v.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", _q, S)
    return o.numpy(), S.numpy()


def fla_delta_rule_chunkwise(q, k, v, beta, chunk_size):
    """fla/ops/delta_rule/naive.py, delta_rule_chunkwise (T a multiple of chunk_size)."""
    q, k, v, beta = map(t, (q, k, v, beta))
    b, h, length, d_k = q.shape
    q = q * (d_k ** -0.5)
    v = v * beta[..., None]
    k_beta = k * beta[..., None]
    split = lambda x: x.reshape(b, h, length // chunk_size, chunk_size, x.shape[-1])  # noqa
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=0)
    q, k, v, k_beta = map(split, [q, k, v, k_beta])
    attn = -(k_beta @ k.transpose(-1, -2)).masked_fill(mask, 0)
    for i in range(1, chunk_size):
        attn[..., i, :i] = attn[..., i, :i] + (attn[..., i, :, None].clone()
                                               * attn[..., :, :i].clone()).sum(-2)
    attn = attn + torch.eye(chunk_size, dtype=attn.dtype)
    u, w = attn @ v, attn @ k_beta
    S = k.new_zeros(b, h, d_k, v.shape[-1])
    o = torch.zeros_like(v)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=1)
    for i in range(0, length // chunk_size):
        q_i, k_i = q[:, :, i], k[:, :, i]
        attn = (q_i @ k_i.transpose(-1, -2)).masked_fill_(mask, 0)
        u_i = u[:, :, i] - w[:, :, i] @ S
        o[:, :, i] = q_i @ S + attn @ u_i
        S = S + k_i.transpose(-1, -2) @ u_i
    return o.reshape(b, h, length, -1).numpy(), S.numpy()


def fla_recurrent_gated_delta_rule(q, k, v, beta, g, initial_state=None):
    """fla/ops/gated_delta_rule/naive.py, naive_recurrent_gated_delta_rule; inputs
    [B, T, H, K] there, [B, H, T, K] here (transposed in and out)."""
    q, k, v, beta, g = (t(x).transpose(1, 2) for x in (q, k, v, beta, g))
    q, k, v, beta, g = (x.transpose(1, 2).contiguous() for x in (q, k, v, beta, g))
    B, H, T, K, V = *k.shape, v.shape[-1]
    o = torch.zeros(B, H, T, V).to(v)
    h = torch.zeros(B, H, K, V).to(v) if initial_state is None else t(initial_state)
    q = q * (1 / (q.shape[-1] ** 0.5))
    for i in range(T):
        b_q, b_k, b_v = q[:, :, i], k[:, :, i], v[:, :, i].clone()
        h = h.clone() * g[:, :, i].exp()[..., None, None]
        b_v = b_v - (h.clone() * b_k[..., None]).sum(-2)
        b_v = b_v * beta[:, :, i][..., None]
        h = h.clone() + b_k.unsqueeze(-1) * b_v.unsqueeze(-2)
        o[:, :, i] = torch.einsum("bhd,bhdm->bhm", b_q, h)
    return o.numpy(), h.numpy()


def fla_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size, initial_state=None):
    """fla/ops/gated_delta_rule/naive.py, naive_chunk_gated_delta_rule, [B, H, T, K] here."""
    q, k, v, beta, g = map(t, (q, k, v, beta, g))
    T = q.shape[-2]
    pad_len = (chunk_size - (T % chunk_size)) % chunk_size
    if pad_len > 0:
        q, k, v = (F.pad(x, (0, 0, 0, pad_len)) for x in (q, k, v))
        beta, g = F.pad(beta, (0, pad_len)), F.pad(g, (0, pad_len))
    b, h, length, d_k = q.shape
    q = q * (1 / (d_k ** 0.5))
    v = v * beta[..., None]
    k_beta = k * beta[..., None]
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=0)
    split = lambda x: x.reshape(b, h, length // chunk_size, chunk_size, x.shape[-1])  # noqa
    q, k, v, k_beta, decay = map(split, [q, k, v, k_beta, g.unsqueeze(-1)])
    decay = decay.squeeze(-1).cumsum(-1)
    decay_exp = decay.exp()[..., None]
    L_mask = ((decay.unsqueeze(-1) - decay.unsqueeze(-2)).tril().exp()).tril()
    attn = -((k_beta @ k.transpose(-1, -2)) * L_mask).masked_fill(mask, 0)
    for i in range(1, chunk_size):
        attn[..., i, :i] = attn[..., i, :i].clone() + (attn[..., i, :i, None].clone()
                                                       * attn[..., :i, :i].clone()).sum(-2)
    attn = attn + torch.eye(chunk_size, dtype=attn.dtype)
    v = attn @ v
    k_cumdecay = attn @ (k_beta * decay_exp)
    S = k.new_zeros(b, h, d_k, v.shape[-1]) if initial_state is None else t(initial_state)
    o = torch.zeros_like(v)
    mask = torch.triu(torch.ones(chunk_size, chunk_size, dtype=torch.bool), diagonal=1)
    for i in range(0, length // chunk_size):
        q_i, k_i, v_i = q[:, :, i], k[:, :, i], v[:, :, i]
        attn = (q_i @ k_i.transpose(-1, -2) * L_mask[:, :, i]).masked_fill_(mask, 0)
        v_new = v_i - k_cumdecay[:, :, i] @ S
        o[:, :, i] = (q_i * decay[:, :, i, :, None].exp()) @ S + attn @ v_new
        S = S * decay[:, :, i, -1, None, None].exp() + (
            k_i * (decay[:, :, i, -1, None] - decay[:, :, i]).exp()[..., None]
        ).transpose(-1, -2) @ v_new
    return o.reshape(b, h, length, -1)[:, :, :T].numpy(), S.numpy()


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
def test_delta_rule_recurrence_equals_fla_naive_recurrence(with_state):
    rng = np.random.default_rng(12)
    q, k, v, beta, _, state = delta_inputs(rng)
    # fla scales q by d_k ** -0.5 inside and keeps the state as (d_k, d_v): S^T here.
    expected, expected_state = fla_delta_rule_recurrence(q, k, v, beta,
                                                         state.swapaxes(-1, -2) if with_state
                                                         else None)
    output, final = delta_rule(q / math.sqrt(8), k, v, beta, return_state=True,
                               initial_state=state if with_state else None)
    np.testing.assert_allclose(output, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(final, expected_state.swapaxes(-1, -2), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("chunk_size", [4, 8, 40])
def test_delta_rule_chunked_equals_fla_naive_chunkwise(chunk_size):
    rng = np.random.default_rng(13)
    q, k, v, beta, _, _ = delta_inputs(rng)
    expected, expected_state = fla_delta_rule_chunkwise(q, k, v, beta, chunk_size)
    output, final = delta_rule(q / math.sqrt(8), k, v, beta, chunk_size=chunk_size,
                               return_state=True)
    np.testing.assert_allclose(output, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(final, expected_state.swapaxes(-1, -2), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("chunk_size", [None, 6, 16])
def test_gated_delta_rule_equals_fla_naive_gated_references(with_state, chunk_size):
    rng = np.random.default_rng(14)
    q, k, v, beta, decay, state = delta_inputs(rng)
    initial = state.swapaxes(-1, -2).copy() if with_state else None
    if chunk_size is None:
        expected, expected_state = fla_recurrent_gated_delta_rule(q, k, v, beta, np.log(decay),
                                                                  initial)
    else:
        expected, expected_state = fla_chunk_gated_delta_rule(q, k, v, np.log(decay), beta,
                                                              chunk_size, initial)
    output, final = delta_rule(q / math.sqrt(8), k, v, beta, decay=decay, chunk_size=chunk_size,
                               initial_state=state if with_state else None, return_state=True)
    np.testing.assert_allclose(output, expected, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(final, expected_state.swapaxes(-1, -2), rtol=1e-10, atol=1e-10)


# =============================================================================================
# Gated attention
# =============================================================================================

def torch_gated_attention(layer, x, mask):
    """Qwen3-Next-style: attention per head, times sigmoid(x W_g + b_g) per head and channel
    (per head only for a head-wise gate), then the output projection. Grouped heads by
    repeating each key/value head for its group of query heads (Qwen3-Next's
    ``repeat_kv``); no RoPE here."""
    H, H_kv = layer.num_heads, layer.num_kv_heads
    x = t(x)
    B, T, D = x.shape

    def heads(y, n):
        return y.view(B, T, n, D // H).transpose(1, 2)  # (B, n, T, d_head)

    q = heads(F.linear(x, t(layer.W_q.T), t(layer.b_q)), H)
    k, v = (heads(F.linear(x, t(W.T), t(b)), H_kv).repeat_interleave(H // H_kv, dim=1)
            for W, b in ((layer.W_k, layer.b_k), (layer.W_v, layer.b_v)))
    attention = F.scaled_dot_product_attention(q, k, v, attn_mask=t(mask))  # (B, H, T, d)
    gate = torch.sigmoid(F.linear(x, t(layer.W_g.T), t(layer.b_g)))  # (B, T, D) or (B, T, H)
    attention = attention.transpose(1, 2)  # (B, T, H, d_head)
    attention = attention * (gate.view(B, T, H, D // H) if gate.shape[-1] == D
                             else gate[..., None])
    return F.linear(attention.reshape(B, T, D), t(layer.W_o.T), t(layer.b_o)).numpy()


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_gated_attention_equals_the_torch_sigmoid_gate_before_the_output_projection(
        gate, num_kv_heads):
    rng = np.random.default_rng(22)
    layer = MultiHeadAttention.init(16, 4, rng, num_kv_heads=num_kv_heads, gate=gate)
    layer.b_g = rng.normal(size=layer.b_g.shape)
    layer.b_q = rng.normal(size=16)
    x = rng.normal(size=(2, 6, 16))
    output, _ = layer(x, mask=causal_mask(6))
    np.testing.assert_allclose(output, torch_gated_attention(layer, x, causal_mask(6)),
                               rtol=1e-10, atol=1e-10)


# =============================================================================================
# Top-k sparse attention
# =============================================================================================

def torch_indexer_scores(indexer, x):
    """DeepSeek-V3.2-Exp's Indexer.forward, transcribed without the Hadamard rotation and FP8
    (index queries from x itself); the index score as fp8_index computes it:
    sum over heads of relu(q . k) times the head weight."""
    x = t(x)
    bsz, seqlen, _ = x.size()
    H, head_dim, rope_dim = indexer.num_heads, indexer.W_k.shape[1], indexer.d_rope
    freqs = 1.0 / (10000.0 ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
    freqs = torch.outer(torch.arange(seqlen, dtype=torch.float64), freqs)
    freqs_cis = torch.polar(torch.ones_like(freqs), freqs)
    rotary = ReferenceMLA.apply_rotary_emb
    q = F.linear(x, t(indexer.W_q.T)).view(bsz, seqlen, H, head_dim)
    q_pe, q_nope = torch.split(q, [rope_dim, head_dim - rope_dim], dim=-1)
    q = torch.cat([rotary(q_pe, freqs_cis), q_nope], dim=-1)
    k = F.layer_norm(F.linear(x, t(indexer.W_k.T)), (head_dim,), t(indexer.k_norm.gamma),
                     t(indexer.k_norm.beta), 1e-6)
    k_pe, k_nope = torch.split(k, [rope_dim, head_dim - rope_dim], dim=-1)
    k = torch.cat([rotary(k_pe.unsqueeze(2), freqs_cis).squeeze(2), k_nope], dim=-1)
    weights = F.linear(x, t(indexer.W_w.T)) * H ** -0.5 * head_dim ** -0.5  # (b, s, h)
    logits = torch.einsum("bshd,btd->bsht", q, k).relu()
    return (logits * weights[..., None]).sum(2).numpy()


def torch_topk_attention(q, k, v, index_scores, top_k, mask):
    """DeepSeek-V3.2-Exp's MLA prefill: a -inf mask scattered open at the top-k indices, the
    causal mask added, then softmax attention (q, k, v per head here)."""
    additive = torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~t(mask), float("-inf"))
    index_score = t(index_scores) + additive
    topk = index_score.topk(min(top_k, index_score.shape[-1]), dim=-1)[1]
    index_mask = torch.full(index_score.shape, float("-inf"), dtype=torch.float64)
    index_mask = index_mask.scatter_(-1, topk, 0) + additive
    scores = t(q) @ t(k).transpose(-1, -2) / math.sqrt(q.shape[-1]) + index_mask.unsqueeze(1)
    return (scores.softmax(-1) @ t(v)).numpy()


def test_lightning_indexer_equals_deepseek_v32_reference_without_fp8():
    rng = np.random.default_rng(28)
    indexer = LightningIndexer.init(16, 4, 8, rng, d_rope=4)
    indexer.k_norm = LayerNorm(rng.normal(size=8), rng.normal(size=8), eps=1e-6)
    x = rng.normal(size=(2, 9, 16))
    np.testing.assert_allclose(indexer(x), torch_indexer_scores(indexer, x), rtol=1e-10,
                               atol=1e-10)


def test_topk_sparse_attention_equals_deepseek_v32_masking():
    rng = np.random.default_rng(29)
    x = rng.normal(size=(2, 12, 16))
    index_scores = LightningIndexer.init(16, 4, 8, rng, d_rope=4)(x)  # (2, 12, 12)
    q = rng.normal(size=(2, 3, 12, 8))  # 3 heads
    k, v = rng.normal(size=(2, 2, 1, 12, 8))  # one key/value head shared by all (as MLA)
    mask = causal_mask(12)
    output, _, _ = topk_sparse_attention(q, k, v, index_scores[:, None], 4, mask)
    expected = torch_topk_attention(q, k, v, index_scores, 4, mask)
    np.testing.assert_allclose(output, expected, rtol=1e-10, atol=1e-10)
