"""The hand-written backward passes of attention_lib.training against PyTorch's autograd, and
Adam and gradient clipping against torch.optim.Adam and clip_grad_norm_, in float64.

Same weights in both (PyTorch stores linear maps as (d_out, d_in): copies are transposed, and
gradients transposed back). Each case backpropagates loss = sum(output * R) with a fixed random
R, so every output entry matters. PyTorch's boolean attn_mask for
F.scaled_dot_product_attention marks with True what may be attended to, as ours does;
nn.MultiheadAttention's and nn.TransformerEncoderLayer's masks mark what may NOT be attended to.
"""


import numpy as np
import pytest
from model_helpers import randomize_parameters as randomize

from attention_lib import EncoderBlock, LayerNorm, MultiHeadAttention, causal_mask, padding_mask
from attention_lib.training import (
    Adam,
    attention_backward,
    attention_forward,
    clip_grad_norm,
    cross_entropy_backward,
    cross_entropy_forward,
    encoder_block_backward,
    encoder_block_forward,
    layer_norm_backward,
    layer_norm_forward,
    mha_backward,
    mha_forward,
)

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOLERANCE = 1e-10


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny matrices: one thread is faster on a busy 2-core machine, and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def leaf(array):
    return torch.tensor(np.ascontiguousarray(array), dtype=torch.float64, requires_grad=True)


def assert_close(ours, theirs):
    theirs = theirs.detach().numpy() if isinstance(theirs, torch.Tensor) else theirs
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=TOLERANCE, atol=TOLERANCE)



# --------------------------------------------------------------------------- attention


def attention_masks():
    fully_masked = np.ones((2, 3, 4, 5), dtype=bool)
    fully_masked[1, 2, 0] = False  # one query of one head may attend to nothing
    return {"none": None, "causal": causal_mask(4, 5),
            "padding": padding_mask([2, 5], 5)[:, None],  # (2, 1, 1, 5)
            "causal+padding": causal_mask(4, 5) & padding_mask([2, 5], 5)[:, None],
            "fully masked row": fully_masked}


@pytest.mark.parametrize("mask_name", list(attention_masks()))
def test_attention_gradients_equal_torch_autograd(mask_name):
    mask = attention_masks()[mask_name]
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 3, 4, 6)), rng.normal(size=(2, 3, 5, 6))
    v, R = rng.normal(size=(2, 3, 5, 7)), rng.normal(size=(2, 3, 4, 7))
    output, _, saved = attention_forward(q, k, v, mask=mask)
    dq, dk, dv = attention_backward(R, saved)

    tq, tk, tv = leaf(q), leaf(k), leaf(v)
    t_mask = None if mask is None else torch.from_numpy(np.ascontiguousarray(mask))
    t_output = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=t_mask)
    (t_output * torch.from_numpy(R)).sum().backward()
    assert_close(output, t_output)
    for ours, theirs in ((dq, tq.grad), (dk, tk.grad), (dv, tv.grad)):
        assert_close(ours, theirs)


@pytest.mark.parametrize("mask_name", ["none", "causal", "padding"])
def test_multi_head_attention_gradients_equal_torch_autograd(mask_name):
    rng = np.random.default_rng(1)
    d_model, num_heads, T = 8, 2, 5
    mha = randomize(MultiHeadAttention.init(d_model, num_heads, rng), rng)
    x, R = rng.normal(size=(2, T, d_model)), rng.normal(size=(2, T, d_model))
    mask = {"none": None, "causal": causal_mask(T), "padding": padding_mask([5, 3], T)}[mask_name]
    output, _, saved = mha_forward(mha, x, mask)
    dx, grads = mha_backward(R, saved)

    layer = torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True,
                                        dtype=torch.float64)
    with torch.no_grad():
        layer.in_proj_weight.copy_(torch.from_numpy(np.concatenate([mha.W_q.T, mha.W_k.T,
                                                                    mha.W_v.T])))
        layer.in_proj_bias.copy_(torch.from_numpy(np.concatenate([mha.b_q, mha.b_k, mha.b_v])))
        layer.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(mha.W_o.T)))
        layer.out_proj.bias.copy_(torch.from_numpy(mha.b_o))
    tx = leaf(x)
    t_mask = None
    if mask is not None:  # PyTorch: True = may NOT attend, one (T, T) mask per batch*head
        full = np.broadcast_to(mask, (2, T, T))
        t_mask = torch.from_numpy(np.repeat(~full, num_heads, axis=0))
    t_output, _ = layer(tx, tx, tx, attn_mask=t_mask, need_weights=False)
    (t_output * torch.from_numpy(R)).sum().backward()
    assert_close(output, t_output)
    assert_close(dx, tx.grad)
    in_weight, in_bias = layer.in_proj_weight.grad.numpy(), layer.in_proj_bias.grad.numpy()
    for index, name in enumerate("qkv"):
        assert_close(grads[f"W_{name}"], in_weight[index * d_model:(index + 1) * d_model].T)
        assert_close(grads[f"b_{name}"], in_bias[index * d_model:(index + 1) * d_model])
    assert_close(grads["W_o"], layer.out_proj.weight.grad.numpy().T)
    assert_close(grads["b_o"], layer.out_proj.bias.grad)


