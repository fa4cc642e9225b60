"""The attention-sink cache (chapter 17): a KV cache that keeps the first few positions and a
rolling window, with positions counted inside the cache (StreamingLLM).

The reference is written independently of SinkCache's re-rotation: it keeps every kept token's
*un-rotated* key and its value per layer in a Python list, and for each new token builds a
fresh plain KVCache whose keys are rotated at positions 0, 1, ... in the order kept, runs the
model on the token, and stores that token's key rotated back to position 0.
"""

from __future__ import annotations

import numpy as np
import pytest
from model_helpers import HAVE_SMOLLM2_WEIGHTS, SMOLLM2_WEIGHTS_INSTALL

from attention_lib import (
    EncoderBlock,
    GatedFeedForward,
    KVCache,
    MultiHeadAttention,
    RMSNorm,
    apply_rope,
)
from attention_lib.cache import SinkCache, next_token_nll
from attention_lib.models.smollm2 import SmolLM2, SmolLM2Config
from attention_lib.softmax import log_softmax

ROPE_BASE = 100.0


def tiny_decoder(seed=0, dtype=np.float64) -> SmolLM2:
    """A random 2-layer Llama-style decoder (grouped-query RoPE attention, SwiGLU, RMSNorm)."""
    rng = np.random.default_rng(seed)
    d, heads, kv_heads, d_ff, vocab = 16, 4, 2, 24, 50
    config = SmolLM2Config(vocab_size=vocab, d_model=d, num_layers=2, num_heads=heads,
                           num_kv_heads=kv_heads, d_ff=d_ff, rms_eps=1e-5,
                           rope_base=ROPE_BASE, context_length=256)

    def matrix(rows, cols):
        return (rng.normal(size=(rows, cols)) / np.sqrt(rows)).astype(dtype)

    kv_dim = kv_heads * d // heads
    blocks = []
    for _ in range(config.num_layers):
        attention = MultiHeadAttention(
            W_q=matrix(d, d), W_k=matrix(d, kv_dim), W_v=matrix(d, kv_dim), W_o=matrix(d, d),
            b_q=np.zeros(d, dtype), b_k=np.zeros(kv_dim, dtype), b_v=np.zeros(kv_dim, dtype),
            b_o=np.zeros(d, dtype), num_heads=heads, num_kv_heads=kv_heads,
            rope_base=ROPE_BASE)
        ff = GatedFeedForward(W_gate=matrix(d, d_ff), W_up=matrix(d, d_ff),
                              W_down=matrix(d_ff, d), activation="silu")
        blocks.append(EncoderBlock(self_attn=attention, ff=ff,
                                   norm1=RMSNorm(np.ones(d, dtype), 1e-5),
                                   norm2=RMSNorm(np.ones(d, dtype), 1e-5), norm_first=True))
    embedding = rng.normal(size=(vocab, d)).astype(dtype)
    return SmolLM2(embedding, blocks, RMSNorm(np.ones(d, dtype), 1e-5), embedding.T, config)


def reference_stream(model: SmolLM2, ids, num_sinks: int, window: int) -> np.ndarray:
    """Logits of each token fed alone, the cache holding sinks + window (see module doc)."""
    c = model.config
    kept = []  # per kept token: (un-rotated keys (L, H_kv, d_head), values (L, H_kv, d_head))
    logits = []
    for token in ids:
        n = len(kept)
        cache = KVCache.init(c.num_layers, c.num_kv_heads, n + 1, c.d_head,
                             dtype=model.embedding.dtype)
        if n:
            raw_keys = np.stack([keys for keys, _ in kept], axis=-2)  # (L, H_kv, n, d_head)
            cache.keys[:, :, :n] = apply_rope(raw_keys, np.arange(n), base=c.rope_base)
            cache.values[:, :, :n] = np.stack([values for _, values in kept], axis=-2)
            cache.lengths[:] = n
        logits.append(model.forward(np.array([token]), cache=cache)[-1])
        new_key = apply_rope(cache.keys[:, :, n:n + 1], np.array([-n]), base=c.rope_base)
        kept.append((new_key[:, :, 0], cache.values[:, :, n].copy()))
        if len(kept) > num_sinks + window:
            del kept[num_sinks]  # the oldest token of the window
    return np.array(logits)


def sink_stream(model: SmolLM2, ids, num_sinks: int, window: int) -> np.ndarray:
    cache = model.new_sink_cache(num_sinks, window)
    return np.array([model.forward(np.array([token]), cache=cache)[-1] for token in ids])


@pytest.mark.parametrize("num_sinks, window", [(0, 5), (1, 4), (4, 6), (2, 1)])
def test_sink_cache_equals_the_reference_after_many_drops(num_sinks, window):
    model = tiny_decoder()
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, size=40)
    np.testing.assert_allclose(sink_stream(model, ids, num_sinks, window),
                               reference_stream(model, ids, num_sinks, window),
                               rtol=1e-10, atol=1e-10)


def test_dropping_changes_the_logits_so_the_reference_comparison_can_fail():
    model = tiny_decoder()
    ids = np.random.default_rng(2).integers(0, model.config.vocab_size, size=30)
    window_only = sink_stream(model, ids, 0, 5)
    with_sinks = sink_stream(model, ids, 2, 5)
    full = sink_stream(model, ids, 0, 40)  # never full: a plain cache
    np.testing.assert_allclose(window_only[:6], full[:6], rtol=1e-12)  # nothing dropped yet
    assert np.abs(window_only[6:] - full[6:]).max() > 1e-3
    assert np.abs(with_sinks[7:] - window_only[7:]).max() > 1e-3


