"""KVCache and greedy decoding (chapter 10): storage shapes and size, appending, capacity and
shape errors, and the central claim of the chapter: decoding with the cache gives exactly the
logits (and so the tokens) of running the whole sequence again at every step."""

import math
import re

import numpy as np
import pytest
from model_helpers import randomize

from attention_lib import (
    DecoderOnlyLM,
    KVCache,
    MultiHeadAttention,
    causal_mask,
    greedy_decode,
)
from attention_lib.cache import LayerCache

VOCAB = 23


def random_lm(seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return randomize(DecoderOnlyLM.init(VOCAB, 16, 4, 32, 2, rng, dtype=dtype), rng)


# --------------------------------------------------------------------------- KVCache storage


@pytest.mark.parametrize("batch_shape", [(), (3,), (2, 3)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kv_cache_init_shapes_and_nbytes_formula(batch_shape, dtype):
    L, H, capacity, d_head = 3, 2, 10, 4
    cache = KVCache.init(L, H, capacity, d_head, batch_shape, dtype=dtype)
    expected_shape = (L, *batch_shape, H, capacity, d_head)
    assert cache.keys.shape == cache.values.shape == expected_shape
    assert cache.keys.dtype == cache.values.dtype == dtype
    np.testing.assert_array_equal(cache.lengths, np.zeros(L))
    assert cache.length == 0 and cache.capacity == capacity
    itemsize = np.dtype(dtype).itemsize
    assert cache.nbytes == 2 * L * math.prod(batch_shape) * H * capacity * d_head * itemsize


def test_kv_cache_init_rejects_non_positive_sizes_by_name():
    for name, args in [("num_layers", (0, 2, 4, 4)), ("num_kv_heads", (1, 0, 4, 4)),
                       ("capacity", (1, 2, 0, 4)), ("d_head", (1, 2, 4, -1))]:
        with pytest.raises(ValueError, match=name):
            KVCache.init(*args)


def test_append_returns_everything_stored_so_far():
    rng = np.random.default_rng(0)
    cache = KVCache.init(2, 3, 8, 4, (2,))
    k1, v1 = rng.normal(size=(2, 3, 3, 4)), rng.normal(size=(2, 3, 3, 4))
    k2, v2 = rng.normal(size=(2, 3, 1, 4)), rng.normal(size=(2, 3, 1, 4))
    keys, values = cache.append(1, k1, v1)
    np.testing.assert_array_equal(keys, k1)
    np.testing.assert_array_equal(values, v1)
    keys, values = cache.append(1, k2, v2)
    assert keys.shape == values.shape == (2, 3, 4, 4)
    np.testing.assert_array_equal(keys, np.concatenate([k1, k2], axis=-2))
    np.testing.assert_array_equal(values, np.concatenate([v1, v2], axis=-2))
    # layer 0 was never written
    np.testing.assert_array_equal(cache.keys[0], 0.0)


def test_lengths_are_counted_per_layer():
    cache = KVCache.init(3, 1, 8, 2)
    cache.append(0, np.ones((1, 2, 2)), np.ones((1, 2, 2)))
    np.testing.assert_array_equal(cache.lengths, [2, 0, 0])
    assert cache.length == 2
    cache.append(2, np.ones((1, 5, 2)), np.ones((1, 5, 2)))
    np.testing.assert_array_equal(cache.lengths, [2, 0, 5])
    assert cache.length == 5
    layer = cache.layer(0)
    assert isinstance(layer, LayerCache) and layer.length == 2
    keys, _ = layer.append(np.full((1, 1, 2), 7.0), np.zeros((1, 1, 2)))
    assert keys.shape == (1, 3, 2) and layer.length == 3
    np.testing.assert_array_equal(cache.lengths, [3, 0, 5])


def test_layer_index_out_of_range_raises():
    with pytest.raises(ValueError, match=r"layer index 2.*2 layers"):
        KVCache.init(2, 1, 4, 2).layer(2)


@pytest.mark.parametrize("index", [1.5, 1.0, "1", True])
def test_layer_index_that_is_not_an_integer_raises_a_type_error(index):
    with pytest.raises(TypeError, match=r"layer index must be an integer"):
        KVCache.init(2, 1, 4, 2).layer(index)


def test_appending_past_capacity_raises_saying_full_and_the_capacity():
    cache = KVCache.init(1, 2, 4, 3)
    cache.append(0, np.ones((2, 3, 3)), np.ones((2, 3, 3)))
    with pytest.raises(ValueError, match=r"full.*capacity 4"):
        cache.append(0, np.ones((2, 2, 3)), np.ones((2, 2, 3)))
    # the failed append stored nothing: exactly one more position still fits
    assert cache.length == 3
    keys, _ = cache.append(0, np.full((2, 1, 3), 2.0), np.ones((2, 1, 3)))
    assert keys.shape == (2, 4, 3)
    with pytest.raises(ValueError, match=r"full.*capacity 4"):
        cache.append(0, np.ones((2, 1, 3)), np.ones((2, 1, 3)))


@pytest.mark.parametrize("bad_shape", [(2, 1, 5), (3, 1, 4), (1, 4)],
                         ids=["d_head", "heads", "missing-heads"])
@pytest.mark.parametrize("name", ["k", "v"])
def test_append_with_a_wrong_shape_raises_naming_k_or_v(name, bad_shape):
    cache = KVCache.init(1, 2, 8, 4)
    good = np.zeros((2, 1, 4))
    bad = np.zeros(bad_shape)
    k, v = (bad, good) if name == "k" else (good, bad)
    with pytest.raises(ValueError) as info:
        cache.append(0, k, v)
    message = str(info.value)
    assert re.match(rf"{name}\b", message), message
    assert str(bad_shape) in message
    assert cache.length == 0


def test_append_with_k_and_v_of_different_lengths_raises():
    cache = KVCache.init(1, 2, 8, 4)
    with pytest.raises(ValueError, match=r"k has 2 new positions but v has 3"):
        cache.append(0, np.zeros((2, 2, 4)), np.zeros((2, 3, 4)))


# --------------------------------------------------------------------------- MultiHeadAttention


def random_mha(d_model, num_heads, seed):
    rng = np.random.default_rng(seed)
    return randomize(MultiHeadAttention.init(d_model, num_heads, rng), rng)


@pytest.mark.parametrize("batch_shape", [(), (2,)], ids=["unbatched", "batch-2"])
@pytest.mark.parametrize("chunks", [[1] * 6, [3, 1, 2], [6]], ids=["steps", "mixed", "one"])
def test_cached_attention_equals_the_rows_of_full_causal_attention(batch_shape, chunks):
    mha = random_mha(12, 3, 1)
    T = sum(chunks)
    x = np.random.default_rng(2).normal(size=(*batch_shape, T, 12))
    full, full_weights = mha(x, mask=causal_mask(T))
    cache = KVCache.init(1, 3, T, 4, batch_shape)
    start = 0
    for size in chunks:
        rows = slice(start, start + size)
        output, weights = mha(x[..., rows, :], mask=causal_mask(size, start + size),
                              cache=cache.layer(0))
        assert weights.shape == (*batch_shape, 3, size, start + size)
        np.testing.assert_allclose(output, full[..., rows, :], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(weights, full_weights[..., rows, : start + size],
                                   rtol=1e-12, atol=1e-12)
        start += size
    assert cache.length == T


def test_a_cache_is_refused_for_cross_attention():
    mha = random_mha(8, 2, 3)
    cache = KVCache.init(1, 2, 4, 4)
    with pytest.raises(ValueError, match="cache"):
        mha(np.ones((1, 8)), context=np.ones((3, 8)), cache=cache.layer(0))


# --------------------------------------------------------------------------- DecoderOnlyLM


def decode_in_chunks(model, tokens, chunks):
    cache = model.new_cache(tokens.shape[:-1], capacity=tokens.shape[-1])
    logits, start = [], 0
    for size in chunks:
        logits.append(model(tokens[..., start : start + size], cache=cache))
        start += size
    assert cache.length == tokens.shape[-1]
    return np.concatenate(logits, axis=-2)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batch_shape", [(), (2,)], ids=["unbatched", "batch-2"])
@pytest.mark.parametrize("chunks", [[1] * 9, [4, 1, 1, 1, 1, 1], [3, 3, 3], [2, 5, 1, 1]],
                         ids=["one-at-a-time", "prefill-4", "chunks-of-3", "mixed"])
def test_decoding_with_a_cache_gives_the_logits_of_the_full_forward_pass(seed, batch_shape,
                                                                          chunks):
    model = random_lm(seed)
    tokens = np.random.default_rng(seed + 50).integers(0, VOCAB, size=(*batch_shape, 9))
    full = model(tokens)
    cached = decode_in_chunks(model, tokens, chunks)
    assert cached.shape == full.shape == (*batch_shape, 9, VOCAB)
    np.testing.assert_allclose(cached, full, rtol=1e-10, atol=1e-10)


def test_the_cache_is_what_carries_the_past():
    # Run without a cache, the last token alone gives different logits than with the cache:
    # the cached test above could not pass if the cache were ignored.
    model = random_lm(3)
    tokens = np.random.default_rng(53).integers(0, VOCAB, size=6)
    cached = decode_in_chunks(model, tokens, [5, 1])
    assert not np.allclose(cached[-1], model(tokens[-1:])[-1], atol=1e-6)


def test_new_cache_has_one_slot_per_layer_and_head_of_the_model():
    model = random_lm(4, dtype=np.float32)
    cache = model.new_cache((2,), capacity=7)
    assert cache.keys.shape == (2, 2, 4, 7, 4)  # (layers, batch, heads, capacity, d_head)
    assert cache.keys.dtype == np.float32


def test_decoding_past_the_cache_capacity_raises():
    model = random_lm(5)
    cache = model.new_cache((), capacity=4)
    model(np.array([1, 2, 3]), cache=cache)
    with pytest.raises(ValueError, match=r"full.*capacity 4"):
        model(np.array([4, 5]), cache=cache)


# --------------------------------------------------------------------------- greedy_decode


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("batch_shape", [(), (2,)], ids=["unbatched", "batch-2"])
def test_greedy_decode_gives_the_same_tokens_with_and_without_the_cache(seed, batch_shape):
    model = random_lm(seed + 10)
    prompt = np.random.default_rng(seed + 60).integers(0, VOCAB, size=(*batch_shape, 3))
    with_cache = greedy_decode(model, prompt, 22, use_cache=True)
    without = greedy_decode(model, prompt, 22, use_cache=False)
    assert with_cache.shape == without.shape == (*batch_shape, 25)
    assert with_cache.dtype == without.dtype == np.int64
    np.testing.assert_array_equal(with_cache, without)
    np.testing.assert_array_equal(with_cache[..., :3], prompt)


def test_greedy_decode_picks_the_argmax_of_the_full_model_at_every_step():
    model = random_lm(20)
    prompt = np.array([[5, 1], [0, 22]])
    tokens = greedy_decode(model, prompt, 20)
    logits = model(tokens[..., :-1])  # position t predicts token t + 1
    np.testing.assert_array_equal(tokens[..., 2:], logits[..., 1:, :].argmax(axis=-1))
    # a random model does not just repeat one token, so the check above has teeth
    assert len(np.unique(tokens[..., 2:])) > 1


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_decode_of_zero_new_tokens_returns_the_prompt(use_cache):
    prompt = np.array([[4, 2, 9]], dtype=np.int32)
    result = greedy_decode(random_lm(21), prompt, 0, use_cache=use_cache)
    np.testing.assert_array_equal(result, prompt)
    assert result.dtype == np.int64


@pytest.mark.parametrize(
    "prompt", [np.array([1.0, 2.0]), np.array([], dtype=np.int64), np.zeros((2, 0), dtype=int),
               np.int64(3)],
    ids=["float", "empty", "empty-batch", "scalar"],
)
def test_greedy_decode_rejects_float_or_empty_prompts(prompt):
    with pytest.raises(ValueError, match=r"prompt"):
        greedy_decode(random_lm(22), prompt, 3)


def test_greedy_decode_rejects_a_negative_number_of_new_tokens():
    with pytest.raises(ValueError, match="num_new_tokens"):
        greedy_decode(random_lm(23), np.array([1, 2]), -1)
