"""Checked entries and trusted kernels (issue 13): the layers check their inputs once, at the
door, and the kernels behind them give the same values; attention without its weights."""

import numpy as np
import pytest

from attention_lib import (
    DecoderOnlyLM,
    Encoder,
    EncoderBlock,
    MultiHeadAttention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
)
from attention_lib.attention import _attend, _attend_by_query_blocks
from attention_lib.cache import KVCache


def layer(d_model=16, heads=4, kv_heads=None, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    mha = MultiHeadAttention.init(d_model, heads, rng, dtype=dtype, num_kv_heads=kv_heads)
    for name in ("b_q", "b_k", "b_v", "b_o"):  # non-zero biases, so they are tested too
        setattr(mha, name, rng.normal(size=getattr(mha, name).shape).astype(dtype))
    return mha


# ------------------------------------------------------------------ without the weights


@pytest.mark.parametrize("kv_heads", [None, 2, 1])
@pytest.mark.parametrize("T", [5, 128, 129, 300])
def test_attention_without_weights_equals_the_default_path(kv_heads, T):
    mha = layer(kv_heads=kv_heads)
    x = np.random.default_rng(1).normal(size=(2, T, 16))
    mask = causal_mask(T)
    output, weights = mha(x, mask=mask)
    fast, none = mha(x, mask=mask, need_weights=False)
    assert none is None
    np.testing.assert_allclose(fast, output, rtol=1e-12, atol=1e-13)


def test_query_blocks_slice_every_kind_of_mask_and_bias_the_same_way():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(2, 3, 300, 8)), rng.normal(size=(2, 3, 200, 8)), \
        rng.normal(size=(2, 3, 200, 5))
    masks = [None, rng.random(200) > 0.3,  # (Tk,)
             rng.random((300, 200)) > 0.3,  # (Tq, Tk)
             rng.random((2, 1, 1, 200)) > 0.3,  # per sequence, every query
             rng.random((3, 300, 1)) > 0.3]  # per head and query, every key
    bias = rng.normal(size=(3, 300, 200))
    for mask in masks:
        for b in (None, bias):
            expected = _attend(q, k, v, 0.3, mask, b)[0]
            got = _attend_by_query_blocks(q, k, v, 0.3, mask, b, block_q=64)
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)


def test_attention_without_weights_stores_no_full_weight_matrix():
    from attention_lib.flash import peak_extra_bytes

    mha = layer(d_model=32, heads=2, dtype=np.float32)
    x = np.random.default_rng(3).normal(size=(1, 2048, 32)).astype(np.float32)
    one_weight_matrix = 2 * 2048 * 2048 * 4  # H * T * T float32
    assert peak_extra_bytes(lambda: mha(x)) > one_weight_matrix
    assert peak_extra_bytes(lambda: mha(x, need_weights=False)) < one_weight_matrix / 4


def test_a_cached_step_without_weights_equals_the_step_with_them():
    mha = layer(kv_heads=2)
    mha.rope_base = 10_000.0
    x = np.random.default_rng(4).normal(size=(1, 7, 16))
    caches = [KVCache.init(1, 2, 16, 4, (1,)).layer(0) for _ in range(2)]
    for start, stop in ((0, 5), (5, 6), (6, 7)):
        mask = causal_mask(stop - start, stop)
        with_weights = mha(x[:, start:stop], mask=mask, cache=caches[0])[0]
        without = mha(x[:, start:stop], mask=mask, cache=caches[1], need_weights=False)[0]
        np.testing.assert_allclose(without, with_weights, rtol=1e-12, atol=1e-13)


# ------------------------------------------------------------------ blocks


