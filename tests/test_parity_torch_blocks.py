"""Parity with PyTorch: EncoderBlock == nn.TransformerEncoderLayer, DecoderBlock ==
nn.TransformerDecoderLayer, and a 2-block Encoder == nn.TransformerEncoder, with the same weights.

The copy transposes every linear map (PyTorch stores (d_out, d_in), the library (d_in, d_out)):
self_attn.in_proj_weight = [W_q.T; W_k.T; W_v.T], in_proj_bias = [b_q; b_k; b_v],
out_proj.weight = W_o.T, linear1.weight = W1.T, linear2.weight = W2.T, normN = (gamma, beta).
Every one of our parameters is random before the copy (biases, gammas and betas included), so a
parameter that is not copied, or copied to the wrong place, makes the outputs differ.
PyTorch's boolean masks mark with True what may NOT be attended to (src_mask / tgt_mask) and
which keys are padding (*_key_padding_mask); ours mark what may be attended to, so they are
inverted. dropout=0.0 and .eval() make PyTorch deterministic.

In eval mode without autograd, nn.TransformerEncoderLayer may take its fused "fast path"
(torch._transformer_encoder_layer_fwd); the encoder-layer test runs each case with the fast
path allowed and with it disabled (torch.backends.mha.set_fastpath_enabled), so both of
PyTorch's code paths are compared with ours.
"""

import contextlib

import numpy as np
import pytest
from model_helpers import randomize

from attention_lib import (
    DecoderBlock,
    Encoder,
    EncoderBlock,
    LayerNorm,
    causal_mask,
    padding_mask,
)

torch = pytest.importorskip("torch")

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
NORM_FIRST = pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
ACTIVATION = pytest.mark.parametrize("activation", ["relu", "gelu"])


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Run PyTorch on one thread here: the matrices are tiny, and on a busy 2-core machine
    waking and syncing worker threads costs more than the arithmetic (3x slower measured)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)




def tensor(array):
    return torch.from_numpy(np.ascontiguousarray(array))


def copy_attention(target, mha):
    target.in_proj_weight.copy_(tensor(np.concatenate([mha.W_q.T, mha.W_k.T, mha.W_v.T])))
    target.in_proj_bias.copy_(tensor(np.concatenate([mha.b_q, mha.b_k, mha.b_v])))
    target.out_proj.weight.copy_(tensor(mha.W_o.T))
    target.out_proj.bias.copy_(tensor(mha.b_o))


def copy_norm(target, norm):
    target.weight.copy_(tensor(norm.gamma))
    target.bias.copy_(tensor(norm.beta))
    assert target.eps == norm.eps


def copy_feed_forward(layer, ff):
    layer.linear1.weight.copy_(tensor(ff.W1.T))
    layer.linear1.bias.copy_(tensor(ff.b1))
    layer.linear2.weight.copy_(tensor(ff.W2.T))
    layer.linear2.bias.copy_(tensor(ff.b2))


def copy_encoder_block(layer, block):
    with torch.no_grad():
        copy_attention(layer.self_attn, block.self_attn)
        copy_feed_forward(layer, block.ff)
        copy_norm(layer.norm1, block.norm1)
        copy_norm(layer.norm2, block.norm2)


def copy_decoder_block(layer, block):
    with torch.no_grad():
        copy_attention(layer.self_attn, block.self_attn)
        copy_attention(layer.multihead_attn, block.cross_attn)
        copy_feed_forward(layer, block.ff)
        copy_norm(layer.norm1, block.norm1)
        copy_norm(layer.norm2, block.norm2)
        copy_norm(layer.norm3, block.norm3)


def torch_encoder_layer(d_model, num_heads, d_ff, activation, norm_first, dtype):
    return torch.nn.TransformerEncoderLayer(
        d_model, num_heads, dim_feedforward=d_ff, dropout=0.0, activation=activation,
        batch_first=True, norm_first=norm_first, dtype=TORCH_DTYPE[dtype],
    )


def random_encoder_block(d_model, num_heads, d_ff, activation, norm_first, dtype, seed):
    rng = np.random.default_rng(seed)
    block = EncoderBlock.init(d_model, num_heads, d_ff, rng, activation=activation,
                              norm_first=norm_first, dtype=dtype)
    return randomize(block, rng)


@contextlib.contextmanager
def fastpath(enabled):
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(enabled)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def assert_close(ours, theirs, dtype):
    assert ours.dtype == dtype
    assert ours.shape == theirs.shape
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance)


MASKS = pytest.mark.parametrize("masks", ["none", "causal", "padding", "causal+padding"])


def encoder_masks(kind, lengths, T):
    """Our mask, PyTorch's src_mask and src_key_padding_mask for one mask kind."""
    ours, src_mask, key_padding = None, None, None
    if "causal" in kind:
        ours = causal_mask(T)
        src_mask = tensor(~causal_mask(T))  # True = NOT allowed
    if "padding" in kind:
        pad = padding_mask(lengths, T)  # (B, 1, T), True = real token
        ours = pad if ours is None else ours & pad
        key_padding = tensor(~pad[:, 0, :])  # (B, T), True = padding
    return ours, src_mask, key_padding


# --------------------------------------------------------------------------- encoder layer


