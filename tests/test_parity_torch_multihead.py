"""Parity with PyTorch: MultiHeadAttention equals torch.nn.MultiheadAttention with the same weights.

PyTorch stores a linear map as (d_out, d_in) and computes x @ W.T + b; the library stores
(d_in, d_out) and computes x @ W + b. So the copy transposes: in_proj_weight is
[W_q.T; W_k.T; W_v.T] stacked along the rows, out_proj.weight is W_o.T.
Masks are converted too: PyTorch's boolean attn_mask and key_padding_mask mark with True what may
NOT be attended to, the library's True means "may attend".
"""

import math

import numpy as np
import pytest

from attention_lib import MultiHeadAttention, causal_mask, padding_mask

torch = pytest.importorskip("torch")

TOLERANCE = {np.float64: 1e-10, np.float32: 1e-5}
TORCH_DTYPE = {np.float64: torch.float64, np.float32: torch.float32}
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])


def random_layer(d_model, num_heads, rng, dtype, bias=True):
    """Our layer with random weights and (if bias) random, non-zero biases."""
    weights = {name: rng.normal(size=(d_model, d_model)) / math.sqrt(d_model)
               for name in ("W_q", "W_k", "W_v", "W_o")}
    biases = {name: rng.normal(size=d_model) if bias else np.zeros(d_model)
              for name in ("b_q", "b_k", "b_v", "b_o")}
    parameters = {name: value.astype(dtype) for name, value in {**weights, **biases}.items()}
    return MultiHeadAttention(**parameters, num_heads=num_heads)


def torch_copy(mha, dtype, bias=True):
    """torch.nn.MultiheadAttention holding the same weights as ``mha``."""
    d_model = mha.d_model
    layer = torch.nn.MultiheadAttention(
        d_model, mha.num_heads, bias=bias, batch_first=True, dtype=TORCH_DTYPE[dtype]
    )
    with torch.no_grad():
        layer.in_proj_weight.copy_(
            torch.from_numpy(np.concatenate([mha.W_q.T, mha.W_k.T, mha.W_v.T], axis=0))
        )
        layer.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(mha.W_o.T)))
        if bias:
            layer.in_proj_bias.copy_(torch.from_numpy(np.concatenate([mha.b_q, mha.b_k, mha.b_v])))
            layer.out_proj.bias.copy_(torch.from_numpy(mha.b_o))
    assert (layer.in_proj_bias is None) == (not bias)
    return layer.eval()


def torch_attention(layer, x, context, attn_mask=None, key_padding_mask=None):
    """Run the PyTorch layer; masks use PyTorch's convention (True = may NOT attend)."""
    query = torch.from_numpy(x)
    key = value = torch.from_numpy(context)
    with torch.no_grad():
        output, weights = layer(
            query, key, value,
            attn_mask=None if attn_mask is None else torch.from_numpy(attn_mask),
            key_padding_mask=None if key_padding_mask is None else torch.from_numpy(
                key_padding_mask),
            need_weights=True,
            average_attn_weights=False,
        )
    return output.numpy(), weights.numpy()