@pytest.mark.parametrize("norm_first", [False, True])
def test_a_block_returns_the_weights_of_its_attention_when_asked(norm_first):
    block = EncoderBlock.init(16, 4, 32, np.random.default_rng(5), norm_first=norm_first)
    x = np.random.default_rng(6).normal(size=(2, 6, 16))
    mask = padding_mask([6, 3], 6)
    output, weights = block(x, mask=mask, return_weights=True)
    attention_input = block.norm1(x) if norm_first else x
    np.testing.assert_array_equal(weights, block.self_attn(attention_input, mask=mask)[1])
    np.testing.assert_allclose(output, block(x, mask=mask), rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(weights[1, :, :, 3:], 0)  # padded keys get no weight


def test_a_stack_checks_its_input_once_with_the_layers_message():
    encoder = Encoder([EncoderBlock.init(16, 4, 32, np.random.default_rng(7))])
    with pytest.raises(ValueError, match=r"x has 15 features but the layer has d_model=16"):
        encoder(np.ones((2, 3, 15)))
    with pytest.raises(ValueError, match=r"x contains NaN or inf"):
        encoder(np.full((2, 3, 16), np.nan))
    with pytest.raises(TypeError, match="mask must be boolean"):
        encoder(np.ones((2, 3, 16)), mask=np.ones((3, 3)))


def test_decoder_only_lm_returns_every_layers_weights_from_its_own_blocks():
    model = DecoderOnlyLM.init(11, 16, 4, 32, 2, np.random.default_rng(8))
    tokens = np.array([[1, 2, 3, 4]])
    logits, attention = model.forward(tokens, return_attention=True)
    np.testing.assert_array_equal(logits, model(tokens))
    assert attention.shape == (2, 1, 4, 4, 4)
    x = model.embed(tokens)
    first = model.blocks[0].self_attn(model.blocks[0].norm1(x), mask=causal_mask(4))[1]
    np.testing.assert_array_equal(attention[0], first)


# ------------------------------------------------------------------ overflow, found for free


def test_scores_that_overflow_to_minus_inf_in_an_unmasked_row_raise():
    q = np.full((1, 2), -250.0, dtype=np.float16)
    k = np.full((3, 2), 250.0, dtype=np.float16)
    # every score is -250 * 250 * 2 / sqrt(2) = -88,388: below float16's range (-65,504)
    with pytest.raises(ValueError, match="overflowed float16"):
        scaled_dot_product_attention(q, k, k)


def test_a_fully_masked_row_is_not_mistaken_for_an_overflow():
    q = np.full((2, 2), -200.0, dtype=np.float16)
    k = np.full((3, 2), 0.001, dtype=np.float16)
    mask = np.array([[False, False, False], [True, True, False]])
    output, weights = scaled_dot_product_attention(q, k, k, mask=mask)
    np.testing.assert_array_equal(weights[0], 0)
    np.testing.assert_allclose(weights[1], [0.5, 0.5, 0], rtol=1e-3)


def test_the_softmax_kernel_gives_what_the_checked_softmax_gives():
    from attention_lib.softmax import _softmax_in_place

    x = np.random.default_rng(9).normal(size=(4, 7)) * 30
    x[1] = -np.inf
    x[2, :3] = -np.inf
    np.testing.assert_array_equal(_softmax_in_place(x.copy()), softmax(x))


def test_query_blocks_on_two_threads_give_the_serial_result_and_restore_blas():
    # The test command runs BLAS on one thread, where the blocks run serially; allow two, so
    # that the thread pool runs, with BLAS limited to one thread per block meanwhile.
    from threadpoolctl import threadpool_info, threadpool_limits

    from attention_lib import attention

    rng = np.random.default_rng(10)
    q, k, v = rng.normal(size=(2, 3, 700, 8)), rng.normal(size=(2, 3, 500, 8)), \
        rng.normal(size=(2, 3, 500, 6))
    mask = rng.random((700, 500)) > 0.2
    expected = _attend(q, k, v, 0.4, mask)[0]
    seen = []
    with threadpool_limits(limits=2, user_api="blas"):
        original = attention._attend

        def spy(*args):
            seen.append([lib["num_threads"] for lib in threadpool_info()
                         if lib["user_api"] == "blas"])
            return original(*args)

        attention._attend = spy
        try:
            got = attention._attend_by_query_blocks(q, k, v, 0.4, mask, block_q=128)
        finally:
            attention._attend = original
        after = [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-13)
    # 6 blocks, each computed while every BLAS library (NumPy's, and SciPy's if loaded) has
    # one thread; the limit is lifted when the pool is done.
    assert len(seen) == 6 and all(set(threads) == {1} for threads in seen), seen
    assert set(after) == {2}, after
