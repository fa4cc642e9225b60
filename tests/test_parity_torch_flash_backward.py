"""tiled_attention_backward against PyTorch's autograd through scaled_dot_product_attention.

Float32 in both, the same inputs; the loss is ``sum(output * R)`` for a fixed random R, so the
upstream gradient is R and every output entry matters. PyTorch's boolean ``attn_mask`` marks
with True what may be attended to, as ours does, and its grouped-query mode
(``enable_gqa=True``) lets query head h use key/value head h // group, as our view of the
queries as (H_kv, group) does. Agreement, for each of dq, dk, dv (and the output):
``max |ours - torch| / max |torch| <= 1e-5``. A fully masked query gets a zero output row and
zero gradients in both.
"""

import numpy as np
import pytest

from attention_lib import (
    causal_mask,
    padding_mask,
    sliding_window_mask,
    tiled_attention,
    tiled_attention_backward,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = 1e-5


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Small problems: one thread is faster on a busy 2-core machine, and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def relative_difference(ours, theirs) -> float:
    """max |ours - theirs| / max |theirs|, in float64."""
    ours = np.asarray(ours, dtype=np.float64)
    theirs = theirs.detach().numpy().astype(np.float64)
    assert ours.shape == theirs.shape
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


def inputs(seed, q_batch, kv_batch, Tq, Tk, d=16):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*q_batch, Tq, d), dtype=np.float32)
    k = rng.standard_normal((*kv_batch, Tk, d), dtype=np.float32)
    v = rng.standard_normal((*kv_batch, Tk, d), dtype=np.float32)
    R = rng.standard_normal((*q_batch, Tq, d), dtype=np.float32)
    return q, k, v, R


def torch_gradients(q, k, v, R, mask, enable_gqa=False):
    leaves = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    t_mask = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    output = F.scaled_dot_product_attention(*leaves, attn_mask=t_mask, enable_gqa=enable_gqa)
    (output * torch.from_numpy(R)).sum().backward()
    return output, [leaf.grad for leaf in leaves]


def fully_masked_mask():
    mask = np.random.default_rng(7).random((2, 3, 40, 40)) > 0.3
    mask[0, 1, 5] = False  # one query of one head may attend to nothing
    return mask


CASES = {  # our options, and the equivalent dense boolean mask for PyTorch
    "none": ({}, None),
    "causal": ({"causal": True}, causal_mask(40)),
    "sliding window": ({"causal": True, "window": 9}, sliding_window_mask(40, window=9)),
    "padding": ({"key_lengths": np.array([[40], [23]])},  # one per sequence, (2, 1)
                padding_mask([40, 23], 40)[:, None]),  # (2, 1, 1, 40)
    "causal + padding": ({"causal": True, "key_lengths": np.array([[17], [40]])},
                         causal_mask(40) & padding_mask([17, 40], 40)[:, None]),
    "general mask, a fully masked row": ({"mask": fully_masked_mask()}, fully_masked_mask()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tiled_gradients_equal_torch_autograd_in_float32(name):
    options, dense_mask = CASES[name]
    q, k, v, R = inputs(0, (2, 3), (2, 3), 40, 40)
    output, lse = tiled_attention(q, k, v, return_lse=True, block_q=16, block_k=8, **options)
    gradients = tiled_attention_backward(R, q, k, v, output, lse, block_q=8, block_k=16,
                                         **options)
    t_output, t_gradients = torch_gradients(q, k, v, R, dense_mask)
    assert relative_difference(output, t_output) <= TOLERANCE
    for ours, theirs in zip(gradients, t_gradients):
        assert ours.dtype == np.float32
        assert relative_difference(ours, theirs) <= TOLERANCE
    if name.endswith("fully masked row"):
        assert (output[0, 1, 5] == 0).all() and (gradients[0][0, 1, 5] == 0).all()
        assert (t_gradients[0][0, 1, 5] == 0).all()


def test_grouped_query_gradients_equal_torch_enable_gqa():
    # 8 query heads, 2 key/value heads: ours views the queries as (batch, 2, 4, T, d).
    q, k, v, R = inputs(1, (2, 8), (2, 2), 24, 30)
    group_view = (2, 2, 4, 24, 16)
    q_grouped, R_grouped = q.reshape(group_view), R.reshape(group_view)
    k_grouped, v_grouped = k[:, :, None], v[:, :, None]  # (2, 2, 1, 30, 16)
    output, lse = tiled_attention(q_grouped, k_grouped, v_grouped, causal=True,
                                  return_lse=True, block_q=8, block_k=8)
    dq, dk, dv = tiled_attention_backward(R_grouped, q_grouped, k_grouped, v_grouped, output,
                                          lse, causal=True, block_q=8, block_k=8)
    t_output, (t_dq, t_dk, t_dv) = torch_gradients(q, k, v, R, causal_mask(24, 30),
                                                   enable_gqa=True)
    assert relative_difference(output.reshape(q.shape), t_output) <= TOLERANCE
    assert relative_difference(dq.reshape(q.shape), t_dq) <= TOLERANCE
    assert relative_difference(dk[:, :, 0], t_dk) <= TOLERANCE
    assert relative_difference(dv[:, :, 0], t_dv) <= TOLERANCE
