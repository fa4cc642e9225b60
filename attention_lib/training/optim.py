"""The Adam optimizer and gradient clipping (chapter 12); AdamW and a learning-rate schedule
(chapter 14)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Adam", "AdamW", "clip_grad_norm", "warmup_cosine_lr"]


class Adam:
    """Adam (Kingma and Ba, 2015): gradient descent with per-parameter adaptive step sizes.

    For each parameter ``theta`` with gradient ``g`` at step ``t = 1, 2, ...``::

        m = beta1 * m + (1 - beta1) * g            # running mean of the gradient
        v = beta2 * v + (1 - beta2) * g**2         # running mean of its square
        m_hat = m / (1 - beta1**t)                 # undo the bias towards the zero start
        v_hat = v / (1 - beta2**t)
        theta -= lr * m_hat / (sqrt(v_hat) + eps)

    Each entry moves by about ``lr`` in the direction its gradient has kept pointing,
    whatever the gradient's scale. ``weight_decay`` adds ``weight_decay * theta`` to the
    gradient first (L2 regularization, as ``torch.optim.Adam``).

    Parameters
    ----------
    params : dict of str to numpy.ndarray
        The arrays to train, updated in place (e.g. ``model.parameters()``).
    lr : float, default 1e-3
    betas : tuple of float, default (0.9, 0.999)
    eps : float, default 1e-8
    weight_decay : float, default 0.0

    Raises
    ------
    ValueError
        If a hyperparameter is out of range or a parameter is not a float array.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*. The same arithmetic, in the same
    order, as ``torch.optim.Adam`` (tested).

    Examples
    --------
    >>> theta = np.array([1.0, -2.0])
    >>> optimizer = Adam({"theta": theta}, lr=0.1)
    >>> optimizer.step({"theta": np.array([0.5, -30.0])})
    >>> theta.round(6)  # both entries moved by lr, whatever their gradient's size
    array([ 0.9, -1.9])
    """

    def __init__(self, params: dict[str, np.ndarray], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if not lr > 0:
            raise ValueError(f"lr must be positive; got {lr!r}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1); got {betas!r}")
        if not eps > 0 or not weight_decay >= 0:
            raise ValueError(f"eps must be positive and weight_decay >= 0; got eps={eps!r}, "
                             f"weight_decay={weight_decay!r}")
        for name, param in params.items():
            if not (isinstance(param, np.ndarray) and np.issubdtype(param.dtype, np.floating)):
                raise ValueError(f"parameter {name!r} must be a float numpy array (updated in "
                                 f"place); got {type(param).__name__}")
        self.params = dict(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.t = 0
        self.m = {name: np.zeros_like(param) for name, param in self.params.items()}
        self.v = {name: np.zeros_like(param) for name, param in self.params.items()}
        self.decoupled = set()  # AdamW: the names whose weight decay is decoupled
        self.l2_decay = True  # Adam adds weight_decay * theta to every gradient; AdamW does not

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """Update every parameter in place from its gradient (same names as ``params``)."""
        missing = self.params.keys() - grads.keys()
        if missing:
            raise ValueError(f"no gradient for the parameters {sorted(missing)}")
        self.t += 1
        beta1, beta2 = self.betas
        bias_correction1 = 1 - beta1**self.t
        bias_correction2 = 1 - beta2**self.t
        step_size = self.lr / bias_correction1
        for name, param in self.params.items():
            grad = grads[name]
            if name in self.decoupled:
                param *= 1 - self.lr * self.weight_decay  # AdamW: shrink, then Adam's step
            elif self.weight_decay and self.l2_decay:
                grad = grad + self.weight_decay * param
            m, v = self.m[name], self.v[name]
            m *= beta1
            m += (1 - beta1) * grad
            v *= beta2
            v += (1 - beta2) * grad * grad
            denominator = np.sqrt(v) / math.sqrt(bias_correction2) + self.eps
            param -= step_size * m / denominator


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov and Hutter, 2019).

    Before each Adam step, every decayed parameter shrinks towards zero by the factor
    ``1 - lr * weight_decay``::

        theta *= 1 - lr * weight_decay     # decay, outside Adam's adaptive scaling
        theta -= lr * m_hat / (sqrt(v_hat) + eps)

    Adding ``weight_decay * theta`` to the gradient instead (``Adam(weight_decay=...)``)
    would be divided by ``sqrt(v_hat)`` with the rest of the step, so parameters with large
    gradients would barely decay; decoupling makes the decay the same for every entry.

    Parameters
    ----------
    params : dict of str to numpy.ndarray
        The arrays to train, updated in place.
    lr : float, default 1e-3
    betas : tuple of float, default (0.9, 0.999)
    eps : float, default 1e-8
    weight_decay : float, default 1e-2
    no_decay : iterable of str, default ()
        Names of parameters that are not decayed (GPT training usually exempts norms,
        biases and embeddings).

    Raises
    ------
    ValueError
        If a hyperparameter is out of range, or ``no_decay`` names an unknown parameter.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*. The same arithmetic, in the same
    order, as ``torch.optim.AdamW`` with two parameter groups (tested).

    Examples
    --------
    >>> theta = np.array([1.0, -2.0])
    >>> optimizer = AdamW({"theta": theta}, lr=0.1, weight_decay=0.5)
    >>> optimizer.step({"theta": np.array([0.5, -30.0])})
    >>> theta.round(6)  # shrunk by 1 - 0.1 * 0.5 = 0.95, then moved by lr
    array([ 0.85, -1.8 ])
    """

    def __init__(self, params: dict[str, np.ndarray], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, no_decay=()):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        no_decay = set(no_decay)
        unknown = no_decay - self.params.keys()
        if unknown:
            raise ValueError(f"no_decay names parameters that are not in params: "
                             f"{sorted(unknown)}")
        self.decoupled = set(self.params) - no_decay
        self.l2_decay = False


