"""Attention variants of chapter 19 (attention_lib/variants.py): every form equal to the others
(naive and absorbed MLA, cached and uncached; quadratic, recurrent and chunked linear attention;
recurrent and chunked delta rule; sparse and dense-masked top-k attention; MultiHeadAttention
with the output gate, cached and uncached), bad input, dtypes and long sequences. The PyTorch
references are in tests/test_parity_torch_variants.py.
"""

import dataclasses

import numpy as np
import pytest
from variants_helpers import DTYPES, TOLERANCE, delta_inputs, small_mla, unit_rows

from attention_lib import (
    DecoderOnlyLM,
    MultiHeadAttention,
    apply_rope,
    causal_mask,
    scaled_dot_product_attention,
)
from attention_lib.cache import KVCache
from attention_lib.layers import RMSNorm
from attention_lib.variants import (
    LatentCache,
    LightningIndexer,
    MultiHeadLatentAttention,
    delta_rule,
    gated_attention_output,
    linear_attention,
    sparse_attention_cost,
    topk_indices,
    topk_mask,
    topk_sparse_attention,
)

# =============================================================================================
# Multi-head latent attention
# =============================================================================================

@DTYPES
def test_mla_naive_and_absorbed_paths_agree_to_rounding(dtype):
    rng = np.random.default_rng(1)
    mla = small_mla(rng, dtype)
    x = rng.normal(size=(2, 9, 24)).astype(dtype)
    naive, naive_weights = mla(x, causal_mask(9), absorb=False)
    absorbed, absorbed_weights = mla(x, causal_mask(9), absorb=True)
    assert naive.dtype == absorbed.dtype == dtype
    np.testing.assert_allclose(absorbed, naive, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    np.testing.assert_allclose(absorbed_weights, naive_weights, atol=TOLERANCE[dtype])


@pytest.mark.parametrize("absorb", [False, True])
def test_mla_decoding_from_the_latent_cache_equals_the_uncached_pass(absorb):
    rng = np.random.default_rng(2)
    mla = small_mla(rng)
    x = rng.normal(size=(3, 10, 24))
    full, _ = mla(x, causal_mask(10), absorb=absorb)
    cache = mla.new_cache(10, batch_shape=(3,))
    steps = [mla(x[:, :4], causal_mask(4), cache=cache, absorb=absorb)[0]]
    steps += [mla(x[:, i:i + 1], cache=cache, absorb=absorb)[0] for i in range(4, 10)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-12, atol=1e-12)


def test_mla_cache_holds_only_the_normalized_latent_and_the_rotated_rope_key():
    rng = np.random.default_rng(3)
    mla = small_mla(rng)
    x = rng.normal(size=(2, 6, 24))
    cache = mla.new_cache(8, batch_shape=(2,))
    mla(x, causal_mask(6), cache=cache)
    assert cache.entries.shape == (2, 8, mla.d_latent + mla.d_rope)
    assert cache.nbytes == 2 * 8 * mla.cache_bytes_per_token() == 2 * 8 * (10 + 4) * 8
    np.testing.assert_allclose(cache.latent, mla.kv_norm(x @ mla.W_dkv), atol=1e-12)
    np.testing.assert_allclose(cache.rope_key, apply_rope(x @ mla.W_kr, np.arange(6)),
                               atol=1e-12)


def test_mla_absorbed_path_never_up_projects_the_latents(monkeypatch):
    """The naive path maps every cached latent (width d_latent = 10) to per-head keys and
    values; the absorbed path never projects a latent: its largest per-token array in the
    attention is the query side, (H, d_latent + d_rope)."""
    import attention_lib.variants as variants

    rng = np.random.default_rng(33)
    mla = small_mla(rng)
    widths = []
    original = variants.project

    def recording_project(x, W, b=None):
        widths.append(x.shape[-1])
        return original(x, W, b)

    monkeypatch.setattr(variants, "project", recording_project)
    cache = mla.new_cache(8)
    mla(rng.normal(size=(5, 24)), causal_mask(5), cache=cache, absorb=True)
    mla(rng.normal(size=(1, 24)), cache=cache, absorb=True)
    assert mla.d_latent not in widths and widths  # inputs: x, query latent, heads for W_o
    mla(rng.normal(size=(1, 24)), cache=cache, absorb=False)
    assert mla.d_latent in widths


def test_mla_rope_makes_scores_depend_on_relative_position_only():
    """A token repeated at positions (0, 1) and (5, 6) gets the same output pattern: the
    decoupled RoPE key carries relative, not absolute, position."""
    rng = np.random.default_rng(4)
    mla = small_mla(rng)
    tokens = rng.normal(size=(2, 24))
    cache = mla.new_cache(8)
    filler = rng.normal(size=(5, 24))
    early, _ = mla(tokens, causal_mask(2))
    mla(filler, None, cache=cache)  # positions 0-4, then the two tokens at 5 and 6
    late, late_weights = mla(tokens, np.tril(np.ones((2, 7), bool), k=5) & (np.arange(7) >= 5),
                             cache=cache)
    np.testing.assert_allclose(late, early, atol=1e-12)
    assert late_weights[..., :5].max() == 0


def test_mla_fully_masked_query_gets_zero_attention_output():
    rng = np.random.default_rng(5)
    mla = small_mla(rng)
    mask = causal_mask(4).copy()
    mask[2] = False
    for absorb in (False, True):
        output, weights = mla(rng.normal(size=(4, 24)), mask, absorb=absorb)
        assert np.isfinite(output).all()
        np.testing.assert_array_equal(output[2], 0.0)  # no biases: zero heads, zero output
        np.testing.assert_array_equal(weights[:, 2], 0.0)


def test_mla_rejects_bad_input():
    rng = np.random.default_rng(6)
    mla = small_mla(rng)
    with pytest.raises(ValueError, match="x has 23 features but the layer has d_model=24"):
        mla(np.zeros((3, 23)))
    with pytest.raises(ValueError, match="NaN"):
        mla(np.full((3, 24), np.nan))
    with pytest.raises(ValueError, match="mask of shape"):
        mla(np.zeros((3, 24)), causal_mask(4))
    cache = mla.new_cache(4, batch_shape=(2,))
    with pytest.raises(ValueError, match="batch shape"):
        mla(np.zeros((3, 3, 24)), cache=cache)
    mla(np.zeros((2, 3, 24)), cache=cache)
    with pytest.raises(ValueError, match="LatentCache is full: capacity 4, holds 3"):
        mla(np.zeros((2, 2, 24)), cache=cache)
    with pytest.raises(ValueError, match=r"W_uk must have shape \(10, 18\)"):
        MultiHeadLatentAttention(**{**vars(mla), "W_uk": np.zeros((10, 17))})
    with pytest.raises(ValueError, match="kv_norm must normalize 10 features"):
        MultiHeadLatentAttention(**{**vars(mla), "kv_norm": RMSNorm.init(9)})
    with pytest.raises(ValueError, match="d_rope must be even"):
        MultiHeadLatentAttention.init(8, 2, rng, d_latent=4, d_query_latent=4, d_head=2,
                                      d_rope=3)
    with pytest.raises(ValueError, match="do not fit the cache"):
        LatentCache.init(4, 3, 2).append(np.zeros((1, 6)))


# =============================================================================================
# Linear attention
# =============================================================================================

@DTYPES
@pytest.mark.parametrize("chunk_size", [1, 4, 7, 64])
def test_linear_attention_recurrent_and_chunked_forms_equal_the_quadratic_form(dtype,
                                                                              chunk_size):
    rng = np.random.default_rng(34)
    q, k, v = (rng.normal(size=(2, 3, 30, 8)).astype(dtype) for _ in range(3))
    quadratic = linear_attention(q, k, v)
    output = linear_attention(q, k, v, chunk_size=chunk_size)
    assert quadratic.dtype == output.dtype == dtype
    np.testing.assert_allclose(output, quadratic, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def test_linear_attention_causal_output_ignores_future_tokens():
    rng = np.random.default_rng(8)
    q, k, v = rng.normal(size=(3, 12, 4))
    changed = v.copy()
    changed[8:] += 10
    for chunk_size in (None, 1, 5):
        before = linear_attention(q, k, v, chunk_size=chunk_size)
        after = linear_attention(q, k, changed, chunk_size=chunk_size)
        np.testing.assert_allclose(after[:8], before[:8], atol=1e-12)
        assert not np.allclose(after[8:], before[8:])


def test_linear_attention_without_mask_is_the_right_product_whatever_the_chunks():
    rng = np.random.default_rng(9)
    q = rng.normal(size=(5, 4))
    k, v = rng.normal(size=(2, 9, 4))
    quadratic = linear_attention(q, k, v, causal=False)
    phi = lambda x: np.where(x > 0, x + 1, np.exp(x))  # noqa: E731
    weights = phi(q) @ phi(k).T
    np.testing.assert_allclose(quadratic, weights @ v / weights.sum(-1, keepdims=True))
    for chunk_size in (1, 4):
        np.testing.assert_allclose(linear_attention(q, k, v, causal=False,
                                                    chunk_size=chunk_size), quadratic)


def test_linear_attention_takes_a_feature_map_callable():
    rng = np.random.default_rng(10)
    q, k, v = rng.normal(size=(3, 10, 4))
    squared = lambda x: x * x  # noqa: E731  (non-negative, as required)
    quadratic = linear_attention(q, k, v, feature_map=squared)
    np.testing.assert_allclose(linear_attention(q, k, v, feature_map=squared, chunk_size=3),
                               quadratic)
    weights = np.tril((q * q) @ (k * k).T)
    np.testing.assert_allclose(quadratic, weights @ v / weights.sum(-1, keepdims=True))


@pytest.mark.parametrize("chunk_size", [None, 1, 64])
def test_linear_attention_has_no_nan_at_4096_tokens_and_outputs_stay_averages(chunk_size):
    rng = np.random.default_rng(11)
    q, k, v = (rng.normal(size=(2, 4096, 16)).astype(np.float32) for _ in range(3))
    q *= 30  # extreme scores: phi underflows to 0 for many features
    output = linear_attention(q, k, v, chunk_size=chunk_size)
    assert output.dtype == np.float32 and np.isfinite(output).all()
    # each output is an average of the values it sees: within their range, channel by channel
    assert (output <= np.maximum.accumulate(v, axis=-2) + 1e-4).all()
    assert (output >= np.minimum.accumulate(v, axis=-2) - 1e-4).all()


def test_linear_attention_query_with_all_features_zero_gets_zero_not_nan():
    q = np.full((2, 3), -1000.0)  # exp(-1000) underflows: phi(q) == 0
    k, v = np.ones((2, 3)), np.ones((2, 3))
    for chunk_size in (None, 1, 2):
        np.testing.assert_array_equal(linear_attention(q, k, v, chunk_size=chunk_size), 0.0)


def test_linear_attention_rejects_bad_input():
    x = np.zeros((5, 4))
    with pytest.raises(ValueError, match="q has d_k=4 but k has d_k=3"):
        linear_attention(x, np.zeros((5, 3)), x)
    with pytest.raises(ValueError, match="same number of tokens"):
        linear_attention(x, np.zeros((6, 4)), np.zeros((6, 4)))
    with pytest.raises(ValueError, match="chunk_size must be >= 1; got 0"):
        linear_attention(x, x, x, chunk_size=0)
    with pytest.raises(TypeError, match="chunk_size must be an integer"):
        linear_attention(x, x, x, chunk_size=2.5)
    with pytest.raises(ValueError, match='feature_map must be "elu\\+1"'):
        linear_attention(x, x, x, feature_map="relu")
    with pytest.raises(ValueError, match="features >= 0"):
        linear_attention(x + 1, x, x, feature_map=lambda z: -z)
    with pytest.raises(ValueError, match="k contains NaN"):
        linear_attention(x, x + np.nan, x)
    with pytest.raises(ValueError, match="do not broadcast"):
        linear_attention(np.zeros((2, 5, 4)), np.zeros((3, 5, 4)), x)


# =============================================================================================
# Delta rule and gated delta rule
# =============================================================================================

@DTYPES
@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated_delta"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
def test_delta_rule_recurrent_and_chunked_forms_agree(dtype, gated, with_state, chunk_size):
    rng = np.random.default_rng(15)
    q, k, v, beta, decay, state = delta_inputs(rng, dtype=dtype)
    options = dict(decay=decay if gated else None, initial_state=state if with_state else None,
                   return_state=True)
    recurrent, recurrent_state = delta_rule(q, k, v, beta, **options)
    chunked, chunked_state = delta_rule(q, k, v, beta, chunk_size=chunk_size, **options)
    assert recurrent.dtype == chunked.dtype == chunked_state.dtype == dtype
    np.testing.assert_allclose(chunked, recurrent, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])
    np.testing.assert_allclose(chunked_state, recurrent_state, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])


