"""Parity with PyTorch in float16: LayerNorm == nn.LayerNorm and RMSNorm == nn.RMSNorm.

Entries around 1000 in float16: their squares (about 1e6) overflow float16 (largest finite
65504), so a norm that computed its statistics in float16 would get an infinite variance and
return zeros. PyTorch computes them in float32 and rounds the result to float16; so must we.
The tolerance is a few float16 roundings of the output: 4 * eps(float16) * max(1, |y|).
"""

import numpy as np
import pytest

from attention_lib import LayerNorm, RMSNorm

torch = pytest.importorskip("torch")

EPS16 = float(np.finfo(np.float16).eps)  # 2**-10


def float16_inputs(seed):
    """(3, 5, 16) float16 entries of size about 1000, plus the reviewer's [300, -300, 10, 5]."""
    rng = np.random.default_rng(seed)
    x = (1000.0 * rng.standard_normal((3, 5, 16)) + 200.0).astype(np.float16)
    assert (np.abs(x) > np.sqrt(np.finfo(np.float16).max)).mean() > 0.5  # most squares overflow
    return x


def assert_close_in_float16(ours, theirs):
    assert ours.dtype == np.float16
    theirs = theirs.detach().numpy()
    assert np.isfinite(ours).all()
    tolerance = 4 * EPS16 * np.maximum(1.0, np.abs(theirs.astype(np.float64)))
    assert (np.abs(ours.astype(np.float64) - theirs.astype(np.float64)) <= tolerance).all()


def test_layer_norm_float16_with_entries_around_1000_equals_torch():
    rng = np.random.default_rng(0)
    x = float16_inputs(1)
    norm = LayerNorm(rng.normal(1.0, 0.5, 16).astype(np.float16),
                     rng.normal(size=16).astype(np.float16))
    torch_norm = torch.nn.LayerNorm(16, eps=norm.eps, dtype=torch.float16)
    with torch.no_grad():
        torch_norm.weight.copy_(torch.from_numpy(norm.gamma))
        torch_norm.bias.copy_(torch.from_numpy(norm.beta))
        expected = torch_norm(torch.from_numpy(x))
    assert_close_in_float16(norm(x), expected)
    assert np.abs(norm(x)).max() > 1.0  # not the all-beta output of an infinite variance


def test_rms_norm_float16_with_entries_around_1000_equals_torch():
    rng = np.random.default_rng(2)
    x = float16_inputs(3)
    norm = RMSNorm(rng.normal(1.0, 0.5, 16).astype(np.float16))
    torch_norm = torch.nn.RMSNorm(16, eps=norm.eps, dtype=torch.float16)
    with torch.no_grad():
        torch_norm.weight.copy_(torch.from_numpy(norm.gamma))
        expected = torch_norm(torch.from_numpy(x))
    assert_close_in_float16(norm(x), expected)
    assert np.abs(norm(x)).max() > 1.0  # not the zeros of an infinite mean square


def test_the_reviewers_example_matches_torch_in_float16():
    x = np.array([300.0, -300.0, 10.0, 5.0], dtype=np.float16)
    with torch.no_grad():
        torch_layer = torch.nn.LayerNorm(4, dtype=torch.float16)(torch.from_numpy(x))
        torch_rms = torch.nn.RMSNorm(4, eps=1e-6, dtype=torch.float16)(torch.from_numpy(x))
    assert_close_in_float16(LayerNorm.init(4, dtype=np.float16)(x), torch_layer)
    assert_close_in_float16(RMSNorm.init(4, dtype=np.float16)(x), torch_rms)