# --------------------------------------------------------------------------- layer norm


@pytest.mark.parametrize("eps", [1e-5, 1e-1])
def test_layer_norm_gradients_equal_torch_autograd(eps):
    rng = np.random.default_rng(2)
    norm = LayerNorm(1.0 + 0.3 * rng.normal(size=6), 0.3 * rng.normal(size=6), eps=eps)
    x, R = rng.normal(size=(3, 4, 6)) * 0.2, rng.normal(size=(3, 4, 6))
    y, saved = layer_norm_forward(norm, x)
    dx, grads = layer_norm_backward(R, saved)

    tx, t_gamma, t_beta = leaf(x), leaf(norm.gamma), leaf(norm.beta)
    t_y = F.layer_norm(tx, (6,), t_gamma, t_beta, eps=eps)
    (t_y * torch.from_numpy(R)).sum().backward()
    assert_close(y, t_y)
    assert_close(dx, tx.grad)
    assert_close(grads["gamma"], t_gamma.grad)
    assert_close(grads["beta"], t_beta.grad)


# --------------------------------------------------------------------------- a whole block


def copy_block_to_torch(block, layer):
    attn = block.self_attn
    with torch.no_grad():
        layer.self_attn.in_proj_weight.copy_(
            torch.from_numpy(np.concatenate([attn.W_q.T, attn.W_k.T, attn.W_v.T])))
        layer.self_attn.in_proj_bias.copy_(
            torch.from_numpy(np.concatenate([attn.b_q, attn.b_k, attn.b_v])))
        layer.self_attn.out_proj.weight.copy_(torch.from_numpy(np.ascontiguousarray(attn.W_o.T)))
        layer.self_attn.out_proj.bias.copy_(torch.from_numpy(attn.b_o))
        layer.linear1.weight.copy_(torch.from_numpy(np.ascontiguousarray(block.ff.W1.T)))
        layer.linear1.bias.copy_(torch.from_numpy(block.ff.b1))
        layer.linear2.weight.copy_(torch.from_numpy(np.ascontiguousarray(block.ff.W2.T)))
        layer.linear2.bias.copy_(torch.from_numpy(block.ff.b2))
        for ours, theirs in ((block.norm1, layer.norm1), (block.norm2, layer.norm2)):
            theirs.weight.copy_(torch.from_numpy(ours.gamma))
            theirs.bias.copy_(torch.from_numpy(ours.beta))


