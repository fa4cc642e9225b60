"""The hand-written backward passes of chapter 19's attention variants
(attention_lib.training.variant_grads) and of the pluggable language model
(attention_lib.training.variant_lm): against PyTorch's autograd on independent PyTorch
re-implementations of each forward pass, and against finite differences, in float64.

Each case backpropagates loss = sum(output * R) with a fixed random R, so every output entry
matters. PyTorch stores linear maps as (d_out, d_in); here the PyTorch side simply computes
x @ W with the library's (d_in, d_out) matrices, so no transposes are needed. torch is a
test dependency that CI installs: this module fails, rather than skips, without it.
"""

import math

import numpy as np
import pytest
import torch

from attention_lib import MultiHeadAttention, causal_mask
from attention_lib.layers import RMSNorm
from attention_lib.masks import sliding_window_mask
from attention_lib.positional import apply_rope
from attention_lib.training.gradcheck import relative_error
from attention_lib.training.variant_grads import (
    attention_layer_backward,
    attention_layer_forward,
    delta_rule_backward,
    delta_rule_forward,
    gated_attention_output_backward,
    gated_attention_output_forward,
    grouped_attention_backward,
    grouped_attention_forward,
    l2_normalize_backward,
    l2_normalize_forward,
    linear_attention_backward,
    linear_attention_forward,
    mla_backward,
    mla_forward,
    rms_norm_backward,
    rms_norm_forward,
    rope_backward,
)
from attention_lib.training.variant_lm import (
    VARIANTS,
    VariantLM,
    cache_bytes,
    first_token_weight,
    variant_lm_loss_and_grads,
)
from attention_lib.variants import (
    MultiHeadLatentAttention,
    delta_rule,
    gated_attention_output,
    linear_attention,
)

F = torch.nn.functional
TOLERANCE = 1e-10


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def leaf(array):
    return torch.tensor(np.ascontiguousarray(array), dtype=torch.float64, requires_grad=True)


def assert_close(ours, theirs, tolerance=TOLERANCE):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance)


def backprop(output, R):
    (output * torch.from_numpy(R)).sum().backward()


# --------------------------------------------------------------------------- PyTorch references