def test_delta_rule_continues_exactly_from_a_returned_state():
    rng = np.random.default_rng(16)
    q, k, v, beta, decay, _ = delta_inputs(rng)
    whole = delta_rule(q, k, v, beta, decay=decay)
    first, state = delta_rule(q[..., :25, :], k[..., :25, :], v[..., :25, :], beta[..., :25],
                              decay=decay[..., :25], return_state=True)
    rest = delta_rule(q[..., 25:, :], k[..., 25:, :], v[..., 25:, :], beta[..., 25:],
                      decay=decay[..., 25:], initial_state=state, chunk_size=8)
    np.testing.assert_allclose(np.concatenate([first, rest], axis=-2), whole, atol=1e-12)


def test_delta_rule_with_beta_one_stores_the_value_under_its_key():
    """b = 1 and |k| = 1: after the update, reading the memory with k returns exactly v."""
    rng = np.random.default_rng(17)
    _, k, v, _, _, state = delta_inputs(rng, shape=(1, 1, 1))
    _, final = delta_rule(k, k, v, np.ones((1, 1, 1)), initial_state=state, return_state=True)
    np.testing.assert_allclose(final[0, 0] @ k[0, 0, 0], v[0, 0, 0], atol=1e-12)


def test_delta_rule_with_beta_zero_only_decays_the_initial_state():
    rng = np.random.default_rng(18)
    q, k, v, _, decay, state = delta_inputs(rng)
    for chunk_size in (None, 7):
        output, final = delta_rule(q, k, v, np.zeros(q.shape[:-1]), decay=decay,
                                   initial_state=state, chunk_size=chunk_size,
                                   return_state=True)
        np.testing.assert_allclose(final, state * decay.prod(-1)[..., None, None], atol=1e-12)
        np.testing.assert_allclose(output[..., 0, :], (decay[..., 0, None, None] * state
                                                       @ q[..., 0, :, None])[..., 0], atol=1e-12)