def test_sink_cache_is_a_plain_cache_until_something_is_dropped():
    model = tiny_decoder()
    ids = np.random.default_rng(3).integers(0, model.config.vocab_size, size=12)
    sink = model.new_sink_cache(4, 8)
    plain = model.new_cache(capacity=12)
    # a 5-token chunk, then single tokens, up to exactly num_sinks + window = 12 positions
    for start, stop in [(0, 5), *[(t, t + 1) for t in range(5, 12)]]:
        np.testing.assert_array_equal(model.forward(ids[start:stop], cache=sink),
                                      model.forward(ids[start:stop], cache=plain))
    assert sink.length == 12 and sink.evicted.tolist() == [0, 0]


def test_length_stays_at_num_sinks_plus_window_and_memory_is_bounded():
    model = tiny_decoder()
    cache = model.new_sink_cache(2, 3)
    for token in range(20):
        model.forward(np.array([token]), cache=cache)
        assert cache.length == min(token + 1, 5)
    assert cache.evicted.tolist() == [15, 15]
    c = model.config
    assert cache.keys.shape == (c.num_layers, c.num_kv_heads, 2 + 3 + 1, c.d_head)
    assert cache.nbytes == 2 * c.num_layers * c.num_kv_heads * 6 * c.d_head * 8


def test_the_sinks_are_never_dropped():
    cache = SinkCache.init(1, 1, 2, num_sinks=2, window=2, rope_base=ROPE_BASE)
    layer = cache.layer(0)
    for step in range(7):
        _, values = layer.append(np.zeros((1, 1, 2)), np.full((1, 1, 2), float(step)))
        assert values[0, :, 0].tolist() == list(range(min(step + 1, 2))) + \
            list(range(max(2, step - 2), step + 1))
    assert cache.values[0, 0, :4, 0].tolist() == [0.0, 1.0, 5.0, 6.0]


def test_kept_window_keys_move_back_one_position_per_drop():
    d = 4
    key = np.arange(1.0, d + 1)
    cache = SinkCache.init(1, 1, d, num_sinks=0, window=2, rope_base=ROPE_BASE)
    layer = cache.layer(0)
    for _ in range(5):  # as an attention layer does: rotate at the current length
        layer.append(apply_rope(key[None, None], np.array([layer.length]), base=ROPE_BASE),
                     np.zeros((1, 1, d)))
    expected = apply_rope(np.stack([key, key])[None], np.arange(2), base=ROPE_BASE)
    np.testing.assert_allclose(cache.keys[0, :, :2], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_sinks=-1, window=4), "num_sinks"),
    (dict(num_sinks=1, window=0), "window"),
    (dict(num_sinks=1.5, window=4), "num_sinks"),
    (dict(num_sinks=1, window=4, rope_base=float("nan")), "rope_base"),
    (dict(num_sinks=1, window=4, rope_base=0.0), "rope_base"),
])
def test_bad_sizes_raise(kwargs, message):
    kwargs = {"rope_base": ROPE_BASE, **kwargs}
    with pytest.raises((ValueError, TypeError), match=message):
        SinkCache.init(2, 1, 4, **kwargs)


def test_several_tokens_at_once_when_full_raise_a_clear_error():
    cache = SinkCache.init(1, 1, 2, num_sinks=1, window=2, rope_base=ROPE_BASE)
    layer = cache.layer(0)
    layer.append(np.zeros((1, 2, 2)), np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="one token per step"):
        layer.append(np.zeros((1, 2, 2)), np.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="does not fit the cache"):
        layer.append(np.zeros((2, 1, 2)), np.zeros((2, 1, 2)))


def test_model_refuses_a_sink_cache_longer_than_its_context():
    with pytest.raises(ValueError, match="context length 256"):
        tiny_decoder().new_sink_cache(4, 252)


def test_next_token_nll_matches_the_log_softmax_of_the_stream():
    model = tiny_decoder()
    ids = np.random.default_rng(4).integers(0, model.config.vocab_size, size=25)
    streamed = sink_stream(model, ids, 2, 6)
    expected = -log_softmax(streamed[:-1], axis=-1)[np.arange(24), ids[1:]]
    np.testing.assert_allclose(next_token_nll(model, ids, num_sinks=2, window=6, chunk=3),
                               expected, rtol=1e-10)
    full = model.forward(ids)
    np.testing.assert_allclose(next_token_nll(model, ids, chunk=7),
                               -log_softmax(full[:-1], axis=-1)[np.arange(24), ids[1:]],
                               rtol=1e-10)


@pytest.mark.parametrize("kwargs, message", [
    (dict(ids=np.array([3])), "at least 2"),
    (dict(ids=np.array([[1, 2]])), "1-d"),
    (dict(ids=np.array([1, 2]), num_sinks=2), "num_sinks needs a window"),
    (dict(ids=np.array([1, 2]), chunk=0), "chunk"),
])
def test_next_token_nll_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        next_token_nll(tiny_decoder(), **kwargs)


@pytest.mark.skipif(not HAVE_SMOLLM2_WEIGHTS,
                    reason=f"weights not installed ({SMOLLM2_WEIGHTS_INSTALL})")
def test_smollm2_with_a_sink_cache_equals_the_reference():
    from attention_lib.models.smollm2 import load_smollm2

    model, tokenizer = load_smollm2()
    ids = tokenizer.encode("To be, or not to be, that is the question: whether 'tis nobler")
    ours = sink_stream(model, ids[:14], 2, 6)
    np.testing.assert_allclose(ours, reference_stream(model, ids[:14], 2, 6),
                               rtol=1e-4, atol=2e-4)