def torch_rope(x, positions, base=10000.0):
    """Interleaved RoPE (pairs (2i, 2i+1)), as RoFormer and DeepSeek-V3's apply_rotary_emb."""
    d = x.shape[-1]
    frequencies = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.as_tensor(positions, dtype=torch.float64)[:, None] * frequencies
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def torch_rms_norm(x, gamma, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma


def torch_attention(q, k, v, mask, scale):
    scores = q @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(~torch.from_numpy(np.asarray(mask)), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def torch_linear_attention(q, k, v):
    """Causal elu+1 linear attention as running sums (Katharopoulos et al. 2020, eq. 9)."""
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    state = torch.cumsum(phi_k[..., :, :, None] * v[..., :, None, :], dim=-3)  # (.., T, dk, dv)
    normalizer = torch.cumsum(phi_k, dim=-2)  # (..., T, d_k)
    numerator = (phi_q[..., None, :] @ state)[..., 0, :]
    return numerator / (phi_q * normalizer).sum(-1, keepdim=True)


def torch_delta_rule(q, k, v, beta, decay):
    """The gated delta rule's recurrence as flash-linear-attention's naive reference writes
    it, with the state kept as (d_k, d_v) and no query scaling (fla's scale=1)."""
    S = torch.zeros(*q.shape[:-2], k.shape[-1], v.shape[-1], dtype=torch.float64)
    outputs = []
    for t in range(q.shape[-2]):
        S = S * decay[..., t, None, None]
        v_new = (v[..., t, :] - (S * k[..., t, :, None]).sum(-2)) * beta[..., t, None]
        S = S + k[..., t, :, None] * v_new[..., None, :]
        outputs.append((q[..., t, :, None] * S).sum(-2))
    return torch.stack(outputs, dim=-2)


# --------------------------------------------------------------------------- small pieces

def test_rms_norm_gradients_equal_torch_autograd():
    rng = np.random.default_rng(0)
    x, R = rng.normal(size=(2, 5, 6)), rng.normal(size=(2, 5, 6))
    norm = RMSNorm(rng.normal(size=6), eps=1e-6)
    y, saved = rms_norm_forward(norm, x)
    assert_close(y, norm(x))
    dx, grads = rms_norm_backward(R, saved)
    tx, tgamma = leaf(x), leaf(norm.gamma)
    backprop(torch_rms_norm(tx, tgamma, norm.eps), R)
    assert_close(dx, tx.grad)
    assert_close(grads["gamma"], tgamma.grad)


def test_rope_backward_is_the_transpose_of_rope():
    rng = np.random.default_rng(1)
    x, R = rng.normal(size=(3, 7, 8)), rng.normal(size=(3, 7, 8))
    positions = np.arange(7)
    tx = leaf(x)
    rotated = torch_rope(tx, positions)
    assert_close(apply_rope(x, positions), rotated)  # the PyTorch transcription is RoPE
    backprop(rotated, R)
    assert_close(rope_backward(R, positions), tx.grad)


def test_l2_normalize_gradients_equal_torch_autograd():
    rng = np.random.default_rng(2)
    x, R = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    y, saved = l2_normalize_forward(x)
    tx = leaf(x)
    expected = tx * torch.rsqrt((tx * tx).sum(-1, keepdim=True) + 1e-6)
    assert_close(y, expected)
    backprop(expected, R)
    assert_close(l2_normalize_backward(R, saved), tx.grad)


# --------------------------------------------------------------------------- grouped attention

MASKS = {"causal": causal_mask(6), "sliding window 3": sliding_window_mask(6, window=3)}


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_grouped_attention_gradients_equal_torch_autograd(num_kv_heads, mask_name):
    rng = np.random.default_rng(3)
    mask = MASKS[mask_name]
    q, R = rng.normal(size=(2, 4, 6, 5)), rng.normal(size=(2, 4, 6, 3))
    k, v = rng.normal(size=(2, num_kv_heads, 6, 5)), rng.normal(size=(2, num_kv_heads, 6, 3))
    output, weights, saved = grouped_attention_forward(q, k, v, mask)
    dq, dk, dv = grouped_attention_backward(R, saved)

    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    group = 4 // num_kv_heads  # each key/value head repeated for its query heads (repeat_kv)
    expected = torch_attention(tq, tk.repeat_interleave(group, dim=1),
                               tv.repeat_interleave(group, dim=1), mask, 1 / math.sqrt(5))
    assert_close(output, expected)
    assert weights.shape == (2, 4, 6, 6)
    backprop(expected, R)
    for ours, theirs in ((dq, tq), (dk, tk), (dv, tv)):
        assert_close(ours, theirs.grad)


@pytest.mark.parametrize("gate", ["elementwise", "headwise"])
def test_gate_gradients_equal_torch_autograd(gate):
    rng = np.random.default_rng(4)
    heads, x = rng.normal(size=(2, 4, 5, 3)), rng.normal(size=(2, 5, 12))
    width = 12 if gate == "elementwise" else 4
    W_g, b_g = rng.normal(size=(12, width)), rng.normal(size=width)
    R = rng.normal(size=heads.shape)
    output, saved = gated_attention_output_forward(heads, x, W_g, b_g)
    assert_close(output, gated_attention_output(heads, x, W_g, b_g))
    d_heads, dx, grads = gated_attention_output_backward(R, saved)

    t_heads, tx, tW, tb = leaf(heads), leaf(x), leaf(W_g), leaf(b_g)
    gate_values = torch.sigmoid(tx @ tW + tb)  # (2, 5, width)
    if gate == "elementwise":
        gate_values = gate_values.reshape(2, 5, 4, 3).transpose(1, 2)
    else:
        gate_values = gate_values.transpose(1, 2)[..., None]
    backprop(t_heads * gate_values, R)
    for ours, theirs in ((d_heads, t_heads), (dx, tx), (grads["W_g"], tW), (grads["b_g"], tb)):
        assert_close(ours, theirs.grad)


def torch_mha(params, x, H, H_kv, mask, gated):
    """Multi-head attention written out: project, split, repeat k/v heads, attend, gate,
    merge, project."""
    B, T, d = x.shape
    d_head = d // H

    def heads(y, n):
        return y.reshape(B, T, n, d_head).transpose(1, 2)

    q = heads(x @ params["W_q"] + params["b_q"], H)
    k = heads(x @ params["W_k"] + params["b_k"], H_kv).repeat_interleave(H // H_kv, dim=1)
    v = heads(x @ params["W_v"] + params["b_v"], H_kv).repeat_interleave(H // H_kv, dim=1)
    out = torch_attention(q, k, v, mask, 1 / math.sqrt(d_head))  # (B, H, T, d_head)
    if gated:
        out = out * heads(torch.sigmoid(x @ params["W_g"] + params["b_g"]), H)
    return out.transpose(1, 2).reshape(B, T, d) @ params["W_o"] + params["b_o"]


@pytest.mark.parametrize("num_kv_heads,gate,window", [(4, None, None), (2, None, None),
                                                      (1, None, None), (4, "elementwise", None),
                                                      (4, None, 3)],
                         ids=["MHA", "GQA", "MQA", "gated", "sliding window"])
def test_attention_layer_gradients_equal_torch_autograd(num_kv_heads, gate, window):
    rng = np.random.default_rng(5)
    mha = MultiHeadAttention.init(12, 4, rng, num_kv_heads=num_kv_heads, gate=gate)
    for name in ("b_q", "b_k", "b_v", "b_o", "b_g"):
        if getattr(mha, name) is not None:
            setattr(mha, name, rng.normal(size=getattr(mha, name).shape))
    x, R = rng.normal(size=(2, 6, 12)), rng.normal(size=(2, 6, 12))
    mask = causal_mask(6) if window is None else sliding_window_mask(6, window=window)
    output, weights, saved = attention_layer_forward(mha, x, mask)
    expected_output, expected_weights = mha(x, mask=mask)
    assert_close(output, expected_output)
    assert_close(weights, expected_weights)
    dx, grads = attention_layer_backward(R, saved)

    names = [name for name in ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o", "W_g",
                               "b_g") if getattr(mha, name) is not None]
    params = {name: leaf(getattr(mha, name)) for name in names}
    tx = leaf(x)
    backprop(torch_mha(params, tx, 4, num_kv_heads, mask, gate is not None), R)
    assert sorted(grads) == sorted(names)
    assert_close(dx, tx.grad)
    for name in names:
        assert_close(grads[name], params[name].grad)


# --------------------------------------------------------------------------- MLA

def small_mla(rng):
    """Widths all different, so a mix-up of two of them cannot go unnoticed."""
    mla = MultiHeadLatentAttention.init(24, 3, rng, d_latent=10, d_query_latent=12, d_head=6,
                                        d_rope=4, d_v=5)
    mla.q_norm.gamma = rng.normal(size=12)
    mla.kv_norm.gamma = rng.normal(size=10)
    return mla


def torch_mla(p, x, mla, mask):
    """MLA's naive path written out (DeepSeek-V2 section 2.1, eqs. 9-19)."""
    B, T, _ = x.shape
    H, dn, dr, dv = mla.num_heads, mla.d_head, mla.d_rope, mla.d_v
    positions = np.arange(T)

    def heads(y, width):
        return y.reshape(B, T, H, width).transpose(1, 2)

    c_q = torch_rms_norm(x @ p["W_dq"], p["q_norm.gamma"], mla.q_norm.eps)
    q = torch.cat([heads(c_q @ p["W_uq"], dn), torch_rope(heads(c_q @ p["W_qr"], dr),
                                                          positions)], dim=-1)
    c_kv = torch_rms_norm(x @ p["W_dkv"], p["kv_norm.gamma"], mla.kv_norm.eps)
    k_rope = torch_rope(x @ p["W_kr"], positions)[:, None].expand(B, H, T, dr)
    k = torch.cat([heads(c_kv @ p["W_uk"], dn), k_rope], dim=-1)
    out = torch_attention(q, k, heads(c_kv @ p["W_uv"], dv), mask, (dn + dr) ** -0.5)
    return out.transpose(1, 2).reshape(B, T, H * dv) @ p["W_o"]


def test_mla_forward_is_the_library_naive_path():
    rng = np.random.default_rng(6)
    mla, x = small_mla(rng), rng.normal(size=(2, 7, 24))
    output, weights, _ = mla_forward(mla, x, causal_mask(7))
    expected_output, expected_weights = mla(x, mask=causal_mask(7), absorb=False)
    assert_close(output, expected_output)
    assert_close(weights, expected_weights)


def test_mla_gradients_equal_torch_autograd():
    rng = np.random.default_rng(7)
    mla, x, R = small_mla(rng), rng.normal(size=(2, 7, 24)), rng.normal(size=(2, 7, 24))
    output, _, saved = mla_forward(mla, x, causal_mask(7))
    dx, grads = mla_backward(R, saved)
    names = ["W_dq", "W_uq", "W_qr", "W_dkv", "W_uk", "W_uv", "W_kr", "W_o"]
    params = {name: leaf(getattr(mla, name)) for name in names}
    params["q_norm.gamma"], params["kv_norm.gamma"] = leaf(mla.q_norm.gamma), leaf(
        mla.kv_norm.gamma)
    tx = leaf(x)
    expected = torch_mla(params, tx, mla, causal_mask(7))
    assert_close(output, expected)
    backprop(expected, R)
    assert sorted(grads) == sorted(params)
    assert_close(dx, tx.grad)
    for name, param in params.items():
        assert_close(grads[name], param.grad)


# --------------------------------------------------------------------------- linear attention

def test_linear_attention_gradients_equal_torch_autograd():
    rng = np.random.default_rng(8)
    q, k = rng.normal(size=(2, 3, 9, 4)), rng.normal(size=(2, 3, 9, 4))
    v, R = rng.normal(size=(2, 3, 9, 5)), rng.normal(size=(2, 3, 9, 5))
    output, weights, saved = linear_attention_forward(q, k, v)
    assert_close(output, linear_attention(q, k, v))
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-12)
    assert np.all(np.triu(weights, 1) == 0)  # causal: no weight on a later key
    dq, dk, dv = linear_attention_backward(R, saved)
    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    expected = torch_linear_attention(tq, tk, tv)
    assert_close(output, expected)
    backprop(expected, R)
    for ours, theirs in ((dq, tq), (dk, tk), (dv, tv)):
        assert_close(ours, theirs.grad)


# --------------------------------------------------------------------------- delta rule

@pytest.mark.parametrize("gated", [False, True], ids=["delta rule", "gated delta rule"])
def test_delta_rule_gradients_equal_torch_autograd(gated):
    rng = np.random.default_rng(9)
    q = rng.normal(size=(2, 3, 12, 4))
    k = rng.normal(size=(2, 3, 12, 4))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v, R = rng.normal(size=(2, 3, 12, 5)), rng.normal(size=(2, 3, 12, 5))
    beta = rng.uniform(0, 1, size=(2, 3, 12))
    decay = rng.uniform(0.7, 1.0, size=(2, 3, 12)) if gated else None
    output, saved = delta_rule_forward(q, k, v, beta, decay)
    assert_close(output, delta_rule(q, k, v, beta, decay=decay))
    dq, dk, dv, dbeta, ddecay = delta_rule_backward(R, saved)

    tq, tk, tv, tbeta = leaf(q), leaf(k), leaf(v), leaf(beta)
    tdecay = leaf(decay) if gated else torch.ones(2, 3, 12, dtype=torch.float64)
    expected = torch_delta_rule(tq, tk, tv, tbeta, tdecay)
    assert_close(output, expected)
    backprop(expected, R)
    for ours, theirs in ((dq, tq), (dk, tk), (dv, tv), (dbeta, tbeta)):
        assert_close(ours, theirs.grad)
    if gated:
        assert_close(ddecay, tdecay.grad)
    else:
        assert ddecay is None


# --------------------------------------------------------------------------- the whole model

def small_model(variant):
    """A 2-layer model (4 for the 3:1 hybrid) with weights large enough that every gradient
    is far from rounding noise."""
    model = VariantLM.init(variant, 11, 8, 16, 4, 4 if variant == "hybrid" else 2,
                           np.random.default_rng(1), dtype=np.float64)
    rng = np.random.default_rng(2)
    for param in model.parameters().values():
        if param.ndim == 2:
            param[...] = rng.normal(size=param.shape) * 0.4
    return model


def sampled_numerical_gradient(loss, param, indices, eps=1e-6):
    """Centred differences of loss() for the entries ``indices`` of the flat ``param``."""
    flat = param.reshape(-1)  # a view: writing it writes param
    result = np.empty(len(indices))
    for position, index in enumerate(indices):
        original = flat[index]
        flat[index] = original + eps
        plus = loss()
        flat[index] = original - eps
        minus = loss()
        flat[index] = original
        result[position] = (plus - minus) / (2 * eps)
    return result


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_model_gradients_equal_finite_differences(variant):
    model = small_model(variant)
    rng = np.random.default_rng(3)
    ids, targets = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    _, grads = variant_lm_loss_and_grads(model, ids, targets)
    params = model.parameters()
    assert sorted(grads) == sorted(params)
    assert all(grads[name].shape == param.shape for name, param in params.items())

    def loss():
        return variant_lm_loss_and_grads(model, ids, targets)[0]

    # Every parameter of the first block's mixer, and the read-out: the gradient of each
    # flows back through every later layer, so this checks every backward pass on the way.
    # 24 entries of each, drawn at random, keep the test fast.
    checked = [name for name in params if name.startswith("blocks.0.mixer.")] + ["W_out"]
    for name in checked:
        indices = rng.choice(params[name].size, size=min(24, params[name].size), replace=False)
        numerical = sampled_numerical_gradient(loss, params[name], indices)
        analytic = grads[name].reshape(-1)[indices]
        if name.endswith("b_k"):  # a key bias moves every score of a row alike: no gradient
            assert np.abs(analytic).max() < 1e-12 and np.abs(numerical).max() < 1e-7
            continue
        assert np.linalg.norm(numerical) > 1e-6, name  # a gradient that is there to check
        assert relative_error(analytic, numerical) < 1e-6, name


def test_model_forward_matches_the_library_layers():
    """The MHA variant's training forward equals the library's MultiHeadAttention, and a
    gated model's gate is the library's MultiHeadAttention gate."""
    model = small_model("gated")
    ids = np.random.default_rng(4).integers(0, 11, (2, 8))
    logits, weights = model.forward(ids, return_weights=True)
    x = model.embedding[ids] + model.positions[:8]
    block = model.blocks[0]
    attended, expected_weights = block.mixer(block.norm1(x), mask=causal_mask(8))
    np.testing.assert_allclose(weights[0], expected_weights, rtol=1e-12, atol=1e-12)
    x = x + attended
    x = x + block.ff(block.norm2(x))
    block = model.blocks[1]
    x = x + block.mixer(block.norm1(x), mask=causal_mask(8))[0]
    x = x + block.ff(block.norm2(x))
    np.testing.assert_allclose(logits, model.norm(x) @ model.W_out, rtol=1e-10, atol=1e-12)


def test_cache_bytes_counts_what_each_decoder_keeps():
    sizes = {variant: cache_bytes(VariantLM.init(variant, 11, 64, 64, 4, 4,
                                                 np.random.default_rng(0)), 64)
             for variant in VARIANTS}
    layers, float32 = 4, 4
    assert sizes["mha"] == layers * 2 * 64 * 64 * float32  # keys and values, 64 tokens
    assert sizes["gqa"] == sizes["mha"] // 2
    assert sizes["mqa"] == sizes["mha"] // 4
    assert sizes["mla"] == layers * (24 + 8) * 64 * float32  # latent + RoPE key
    assert sizes["sliding_window"] == sizes["mha"] // 4  # 16 of 64 tokens
    assert sizes["delta"] == layers * 4 * 16 * 16 * float32  # 4 heads' 16 x 16 states
    assert sizes["linear"] == layers * 4 * (16 * 16 + 16) * float32
    assert sizes["hybrid"] == 3 * sizes["delta"] // 4 + sizes["mha"] // 4


def test_first_token_weight_of_uniform_attention_is_the_uniform_reference():
    """With all-zero query weights every score is 0: attention is uniform over the visible
    keys, so the measured first-token weight equals the reference exactly."""
    for variant, window, expected in (("mha", None, np.mean(1 / np.arange(2, 9))),
                                      ("sliding_window", 3, np.mean([1 / 2, 1 / 3]))):
        model = VariantLM.init(variant, 11, 8, 16, 4, 2, np.random.default_rng(0),
                               dtype=np.float64)
        for block in model.blocks:
            block.mixer.W_q[...] = 0
            block.window = window  # 3: only queries 1 and 2 still see key 0
        ids = np.random.default_rng(1).integers(0, 11, (3, 8))
        result = first_token_weight(model, ids)
        np.testing.assert_allclose(result["per_layer"], result["uniform_per_layer"])
        assert result["mean"] == pytest.approx(expected)


def test_unknown_variant_is_rejected_by_name():
    with pytest.raises(ValueError, match="variant must be one of"):
        VariantLM.init("sparse", 11, 8, 16, 4, 2, np.random.default_rng(0))


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_ignore_future_tokens(variant):
    """Causal: changing the characters after position 4 leaves the logits up to 4 unchanged
    (a leak would make the comparison's losses meaningless)."""
    model = small_model(variant)
    ids = np.random.default_rng(5).integers(0, 11, (2, 8))
    changed = ids.copy()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    logits, changed_logits = model.forward(ids), model.forward(changed)
    np.testing.assert_allclose(logits[:, :5], changed_logits[:, :5], rtol=1e-12, atol=1e-12)
    assert not np.allclose(logits[:, 5:], changed_logits[:, 5:])