@pytest.mark.parametrize("chunk_size", [None, 64])
def test_delta_rule_state_stays_bounded_at_4096_tokens(chunk_size):
    """Unit keys, b in [0, 1]: |S_t| <= a_t |S_t-1| + b_t |v_t| (spectral norm). With decay
    <= 0.95 the state stays below max|v| / (1 - 0.95); without, below sum of b_t |v_t|."""
    rng = np.random.default_rng(19)
    q, k, v, beta, _, _ = delta_inputs(rng, shape=(2, 4096), d_k=16, d_v=16, dtype=np.float32)
    decay = rng.uniform(0.5, 0.95, size=(2, 4096)).astype(np.float32)
    value_norms = np.linalg.norm(v.astype(np.float64), axis=-1)
    for gate, bound in ((decay, value_norms.max() / (1 - 0.95)),
                        (None, (beta * value_norms).sum(-1).min())):
        output, state = delta_rule(q, k, v, beta, decay=gate, chunk_size=chunk_size,
                                   return_state=True)
        assert output.dtype == np.float32
        assert np.isfinite(output).all() and np.isfinite(state).all()
        assert np.linalg.norm(state.astype(np.float64), ord=2, axis=(-2, -1)).max() <= bound


def test_delta_rule_with_unnormalized_keys_overflows_with_a_clear_error():
    rng = np.random.default_rng(20)
    q, k, v = rng.normal(size=(3, 800, 4))
    k = 3 * unit_rows(k)  # b |k|^2 = 9 > 2: the update amplifies the state about 8-fold
    for chunk_size in (None, 16):
        with pytest.raises(ValueError, match="overflowed float64.*L2-normalize the keys"):
            delta_rule(q, k, v, np.ones(800), chunk_size=chunk_size)


