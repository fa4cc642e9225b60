"""A training loop with a plain-text progress bar (chapter 12)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np

from .._checks import check_positive_int
from .optim import clip_grad_norm

__all__ = ["train", "progress_bar"]


def progress_bar(step: int, num_steps: int, loss: float, width: int = 20,
                 extra: dict[str, float] | None = None, digits: int = 4) -> str:
    """One line of progress: ``[#####---------------]  250/1000  loss 1.2345``.

    Nothing in it depends on the clock, so a notebook that prints it reproduces its output
    exactly. ``extra`` appends more named numbers (``train 1.2345  val 1.3456``, the losses
    of an evaluation); ``digits`` is the number of decimals of every number.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> progress_bar(250, 1000, 1.23456)
    '[#####---------------]  250/1000  loss 1.2346'
    """
    done = width * step // num_steps
    step_width = len(str(num_steps))
    line = (f"[{'#' * done}{'-' * (width - done)}] {step:{step_width}d}/{num_steps}  "
            f"loss {loss:.{digits}f}")
    for name, value in (extra or {}).items():
        line += f"  {name} {value:.{digits}f}"
    return line


def train(step_fn: Callable, optimizer, batches: Iterator | Callable[[int], object],
          num_steps: int, *, clip_norm: float | None = None,
          lr_schedule: Callable[[int], float] | None = None, log_every: int | None = None,
          print_fn: Callable[[str], None] = print,
          eval_fn: Callable[[int], dict[str, float]] | None = None,
          digits: int = 4) -> np.ndarray:
    """Run ``num_steps`` steps of: get a batch, compute loss and gradients, update.

    Parameters
    ----------
    step_fn : callable
        ``step_fn(batch) -> (loss, grads)``, with ``grads`` keyed like the optimizer's
        parameters (e.g. a wrapper of
        :func:`~attention_lib.training.models.loss_and_grads`).
    optimizer : Adam
        Anything with ``step(grads)`` (and an ``lr`` attribute if ``lr_schedule`` is given).
    batches : iterator or callable
        The batches, as an iterator (``next(batches)``) or a function of the step index.
    num_steps : int
    clip_norm : float, optional
        Rescale the gradients to this joint norm when larger
        (:func:`~attention_lib.training.optim.clip_grad_norm`).
    lr_schedule : callable, optional
        ``lr_schedule(step) -> learning rate`` for step ``0 .. num_steps - 1``.
    log_every : int, optional
        Print a :func:`progress_bar` line (with the mean loss since the last line) every
        this many steps and after the last one; None prints nothing.
    print_fn : callable, default print
    eval_fn : callable, optional
        ``eval_fn(steps_done) -> {"train": ..., "val": ...}``, called at every progress line
        (so every ``log_every`` steps and after the last); its numbers are appended to the
        line (e.g. the losses on both splits, chapter 14).
    digits : int, default 4
        Decimals of the numbers on the progress line.

    Returns
    -------
    numpy.ndarray
        The loss of every step, ``(num_steps,)``.

    Raises
    ------
    FloatingPointError
        If a loss is NaN or infinite (the step and the loss are named), instead of
        training on garbage.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    num_steps = check_positive_int(num_steps, "num_steps")
    next_batch = batches if callable(batches) else (lambda _: next(batches))
    losses = np.empty(num_steps)
    last_logged = 0
    for step in range(num_steps):
        if lr_schedule is not None:
            optimizer.lr = lr_schedule(step)
        loss, grads = step_fn(next_batch(step))
        if not math.isfinite(loss):
            raise FloatingPointError(f"the loss is {loss} at step {step}; lower the learning "
                                     "rate or clip the gradients")
        if clip_norm is not None:
            clip_grad_norm(grads, clip_norm)
        optimizer.step(grads)
        losses[step] = loss
        if log_every and ((step + 1) % log_every == 0 or step + 1 == num_steps):
            extra = None if eval_fn is None else eval_fn(step + 1)
            print_fn(progress_bar(step + 1, num_steps, losses[last_logged:step + 1].mean(),
                                  extra=extra, digits=digits))
            last_logged = step + 1
    return losses
