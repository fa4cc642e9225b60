"""Choosing the next token from a language model's logits: temperature, top-k, top-p (chapter 14).

Temperature is chapter 10's: ``softmax(logits / temperature)``. Top-k keeps only the ``k``
most probable tokens; top-p ("nucleus sampling", Holtzman et al. 2020) keeps the smallest set
of most probable tokens whose probabilities add up to at least ``p``. Both then renormalise
and draw from what is left. They are applied in that order: temperature, top-k, top-p.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._checks import as_float_array
from ..softmax import softmax

__all__ = ["filter_top_k", "filter_top_p", "next_token_probabilities", "sample_next",
           "generate"]


def _check_top_k(top_k) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1 (or None); got {top_k!r}")
    return int(top_k)


def _check_top_p(top_p) -> float:
    if (isinstance(top_p, bool) or not isinstance(top_p, numbers.Real)
            or not 0 < top_p <= 1):
        raise ValueError(f"top_p must lie in (0, 1] (or be None); got {top_p!r}")
    return float(top_p)


def _check_temperature(temperature) -> float:
    if (isinstance(temperature, bool) or not isinstance(temperature, numbers.Real)
            or not math.isfinite(temperature) or temperature <= 0):
        raise ValueError(f"temperature must be a finite number > 0; got {temperature!r}")
    return float(temperature)


def filter_top_k(logits, top_k: int) -> np.ndarray:
    """``logits`` with every entry below the ``top_k``-th largest of its row set to ``-inf``.

    Entries tied with the ``top_k``-th largest are kept (as nanoGPT's ``sample.py`` does), so
    a row may keep more than ``top_k`` entries only when there are ties. ``top_k`` larger than
    the vocabulary keeps everything.

    Shapes
    ------
    logits : (..., V) -> (..., V)

    Raises
    ------
    ValueError
        If ``top_k`` is not an integer >= 1.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.

    Examples
    --------
    >>> filter_top_k(np.array([1.0, 3.0, 2.0]), 2)
    array([-inf,   3.,   2.])
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    top_k = min(_check_top_k(top_k), logits.shape[-1])
    kth_largest = np.partition(logits, -top_k, axis=-1)[..., -top_k, None]  # (..., 1)
    return np.where(logits < kth_largest, -np.inf, logits).astype(logits.dtype, copy=False)


def filter_top_p(logits, top_p: float) -> np.ndarray:
    """``logits`` with everything outside the *nucleus* set to ``-inf``.

    The nucleus is the smallest set of most probable tokens whose probabilities add up to
    at least ``top_p``: sort the probabilities in decreasing order (ties by token id), and
    keep a token if the mass of the tokens before it is still below ``top_p``. The most
    probable token is always kept; ``top_p = 1`` keeps every token.

    Shapes
    ------
    logits : (..., V) -> (..., V)

    Raises
    ------
    ValueError
        If ``top_p`` is not in ``(0, 1]``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*; nucleus sampling is Holtzman et
    al. (2020).

    Examples
    --------
    >>> logits = np.log(np.array([0.5, 0.2, 0.3]))
    >>> filter_top_p(logits, 0.7).round(4)  # 0.5 + 0.3 reaches 0.7; 0.2 is cut
    array([-0.6931,    -inf, -1.204 ])
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    top_p = _check_top_p(top_p)
    probabilities = softmax(logits, axis=-1)
    order = np.argsort(-probabilities, axis=-1, kind="stable")  # ties: the lower id first
    sorted_probabilities = np.take_along_axis(probabilities, order, axis=-1)
    mass_before = np.cumsum(sorted_probabilities, axis=-1) - sorted_probabilities
    keep_sorted = mass_before < top_p  # (..., V), True for a prefix of each row
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf).astype(logits.dtype, copy=False)


def next_token_probabilities(logits, temperature: float = 1.0, top_k: int | None = None,
                             top_p: float | None = None) -> np.ndarray:
    """The distribution the next token is drawn from: temperature, then top-k, then top-p.

    Shapes
    ------
    logits : (..., V) -> (..., V), rows summing to 1

    Raises
    ------
    ValueError
        If ``temperature <= 0``, ``top_k < 1`` or ``top_p`` outside ``(0, 1]``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    logits = logits / np.asarray(_check_temperature(temperature), dtype=logits.dtype)
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    if top_p is not None:
        logits = filter_top_p(logits, top_p)
    return softmax(logits, axis=-1)


def sample_next(logits, rng: np.random.Generator, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """Draw one token id per row of ``logits`` from :func:`next_token_probabilities`.

    One uniform number per row picks the token where the cumulative probability first
    exceeds it, so the same ``rng`` state gives the same tokens. Tokens of probability 0
    are never drawn.

    Shapes
    ------
    logits : (..., V) -> ids (...)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.

    Examples
    --------
    >>> sample_next(np.array([[0.0, 5.0, 1.0]]), np.random.default_rng(0), top_k=1)
    array([1])
    """
    probabilities = next_token_probabilities(logits, temperature, top_k, top_p)
    cumulative = np.cumsum(probabilities.astype(np.float64), axis=-1)  # (..., V)
    draws = rng.random(cumulative.shape[:-1]) * cumulative[..., -1]  # (...)
    return (cumulative <= draws[..., None]).sum(axis=-1)


def generate(model, prompt_ids, num_new_tokens: int, rng: np.random.Generator, *,
             temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None) -> np.ndarray:
    """Continue ``prompt_ids`` by ``num_new_tokens`` tokens, one at a time.

    The model sees at most its last ``model.context_len`` tokens: a longer prompt, or prompt
    plus generated text, is cropped from the left (the most recent context is kept). Each
    step draws the next token from the last row of logits with :func:`sample_next`. While
    everything fits in the context, a key/value cache (chapter 10) computes only the new
    position; after that, each step runs the model on the cropped window again.

    Shapes
    ------
    prompt_ids : (T,) int with T >= 1 -> (T + num_new_tokens,) int

    Raises
    ------
    ValueError
        For an empty prompt or a bad sampling argument (checked before any work).

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt_ids must be a non-empty 1-d integer array; got shape "
                         f"{ids.shape}, dtype {ids.dtype}")
    if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, numbers.Integral) \
            or num_new_tokens < 0:
        raise ValueError(f"num_new_tokens must be an integer >= 0; got {num_new_tokens!r}")
    next_token_probabilities(np.zeros(1), temperature, top_k, top_p)  # check the arguments
    ids = ids.astype(np.int64)
    if num_new_tokens == 0:
        return ids
    cache = model.new_cache()
    logits = model.forward(ids[None, -model.context_len:], cache=cache)[0, -1]  # (V,)
    for step in range(num_new_tokens):
        ids = np.append(ids, sample_next(logits, rng, temperature, top_k, top_p))
        if step == num_new_tokens - 1:
            break
        if cache.length < model.context_len:  # room left: feed only the new token
            logits = model.forward(ids[None, -1:], cache=cache)[0, -1]
        else:  # crop from the left and run the whole window
            logits = model.forward(ids[None, -model.context_len:])[0, -1]
    return ids
