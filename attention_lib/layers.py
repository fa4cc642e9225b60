"""Normalization, the position-wise feed-forward network and activations (chapter 08)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import erf

from ._checks import as_float_array, check_positive_int
from .attention import init_linear_weight, project

__all__ = ["relu", "gelu", "gelu_tanh", "silu", "ACTIVATIONS", "LayerNorm", "RMSNorm",
           "FeedForward", "GatedFeedForward"]


def relu(x) -> np.ndarray:
    """``max(x, 0)``: the activation of the 2017 transformer's feed-forward layer.

    Shapes
    ------
    x : (...) -> (...)

    Notes
    -----
    Derived in chapter 08, *The transformer block*.

    Examples
    --------
    >>> relu(np.array([-1.0, 0.5]))
    array([0. , 0.5])
    """
    x = as_float_array(x, "x")
    return np.maximum(x, 0)


def gelu(x) -> np.ndarray:
    """The exact Gaussian error linear unit ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))``.

    Hendrycks and Gimpel 2016. PyTorch's ``activation="gelu"`` and Hugging Face's BERT
    (activation ``"gelu"``, documented as "the original implementation ... in Google BERT
    repo when initially created") compute this exact form. Google's BERT code
    (``modeling.py``) did so in its first release (2018) and has computed the ``tanh``
    approximation since February 2019. That approximation, :func:`gelu_tanh` (also
    GPT-2's code), differs from this one by up to about 5e-4.

    Shapes
    ------
    x : (...) -> (...)

    Notes
    -----
    Derived in chapter 08, *The transformer block*.

    Examples
    --------
    >>> gelu(np.array([0.0, 1.0])).round(4)
    array([0.    , 0.8413])
    """
    x = as_float_array(x, "x")
    return (0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))).astype(x.dtype, copy=False)


def gelu_tanh(x) -> np.ndarray:
    """The ``tanh`` approximation of GELU (Hendrycks and Gimpel 2016), used by GPT-2's code.

    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    Shapes
    ------
    x : (...) -> (...)

    Notes
    -----
    Derived in chapter 08, *The transformer block*.

    Examples
    --------
    >>> gelu_tanh(np.array([1.0])).round(4)
    array([0.8412])
    """
    x = as_float_array(x, "x")
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)
    return 0.5 * x * (1.0 + np.tanh(inner))


def silu(x) -> np.ndarray:
    """``x * sigmoid(x)`` (also called swish), the gate activation of Llama's SwiGLU.

    Shapes
    ------
    x : (...) -> (...)

    Notes
    -----
    Derived in chapter 08, *The transformer block*.

    Examples
    --------
    >>> silu(np.array([0.0, 1.0])).round(4)
    array([0.    , 0.7311])
    """
    x = as_float_array(x, "x")
    # x * sigmoid(x) written with exp(-|x|) so that no exp overflows for large |x|.
    e = np.exp(-np.abs(x))
    sigmoid = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)
    return x * sigmoid


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}
"""The activations :class:`FeedForward` accepts, by name."""


def _check_eps(eps) -> float:
    """Return ``eps`` as a float, or raise naming it if it is not a finite positive number."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"eps must be a real number; got {eps!r}")
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be finite and positive; got {eps!r}")
    return float(eps)


def _at_least_float32(x: np.ndarray) -> np.ndarray:
    """``x`` in float32 if it is float16 (whose squares overflow beyond ~256), else as is."""
    return x.astype(np.result_type(x.dtype, np.float32), copy=False)


def _check_features(x: np.ndarray, expected: int, owner: str) -> None:
    if x.shape[-1] != expected:
        raise ValueError(
            f"x has {x.shape[-1]} features but the {owner} expects {expected} (x.shape={x.shape})"
        )


@dataclass
class LayerNorm:
    """Normalize each token's vector to mean 0 and variance 1, then scale and shift.

    ``y = (x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis, with the
    *biased* variance (divide by ``d``), as in Ba et al. 2016 and PyTorch. Note
    ``sqrt(var + eps)``, not ``std + eps``: the two differ most when the variance is small.

    Attributes
    ----------
    gamma : numpy.ndarray
        Learned scale, one per feature, ``(d,)``; starts at 1.
    beta : numpy.ndarray
        Learned shift, one per feature, ``(d,)``; starts at 0.
    eps : float
        Added to the variance, finite and positive; PyTorch's default is 1e-5 (BERT uses
        1e-12).

    Shapes
    ------
    x : (..., d) -> (..., d)

    Notes
    -----
    Derived in chapter 08, *The transformer block*. Equal to ``torch.nn.LayerNorm``. Float16
    input is normalized in float32 and the result cast back.

    Examples
    --------
    >>> LayerNorm.init(2)(np.array([[1.0, 3.0]])).round(4)
    array([[-1.,  1.]])
    """

    gamma: np.ndarray
    beta: np.ndarray
    eps: float = 1e-5

    def __post_init__(self):
        self.gamma = as_float_array(self.gamma, "gamma", min_ndim=1)
        self.beta = as_float_array(self.beta, "beta", min_ndim=1)
        if self.gamma.ndim != 1 or self.gamma.shape != self.beta.shape:
            raise ValueError(
                f"gamma and beta must both have shape (d,); got {self.gamma.shape} and "
                f"{self.beta.shape}"
            )
        self.eps = _check_eps(self.eps)

    @classmethod
    def init(cls, d: int, eps: float = 1e-5, dtype=np.float64) -> LayerNorm:
        """gamma = 1 and beta = 0: the identity after normalizing."""
        d = check_positive_int(d, "d")
        return cls(np.ones(d, dtype=dtype), np.zeros(d, dtype=dtype), eps)

    def __call__(self, x) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        _check_features(x, self.gamma.shape[0], "LayerNorm")
        out_dtype = np.result_type(x.dtype, self.gamma.dtype, self.beta.dtype)
        x = _at_least_float32(x)  # float16's (x - mean)**2 overflows beyond |x - mean| ~ 256
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, (..., 1)
        normalized = (x - mean) / np.sqrt(variance + self.eps)
        return (normalized * self.gamma + self.beta).astype(out_dtype, copy=False)


@dataclass
class RMSNorm:
    """Scale each token's vector to root-mean-square 1, then by ``gamma`` (no centring).

    ``y = x / sqrt(mean(x^2) + eps) * gamma`` over the last axis: LayerNorm without the
    mean and without ``beta``, cheaper and used by Llama-style models.

    Attributes
    ----------
    gamma : numpy.ndarray
        Learned scale, one per feature, ``(d,)``; starts at 1.
    eps : float
        Added to the mean square, finite and positive (default 1e-6).

    Shapes
    ------
    x : (..., d) -> (..., d)

    Notes
    -----
    Derived in chapter 08, *The transformer block*. Equal to ``torch.nn.RMSNorm`` with the
    same ``eps``. Float16 input is normalized in float32 and the result cast back.

    Examples
    --------
    >>> RMSNorm.init(2)(np.array([[3.0, 4.0]])).round(4)
    array([[0.8485, 1.1314]])
    """

    gamma: np.ndarray
    eps: float = 1e-6

    def __post_init__(self):
        self.gamma = as_float_array(self.gamma, "gamma", min_ndim=1)
        if self.gamma.ndim != 1:
            raise ValueError(f"gamma must have shape (d,); got {self.gamma.shape}")
        self.eps = _check_eps(self.eps)

    @classmethod
    def init(cls, d: int, eps: float = 1e-6, dtype=np.float64) -> RMSNorm:
        d = check_positive_int(d, "d")
        return cls(np.ones(d, dtype=dtype), eps)

    def __call__(self, x) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        _check_features(x, self.gamma.shape[0], "RMSNorm")
        out_dtype = np.result_type(x.dtype, self.gamma.dtype)
        x = _at_least_float32(x)  # float16's x * x overflows beyond |x| ~ 256
        mean_square = (x * x).mean(axis=-1, keepdims=True)  # (..., 1)
        return (x / np.sqrt(mean_square + self.eps) * self.gamma).astype(out_dtype, copy=False)


@dataclass
class FeedForward:
    """The position-wise feed-forward network: ``activation(x W1 + b1) W2 + b2``.

    Applied to every token on its own (the same weights at every position): widen to
    ``d_ff`` (4 d_model in the paper), apply the non-linearity, project back.

    Attributes
    ----------
    W1 : numpy.ndarray
        ``(d_model, d_ff)``.
    b1 : numpy.ndarray
        ``(d_ff,)``.
    W2 : numpy.ndarray
        ``(d_ff, d_model)``.
    b2 : numpy.ndarray
        ``(d_model,)``.
    activation : str
        A key of :data:`ACTIVATIONS`: ``"relu"`` (the paper), ``"gelu"`` (the exact form,
        Hugging Face's BERT) or ``"gelu_tanh"`` (the tanh approximation: GPT-2's code and
        Google's BERT code since 2019).

    Shapes
    ------
    x : (..., T, d_model) -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 08, *The transformer block*.

    Examples
    --------
    >>> ff = FeedForward.init(4, 16, np.random.default_rng(0))
    >>> ff(np.ones((3, 4))).shape
    (3, 4)
    """

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    activation: str = "relu"

    def __post_init__(self):
        for name in ("W1", "b1", "W2", "b2"):
            setattr(self, name, as_float_array(getattr(self, name), name, min_ndim=1))
        if self.W1.ndim != 2 or self.W2.ndim != 2:
            raise ValueError(f"W1 and W2 must be 2-d; got {self.W1.shape} and {self.W2.shape}")
        d_model, d_ff = self.W1.shape
        if (self.W2.shape != (d_ff, d_model) or self.b1.shape != (d_ff,)
                or self.b2.shape != (d_model,)):
            raise ValueError(
                f"with W1 of shape {self.W1.shape} = (d_model, d_ff), expected b1 ({d_ff},), "
                f"W2 ({d_ff}, {d_model}), b2 ({d_model},); got {self.b1.shape}, "
                f"{self.W2.shape}, {self.b2.shape}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(ACTIVATIONS)}; got {self.activation!r}"
            )

    @classmethod
    def init(cls, d_model: int, d_ff: int, rng: np.random.Generator,
             activation: str = "relu", dtype=np.float64) -> FeedForward:
        """Weights of scale ``1/sqrt(d_in)``, zero biases."""
        return cls(
            W1=init_linear_weight(d_model, d_ff, rng, dtype),
            b1=np.zeros(d_ff, dtype=dtype),
            W2=init_linear_weight(d_ff, d_model, rng, dtype),
            b2=np.zeros(d_model, dtype=dtype),
            activation=activation,
        )

    def __call__(self, x) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        _check_features(x, self.W1.shape[0], "FeedForward")
        hidden = ACTIVATIONS[self.activation](project(x, self.W1, self.b1))  # (..., T, d_ff)
        return project(hidden, self.W2, self.b2)  # (..., T, d_model)


@dataclass
class GatedFeedForward:
    """The gated feed-forward network of Llama-style models (SwiGLU with ``silu``).

    ``(activation(x W_gate) * (x W_up)) W_down``: one projection, passed through the
    activation, multiplies another elementwise; no biases. (With ``silu`` that factor is not a
    gate in [0, 1]: it dips to about -0.28 and is unbounded above.)

    Attributes
    ----------
    W_gate : numpy.ndarray
        ``(d_model, d_ff)``.
    W_up : numpy.ndarray
        ``(d_model, d_ff)``.
    W_down : numpy.ndarray
        ``(d_ff, d_model)``.
    activation : str
        A key of :data:`ACTIVATIONS`; ``"silu"`` gives SwiGLU.

    Shapes
    ------
    x : (..., T, d_model) -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 08, *The transformer block*; used by the real decoder of chapter 16.

    Examples
    --------
    >>> ff = GatedFeedForward.init(4, 16, np.random.default_rng(0))
    >>> ff(np.ones((3, 4))).shape
    (3, 4)
    """

    W_gate: np.ndarray
    W_up: np.ndarray
    W_down: np.ndarray
    activation: str = "silu"

    def __post_init__(self):
        names = ("W_gate", "W_up", "W_down")
        for name in names:
            setattr(self, name, as_float_array(getattr(self, name), name, min_ndim=1))
        if any(getattr(self, name).ndim != 2 for name in names):
            got = ", ".join(f"{name} {getattr(self, name).shape}" for name in names)
            raise ValueError(f"W_gate, W_up and W_down must be 2-d; got {got}")
        d_model, d_ff = self.W_gate.shape
        if self.W_up.shape != (d_model, d_ff) or self.W_down.shape != (d_ff, d_model):
            raise ValueError(
                f"with W_gate of shape {self.W_gate.shape} = (d_model, d_ff), expected W_up "
                f"({d_model}, {d_ff}) and W_down ({d_ff}, {d_model}); got {self.W_up.shape} "
                f"and {self.W_down.shape}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {sorted(ACTIVATIONS)}; got {self.activation!r}"
            )

    @classmethod
    def init(cls, d_model: int, d_ff: int, rng: np.random.Generator,
             activation: str = "silu", dtype=np.float64) -> GatedFeedForward:
        return cls(
            W_gate=init_linear_weight(d_model, d_ff, rng, dtype),
            W_up=init_linear_weight(d_model, d_ff, rng, dtype),
            W_down=init_linear_weight(d_ff, d_model, rng, dtype),
            activation=activation,
        )

    def __call__(self, x) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        _check_features(x, self.W_gate.shape[0], "GatedFeedForward")
        gate = ACTIVATIONS[self.activation](project(x, self.W_gate))  # (..., T, d_ff)
        return project(gate * project(x, self.W_up), self.W_down)  # (..., T, d_model)
