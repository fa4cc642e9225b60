"""Parity with PyTorch: attention, masks, softmax and log_softmax give PyTorch's numbers.

PyTorch is a test-only dependency (the test command installs its CPU build); without it this
module is skipped, and a skip fails a CI run (conftest.py).
"""

import importlib.metadata

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attention_lib import (
    causal_mask,
    log_softmax,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional



def test_the_installed_pytorch_is_the_pinned_cpu_build():
    # scripts/test.sh installs torch==2.13.0+cpu: no CUDA build (several GB) in the test venv
    assert torch.__version__ == "2.13.0+cpu"
    assert torch.version.cuda is None
    nvidia = [d.metadata["Name"] for d in importlib.metadata.distributions()
              if d.metadata["Name"].lower().startswith("nvidia-")]
    assert nvidia == []


TOLERANCE = {np.float64: 1e-12, np.float32: 1e-5}
DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])


def torch_weights(q, k, mask, scale):
    """softmax(q k^T * scale), blocked scores set to -inf, computed in PyTorch."""
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1)


def as_torch_mask(mask):
    """The mask as a tensor, a 1-d ``(Tk,)`` mask reshaped to the equivalent ``(1, Tk)``.

    The library takes the 1-d mask as is; PyTorch's SDPA raises IndexError for a 1-d mask
    of one key with 4-d inputs, so it gets the same mask with an explicit query axis.
    """
    if mask is None:
        return None
    return torch.from_numpy(mask.reshape(1, -1) if mask.ndim == 1 else mask)


@st.composite
def attention_case(draw):
    """Random shapes, a mask of a random broadcastable shape (no fully masked row), a scale."""
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    Tq, Tk = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    d_k, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    mask_shapes = [None, (Tq, Tk), (1, Tk), (Tk,), (Tq, 1)]
    if batch:
        mask_shapes += [(*batch, Tq, Tk), (*batch, 1, Tk), (batch[-1], 1, Tk)]
    mask_shape = draw(st.sampled_from(mask_shapes))
    scale = draw(st.one_of(st.none(), st.floats(-2.0, 2.0)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(*batch, Tq, d_k))
    k = rng.normal(size=(*batch, Tk, d_k))
    v = rng.normal(size=(*batch, Tk, d_v))
    mask = None
    if mask_shape is not None:
        mask = rng.random(mask_shape) < 0.5
        # Unmask one random key per mask row, so no query row ends up fully masked.
        keep = rng.integers(0, mask.shape[-1], size=(*mask.shape[:-1], 1))
        np.put_along_axis(mask, keep, True, axis=-1)
    return q, k, v, mask, scale


@DTYPES
@given(case=attention_case())
def test_attention_output_matches_torch_sdpa(dtype, case):
    q, k, v, mask, scale = case
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    output, weights = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    expected = F.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=as_torch_mask(mask), scale=scale
    )
    assert output.dtype == dtype and weights.dtype == dtype
    assert output.shape == tuple(expected.shape)
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=TOLERANCE[dtype])


@DTYPES
@given(case=attention_case())
def test_attention_weights_match_softmax_of_masked_scaled_scores_in_torch(dtype, case):
    q, k, v, mask, scale = case
    q, k, v = (a.astype(dtype) for a in (q, k, v))
    _, weights = scaled_dot_product_attention(q, k, v, mask, scale=scale)
    used_scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    expected = torch_weights(
        torch.from_numpy(q), torch.from_numpy(k), as_torch_mask(mask), used_scale
    )
    np.testing.assert_allclose(weights, expected.numpy(), rtol=0, atol=TOLERANCE[dtype])


