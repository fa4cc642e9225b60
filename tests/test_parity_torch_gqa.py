"""Parity with PyTorch for chapter 11: grouped-query attention and tiled attention.

PyTorch's ``scaled_dot_product_attention(q, k, v, attn_mask, enable_gqa=True)`` lets query
head h read key/value head h // (H / H_kv), as ``grouped_attention`` does. PyTorch has no
grouped-query ``nn.MultiheadAttention``, so the reference for ``MultiHeadAttention`` with
``num_kv_heads`` is built from torch operations: ``F.linear`` projections (weights transposed:
PyTorch stores (d_out, d_in)), heads split with ``view``/``transpose``, SDPA with
``enable_gqa=True``, heads merged, output projection. Boolean masks mean "may attend" in both
(SDPA's convention), and SDPA gives zero rows for fully masked queries, as the library does.
"""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import (
    MultiHeadAttention,
    causal_mask,
    grouped_attention,
    padding_mask,
    sliding_window_mask,
    tiled_attention,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])


def torch_sdpa(q, k, v, mask=None, enable_gqa=False):
    """torch's scaled_dot_product_attention on NumPy arrays (mask: True = may attend)."""
    with torch.no_grad():
        output = F.scaled_dot_product_attention(
            torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
            attn_mask=None if mask is None else torch.from_numpy(np.ascontiguousarray(mask)),
            enable_gqa=enable_gqa)
    return output.numpy()


def torch_weights(q, k, mask=None):
    """The attention weights torch's way for grouped heads: repeat_interleave the key heads."""
    query, key = torch.from_numpy(q), torch.from_numpy(k)
    key = key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    scores = query @ key.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~torch.from_numpy(np.ascontiguousarray(mask)), -math.inf)
    weights = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(weights, nan=0.0).numpy()  # fully masked rows: 0, as the library


def assert_close(actual, expected, dtype):
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance)


# --------------------------------------------------------------------------- grouped_attention


@st.composite
def grouped_problems(draw, dtype):
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    H_kv = draw(st.integers(1, 3))
    H = H_kv * draw(st.integers(1, 4))
    Tq, Tk = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    d, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal((*batch, H, Tq, d)).astype(dtype)
    k = rng.standard_normal((*batch, H_kv, Tk, d)).astype(dtype)
    v = rng.standard_normal((*batch, H_kv, Tk, d_v)).astype(dtype)
    mask_shape = draw(st.sampled_from([None, (Tq, Tk), (*batch, 1, Tq, Tk),
                                       (*batch, H, Tq, Tk)]))
    mask = None if mask_shape is None else rng.random(mask_shape) < draw(
        st.sampled_from([0.3, 0.8]))  # 0.3: many fully masked rows
    return q, k, v, mask


@given(problem=grouped_problems(np.float64))
def test_grouped_attention_equals_torch_sdpa_enable_gqa_in_float64(problem):
    q, k, v, mask = problem
    output, weights = grouped_attention(q, k, v, mask=mask)
    assert_close(output, torch_sdpa(q, k, v, mask, enable_gqa=True), np.float64)
    assert_close(weights, torch_weights(q, k, mask), np.float64)


@given(problem=grouped_problems(np.float32))
def test_grouped_attention_equals_torch_sdpa_enable_gqa_in_float32(problem):
    q, k, v, mask = problem
    output, weights = grouped_attention(q, k, v, mask=mask)
    assert output.dtype == np.float32
    assert_close(output, torch_sdpa(q, k, v, mask, enable_gqa=True), np.float32)
    assert_close(weights, torch_weights(q, k, mask), np.float32)


def test_torch_with_enable_gqa_pairs_query_head_h_with_kv_head_h_over_the_group():
    # The convention the library copies, checked on torch itself: values constant per kv head.
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 6, 2, 3))
    k = rng.standard_normal((1, 2, 4, 3))
    v = np.broadcast_to(np.arange(2.0)[None, :, None, None], (1, 2, 4, 1)).copy()
    np.testing.assert_allclose(torch_sdpa(q, k, v, enable_gqa=True)[0, :, 0, 0],
                               [0, 0, 0, 1, 1, 1], atol=1e-12)
    np.testing.assert_allclose(grouped_attention(q, k, v)[0][0, :, 0, 0], [0, 0, 0, 1, 1, 1],
                               atol=1e-12)


# --------------------------------------------------------------------------- MultiHeadAttention