def test_delta_rule_rejects_bad_input():
    rng = np.random.default_rng(21)
    q, k, v, beta, decay, state = delta_inputs(rng, shape=(2, 5))
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]; got values from -0.1"):
        delta_rule(q, k, v, beta - 0.1 - beta.min())
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        delta_rule(q, k, v, beta + 1)
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\]"):
        delta_rule(q, k, v, beta, decay=decay * 0)
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\]"):
        delta_rule(q, k, v, beta, decay=decay + 0.5)
    with pytest.raises(ValueError, match=r"beta of shape \(2, 4\) does not broadcast to "
                                         r"\(\.\.\., T\) = \(2, 5\)"):
        delta_rule(q, k, v, beta[:, :4])
    with pytest.raises(ValueError, match="same number of tokens"):
        delta_rule(q, k[:, :4], v, beta)
    with pytest.raises(ValueError, match="q has d_k=8 but k has d_k=7"):
        delta_rule(q, k[..., :7], v, beta)
    with pytest.raises(ValueError, match="chunk_size must be >= 1; got -2"):
        delta_rule(q, k, v, beta, chunk_size=-2)
    with pytest.raises(ValueError, match=r"initial_state of shape \(2, 8, 6\) does not "
                                         r"broadcast to \(\.\.\., d_v, d_k\) = \(2, 6, 8\)"):
        delta_rule(q, k, v, beta, initial_state=state.swapaxes(-1, -2))
    with pytest.raises(ValueError, match="beta must lie"):
        delta_rule(q, k, v, np.full(5, np.nan))
    with pytest.raises(ValueError, match=r"decay must lie in \(0, 1\]; got values from 0"):
        delta_rule(*(x.astype(np.float32) for x in (q, k, v)), beta,
                   decay=np.full(5, 1e-50))  # 1e-50 is 0 in float32


