"""Grouped-query and multi-query attention (chapter 11): grouped_attention and
MultiHeadAttention(num_kv_heads=...).

Claims checked: query head h uses key/value head h // (H / H_kv); grouped attention equals
ordinary attention with the key/value heads repeated explicitly (np.repeat); with
H_kv == H it is ordinary multi-head attention; the KV cache of a GQA layer holds only the
key/value heads, so it is H / H_kv times smaller, and decoding with it gives the logits of the
full forward pass; bad head counts raise naming the argument.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import (
    DecoderOnlyLM,
    KVCache,
    MultiHeadAttention,
    causal_mask,
    grouped_attention,
    merge_heads,
    padding_mask,
    scaled_dot_product_attention,
    split_heads,
)

NAMES = ("W_q", "W_k", "W_v", "W_o", "b_q", "b_k", "b_v", "b_o")


def random_gqa(d_model, num_heads, num_kv_heads, seed=0, dtype=np.float64, rope_base=None):
    """A layer with random weights and random, non-zero biases (a dropped bias shows)."""
    rng = np.random.default_rng(seed)
    kv_dim = num_kv_heads * (d_model // num_heads)
    shapes = {"W_q": (d_model, d_model), "W_k": (d_model, kv_dim), "W_v": (d_model, kv_dim),
              "W_o": (d_model, d_model), "b_q": (d_model,), "b_k": (kv_dim,),
              "b_v": (kv_dim,), "b_o": (d_model,)}
    parameters = {name: (rng.normal(size=shape) / math.sqrt(shape[0] if len(shape) == 2 else 3)
                         ).astype(dtype) for name, shape in shapes.items()}
    return MultiHeadAttention(**parameters, num_heads=num_heads, num_kv_heads=num_kv_heads,
                              rope_base=rope_base)


def repeat_kv_reference(mha, x, mask=None):
    """GQA written the plain way: project, split into H_kv heads, np.repeat each key/value
    head for the H / H_kv query heads of its group, then ordinary attention and W_o."""
    H, H_kv = mha.num_heads, mha.num_kv_heads
    group = H // H_kv
    q = split_heads(x @ mha.W_q + mha.b_q, H)  # (..., H, T, d_head)
    k = np.repeat(split_heads(x @ mha.W_k + mha.b_k, H_kv), group, axis=-3)  # (..., H, T, d)
    v = np.repeat(split_heads(x @ mha.W_v + mha.b_v, H_kv), group, axis=-3)
    heads_mask = None if mask is None else np.asarray(mask)[..., None, :, :]
    heads, weights = scaled_dot_product_attention(q, k, v, mask=heads_mask)
    return merge_heads(heads) @ mha.W_o + mha.b_o, weights


def expand_to_multi_head(mha):
    """The same layer as ordinary multi-head attention: copy each key/value head's columns of
    W_k, W_v (and b_k, b_v) once for every query head of its group."""
    group = mha.num_heads // mha.num_kv_heads
    d_head = mha.d_model // mha.num_heads

    def repeat_heads(array):  # (..., H_kv * d_head) -> (..., H * d_head)
        heads = array.reshape(*array.shape[:-1], mha.num_kv_heads, d_head)
        return np.repeat(heads, group, axis=-2).reshape(*array.shape[:-1], mha.d_model)

    return MultiHeadAttention(W_q=mha.W_q, W_k=repeat_heads(mha.W_k), W_v=repeat_heads(mha.W_v),
                              W_o=mha.W_o, b_q=mha.b_q, b_k=repeat_heads(mha.b_k),
                              b_v=repeat_heads(mha.b_v), b_o=mha.b_o, num_heads=mha.num_heads,
                              rope_base=mha.rope_base)


# --------------------------------------------------------------------------- grouped_attention


@st.composite
def grouped_problems(draw):
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    H_kv = draw(st.integers(1, 3))
    H = H_kv * draw(st.integers(1, 4))
    Tq, Tk, d = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((*batch, H, Tq, d))
    k = rng.standard_normal((*batch, H_kv, Tk, d))
    v = rng.standard_normal((*batch, H_kv, Tk, d + 1))
    mask_shape = draw(st.sampled_from([None, (Tq, Tk), (H, Tq, Tk), (*batch, 1, Tq, Tk),
                                       (*batch, H, Tq, Tk), (Tk,)]))
    mask = None if mask_shape is None else rng.random(mask_shape) < 0.7
    return q, k, v, mask


@given(problem=grouped_problems())
def test_grouped_attention_equals_attention_with_the_kv_heads_repeated(problem):
    q, k, v, mask = problem
    group = q.shape[-3] // k.shape[-3]
    output, weights = grouped_attention(q, k, v, mask=mask)
    expected_output, expected_weights = scaled_dot_product_attention(
        q, np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3), mask=mask)
    assert output.shape == expected_output.shape
    assert weights.shape == expected_weights.shape
    np.testing.assert_allclose(output, expected_output, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-12, atol=1e-12)


def test_query_head_h_reads_key_value_head_h_over_the_group_size():
    # Each kv head's values are one constant (its index), so every output of query head h is
    # the index of the kv head it reads: 6 query heads, 3 kv heads -> 0 0 1 1 2 2.
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 4, 2))
    k = rng.standard_normal((3, 5, 2))
    v = np.broadcast_to(np.arange(3.0)[:, None, None], (3, 5, 1))
    output, _ = grouped_attention(q, k, v)
    np.testing.assert_allclose(output[..., 0], np.repeat([0.0, 0, 1, 1, 2, 2], 4).reshape(6, 4))


def test_one_kv_head_is_multi_query_attention_shared_by_every_query_head():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 3, 8))
    k, v = rng.standard_normal((2, 1, 5, 8)), rng.standard_normal((2, 1, 5, 8))
    output, weights = grouped_attention(q, k, v)
    for h in range(4):
        expected, expected_weights = scaled_dot_product_attention(q[:, h], k[:, 0], v[:, 0])
        np.testing.assert_allclose(output[:, h], expected, rtol=1e-12)
        np.testing.assert_allclose(weights[:, h], expected_weights, rtol=1e-12)


def test_as_many_kv_heads_as_query_heads_is_ordinary_attention():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 4, 5, 3)) for _ in range(3))
    mask = causal_mask(5)
    for got, expected in zip(grouped_attention(q, k, v, mask=mask),
                             scaled_dot_product_attention(q, k, v, mask=mask)):
        np.testing.assert_array_equal(got, expected)


def test_grouped_attention_keeps_float32_and_gives_zero_rows_for_fully_masked_queries():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 3, 2)).astype(np.float32)
    k = rng.standard_normal((2, 5, 2)).astype(np.float32)
    mask = np.ones((3, 5), dtype=bool)
    mask[1] = False
    output, weights = grouped_attention(q, k, k, mask=mask)
    assert output.dtype == weights.dtype == np.float32
    np.testing.assert_array_equal(output[:, 1], 0.0)
    np.testing.assert_array_equal(weights[:, 1], 0.0)


def test_grouped_attention_rejects_head_counts_that_do_not_divide():
    with pytest.raises(ValueError, match=r"^q has 4 heads, not a multiple of the 3 key/value"):
        grouped_attention(np.ones((4, 2, 3)), np.ones((3, 2, 3)), np.ones((3, 2, 3)))
    with pytest.raises(ValueError, match=r"^k has 2 heads but v has 1"):
        grouped_attention(np.ones((4, 2, 3)), np.ones((2, 2, 3)), np.ones((1, 2, 3)))


def test_grouped_attention_rejects_a_non_boolean_mask_naming_mask():
    with pytest.raises(TypeError, match=r"^mask must be boolean"):
        grouped_attention(np.ones((4, 2, 3)), np.ones((2, 2, 3)), np.ones((2, 2, 3)),
                          mask=np.ones((2, 2)))


def test_grouped_attention_rejects_a_mask_that_does_not_broadcast_naming_mask():
    # A (2, Tq, Tk) mask puts 2 on the head axis, which has 4 query heads: it must not
    # broadcast, and the error should say so about the mask (as scaled_dot_product_attention
    # does), not come from a reshape deep inside.
    with pytest.raises(ValueError, match=r"^mask"):
        grouped_attention(np.ones((4, 3, 2)), np.ones((2, 5, 2)), np.ones((2, 5, 2)),
                          mask=np.ones((2, 3, 5), dtype=bool))


# --------------------------------------------------------------------------- MultiHeadAttention


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (4, 1), (6, 3), (6, 2)])
@pytest.mark.parametrize("masked", [False, True])
def test_gqa_layer_equals_the_np_repeat_reference(num_heads, num_kv_heads, masked):
    mha = random_gqa(24, num_heads, num_kv_heads, seed=num_heads * 10 + num_kv_heads)
    x = np.random.default_rng(7).normal(size=(2, 5, 24))
    mask = (causal_mask(5) & padding_mask([5, 3], 5)) if masked else None
    output, weights = mha(x, mask=mask)
    expected_output, expected_weights = repeat_kv_reference(mha, x, mask)
    assert output.shape == (2, 5, 24) and weights.shape == (2, num_heads, 5, 5)
    np.testing.assert_allclose(output, expected_output, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(weights, expected_weights, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (8, 1), (6, 3)])
def test_gqa_layer_equals_multi_head_with_each_kv_head_copied_for_its_group(num_heads,
                                                                              num_kv_heads):
    mha = random_gqa(24, num_heads, num_kv_heads, seed=5)
    x = np.random.default_rng(8).normal(size=(3, 7, 24))
    for got, expected in zip(mha(x, mask=causal_mask(7)),
                             expand_to_multi_head(mha)(x, mask=causal_mask(7))):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_num_kv_heads_equal_to_num_heads_is_ordinary_multi_head_attention():
    # The same weights in a layer built without num_kv_heads: identical results, and both
    # equal a per-head loop over plain scaled dot-product attention.
    gqa = random_gqa(12, 3, 3, seed=9)
    assert gqa.num_kv_heads == 3 and gqa.W_k.shape == (12, 12)
    plain = MultiHeadAttention(**{name: getattr(gqa, name) for name in NAMES}, num_heads=3)
    assert plain.num_kv_heads == 3
    x = np.random.default_rng(10).normal(size=(2, 4, 12))
    output, weights = gqa(x)
    np.testing.assert_array_equal(output, plain(x)[0])
    heads = []
    for h in range(3):
        cols = slice(4 * h, 4 * h + 4)
        head, head_weights = scaled_dot_product_attention(
            x @ gqa.W_q[:, cols] + gqa.b_q[cols], x @ gqa.W_k[:, cols] + gqa.b_k[cols],
            x @ gqa.W_v[:, cols] + gqa.b_v[cols])
        np.testing.assert_allclose(weights[:, h], head_weights, rtol=1e-12)
        heads.append(head)
    np.testing.assert_allclose(output, np.concatenate(heads, -1) @ gqa.W_o + gqa.b_o,
                               rtol=1e-12, atol=1e-12)


def test_init_with_num_kv_heads_makes_smaller_key_and_value_projections():
    mha = MultiHeadAttention.init(32, 8, np.random.default_rng(0), num_kv_heads=2)
    assert mha.W_q.shape == mha.W_o.shape == (32, 32)
    assert mha.W_k.shape == mha.W_v.shape == (32, 8)  # 2 kv heads of d_head 4
    assert mha.b_k.shape == mha.b_v.shape == (8,)
    output, weights = mha(np.ones((5, 32)))
    assert output.shape == (5, 32) and weights.shape == (8, 5, 5)


def test_a_float32_gqa_layer_gives_float32():
    mha = random_gqa(16, 4, 2, dtype=np.float32)
    output, weights = mha(np.ones((3, 16), dtype=np.float32))
    assert output.dtype == weights.dtype == np.float32


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 3), (6, 4), (8, 16)])
def test_num_heads_not_a_multiple_of_num_kv_heads_raises_naming_both(num_heads, num_kv_heads):
    pattern = rf"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}"
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention.init(48, num_heads, rng, num_kv_heads=num_kv_heads)
    parameters = {name: getattr(MultiHeadAttention.init(48, num_heads, rng), name)
                  for name in NAMES}
    with pytest.raises(ValueError, match=pattern):
        MultiHeadAttention(**parameters, num_heads=num_heads, num_kv_heads=num_kv_heads)


@pytest.mark.parametrize(("value", "error"), [(0, ValueError), (2.0, TypeError)])
def test_a_num_kv_heads_that_is_not_a_positive_integer_raises_naming_it(value, error):
    with pytest.raises(error, match=r"^num_kv_heads must be"):
        MultiHeadAttention.init(8, 2, np.random.default_rng(0), num_kv_heads=value)


def test_a_w_k_sized_for_every_head_in_a_gqa_layer_raises_naming_w_k_and_num_kv_heads():
    parameters = {name: getattr(MultiHeadAttention.init(16, 4, np.random.default_rng(0)), name)
                  for name in NAMES}  # W_k is (16, 16): right for 4 kv heads, not for 2
    with pytest.raises(ValueError, match=r"^W_k must have shape \(16, 8\).*num_kv_heads=2"):
        MultiHeadAttention(**parameters, num_heads=4, num_kv_heads=2)


# --------------------------------------------------------------------------- the KV cache


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(8, 8), (8, 4), (8, 2), (8, 1),
                                                         (9, 3)])
def test_the_cache_of_a_gqa_layer_is_num_heads_over_num_kv_heads_times_smaller(num_heads,
                                                                               num_kv_heads):
    d_head, layers, capacity = 4, 3, 32
    full = KVCache.init(layers, num_heads, capacity, d_head, batch_shape=(2,))
    grouped = KVCache.init(layers, num_kv_heads, capacity, d_head, batch_shape=(2,))
    assert full.nbytes == grouped.nbytes * (num_heads // num_kv_heads)
    assert grouped.nbytes == 2 * layers * 2 * num_kv_heads * capacity * d_head * 8
    # ... and that small cache is the one the layer fills: append takes kv heads only.
    mha = random_gqa(num_heads * d_head, num_heads, num_kv_heads)
    x = np.random.default_rng(1).normal(size=(2, 5, num_heads * d_head))
    mha(x, mask=causal_mask(5), cache=grouped.layer(0))
    assert grouped.lengths.tolist() == [5, 0, 0]


def test_a_cache_with_a_slot_for_every_query_head_does_not_fit_a_gqa_layer():
    mha = random_gqa(16, 4, 2)
    cache = KVCache.init(1, 4, 8, 4)
    with pytest.raises(ValueError, match=r"does not fit the cache"):
        mha(np.ones((3, 16)), mask=causal_mask(3), cache=cache.layer(0))


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 2), (4, 1), (6, 3)])
@pytest.mark.parametrize("chunks", [[1] * 7, [4, 1, 2], [7]], ids=["steps", "mixed", "one"])
@pytest.mark.parametrize("rope_base", [None, 10000.0], ids=["no-rope", "rope"])
def test_cached_gqa_attention_equals_the_rows_of_full_causal_attention(num_heads, num_kv_heads,
                                                                       chunks, rope_base):
    mha = random_gqa(24, num_heads, num_kv_heads, seed=3, rope_base=rope_base)
    T = sum(chunks)
    x = np.random.default_rng(4).normal(size=(2, T, 24))
    full, _ = mha(x, mask=causal_mask(T))
    cache = KVCache.init(1, num_kv_heads, T, 24 // num_heads, batch_shape=(2,))
    start = 0
    for size in chunks:
        output, weights = mha(x[..., start:start + size, :],
                              mask=causal_mask(size, start + size), cache=cache.layer(0))
        assert weights.shape == (2, num_heads, size, start + size)
        np.testing.assert_allclose(output, full[..., start:start + size, :], rtol=1e-12,
                                   atol=1e-12)
        start += size


def gqa_language_model(num_kv_heads, seed=0):
    """A DecoderOnlyLM whose blocks use grouped-query attention (4 query heads, d_model 16)."""
    rng = np.random.default_rng(seed)
    model = DecoderOnlyLM.init(23, 16, 4, 32, 2, rng)
    for index, block in enumerate(model.blocks):
        block.self_attn = random_gqa(16, 4, num_kv_heads, seed=seed * 10 + index)
    return model


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_new_cache_of_a_gqa_model_holds_only_the_kv_heads(num_kv_heads):
    cache = gqa_language_model(num_kv_heads).new_cache((3,), capacity=10)
    assert cache.keys.shape == (2, 3, num_kv_heads, 10, 4)  # (layers, batch, H_kv, T, d_head)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("chunks", [[1] * 8, [5, 1, 1, 1], [3, 2, 3]])
def test_decoding_a_gqa_model_with_its_cache_gives_the_full_forward_logits(num_kv_heads, chunks):
    model = gqa_language_model(num_kv_heads, seed=1)
    tokens = np.random.default_rng(2).integers(0, 23, size=(2, 8))
    full = model(tokens)
    cache = model.new_cache((2,), capacity=8)
    logits, start = [], 0
    for size in chunks:
        logits.append(model(tokens[..., start:start + size], cache=cache))
        start += size
    np.testing.assert_allclose(np.concatenate(logits, axis=-2), full, rtol=1e-10, atol=1e-10)