def random_gqa(d_model, num_heads, num_kv_heads, rng, dtype):
    kv_dim = num_kv_heads * (d_model // num_heads)
    shapes = {"W_q": (d_model, d_model), "W_k": (d_model, kv_dim), "W_v": (d_model, kv_dim),
              "W_o": (d_model, d_model), "b_q": (d_model,), "b_k": (kv_dim,),
              "b_v": (kv_dim,), "b_o": (d_model,)}
    parameters = {name: (rng.normal(size=shape) / math.sqrt(shape[0])).astype(dtype)
                  for name, shape in shapes.items()}
    return MultiHeadAttention(**parameters, num_heads=num_heads, num_kv_heads=num_kv_heads)


def torch_gqa_layer(mha, x, mask=None):
    """Grouped-query multi-head attention from torch operations and the layer's weights."""
    def tensor(array):
        return torch.from_numpy(np.ascontiguousarray(array))

    def heads(y, num_heads):  # (B, T, n * d_head) -> (B, n, T, d_head)
        return y.view(*y.shape[:-1], num_heads, -1).transpose(-2, -3)

    H, H_kv = mha.num_heads, mha.num_kv_heads
    with torch.no_grad():
        inputs = tensor(x)
        q = heads(F.linear(inputs, tensor(mha.W_q.T), tensor(mha.b_q)), H)
        k = heads(F.linear(inputs, tensor(mha.W_k.T), tensor(mha.b_k)), H_kv)
        v = heads(F.linear(inputs, tensor(mha.W_v.T), tensor(mha.b_v)), H_kv)
        attn_mask = None if mask is None else tensor(mask)[..., None, :, :]  # head axis
        output = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)
        merged = output.transpose(-2, -3).reshape(*x.shape[:-1], mha.d_model)
        return F.linear(merged, tensor(mha.W_o.T), tensor(mha.b_o)).numpy()


@DTYPES
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), [(4, 4), (4, 2), (4, 1), (6, 2),
                                                         (8, 2)])
@pytest.mark.parametrize("masking", ["none", "causal", "causal+padding", "a fully masked row"])
def test_gqa_multi_head_attention_equals_the_torch_reference(dtype, num_heads, num_kv_heads,
                                                             masking):
    rng = np.random.default_rng(num_heads * 7 + num_kv_heads)
    mha = random_gqa(48, num_heads, num_kv_heads, rng, dtype)
    x = rng.standard_normal((3, 6, 48)).astype(dtype)
    mask = {"none": None, "causal": causal_mask(6),
            "causal+padding": causal_mask(6) & padding_mask([6, 4, 1], 6),
            "a fully masked row": padding_mask([6, 0, 3], 6) & np.ones((6, 6), dtype=bool)
            }[masking]
    output, weights = mha(x, mask=mask)
    assert output.dtype == dtype and weights.shape == (3, num_heads, 6, 6)
    assert_close(output, torch_gqa_layer(mha, x, mask), dtype)


# --------------------------------------------------------------------------- tiled_attention


@DTYPES
@pytest.mark.parametrize(("Tq", "Tk", "block_q", "block_k"), [(37, 37, 8, 16), (10, 53, 4, 9)])
@pytest.mark.parametrize("structure", ["full", "causal", "window 5", "padding"])
def test_tiled_attention_equals_torch_sdpa(dtype, Tq, Tk, block_q, block_k, structure):
    # torch's is_causal=True aligns the causal mask top-left when Tq != Tk; the library
    # aligns it bottom-right (queries are the last Tq positions), so an explicit mask is used.
    rng = np.random.default_rng(Tq + Tk)
    q = rng.standard_normal((2, 3, Tq, 16)).astype(dtype)
    k = rng.standard_normal((2, 3, Tk, 16)).astype(dtype)
    v = rng.standard_normal((2, 3, Tk, 8)).astype(dtype)
    kwargs, mask = {}, None
    if structure == "causal":
        kwargs, mask = {"causal": True}, causal_mask(Tq, Tk)
    elif structure == "window 5":
        kwargs, mask = {"causal": True, "window": 5}, sliding_window_mask(Tq, Tk, window=5)
    elif structure == "padding":
        lengths = np.array([[Tk, 3, 0], [1, Tk // 2, Tk]])  # one count per (batch, head)
        kwargs, mask = {"key_lengths": lengths}, padding_mask(lengths, Tk)
    output = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, **kwargs)
    assert output.dtype == dtype
    assert_close(output, torch_sdpa(q, k, v, mask), dtype)
