"""Encoder and decoder blocks, stacks, token embedding and whole models (chapters 08-10).

Every block is compared with a reference written here from scratch (its own LayerNorm, a
per-head attention loop, its own feed-forward network), for both post-LN and pre-LN, with ALL
parameters random (biases, gammas and betas included) so that a dropped term shows. Whole
models are checked for the properties that make them usable: causality of the target and
invisibility of padded source tokens.
"""

import dataclasses
import math
import warnings

import numpy as np
import pytest
from model_helpers import randomize

from attention_lib import (
    Decoder,
    DecoderBlock,
    DecoderOnlyLM,
    Encoder,
    EncoderBlock,
    EncoderDecoder,
    FeedForward,
    KVCache,
    LayerNorm,
    MultiHeadAttention,
    causal_mask,
    count_parameters,
    embed_tokens,
    padding_mask,
)

NORM_FIRST = pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
ACTIVATION = pytest.mark.parametrize("activation", ["relu", "gelu"])




def encoder_block(d_model, num_heads, d_ff, seed, *, norm_first=False, activation="relu"):
    rng = np.random.default_rng(seed)
    block = EncoderBlock.init(d_model, num_heads, d_ff, rng, norm_first=norm_first,
                              activation=activation)
    return randomize(block, rng)


def decoder_block(d_model, num_heads, d_ff, seed, *, norm_first=False, activation="relu"):
    rng = np.random.default_rng(seed)
    block = DecoderBlock.init(d_model, num_heads, d_ff, rng, norm_first=norm_first,
                              activation=activation)
    return randomize(block, rng)


# --------------------------------------------------------------------------- references


def ref_layer_norm(x, norm):
    mean = x.sum(axis=-1, keepdims=True) / x.shape[-1]
    variance = ((x - mean) ** 2).sum(axis=-1, keepdims=True) / x.shape[-1]
    return (x - mean) / np.sqrt(variance + norm.eps) * norm.gamma + norm.beta


def ref_attention(mha, x, context, mask):
    """Multi-head attention with one head at a time in a Python loop."""
    d_head = mha.d_model // mha.num_heads
    q = x @ mha.W_q + mha.b_q
    k = context @ mha.W_k + mha.b_k
    v = context @ mha.W_v + mha.b_v
    heads = []
    for h in range(mha.num_heads):
        cols = slice(h * d_head, (h + 1) * d_head)
        scores = q[..., cols] @ np.swapaxes(k[..., cols], -1, -2) / math.sqrt(d_head)
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights = weights / weights.sum(axis=-1, keepdims=True)
        heads.append(weights @ v[..., cols])
    return np.concatenate(heads, axis=-1) @ mha.W_o + mha.b_o


def ref_feed_forward(x, ff):
    pre = x @ ff.W1 + ff.b1
    if ff.activation == "relu":
        hidden = np.where(pre > 0, pre, 0.0)
    else:
        assert ff.activation == "gelu"
        hidden = 0.5 * pre * (1 + np.vectorize(math.erf)(pre / math.sqrt(2)))
    return hidden @ ff.W2 + ff.b2


def ref_encoder_block(block, x, mask):
    if block.norm_first:
        x = x + ref_attention(block.self_attn, ref_layer_norm(x, block.norm1),
                              ref_layer_norm(x, block.norm1), mask)
        return x + ref_feed_forward(ref_layer_norm(x, block.norm2), block.ff)
    x = ref_layer_norm(x + ref_attention(block.self_attn, x, x, mask), block.norm1)
    return ref_layer_norm(x + ref_feed_forward(x, block.ff), block.norm2)


def ref_decoder_block(block, x, memory, self_mask, memory_mask):
    if block.norm_first:
        normed = ref_layer_norm(x, block.norm1)
        x = x + ref_attention(block.self_attn, normed, normed, self_mask)
        x = x + ref_attention(block.cross_attn, ref_layer_norm(x, block.norm2), memory,
                              memory_mask)
        return x + ref_feed_forward(ref_layer_norm(x, block.norm3), block.ff)
    x = ref_layer_norm(x + ref_attention(block.self_attn, x, x, self_mask), block.norm1)
    x = ref_layer_norm(x + ref_attention(block.cross_attn, x, memory, memory_mask), block.norm2)
    return ref_layer_norm(x + ref_feed_forward(x, block.ff), block.norm3)