def warmup_cosine_lr(step: int, *, max_lr: float, min_lr: float, warmup_steps: int,
                     decay_steps: int) -> float:
    """The learning rate at ``step``: a linear warm-up, then a cosine decay to ``min_lr``.

    ``max_lr * (step + 1) / (warmup_steps + 1)`` for ``step < warmup_steps``; then
    ``min_lr + (max_lr - min_lr) * (1 + cos(pi * r)) / 2`` with
    ``r = (step - warmup_steps) / (decay_steps - warmup_steps)`` going from 0 to 1;
    ``min_lr`` after ``decay_steps``. The warm-up keeps the first steps small while Adam's
    running averages are still poor estimates; the decay lets the last steps settle.

    Raises
    ------
    ValueError
        If the rates are not ``0 <= min_lr <= max_lr``, ``max_lr > 0``, or the step counts
        are not ``0 <= warmup_steps < decay_steps``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*. The same function as nanoGPT's
    ``get_lr`` (``train.py``).

    Examples
    --------
    >>> [round(warmup_cosine_lr(s, max_lr=1.0, min_lr=0.1, warmup_steps=1, decay_steps=3), 4)
    ...  for s in range(5)]
    [0.5, 1.0, 0.55, 0.1, 0.1]
    """
    if not (max_lr > 0 and 0 <= min_lr <= max_lr):
        raise ValueError(f"need max_lr > 0 and 0 <= min_lr <= max_lr; got max_lr={max_lr!r}, "
                         f"min_lr={min_lr!r}")
    if not 0 <= warmup_steps < decay_steps:
        raise ValueError(f"need 0 <= warmup_steps < decay_steps; got warmup_steps="
                         f"{warmup_steps!r}, decay_steps={decay_steps!r}")
    if step < warmup_steps:
        return max_lr * (step + 1) / (warmup_steps + 1)
    if step > decay_steps:
        return min_lr
    ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (max_lr - min_lr)


def clip_grad_norm(grads: dict[str, np.ndarray], max_norm: float) -> float:
    """Scale all gradients down together if their joint norm exceeds ``max_norm``.

    The norm is taken over every entry of every gradient. Scaling (not clipping entries)
    keeps the direction of the update. Returns the norm before clipping.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*. As
    ``torch.nn.utils.clip_grad_norm_``.

    Examples
    --------
    >>> grads = {"a": np.array([3.0, 4.0])}
    >>> clip_grad_norm(grads, 1.0), grads["a"].round(4)
    (5.0, array([0.6, 0.8]))
    """
    total = math.sqrt(sum(float(np.sum(grad * grad)) for grad in grads.values()))
    if total > max_norm:
        factor = max_norm / (total + 1e-6)
        for grad in grads.values():
            grad *= factor
    return total