@DTYPES
@NORM_FIRST
@ACTIVATION
@MASKS
@pytest.mark.parametrize("fast_path", [True, False], ids=["fastpath-allowed", "fastpath-off"])
def test_encoder_block_equals_torch_transformer_encoder_layer(dtype, norm_first, activation,
                                                              masks, fast_path):
    d_model, num_heads, d_ff, T = 16, 4, 24, 6
    block = random_encoder_block(d_model, num_heads, d_ff, activation, norm_first, dtype, 0)
    layer = torch_encoder_layer(d_model, num_heads, d_ff, activation, norm_first, dtype)
    copy_encoder_block(layer, block)
    layer.eval()
    x = np.random.default_rng(1).normal(size=(3, T, d_model)).astype(dtype)
    ours_mask, src_mask, key_padding = encoder_masks(masks, [6, 4, 1], T)
    with torch.no_grad(), fastpath(fast_path):
        expected = layer(tensor(x), src_mask=src_mask, src_key_padding_mask=key_padding).numpy()
    assert_close(block(x, mask=ours_mask), expected, dtype)


def test_a_missed_parameter_copy_would_be_noticed():
    # The tests above rely on every parameter being random; here one of them (beta of norm2)
    # is copied wrong on purpose, and the outputs then differ.
    block = random_encoder_block(8, 2, 16, "relu", False, np.float64, 2)
    layer = torch_encoder_layer(8, 2, 16, "relu", False, np.float64)
    copy_encoder_block(layer, block)
    with torch.no_grad():
        layer.norm2.bias.zero_()
    layer.eval()
    x = np.random.default_rng(3).normal(size=(2, 5, 8))
    with torch.no_grad():
        expected = layer(tensor(x)).numpy()
    assert not np.allclose(block(x), expected, atol=1e-3)


# --------------------------------------------------------------------------- decoder layer


@DTYPES
@NORM_FIRST
@ACTIVATION
@pytest.mark.parametrize("masks", ["none", "causal", "memory-padding", "causal+memory-padding"])
def test_decoder_block_equals_torch_transformer_decoder_layer(dtype, norm_first, activation,
                                                              masks):
    d_model, num_heads, d_ff, T, S = 12, 3, 20, 5, 7
    rng = np.random.default_rng(4)
    block = randomize(DecoderBlock.init(d_model, num_heads, d_ff, rng, activation=activation,
                                        norm_first=norm_first, dtype=dtype), rng)
    layer = torch.nn.TransformerDecoderLayer(
        d_model, num_heads, dim_feedforward=d_ff, dropout=0.0, activation=activation,
        batch_first=True, norm_first=norm_first, dtype=TORCH_DTYPE[dtype],
    )
    copy_decoder_block(layer, block)
    layer.eval()
    x = rng.normal(size=(2, T, d_model)).astype(dtype)
    memory = rng.normal(size=(2, S, d_model)).astype(dtype)
    self_mask = tgt_mask = memory_mask = memory_key_padding = None
    if "causal" in masks:
        self_mask = causal_mask(T)
        tgt_mask = tensor(~self_mask)
    if "memory-padding" in masks:
        memory_mask = padding_mask([7, 3], S)
        memory_key_padding = tensor(~memory_mask[:, 0, :])
    with torch.no_grad():
        expected = layer(tensor(x), tensor(memory), tgt_mask=tgt_mask,
                         memory_key_padding_mask=memory_key_padding).numpy()
    assert_close(block(x, memory, self_mask=self_mask, memory_mask=memory_mask), expected, dtype)


# --------------------------------------------------------------------------- stacks


@DTYPES
@NORM_FIRST
@pytest.mark.parametrize("padding", [False, True], ids=["no-mask", "padding"])
def test_encoder_of_two_blocks_equals_torch_transformer_encoder(dtype, norm_first, padding):
    d_model, num_heads, d_ff, T = 16, 2, 32, 5
    blocks = [random_encoder_block(d_model, num_heads, d_ff, "gelu", norm_first, dtype, seed)
              for seed in (5, 6)]
    # pre-LN stacks need a final norm (torch's `norm=`); post-LN ones are complete without
    final_norm = randomize(LayerNorm.init(d_model, dtype=dtype), np.random.default_rng(7)) \
        if norm_first else None
    prototype = torch_encoder_layer(d_model, num_heads, d_ff, "gelu", norm_first, dtype)
    torch_norm = None
    if final_norm is not None:
        torch_norm = torch.nn.LayerNorm(d_model, dtype=TORCH_DTYPE[dtype])
        with torch.no_grad():
            copy_norm(torch_norm, final_norm)
    stack = torch.nn.TransformerEncoder(prototype, num_layers=2, norm=torch_norm,
                                        enable_nested_tensor=False)
    for layer, block in zip(stack.layers, blocks):
        copy_encoder_block(layer, block)
    stack.eval()
    x = np.random.default_rng(8).normal(size=(2, T, d_model)).astype(dtype)
    mask = key_padding = None
    if padding:
        mask = padding_mask([5, 3], T)
        key_padding = tensor(~mask[:, 0, :])
    with torch.no_grad():
        expected = stack(tensor(x), src_key_padding_mask=key_padding).numpy()
    assert_close(Encoder(blocks, final_norm)(x, mask=mask), expected, dtype)
    # the two layers hold different weights, so the order of the copy matters
    assert not np.allclose(Encoder(blocks[::-1], final_norm)(x, mask=mask), expected, atol=1e-3)