def test_delta_rule_broadcasts_one_beta_and_decay_per_token_over_heads():
    rng = np.random.default_rng(32)
    q, k, v, beta, decay, _ = delta_inputs(rng, shape=(2, 3, 12))
    shared_beta, shared_decay = beta[0, 0], decay[0, 0]  # (T,)
    full = delta_rule(q, k, v, np.broadcast_to(shared_beta, beta.shape),
                      decay=np.broadcast_to(shared_decay, decay.shape), chunk_size=5)
    np.testing.assert_array_equal(delta_rule(q, k, v, shared_beta, decay=shared_decay,
                                             chunk_size=5), full)


# =============================================================================================
# Gated attention
# =============================================================================================

GATES = pytest.mark.parametrize("gate", ["elementwise", "headwise"])


def gated_layer(rng, gate, num_kv_heads=2, dtype=np.float64):
    """A gated MultiHeadAttention with RoPE, grouped heads and non-zero gate bias."""
    layer = MultiHeadAttention.init(16, 4, rng, dtype, num_kv_heads=num_kv_heads, gate=gate)
    layer.rope_base = 10000.0
    layer.b_g = rng.normal(size=layer.b_g.shape).astype(dtype)
    return layer


def without_gate(layer):
    return dataclasses.replace(layer, W_g=None, b_g=None)