def assert_matches_torch(mha, layer, x, context, our_mask, attn_mask, key_padding_mask, dtype):
    output, weights = mha(x, context=None if context is x else context, mask=our_mask)
    expected_output, expected_weights = torch_attention(layer, x, context, attn_mask,
                                                        key_padding_mask)
    assert output.dtype == weights.dtype == dtype
    assert output.shape == expected_output.shape
    assert weights.shape == expected_weights.shape
    tolerance = TOLERANCE[dtype]
    np.testing.assert_allclose(output, expected_output, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(weights, expected_weights, rtol=tolerance, atol=tolerance)


# --------------------------------------------------------------------------- named cases


@DTYPES
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_self_attention_matches_torch(dtype, bias):
    rng = np.random.default_rng(0)
    mha = random_layer(16, 4, rng, dtype, bias)
    x = rng.normal(size=(2, 5, 16)).astype(dtype)
    assert_matches_torch(mha, torch_copy(mha, dtype, bias), x, x, None, None, None, dtype)


@DTYPES
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize(("Tq", "Tk"), [(3, 7), (6, 2)])
def test_cross_attention_with_tq_not_tk_matches_torch(dtype, bias, Tq, Tk):
    rng = np.random.default_rng(1)
    mha = random_layer(12, 3, rng, dtype, bias)
    x = rng.normal(size=(2, Tq, 12)).astype(dtype)
    context = rng.normal(size=(2, Tk, 12)).astype(dtype)
    assert_matches_torch(mha, torch_copy(mha, dtype, bias), x, context, None, None, None, dtype)


@DTYPES
def test_a_boolean_attention_mask_matches_torch_with_the_mask_inverted(dtype):
    rng = np.random.default_rng(2)
    mha = random_layer(8, 2, rng, dtype)
    x = rng.normal(size=(3, 4, 8)).astype(dtype)
    context = rng.normal(size=(3, 6, 8)).astype(dtype)
    mask = rng.random((4, 6)) < 0.5
    mask[np.arange(4), rng.integers(0, 6, size=4)] = True  # no fully masked query
    assert_matches_torch(mha, torch_copy(mha, dtype), x, context, mask, ~mask, None, dtype)


@DTYPES
def test_a_per_sequence_mask_matches_torch_with_one_mask_per_sequence_and_head(dtype):
    # PyTorch wants a 3-d attn_mask as (B * H, Tq, Tk), sequence-major; ours is (B, Tq, Tk).
    rng = np.random.default_rng(3)
    mha = random_layer(12, 4, rng, dtype)
    x = rng.normal(size=(2, 5, 12)).astype(dtype)
    mask = rng.random((2, 5, 5)) < 0.5
    mask[:, np.arange(5), np.arange(5)] = True
    torch_mask = np.repeat(~mask, 4, axis=0)  # (B * H, Tq, Tk)
    assert_matches_torch(mha, torch_copy(mha, dtype), x, x, mask, torch_mask, None, dtype)


@DTYPES
def test_a_padding_mask_matches_torch_key_padding_mask(dtype):
    rng = np.random.default_rng(4)
    mha = random_layer(16, 8, rng, dtype)
    x = rng.normal(size=(3, 6, 16)).astype(dtype)
    ours = padding_mask([6, 2, 4], 6)  # (B, 1, Tk), True = real token
    key_padding_mask = ~ours[:, 0, :]  # (B, Tk), True = ignore
    assert_matches_torch(mha, torch_copy(mha, dtype), x, x, ours, None, key_padding_mask, dtype)


@DTYPES
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_a_causal_mask_matches_torch(dtype, bias):
    rng = np.random.default_rng(5)
    mha = random_layer(8, 4, rng, dtype, bias)
    x = rng.normal(size=(2, 7, 8)).astype(dtype)
    mask = causal_mask(7)
    assert_matches_torch(mha, torch_copy(mha, dtype, bias), x, x, mask, ~mask, None, dtype)


@DTYPES
def test_a_causal_mask_and_padding_together_match_torch_with_both_masks(dtype):
    rng = np.random.default_rng(6)
    mha = random_layer(12, 2, rng, dtype)
    x = rng.normal(size=(3, 5, 12)).astype(dtype)
    lengths = [5, 3, 1]
    ours = causal_mask(5) & padding_mask(lengths, 5)  # (B, Tq, Tk)
    assert_matches_torch(mha, torch_copy(mha, dtype), x, x, ours, ~causal_mask(5),
                         ~padding_mask(lengths, 5)[:, 0, :], dtype)


def test_a_fully_masked_query_gives_b_o_where_torch_gives_nan():
    rng = np.random.default_rng(7)
    mha = random_layer(8, 2, rng, np.float64)
    layer = torch_copy(mha, np.float64)
    x = rng.normal(size=(2, 4, 8))
    mask = np.ones((4, 4), dtype=bool)
    mask[1] = False  # query 1 may attend to nothing
    output, weights = mha(x, mask=mask)
    torch_output, torch_weights = torch_attention(layer, x, x, attn_mask=~mask)
    # PyTorch's nn.MultiheadAttention: softmax of an all -inf row is NaN.
    assert np.isnan(torch_output[:, 1]).all() and np.isnan(torch_weights[:, :, 1]).all()
    # Ours: zero weights, a zero attention output, so the layer's output is the bias b_o.
    assert not np.isnan(output).any() and not np.isnan(weights).any()
    np.testing.assert_array_equal(weights[:, :, 1], 0.0)
    np.testing.assert_allclose(output[:, 1], np.broadcast_to(mha.b_o, (2, 8)), rtol=0, atol=1e-15)
    # Every other query still agrees with PyTorch.
    rows = [0, 2, 3]
    np.testing.assert_allclose(output[:, rows], torch_output[:, rows], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(weights[:, :, rows], torch_weights[:, :, rows],
                               rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- a seeded grid


def grid_case(seed):
    """Random sizes and one mask kind; every query keeps at least one key it may attend to."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 4))
    d_model = int(rng.choice([8, 12, 16]))
    num_heads = int(rng.choice([h for h in range(1, d_model + 1) if d_model % h == 0]))
    kind = ["none", "attn_mask", "key_padding", "causal", "causal+key_padding",
            "attn_mask+key_padding"][seed % 6]
    cross = bool(rng.integers(0, 2))
    Tq = int(rng.integers(1, 10))
    Tk = int(rng.integers(Tq if "causal" in kind else 1, 10)) if cross else Tq
    bias = bool(rng.integers(0, 2))
    lengths = rng.integers(1, Tk + 1, size=B)  # at least one real key per sequence
    ours, attn_mask, key_padding_mask = None, None, None
    if "attn_mask" in kind:
        ours = rng.random((Tq, Tk)) < 0.5
        ours[:, 0] |= "key_padding" in kind  # key 0 is never padding
        ours[np.arange(Tq), rng.integers(0, Tk, size=Tq)] = True
    if "causal" in kind:
        ours = causal_mask(Tq, Tk)  # bottom-right aligned: key 0 is always allowed
    if ours is not None:
        attn_mask = ~ours
    if "key_padding" in kind:
        padding = padding_mask(lengths, Tk)  # (B, 1, Tk)
        key_padding_mask = ~padding[:, 0, :]
        ours = padding if ours is None else ours & padding
    return dict(B=B, Tq=Tq, Tk=Tk, d_model=d_model, num_heads=num_heads, cross=cross, bias=bias,
                kind=kind, ours=ours, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                seed=seed)


GRID = [grid_case(seed) for seed in range(36)]


def grid_id(case):
    return (f"B{case['B']}-Tq{case['Tq']}-Tk{case['Tk']}-d{case['d_model']}-H{case['num_heads']}"
            f"-{'cross' if case['cross'] else 'self'}-{'bias' if case['bias'] else 'nobias'}"
            f"-{case['kind']}-s{case['seed']}")


def test_the_grid_covers_every_kind_of_case():
    assert {case["B"] for case in GRID} == {1, 2, 3}
    assert {case["d_model"] for case in GRID} == {8, 12, 16}
    assert {case["cross"] for case in GRID} == {True, False}
    assert {case["bias"] for case in GRID} == {True, False}
    assert any(case["cross"] and case["Tq"] != case["Tk"] for case in GRID)
    assert any(case["num_heads"] == 1 for case in GRID)
    assert any(case["num_heads"] == case["d_model"] for case in GRID)
    for kind in {case["kind"] for case in GRID}:
        assert any(case["kind"] == kind and case["cross"] and case["Tq"] != case["Tk"]
                   for case in GRID), kind
    for case in GRID:  # no fully masked query row (PyTorch gives NaN there)
        if case["ours"] is not None:
            mask = np.broadcast_to(case["ours"], (case["B"], case["Tq"], case["Tk"]))
            assert mask.any(axis=-1).all()


@DTYPES
@pytest.mark.parametrize("case", GRID, ids=grid_id)
def test_a_grid_of_seeded_cases_matches_torch(dtype, case):
    rng = np.random.default_rng(1000 + case["seed"])
    mha = random_layer(case["d_model"], case["num_heads"], rng, dtype, case["bias"])
    x = rng.normal(size=(case["B"], case["Tq"], case["d_model"])).astype(dtype)
    context = (rng.normal(size=(case["B"], case["Tk"], case["d_model"])).astype(dtype)
               if case["cross"] else x)
    assert_matches_torch(mha, torch_copy(mha, dtype, case["bias"]), x, context, case["ours"],
                         case["attn_mask"], case["key_padding_mask"], dtype)
