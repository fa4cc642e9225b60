"""Shared inputs for tests/test_variants.py and tests/test_parity_torch_variants.py."""

import numpy as np
import pytest

from attention_lib.variants import MultiHeadLatentAttention

DTYPES = pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["float64", "float32"])
TOLERANCE = {np.float64: 1e-10, np.float32: 2e-4}


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def small_mla(rng, dtype=np.float64):
    """H = 3 heads; widths all different (d_model 24, d_query_latent 12, d_latent 10, d_head
    6, d_rope 4, d_v 5), so a mix-up of two of them cannot go unnoticed."""
    return MultiHeadLatentAttention.init(24, 3, rng, d_latent=10, d_query_latent=12, d_head=6,
                                         d_rope=4, d_v=5, dtype=dtype)


def delta_inputs(rng, shape=(2, 3, 40), d_k=8, d_v=6, dtype=np.float64):
    """q, unit keys, v, beta in [0, 1], decay in [0.8, 1], an initial state (..., d_v, d_k)."""
    q = rng.normal(size=(*shape, d_k))
    k = unit_rows(rng.normal(size=(*shape, d_k)))
    v = rng.normal(size=(*shape, d_v))
    beta = rng.uniform(0, 1, size=shape)
    decay = rng.uniform(0.8, 1.0, size=shape)
    state = rng.normal(size=(*shape[:-1], d_v, d_k))
    return tuple(x.astype(dtype) for x in (q, k, v, beta, decay, state))