@GATES
def test_gated_attention_with_an_open_gate_is_the_plain_layer(gate):
    rng = np.random.default_rng(23)
    layer = gated_layer(rng, gate)
    layer.b_g = np.full(layer.W_g.shape[1], 50.0)  # sigmoid(50) rounds to 1 in float64
    x = rng.normal(size=(2, 6, 16))
    np.testing.assert_allclose(layer(x, mask=causal_mask(6))[0],
                               without_gate(layer)(x, mask=causal_mask(6))[0], atol=1e-12)


@GATES
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_gated_attention_with_a_cache_equals_the_uncached_pass(gate, num_kv_heads):
    rng = np.random.default_rng(24)
    layer = gated_layer(rng, gate, num_kv_heads)
    x = rng.normal(size=(2, 7, 16))
    full, full_weights = layer(x, mask=causal_mask(7))
    assert not np.allclose(full, without_gate(layer)(x, mask=causal_mask(7))[0])
    cache = KVCache.init(1, num_kv_heads, 7, 4, batch_shape=(2,)).layer(0)
    steps = [layer(x[:, :3], mask=causal_mask(3), cache=cache)]
    steps += [layer(x[:, i:i + 1], cache=cache) for i in range(3, 7)]
    np.testing.assert_allclose(np.concatenate([out for out, _ in steps], axis=1), full,
                               atol=1e-12)
    np.testing.assert_allclose(steps[-1][1], full_weights[..., -1:, :], atol=1e-12)
    np.testing.assert_allclose(layer(x, mask=causal_mask(7), need_weights=False)[0], full,
                               atol=1e-12)


@GATES
def test_a_decoder_with_gated_attention_decodes_with_its_cache_as_without(gate):
    # The blocks call MultiHeadAttention.forward, so the gate works inside a whole model.
    rng = np.random.default_rng(28)
    model = DecoderOnlyLM.init(11, 16, 4, 32, 2, rng, num_kv_heads=2)
    for block in model.blocks:
        W_g = rng.normal(size=(16, 16 if gate == "elementwise" else 4)) / 4
        block.self_attn = dataclasses.replace(block.self_attn, W_g=W_g)
    tokens = rng.integers(0, 11, size=(2, 6))
    full = model(tokens)
    cache = model.new_cache((2,), capacity=6)
    steps = [model(tokens[:, :2], cache)] + [model(tokens[:, i:i + 1], cache)
                                             for i in range(2, 6)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-12)
    for block in model.blocks:
        block.self_attn = without_gate(block.self_attn)
    assert not np.allclose(model(tokens), full)


def test_headwise_gate_scales_each_head_by_one_number():
    rng = np.random.default_rng(25)
    heads = rng.normal(size=(2, 3, 5, 4))  # (batch, H, T, d_head)
    x = rng.normal(size=(2, 5, 8))
    W_g, b_g = rng.normal(size=(8, 3)), rng.normal(size=3)
    gated = gated_attention_output(heads, x, W_g, b_g)
    gate = 1 / (1 + np.exp(-(x @ W_g + b_g)))  # (batch, T, H)
    np.testing.assert_allclose(gated, heads * gate.transpose(0, 2, 1)[..., None], rtol=1e-14)
    layer = MultiHeadAttention.init(8, 2, rng, gate="headwise")
    assert layer.gate(x).shape == (2, 2, 5, 1)


