"""Checking a backward pass against centred finite differences (chapter 12)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["numerical_gradient", "relative_error", "check_gradients"]


def numerical_gradient(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """The gradient of the scalar ``f()`` with respect to the array ``x``, by centred
    differences ``(f(x + eps e_i) - f(x - eps e_i)) / (2 eps)``, one entry at a time.

    ``x`` is changed in place and restored, so ``f`` reads it (it takes no argument): a
    parameter inside a model can be checked without rebuilding the model. The error of a
    centred difference is of order ``eps**2``; use float64.

    Shapes
    ------
    x : (...) -> (...)

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> x = np.array([1.0, 2.0])
    >>> numerical_gradient(lambda: float(np.sum(x**3)), x).round(6)  # 3 x^2
    array([ 3., 12.])
    """
    if x.dtype != np.float64:
        raise TypeError(f"numerical_gradient needs a float64 array; got {x.dtype}")
    grad = np.zeros_like(x)
    flat_x, flat_grad = x.reshape(-1), grad.reshape(-1)  # views: writing them writes x, grad
    if not np.shares_memory(flat_x, x):
        raise ValueError("x must be contiguous (its reshape must be a view)")
    for i in range(flat_x.size):
        original = flat_x[i]
        flat_x[i] = original + eps
        f_plus = f()
        flat_x[i] = original - eps
        f_minus = f()
        flat_x[i] = original
        flat_grad[i] = (f_plus - f_minus) / (2 * eps)
    return grad


def relative_error(a, b) -> float:
    """``|a - b| / (|a| + |b|)`` with Frobenius norms: 0 for equal arrays, 1 for opposite ones.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    0.0
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    denominator = np.linalg.norm(a) + np.linalg.norm(b)
    return 0.0 if denominator == 0 else float(np.linalg.norm(a - b) / denominator)


def check_gradients(loss_fn: Callable[[], float], params: dict[str, np.ndarray],
                    grads: dict[str, np.ndarray], eps: float = 1e-6,
                    zero_tol: float = 1e-7) -> dict[str, float]:
    """The relative error of every analytic gradient against finite differences.

    ``loss_fn()`` computes the loss from the current values of ``params`` (arrays changed
    in place); ``grads`` holds the analytic gradients under the same names.

    A gradient that is zero is compared absolutely: if both the analytic and the numerical
    gradient have a norm below ``zero_tol``, the error is reported as 0.0 (a relative error
    of two round-off noises, about 1e-10 each, means nothing). The key bias ``b_k`` of
    attention is such a case: adding the same vector to every key adds the same number to
    every score of a row, which softmax ignores, so its gradient is exactly zero.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    errors = {}
    for name, param in params.items():
        numerical = numerical_gradient(loss_fn, param, eps)
        both_zero = max(np.linalg.norm(grads[name]), np.linalg.norm(numerical)) < zero_tol
        errors[name] = 0.0 if both_zero else relative_error(grads[name], numerical)
    return errors