def ref_sinusoidal(T, d):
    pe = np.zeros((T, d))
    for t in range(T):
        for i in range(d):
            angle = t / 10000 ** (2 * (i // 2) / d)
            pe[t, i] = math.sin(angle) if i % 2 == 0 else math.cos(angle)
    return pe


# --------------------------------------------------------------------------- EncoderBlock

MASKS = ["none", "causal", "padding", "causal+padding"]


def make_mask(kind, lengths, T):
    mask = None
    if "causal" in kind:
        mask = causal_mask(T)
    if "padding" in kind:
        pad = padding_mask(lengths, T)
        mask = pad if mask is None else mask & pad
    return mask


@NORM_FIRST
@ACTIVATION
@pytest.mark.parametrize("mask_kind", MASKS)
def test_encoder_block_equals_a_manual_composition(norm_first, activation, mask_kind):
    block = encoder_block(12, 3, 20, 0, norm_first=norm_first, activation=activation)
    x = np.random.default_rng(100).normal(size=(2, 5, 12))
    mask = make_mask(mask_kind, [5, 3], 5)
    out = block(x, mask=mask)
    assert out.shape == x.shape
    np.testing.assert_allclose(out, ref_encoder_block(block, x, mask), rtol=1e-12, atol=1e-12)


def test_post_ln_and_pre_ln_encoder_blocks_differ():
    # The same weights, wired two ways: the manual-composition test above could not tell
    # the two apart if they happened to agree.
    post = encoder_block(8, 2, 16, 1, norm_first=False)
    pre = dataclasses.replace(post, norm_first=True)
    x = np.random.default_rng(101).normal(size=(3, 8))
    assert not np.allclose(post(x), pre(x), atol=1e-3)
    # post-LN ends with a LayerNorm: every output token has mean beta.mean(), pre-LN need not.
    np.testing.assert_allclose(
        ((post(x) - post.norm2.beta) / post.norm2.gamma).mean(axis=-1), 0.0, atol=1e-12)


def test_encoder_block_works_on_a_single_unbatched_sequence():
    block = encoder_block(8, 4, 16, 2, norm_first=True)
    x = np.random.default_rng(102).normal(size=(2, 4, 8))
    np.testing.assert_allclose(block(x[1]), block(x)[1], rtol=1e-12, atol=1e-12)


def test_encoder_block_init_uses_the_requested_options():
    block = EncoderBlock.init(8, 2, 32, np.random.default_rng(3), activation="gelu",
                              norm_first=True, eps=1e-6, dtype=np.float32)
    assert block.norm_first is True and block.ff.activation == "gelu"
    assert block.norm1.eps == block.norm2.eps == 1e-6
    assert block.ff.W1.shape == (8, 32) and block.self_attn.num_heads == 2
    assert block(np.ones((3, 8), dtype=np.float32)).dtype == np.float32


# --------------------------------------------------------------------------- DecoderBlock


@NORM_FIRST
@ACTIVATION
@pytest.mark.parametrize("masks", ["none", "causal", "memory-padding", "both"])
def test_decoder_block_equals_a_manual_composition(norm_first, activation, masks):
    block = decoder_block(12, 4, 24, 4, norm_first=norm_first, activation=activation)
    rng = np.random.default_rng(103)
    x, memory = rng.normal(size=(2, 4, 12)), rng.normal(size=(2, 6, 12))
    self_mask = causal_mask(4) if masks in ("causal", "both") else None
    memory_mask = padding_mask([6, 2], 6) if masks in ("memory-padding", "both") else None
    out = block(x, memory, self_mask=self_mask, memory_mask=memory_mask)
    assert out.shape == x.shape
    expected = ref_decoder_block(block, x, memory, self_mask, memory_mask)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_decoder_block_output_depends_on_the_memory():
    block = decoder_block(8, 2, 16, 5)
    rng = np.random.default_rng(104)
    x, memory = rng.normal(size=(3, 8)), rng.normal(size=(5, 8))
    assert not np.allclose(block(x, memory), block(x, memory + 1.0), atol=1e-3)


# --------------------------------------------------------------------------- stacks


@NORM_FIRST
def test_encoder_applies_its_layers_in_order_then_the_final_norm(norm_first):
    blocks = [encoder_block(8, 2, 16, seed, norm_first=norm_first) for seed in (6, 7)]
    final_norm = randomize(LayerNorm.init(8), np.random.default_rng(8))
    x = np.random.default_rng(105).normal(size=(2, 5, 8))
    mask = padding_mask([5, 2], 5)
    expected = final_norm(blocks[1](blocks[0](x, mask=mask), mask=mask))
    np.testing.assert_allclose(Encoder(blocks, final_norm)(x, mask=mask), expected,
                               rtol=1e-13, atol=1e-13)
    # without a final norm, just the blocks
    np.testing.assert_allclose(Encoder(blocks)(x, mask=mask),
                               blocks[1](blocks[0](x, mask=mask), mask=mask),
                               rtol=1e-13, atol=1e-13)
    # and the order matters, so the test above would notice the wrong one
    reversed_order = final_norm(blocks[0](blocks[1](x, mask=mask), mask=mask))
    assert not np.allclose(expected, reversed_order, atol=1e-3)


@NORM_FIRST
def test_decoder_applies_its_layers_in_order_then_the_final_norm(norm_first):
    blocks = [decoder_block(8, 2, 16, seed, norm_first=norm_first) for seed in (9, 10)]
    final_norm = randomize(LayerNorm.init(8), np.random.default_rng(11))
    rng = np.random.default_rng(106)
    x, memory = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 6, 8))
    self_mask, memory_mask = causal_mask(4), padding_mask([6, 3], 6)

    def run(order):
        h = x
        for block in order:
            h = block(h, memory, self_mask=self_mask, memory_mask=memory_mask)
        return h

    kwargs = {"self_mask": self_mask, "memory_mask": memory_mask}
    np.testing.assert_allclose(Decoder(blocks, final_norm)(x, memory, **kwargs),
                               final_norm(run(blocks)), rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(Decoder(blocks)(x, memory, **kwargs), run(blocks),
                               rtol=1e-13, atol=1e-13)
    assert not np.allclose(run(blocks), run(blocks[::-1]), atol=1e-3)


# --------------------------------------------------------------------------- embed_tokens


def test_embed_tokens_is_lookup_times_sqrt_d_plus_sinusoidal_positions():
    rng = np.random.default_rng(12)
    embedding = rng.normal(size=(11, 6))
    tokens = np.array([[3, 0, 10, 3, 7], [1, 2, 2, 9, 4]])
    expected = embedding[tokens] * math.sqrt(6) + ref_sinusoidal(5, 6)
    result = embed_tokens(embedding, tokens)
    assert result.shape == (2, 5, 6)
    np.testing.assert_allclose(result, expected, rtol=1e-13, atol=1e-13)


def test_embed_tokens_with_a_start_offset_equals_slicing_a_longer_encoding():
    rng = np.random.default_rng(13)
    embedding = rng.normal(size=(9, 8))
    tokens = rng.integers(0, 9, size=(2, 7))
    full = embed_tokens(embedding, tokens)
    for start in (1, 3, 6):
        np.testing.assert_allclose(embed_tokens(embedding, tokens[:, start:], start=start),
                                   full[:, start:], rtol=1e-13, atol=1e-13)
    # the positions really are part of it: the same token at two positions differs
    assert not np.allclose(embed_tokens(embedding, [5], start=0),
                           embed_tokens(embedding, [5], start=1))


def test_embed_tokens_keeps_a_float32_embedding_float32():
    embedding = np.random.default_rng(14).normal(size=(5, 4)).astype(np.float32)
    assert embed_tokens(embedding, [[0, 4, 2]]).dtype == np.float32


def test_embed_tokens_of_an_empty_batch_is_an_empty_array_like_the_layers():
    # a (0, T) batch has no ids to check; it embeds to (0, T, d_model), as LayerNorm and
    # attention return an empty batch for an empty batch.
    embedding = np.random.default_rng(15).normal(size=(5, 4)).astype(np.float32)
    result = embed_tokens(embedding, np.zeros((0, 3), dtype=np.int64), start=2)
    assert result.shape == (0, 3, 4) and result.dtype == np.float32
    assert LayerNorm.init(4)(result).shape == (0, 3, 4)


@pytest.mark.parametrize(("bad", "shown"), [([0, -1, 2], "-1"), ([0, 5, 2], "5")],
                         ids=["negative", "too-large"])
def test_embed_tokens_rejects_ids_outside_the_vocabulary_naming_tokens(bad, shown):
    embedding = np.zeros((5, 4))
    with pytest.raises(ValueError, match=r"\btokens\b") as info:
        embed_tokens(embedding, np.array(bad))
    message = str(info.value)
    assert "5" in message and shown in message


def test_embed_tokens_rejects_a_scalar_token_id_naming_tokens():
    # tokens must be (..., T); a 0-d id has no sequence axis.
    with pytest.raises((ValueError, TypeError), match=r"\btokens\b"):
        embed_tokens(np.zeros((5, 4)), np.int64(3))


def test_embed_tokens_rejects_an_embedding_that_is_not_2d_naming_embedding():
    with pytest.raises((ValueError, TypeError), match=r"\bembedding\b.*\(5,\)"):
        embed_tokens(np.zeros(5), np.array([1, 2]))


def test_embed_tokens_rejects_float_token_ids_naming_tokens():
    with pytest.raises(TypeError, match=r"\btokens\b.*float64"):
        embed_tokens(np.zeros((5, 4)), np.array([0.0, 1.0]))


# --------------------------------------------------------------------------- no attention


@NORM_FIRST
def test_a_block_without_attention_is_its_feed_forward_sub_layer_alone(norm_first):
    rng = np.random.default_rng(120)
    block = randomize(EncoderBlock.init(8, 2, 12, rng, norm_first=norm_first,
                                        attention=False), rng)
    assert block.self_attn is None and block.norm1 is None
    x = rng.normal(size=(2, 5, 8))
    ff, norm = block.ff, block.norm2
    expected = x + ff(norm(x)) if norm_first else norm(x + ff(x))
    np.testing.assert_allclose(block(x), expected, rtol=1e-14, atol=1e-15)
    # each position on its own: a mask changes nothing, and there are no weights
    output, weights = block(x, mask=causal_mask(5), return_weights=True)
    np.testing.assert_allclose(output, expected, rtol=1e-14, atol=1e-15)
    assert weights is None
    np.testing.assert_allclose(block(x[:, 3:4]), expected[:, 3:4], rtol=1e-14, atol=1e-15)


def test_with_or_without_attention_the_feed_forward_weights_are_the_same_draws():
    with_attention = EncoderBlock.init(8, 2, 12, np.random.default_rng(121))
    without = EncoderBlock.init(8, 2, 12, np.random.default_rng(121), attention=False)
    np.testing.assert_array_equal(without.ff.W1, with_attention.ff.W1)
    np.testing.assert_array_equal(without.ff.W2, with_attention.ff.W2)


def test_a_block_without_attention_checks_x_and_refuses_half_an_attention_sub_layer():
    block = EncoderBlock.init(8, 2, 12, np.random.default_rng(122), attention=False)
    with pytest.raises(ValueError, match=r"x has 6 features.*expects 8"):
        block(np.zeros((2, 5, 6)))
    with pytest.raises(ValueError, match="no keys and values to cache"):
        block(np.zeros((2, 5, 8)), cache=KVCache.init(1, 2, 8, 4).layer(0))
    with pytest.raises(ValueError, match="self_attn and norm1 go together"):
        dataclasses.replace(block, norm1=LayerNorm.init(8))


# --------------------------------------------------------------------------- EncoderDecoder


def encoder_decoder(seed, norm_first=False):
    rng = np.random.default_rng(seed)
    model = EncoderDecoder.init(13, 17, 8, 2, 16, 2, rng, norm_first=norm_first)
    return randomize(model, rng)


@NORM_FIRST
def test_encoder_decoder_logits_of_a_padded_batch_equal_each_source_run_alone(norm_first):
    model = encoder_decoder(15, norm_first)
    rng = np.random.default_rng(107)
    source, target = rng.integers(0, 13, size=(3, 6)), rng.integers(0, 17, size=(3, 4))
    lengths = np.array([6, 1, 4])
    logits = model(source, target, source_lengths=lengths)
    assert logits.shape == (3, 4, 17) and logits.dtype == np.float64
    # padding is invisible: each sequence alone, cut to its length, gives the same logits
    for b, length in enumerate(lengths):
        alone = model(source[b:b + 1, :length], target[b:b + 1])
        np.testing.assert_allclose(logits[b:b + 1], alone, rtol=1e-10, atol=1e-12)
    assert (model.encoder.norm is not None) == norm_first
    assert (model.decoder.norm is not None) == norm_first


def test_encoder_decoder_equals_its_parts_composed_by_hand():
    model = encoder_decoder(16, norm_first=True)
    rng = np.random.default_rng(108)
    source, target = rng.integers(0, 13, size=(2, 5)), rng.integers(0, 17, size=(2, 3))
    lengths = np.array([5, 2])
    memory_mask = padding_mask(lengths, 5)
    memory = model.encoder(embed_tokens(model.src_embedding, source), mask=memory_mask)
    hidden = model.decoder(embed_tokens(model.tgt_embedding, target), memory,
                           self_mask=causal_mask(3), memory_mask=memory_mask)
    np.testing.assert_allclose(model(source, target, lengths), hidden @ model.W_out,
                               rtol=1e-13, atol=1e-13)


@NORM_FIRST
def test_changing_a_future_target_token_does_not_change_earlier_logits(norm_first):
    model = encoder_decoder(17, norm_first)
    rng = np.random.default_rng(109)
    source, target = rng.integers(0, 13, size=(2, 5)), rng.integers(0, 17, size=(2, 6))
    logits = model(source, target)
    for t in range(6):
        changed = target.copy()
        changed[:, t] = (changed[:, t] + 1) % 17
        new_logits = model(source, changed)
        np.testing.assert_allclose(new_logits[:, :t], logits[:, :t], rtol=1e-12, atol=1e-12)
        assert not np.allclose(new_logits[:, t], logits[:, t], atol=1e-6)


@NORM_FIRST
def test_changing_a_padded_source_token_does_not_change_any_logits(norm_first):
    model = encoder_decoder(18, norm_first)
    rng = np.random.default_rng(110)
    source, target = rng.integers(0, 13, size=(2, 6)), rng.integers(0, 17, size=(2, 4))
    lengths = np.array([6, 3])
    logits = model(source, target, source_lengths=lengths)
    changed = source.copy()
    changed[1, 3:] = (changed[1, 3:] + 5) % 13  # only padding of sequence 1
    np.testing.assert_allclose(model(changed, target, source_lengths=lengths), logits,
                               rtol=1e-12, atol=1e-12)
    # Without the lengths the same change is visible: the mask is what hides it.
    assert not np.allclose(model(changed, target), model(source, target), atol=1e-6)
    # A real source token is visible to its own sequence only.
    real = source.copy()
    real[1, 2] = (real[1, 2] + 5) % 13
    new_logits = model(real, target, source_lengths=lengths)
    assert not np.allclose(new_logits[1], logits[1], atol=1e-6)
    np.testing.assert_allclose(new_logits[0], logits[0], rtol=1e-12, atol=1e-12)


def test_a_source_of_length_zero_gives_finite_logits_and_no_warning():
    # Every key of sequence 0 is padding: its encoder queries and the decoder's cross-attention
    # queries attend to nothing, which the library defines as a zero attention output.
    model = encoder_decoder(23)
    rng = np.random.default_rng(112)
    source, target = rng.integers(0, 13, size=(2, 4)), rng.integers(0, 17, size=(2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits = model(source, target, source_lengths=np.array([0, 4]))
    assert np.isfinite(logits).all()
    # with no visible source, sequence 0's logits do not depend on its source tokens
    np.testing.assert_allclose(model(source[::-1], target, source_lengths=np.array([0, 4]))[0],
                               logits[0], rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- DecoderOnlyLM


def decoder_only_lm(seed, vocab=19):
    rng = np.random.default_rng(seed)
    return randomize(DecoderOnlyLM.init(vocab, 8, 2, 16, 2, rng), rng)


def test_decoder_only_lm_equals_its_parts_composed_by_hand():
    model = decoder_only_lm(19)
    tokens = np.random.default_rng(111).integers(0, 19, size=(2, 5))
    x = embed_tokens(model.embedding, tokens)
    for block in model.blocks:
        assert block.norm_first  # GPT-style pre-LN blocks
        x = block(x, mask=causal_mask(5))
    np.testing.assert_allclose(model(tokens), model.norm(x) @ model.W_out,
                               rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("seed", [20, 21])
@pytest.mark.parametrize("batch_shape", [(), (2,)], ids=["unbatched", "batch-2"])
def test_decoder_only_lm_is_causal_changing_token_t_changes_no_earlier_logits(seed, batch_shape):
    model = decoder_only_lm(seed)
    T = 6
    tokens = np.random.default_rng(seed + 100).integers(0, 19, size=(*batch_shape, T))
    logits = model(tokens)
    assert logits.shape == (*batch_shape, T, 19)
    for t in range(T):
        changed = tokens.copy()
        changed[..., t] = (changed[..., t] + 1) % 19
        new_logits = model(changed)
        np.testing.assert_allclose(new_logits[..., :t, :], logits[..., :t, :],
                                   rtol=1e-12, atol=1e-12)
        assert not np.allclose(new_logits[..., t:, :], logits[..., t:, :], atol=1e-6)


def test_layers_built_by_init_hold_the_documented_shapes():
    model = EncoderDecoder.init(7, 9, 8, 2, 16, 3, np.random.default_rng(22))
    assert model.src_embedding.shape == (7, 8) and model.tgt_embedding.shape == (9, 8)
    assert model.W_out.shape == (8, 9)
    assert len(model.encoder.layers) == len(model.decoder.layers) == 3
    assert all(isinstance(layer.self_attn, MultiHeadAttention) for layer in model.encoder.layers)
    assert all(isinstance(layer.ff, FeedForward) for layer in model.decoder.layers)
    with pytest.raises(ValueError, match="num_layers"):
        EncoderDecoder.init(7, 9, 8, 2, 16, 0, np.random.default_rng(22))


# --------------------------------------------------------------------------- count_parameters


def test_count_parameters_of_an_encoder_block_is_the_hand_formula():
    # attention 4 d^2 + 4 d, feed-forward 2 d d_ff + d_ff + d, two norms 4 d.
    d, d_ff = 8, 20
    block = EncoderBlock.init(d, 2, d_ff, np.random.default_rng(0))
    expected = (4 * d * d + 4 * d) + (2 * d * d_ff + d_ff + d) + 4 * d
    assert count_parameters(block) == expected == 668
    assert count_parameters(block.self_attn, block.ff) == expected - 4 * d


def test_count_parameters_walks_lists_of_blocks_and_whole_models():
    d, d_ff, vocab = 8, 20, 11
    rng = np.random.default_rng(1)
    per_block = count_parameters(EncoderBlock.init(d, 2, d_ff, rng))
    model = DecoderOnlyLM.init(vocab, d, 2, d_ff, 3, rng)
    # embedding (V, d), 3 blocks, final norm 2 d, W_out (d, V)
    assert count_parameters(model) == vocab * d + 3 * per_block + 2 * d + d * vocab
    assert count_parameters([model.blocks[0].norm1, model.norm]) == 4 * d


def test_count_parameters_counts_an_array_held_twice_once():
    block = EncoderBlock.init(8, 2, 20, np.random.default_rng(2))
    assert count_parameters(block, block) == count_parameters(block) == 668
    assert count_parameters([block.norm1, block.norm1]) == 16
    # Equal values in different arrays are different parameters.
    twin = dataclasses.replace(block.norm1, gamma=block.norm1.gamma.copy(),
                               beta=block.norm1.beta.copy())
    assert count_parameters(block.norm1, twin) == 32


def test_count_parameters_counts_tied_embeddings_once_like_torch_parameters():
    torch = pytest.importorskip("torch")
    d, d_ff, vocab = 8, 20, 11
    untied = DecoderOnlyLM.init(vocab, d, 2, d_ff, 3, np.random.default_rng(3))
    tied = dataclasses.replace(untied, W_out=untied.embedding.T)  # a view, as in GPT-2
    assert count_parameters(tied) == count_parameters(untied) - d * vocab
    # PyTorch: an embedding and an output layer sharing one weight.
    embedding, output = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab, bias=False)
    output.weight = embedding.weight
    torch_count = sum(p.numel() for p in torch.nn.ModuleList([embedding, output]).parameters())
    assert torch_count == count_parameters(untied.embedding, untied.embedding.T) == vocab * d


def test_count_parameters_rejects_something_that_is_not_a_layer():
    with pytest.raises(TypeError, match=r"count_parameters.*dict"):
        count_parameters({"W": np.ones(3)})