def torch_block_grads(layer, d_model):
    """Our gradient names -> PyTorch's gradients, transposed to our layout."""
    attn = layer.self_attn
    in_weight, in_bias = attn.in_proj_weight.grad.numpy(), attn.in_proj_bias.grad.numpy()
    grads = {}
    for index, name in enumerate("qkv"):
        rows = slice(index * d_model, (index + 1) * d_model)
        grads[f"self_attn.W_{name}"] = in_weight[rows].T
        grads[f"self_attn.b_{name}"] = in_bias[rows]
    grads |= {
        "self_attn.W_o": attn.out_proj.weight.grad.numpy().T,
        "self_attn.b_o": attn.out_proj.bias.grad.numpy(),
        "ff.W1": layer.linear1.weight.grad.numpy().T, "ff.b1": layer.linear1.bias.grad.numpy(),
        "ff.W2": layer.linear2.weight.grad.numpy().T, "ff.b2": layer.linear2.bias.grad.numpy(),
        "norm1.gamma": layer.norm1.weight.grad.numpy(), "norm1.beta": layer.norm1.bias.grad.numpy(),
        "norm2.gamma": layer.norm2.weight.grad.numpy(), "norm2.beta": layer.norm2.bias.grad.numpy(),
    }
    return grads


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-LN", "pre-LN"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("masks", ["none", "causal+padding"])
def test_encoder_block_gradients_equal_torch_autograd(norm_first, activation, masks):
    d_model, num_heads, d_ff, T = 8, 2, 12, 5
    rng = np.random.default_rng(3)
    block = randomize(EncoderBlock.init(d_model, num_heads, d_ff, rng, activation=activation,
                                        norm_first=norm_first), rng)
    x, R = rng.normal(size=(3, T, d_model)), rng.normal(size=(3, T, d_model))
    mask = src_mask = key_padding = None
    if masks != "none":
        padding = padding_mask([5, 3, 1], T)  # (3, 1, T), every query keeps >= 1 key
        mask = causal_mask(T) & padding
        src_mask = torch.from_numpy(~causal_mask(T))  # True = may NOT attend
        key_padding = torch.from_numpy(~padding[:, 0, :])
    y, _, saved = encoder_block_forward(block, x, mask)
    dx, grads = encoder_block_backward(R, saved)

    layer = torch.nn.TransformerEncoderLayer(
        d_model, num_heads, dim_feedforward=d_ff, dropout=0.0, activation=activation,
        batch_first=True, norm_first=norm_first, dtype=torch.float64)
    copy_block_to_torch(block, layer)
    tx = leaf(x)
    t_y = layer(tx, src_mask=src_mask, src_key_padding_mask=key_padding)
    (t_y * torch.from_numpy(R)).sum().backward()
    assert_close(y, t_y)
    assert_close(dx, tx.grad)
    expected = torch_block_grads(layer, d_model)
    assert grads.keys() == expected.keys()
    for name, grad in grads.items():
        assert_close(grad, expected[name])


# --------------------------------------------------------------------------- loss, optimizer


def test_cross_entropy_and_its_gradient_equal_torch_with_ignore_index():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(3, 4, 6)) * 4
    targets = rng.integers(0, 6, size=(3, 4))
    targets[2, 1:] = -100
    loss, saved = cross_entropy_forward(logits, targets)
    d_logits = cross_entropy_backward(1.0, saved)

    t_logits = leaf(logits)
    t_loss = F.cross_entropy(t_logits.reshape(-1, 6), torch.from_numpy(targets.reshape(-1)),
                             ignore_index=-100)
    t_loss.backward()
    assert loss == pytest.approx(t_loss.item(), rel=1e-12)
    assert_close(d_logits, t_logits.grad)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_steps_equal_torch_optim_adam(weight_decay):
    # A toy problem: least squares, 25 steps with a gradient that changes every step.
    rng = np.random.default_rng(5)
    A, target = rng.normal(size=(10, 4)), rng.normal(size=10)
    W, b = rng.normal(size=(4, 3)), rng.normal(size=3)
    ours = {"W": W.copy(), "b": b.copy()}
    theirs = {"W": leaf(W), "b": leaf(b)}
    optimizer = Adam(ours, lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay)
    t_optimizer = torch.optim.Adam(list(theirs.values()), lr=0.05, betas=(0.8, 0.99), eps=1e-6,
                                   weight_decay=weight_decay)
    t_A, t_target = torch.from_numpy(A), torch.from_numpy(target)
    for _ in range(25):
        residual = (A @ ours["W"] + ours["b"]).sum(axis=1) - target  # (10,)
        d_out = np.broadcast_to(2 * residual[:, None], (10, 3))
        optimizer.step({"W": A.T @ d_out, "b": d_out.sum(axis=0)})

        t_optimizer.zero_grad()
        t_loss = (((t_A @ theirs["W"] + theirs["b"]).sum(dim=1) - t_target) ** 2).sum()
        t_loss.backward()
        t_optimizer.step()
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name].detach().numpy(), rtol=1e-12,
                                   atol=1e-12)


def test_clip_grad_norm_equals_torch():
    rng = np.random.default_rng(6)
    grads = {"a": rng.normal(size=(3, 4)) * 5, "b": rng.normal(size=7)}
    tensors = [leaf(np.zeros_like(grad)) for grad in grads.values()]
    for tensor, grad in zip(tensors, grads.values()):
        tensor.grad = torch.from_numpy(grad.copy())
    expected_norm = torch.nn.utils.clip_grad_norm_(tensors, max_norm=2.0)
    norm = clip_grad_norm(grads, 2.0)
    assert norm == pytest.approx(expected_norm.item(), rel=1e-12)
    for tensor, grad in zip(tensors, grads.values()):
        assert_close(grad, tensor.grad)