def test_elementwise_gate_scales_each_head_and_channel():
    rng = np.random.default_rng(29)
    heads = rng.normal(size=(3, 5, 4))  # (H, T, d_head)
    x = rng.normal(size=(5, 8))
    W_g = rng.normal(size=(8, 12))
    gate = 1 / (1 + np.exp(-(x @ W_g)))  # (T, H * d_head): head h in columns 4h to 4h + 4
    expected = heads * gate.reshape(5, 3, 4).transpose(1, 0, 2)
    np.testing.assert_allclose(gated_attention_output(heads, x, W_g), expected, rtol=1e-14)


@DTYPES
@GATES
def test_gated_attention_keeps_the_dtype(dtype, gate):
    rng = np.random.default_rng(26)
    layer = gated_layer(rng, gate, dtype=dtype)
    output, weights = layer(rng.normal(size=(3, 16)).astype(dtype))
    assert output.dtype == weights.dtype == layer.gate(np.zeros((3, 16), dtype)).dtype == dtype
    heads = np.ones((4, 3, 4), dtype)
    assert gated_attention_output(heads, np.zeros((3, 16), dtype), layer.W_g).dtype == dtype


def test_gated_attention_output_rejects_bad_input():
    rng = np.random.default_rng(27)
    heads, x = np.zeros((2, 5, 4)), np.zeros((5, 8))
    with pytest.raises(ValueError, match=r"x \(5, 7\) .* and W_g \(8, 8\) .* do not fit"):
        gated_attention_output(heads, np.zeros((5, 7)), np.zeros((8, 8)))
    with pytest.raises(ValueError, match=r"heads \(2, 5, 4\) .* W_g \(8, 3\) .* do not fit"):
        gated_attention_output(heads, x, np.zeros((8, 3)))
    with pytest.raises(ValueError, match=r"x \(6, 8\) .* do not fit"):
        gated_attention_output(heads, np.zeros((6, 8)), np.zeros((8, 2)))
    with pytest.raises(ValueError, match=r"heads \(3, 2, 5, 4\) .* batch dims that broadcast"):
        gated_attention_output(np.zeros((3, 2, 5, 4)), np.zeros((2, 5, 8)), np.zeros((8, 2)))
    with pytest.raises(ValueError, match=r"W_g \(8, 2, 1\) .* do not fit"):
        gated_attention_output(heads, x, np.zeros((8, 2, 1)))
    with pytest.raises(ValueError, match=r"b_g must have shape \(8,\); got \(2,\)"):
        gated_attention_output(heads, x, np.zeros((8, 8)), np.zeros(2))
    layer = MultiHeadAttention.init(8, 2, rng, gate="elementwise")
    with pytest.raises(ValueError, match="x has 7 features"):
        layer(np.zeros((3, 7)))


# =============================================================================================
# Top-k sparse attention
# =============================================================================================

def test_topk_sparse_attention_equals_dense_attention_masked_to_the_selected_keys():
    rng = np.random.default_rng(29)
    x = rng.normal(size=(2, 12, 16))
    index_scores = LightningIndexer.init(16, 4, 8, rng, d_rope=4)(x)[:, None]  # (2, 1, 12, 12)
    q = rng.normal(size=(2, 3, 12, 8))  # 3 heads
    k, v = rng.normal(size=(2, 2, 1, 12, 8))  # one key/value head shared by all (as MLA)
    mask = causal_mask(12)
    output, weights, indices = topk_sparse_attention(q, k, v, index_scores, 4, mask)
    assert output.shape == (2, 3, 12, 8) and weights.shape == indices.shape == (2, 3, 12, 4)
    dense, dense_weights = scaled_dot_product_attention(q, k, v,
                                                        mask=topk_mask(index_scores, 4, mask))
    np.testing.assert_allclose(output, dense, atol=1e-12)
    np.testing.assert_allclose(np.take_along_axis(dense_weights, indices, -1), weights,
                               atol=1e-12)
    assert (dense_weights > 0).sum(-1).max() == 4
    assert (dense_weights > 0).sum(-1)[..., 0].max() == 1  # the first query has one key