@DTYPES
def test_fully_masked_rows_give_zeros_where_torch_softmax_gives_nan(dtype):
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 3, 4)).astype(dtype)
    k = rng.normal(size=(2, 5, 4)).astype(dtype)
    v = rng.normal(size=(2, 5, 6)).astype(dtype)
    mask = np.ones((2, 3, 5), dtype=bool)
    mask[0, 1] = False  # query 1 of batch 0 may attend to nothing
    output, weights = scaled_dot_product_attention(q, k, v, mask)
    tq, tk, tv, tmask = (torch.from_numpy(a) for a in (q, k, v, mask))

    reference_weights = torch_weights(tq, tk, tmask, 0.5).numpy()
    assert np.isnan(reference_weights[0, 1]).all()  # softmax of an all -inf row is NaN
    np.testing.assert_array_equal(weights[0, 1], 0.0)
    np.testing.assert_array_equal(output[0, 1], 0.0)

    reference_output = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tmask).numpy()
    # Older PyTorch returns NaN for that row, PyTorch >= 2.5 returns zeros: never disagree.
    row = reference_output[0, 1]
    assert np.isnan(row).all() or (row == 0).all()
    visible = ~np.isnan(reference_output)
    np.testing.assert_allclose(output[visible], reference_output[visible], atol=TOLERANCE[dtype])


@DTYPES
@pytest.mark.parametrize("T", [1, 2, 5, 8])
def test_causal_mask_equals_torch_tril_and_matches_is_causal(dtype, T):
    expected_mask = torch.ones(T, T, dtype=torch.bool).tril()
    np.testing.assert_array_equal(causal_mask(T), expected_mask.numpy())

    rng = np.random.default_rng(T)
    q, k, v = (rng.normal(size=(2, T, 4)).astype(dtype) for _ in range(3))
    output, _ = scaled_dot_product_attention(q, k, v, causal_mask(T))
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), is_causal=True
    )
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=TOLERANCE[dtype])


@pytest.mark.parametrize(("Tq", "Tk"), [(1, 4), (2, 5), (3, 3), (4, 7)])
def test_rectangular_causal_mask_matches_torch_lower_right_causal_bias(Tq, Tk):
    from torch.nn.attention.bias import causal_lower_right

    rng = np.random.default_rng(Tq * 10 + Tk)
    q = rng.normal(size=(2, Tq, 3))
    k = rng.normal(size=(2, Tk, 3))
    v = rng.normal(size=(2, Tk, 2))
    output, _ = scaled_dot_product_attention(q, k, v, causal_mask(Tq, Tk))
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=causal_lower_right(Tq, Tk)
    )
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("Tq", "Tk"), [(1, 4), (2, 5)])
def test_rectangular_causal_mask_is_not_torch_is_causal_top_left_alignment(Tq, Tk):
    # The docstring's warning: is_causal=True aligns at the top left when Tq < Tk.
    top_left = torch.ones(Tq, Tk, dtype=torch.bool).tril().numpy()
    assert not np.array_equal(causal_mask(Tq, Tk), top_left)


def test_padding_and_causal_masks_match_torch_attention():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 5, 4))
    mask = padding_mask([5, 2, 1], 5) & causal_mask(5)
    output, _ = scaled_dot_product_attention(x, x, x, mask)
    tx = torch.from_numpy(x)
    expected = F.scaled_dot_product_attention(tx, tx, tx, attn_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=1e-12)


@st.composite
def logits_case(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(-ndim, ndim - 1))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spread = draw(st.sampled_from([1.0, 30.0, 1e4]))
    x = rng.normal(size=shape) * spread
    # Some -inf entries, but never a whole row of them (torch gives NaN there).
    blocked = rng.random(shape) < 0.2
    first = np.take(blocked, [0], axis=axis)
    np.put_along_axis(blocked, np.zeros_like(first, dtype=int), False, axis=axis)
    x[blocked] = -np.inf
    return x, axis


@DTYPES
@given(case=logits_case())
def test_softmax_and_log_softmax_equal_torch(dtype, case):
    x, axis = case
    x = x.astype(dtype)
    tx = torch.from_numpy(x)
    np.testing.assert_allclose(
        softmax(x, axis=axis), torch.softmax(tx, dim=axis).numpy(), rtol=0, atol=TOLERANCE[dtype]
    )
    ours = log_softmax(x, axis=axis)
    theirs = torch.log_softmax(tx, dim=axis).numpy()
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs))
    finite = np.isfinite(theirs)
    # Log-weights can be as large as the logits (1e4), so compare them relatively.
    np.testing.assert_allclose(
        ours[finite], theirs[finite], rtol=10 * TOLERANCE[dtype], atol=TOLERANCE[dtype]
    )