def test_topk_with_k_at_least_the_sequence_length_is_dense_attention():
    rng = np.random.default_rng(30)
    q, k, v = rng.normal(size=(3, 2, 10, 4))
    index_scores = rng.normal(size=(2, 10, 10))
    for top_k in (10, 50):
        output, _, _ = topk_sparse_attention(q, k, v, index_scores, top_k, causal_mask(10))
        np.testing.assert_allclose(output, scaled_dot_product_attention(
            q, k, v, mask=causal_mask(10))[0], atol=1e-12)


def test_topk_indices_never_prefer_a_blocked_key_and_flag_the_ones_they_must_take():
    scores = np.array([[5.0, 1.0, 9.0, 7.0]])
    mask = np.array([[True, True, False, False]])
    indices, allowed = topk_indices(scores, 3, mask)
    np.testing.assert_array_equal(indices[0][allowed[0]], [0, 1])  # the two allowed keys
    assert allowed.sum() == 2
    np.testing.assert_array_equal(topk_mask(scores, 3, mask), [[True, True, False, False]])


@DTYPES
def test_topk_sparse_attention_keeps_the_dtype_and_zeroes_empty_rows(dtype):
    rng = np.random.default_rng(31)
    q, k, v = (rng.normal(size=(4, 6)).astype(dtype) for _ in range(3))
    mask = causal_mask(4).copy()
    mask[1] = False
    output, weights, _ = topk_sparse_attention(q, k, v, rng.normal(size=(4, 4)), 2, mask)
    assert output.dtype == weights.dtype == dtype
    np.testing.assert_array_equal(output[1], 0.0)
    indexer = LightningIndexer.init(6, 2, 4, rng, d_rope=2, dtype=dtype)
    assert indexer(q).dtype == dtype


def test_sparse_attention_cost_counts_scores_and_bytes():
    # DeepSeek-V3.2: 128 heads of 192 (128 + 64), MLA rows of 576 BF16 numbers, an indexer of
    # 64 heads of 128 with FP8 keys (128 bytes), top 2048, one query at the end of 128k.
    cost = sparse_attention_cost(1, 131072, 2048, num_heads=128, d_qk=192,
                                 kv_bytes_per_token=576 * 2, index_heads=64, d_index=128,
                                 index_bytes_per_token=128)
    assert cost["dense_scores"] == 128 * 131072 and cost["sparse_scores"] == 128 * 2048
    assert cost["dense_kv_bytes"] == 131072 * 1152
    assert cost["sparse_kv_bytes"] == 2048 * 1152 + 131072 * 128
    assert cost["sparse_flops"] == 2 * 192 * 128 * 2048 + 2 * 128 * 64 * 131072
    causal = sparse_attention_cost(4, 4, 2, num_heads=1, d_qk=1, kv_bytes_per_token=1)
    assert causal["dense_scores"] == 1 + 2 + 3 + 4 and causal["sparse_scores"] == 1 + 2 + 2 + 2


def test_sparse_attention_rejects_bad_input():
    q = np.zeros((4, 3))
    with pytest.raises(ValueError, match="top_k must be >= 1; got 0"):
        topk_sparse_attention(q, q, q, np.zeros((4, 4)), 0)
    with pytest.raises(ValueError, match=r"index_scores of shape \(4, 5\) do not broadcast"):
        topk_sparse_attention(q, q, q, np.zeros((4, 5)), 2)
    with pytest.raises(ValueError, match="index_scores contain NaN"):
        topk_indices(np.full((2, 2), np.nan), 1)
    with pytest.raises(TypeError, match="mask must be boolean"):
        topk_mask(np.zeros((2, 2)), 1, np.ones((2, 2)))
    with pytest.raises(ValueError, match="Tq=5 > Tk=4"):
        sparse_attention_cost(5, 4, 2, num_heads=1, d_qk=1, kv_bytes_per_token=1)
    with pytest.raises(ValueError, match="d_rope must be even"):
        LightningIndexer.init(8, 2, 4, np.random.default_rng(0), d_rope=3)
