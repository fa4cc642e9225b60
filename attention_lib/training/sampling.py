"""Choosing the next token from a language model's logits: temperature, top-k, top-p (chapter
14), min-p and a repetition penalty (chapter 17).

Temperature is chapter 10's: ``softmax(logits / temperature)``. Top-k keeps only the ``k``
most probable tokens; top-p ("nucleus sampling", Holtzman et al. 2020) keeps the smallest set
of most probable tokens whose probabilities add up to at least ``p``; min-p (Nguyen et al.
2025) keeps the tokens at least ``min_p`` times as probable as the most probable one. What is
left is renormalised and drawn from. The repetition penalty (Keskar et al. 2019, CTRL) makes
every token that already occurred less likely before anything else is decided.

Every rule is off unless asked for (chapter 14's defaults are unchanged). They apply in this
order, the order of Hugging Face ``transformers`` (``GenerationMixin._get_logits_processor``:
the repetition penalty among the logits processors, then the warpers temperature, top-k,
top-p, min-p):

1. the repetition penalty, on the raw logits;
2. temperature;
3. top-k, then top-p, then min-p, each on the distribution the previous steps left.

The penalty comes first because it changes *which* tokens are likely: a penalised token must
be able to fall out of the top-k, the nucleus or the min-p set (llama.cpp's default chain
also starts with it). It commutes with temperature (both only scale a logit, and a positive
temperature keeps its sign). Temperature before the filters is a choice: llama.cpp's default
chain (``common_params_sampling::samplers`` in ``common/common.h``: penalties, DRY, top-n-sigma,
top-k, typical, top-p, min-p, XTC, temperature) applies temperature *last*, so its filters see
the untempered distribution and a high temperature cannot bring back a token min-p removed.
Here, as in ``transformers``, the filters see the tempered distribution: min-p at temperature
``T`` keeps the tokens whose logit is within ``T * log(1 / min_p)`` of the largest.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .._checks import as_float_array
from ..softmax import softmax

__all__ = ["apply_repetition_penalty", "filter_min_p", "filter_top_k", "filter_top_p",
           "generate", "next_token_probabilities", "sample_next"]


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


def _check_min_p(min_p) -> float:
    if (isinstance(min_p, bool) or not isinstance(min_p, numbers.Real)
            or not 0 <= min_p <= 1):
        raise ValueError(f"min_p must lie in [0, 1] (or be None); got {min_p!r}")
    return float(min_p)


def _check_penalty(penalty) -> float:
    if (isinstance(penalty, bool) or not isinstance(penalty, numbers.Real)
            or not math.isfinite(penalty) or penalty <= 0):
        raise ValueError(f"repetition_penalty must be a finite number > 0 (or None); "
                         f"got {penalty!r}")
    return float(penalty)


def _check_penalty_last_n(penalty_last_n) -> int | None:
    if penalty_last_n is None:
        return None
    if (isinstance(penalty_last_n, bool) or not isinstance(penalty_last_n, numbers.Integral)
            or penalty_last_n < 1):
        raise ValueError(f"penalty_last_n must be an integer >= 1 (or None for every "
                         f"token); got {penalty_last_n!r}")
    return int(penalty_last_n)


def _check_sampling(temperature, top_k, top_p, min_p, repetition_penalty,
                    penalty_last_n) -> None:
    """Every sampling argument checked at once, before any model work."""
    next_token_probabilities(np.zeros(1), temperature, top_k, top_p, min_p=min_p,
                             repetition_penalty=repetition_penalty,
                             previous_ids=np.zeros(0, np.int64))
    _check_penalty_last_n(penalty_last_n)


def _recent_ids(ids, penalty_last_n: int | None) -> np.ndarray:
    """The ids the repetition penalty looks at: all of ``ids``, or only the last
    ``penalty_last_n``."""
    return ids if penalty_last_n is None else ids[-penalty_last_n:]


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


def filter_min_p(logits, min_p: float) -> np.ndarray:
    """``logits`` with every token less than ``min_p`` times as probable as the most probable
    one set to ``-inf``.

    A token of probability ``p`` is kept when ``p >= min_p * p_max`` (Nguyen et al. 2025,
    "min-p"). The cut scales with the model's confidence: a peaked distribution keeps few
    tokens, a flat one many. Since ``p / p_max = exp(logit - max logit)``, the test needs no
    softmax; it is done on the logits (as llama.cpp's ``llama_sampler_min_p_apply`` does).
    ``min_p = 0`` keeps everything; ``min_p = 1`` keeps only the most probable token (and
    any token tied with it).

    Shapes
    ------
    logits : (..., V) -> (..., V)

    Raises
    ------
    ValueError
        If ``min_p`` is not in ``[0, 1]``.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    >>> np.isfinite(filter_min_p(logits, 0.2))  # keeps p >= 0.2 * 0.5 = 0.1
    array([ True,  True,  True, False])
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    min_p = _check_min_p(min_p)
    largest = logits.max(axis=-1, keepdims=True)  # (..., 1)
    with np.errstate(invalid="ignore"):  # a row of only -inf: nothing to compare with
        relative = np.exp(logits - largest)  # p / p_max, in [0, 1]
    keep = (relative >= min_p) | (logits == largest)
    return np.where(keep, logits, -np.inf).astype(logits.dtype, copy=False)


def apply_repetition_penalty(logits, previous_ids, penalty: float) -> np.ndarray:
    """``logits`` with every token that occurs in ``previous_ids`` made less likely.

    CTRL's penalty (Keskar et al. 2019) divides the logit of every token that already
    occurred by ``penalty`` (1.2 by default in its reference code, ``pytorch_generation.py``).
    Dividing a *negative* logit would raise it, making the token more likely, so, as Hugging
    Face ``transformers`` (``RepetitionPenaltyLogitsProcessor``) and llama.cpp
    (``llama_sampler_penalties_apply``) do, a positive logit is divided by ``penalty`` and a
    negative one multiplied by it. A token is penalised once however often it occurred.
    ``penalty > 1`` discourages repetition, ``penalty < 1`` encourages it, ``penalty = 1``
    changes nothing.

    Parameters
    ----------
    logits : array_like
        ``(..., V)``.
    previous_ids : array_like of int
        The tokens already in the context: ``(n,)``, the same for every row, or ``(..., n)``,
        one list per row. Which tokens to pass is the caller's choice; :func:`generate` passes
        the prompt and everything generated (as ``transformers``), or only the last
        ``penalty_last_n`` of them (as llama.cpp).
    penalty : float
        A finite number > 0.

    Shapes
    ------
    logits : (..., V), previous_ids : (n,) or (..., n) -> (..., V)

    Raises
    ------
    ValueError
        If ``penalty`` is not a finite number > 0, or ``previous_ids`` are not integer ids in
        ``[0, V)`` of a matching shape.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> apply_repetition_penalty(np.array([2.0, -2.0, 1.0]), [0, 1, 0], 2.0)
    array([ 1., -4.,  1.])
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    penalty = _check_penalty(penalty)
    ids = np.asarray(previous_ids)
    if ids.size == 0:
        return logits.copy()
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"previous_ids must be integer token ids; got dtype {ids.dtype}")
    batch_shape, V = logits.shape[:-1], logits.shape[-1]
    if ids.ndim == 0:
        raise ValueError(f"previous_ids must be a 1-d list of ids (or one per row); got the "
                         f"scalar {ids!r}")
    if ids.ndim == 1:
        ids = np.broadcast_to(ids, (*batch_shape, ids.size))
    elif ids.shape[:-1] != batch_shape:
        raise ValueError(f"previous_ids must have shape (n,) or {(*batch_shape, 'n')} to "
                         f"match logits {logits.shape}; got {ids.shape}")
    if ids.min() < 0 or ids.max() >= V:
        raise ValueError(f"previous_ids must be ids in [0, {V}); got min {ids.min()}, max "
                         f"{ids.max()}")
    occurred = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(occurred, ids, True, axis=-1)  # (..., V)
    scale = np.asarray(penalty, dtype=logits.dtype)
    penalised = np.where(logits > 0, logits / scale, logits * scale)
    return np.where(occurred, penalised, logits).astype(logits.dtype, copy=False)


def next_token_probabilities(logits, temperature: float = 1.0, top_k: int | None = None,
                             top_p: float | None = None, *, min_p: float | None = None,
                             repetition_penalty: float | None = None,
                             previous_ids=None) -> np.ndarray:
    """The distribution the next token is drawn from.

    In order: the repetition penalty (with ``previous_ids``), temperature, top-k, top-p,
    min-p (the module docstring says why). A rule left at None is skipped.

    Parameters
    ----------
    logits : array_like
        ``(..., V)``.
    temperature : float, default 1.0
    top_k : int, optional
    top_p : float, optional
    min_p : float, optional
        In ``[0, 1]``; see :func:`filter_min_p`.
    repetition_penalty : float, optional
        A finite number > 0; needs ``previous_ids`` (see :func:`apply_repetition_penalty`).
    previous_ids : array_like of int, optional
        ``(n,)`` or ``(..., n)``: the tokens the penalty applies to. Unused without
        ``repetition_penalty``.

    Shapes
    ------
    logits : (..., V) -> (..., V), rows summing to 1

    Raises
    ------
    ValueError
        If ``temperature <= 0``, ``top_k < 1``, ``top_p`` outside ``(0, 1]``, ``min_p``
        outside ``[0, 1]``, ``repetition_penalty`` not a finite number > 0, or a penalty
        without ``previous_ids``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*; min-p and the repetition penalty
    in chapter 17, *From weights to a chat*.
    """
    logits = as_float_array(logits, "logits", min_ndim=1)
    temperature = _check_temperature(temperature)
    if repetition_penalty is not None:
        if previous_ids is None:
            raise ValueError("repetition_penalty needs previous_ids (the token ids already "
                             "in the context)")
        logits = apply_repetition_penalty(logits, previous_ids, repetition_penalty)
    logits = logits / np.asarray(temperature, dtype=logits.dtype)
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    if top_p is not None:
        logits = filter_top_p(logits, top_p)
    if min_p is not None:
        logits = filter_min_p(logits, min_p)
    return softmax(logits, axis=-1)


def sample_next(logits, rng: np.random.Generator, temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, *,
                min_p: float | None = None, repetition_penalty: float | None = None,
                previous_ids=None) -> np.ndarray:
    """Draw one token id per row of ``logits`` from :func:`next_token_probabilities`.

    One uniform number per row picks the token where the cumulative probability first
    exceeds it, so the same ``rng`` state gives the same tokens. Tokens of probability 0
    are never drawn. The keyword arguments are :func:`next_token_probabilities`'.

    Shapes
    ------
    logits : (..., V) -> ids (...)

    Raises
    ------
    ValueError
        For a bad sampling argument (see :func:`next_token_probabilities`).

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*; min-p and the repetition penalty
    in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> sample_next(np.array([[0.0, 5.0, 1.0]]), np.random.default_rng(0), top_k=1)
    array([1])
    """
    probabilities = next_token_probabilities(logits, temperature, top_k, top_p, min_p=min_p,
                                             repetition_penalty=repetition_penalty,
                                             previous_ids=previous_ids)
    cumulative = np.cumsum(probabilities.astype(np.float64), axis=-1)  # (..., V)
    draws = rng.random(cumulative.shape[:-1]) * cumulative[..., -1]  # (...)
    return (cumulative <= draws[..., None]).sum(axis=-1)


def generate(model, prompt_ids, num_new_tokens: int, rng: np.random.Generator, *,
             temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, min_p: float | None = None,
             repetition_penalty: float | None = None,
             penalty_last_n: int | None = None) -> np.ndarray:
    """Continue ``prompt_ids`` by ``num_new_tokens`` tokens, one at a time.

    The model sees at most its last ``model.context_len`` tokens: a longer prompt, or prompt
    plus generated text, is cropped from the left (the most recent context is kept). Each
    step draws the next token from the last row of logits with :func:`sample_next`. While
    everything fits in the context, a key/value cache (chapter 10) computes only the new
    position; after that, each step runs the model on the cropped window again.

    The repetition penalty applies to every token of the prompt and of the text generated so
    far (as ``transformers``' ``RepetitionPenaltyLogitsProcessor`` and CTRL's reference
    ``pytorch_generation.py``, which penalise all input ids), or, with ``penalty_last_n``,
    only to the last ``penalty_last_n`` of them (llama.cpp's ``penalty_last_n``, 64 there).

    Shapes
    ------
    prompt_ids : (T,) int with T >= 1 -> (T + num_new_tokens,) int

    Raises
    ------
    ValueError
        For an empty prompt or a bad sampling argument (checked before any work).

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*; ``min_p``, ``repetition_penalty``
    and ``penalty_last_n`` in chapter 17, *From weights to a chat*.
    """
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or ids.size < 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"prompt_ids must be a non-empty 1-d integer array; got shape "
                         f"{ids.shape}, dtype {ids.dtype}")
    if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, numbers.Integral) \
            or num_new_tokens < 0:
        raise ValueError(f"num_new_tokens must be an integer >= 0; got {num_new_tokens!r}")
    _check_sampling(temperature, top_k, top_p, min_p, repetition_penalty, penalty_last_n)
    ids = ids.astype(np.int64)
    if num_new_tokens == 0:
        return ids
    cache = model.new_cache()
    logits = model.forward(ids[None, -model.context_len:], cache=cache)[0, -1]  # (V,)
    for step in range(num_new_tokens):
        ids = np.append(ids, sample_next(
            logits, rng, temperature, top_k, top_p, min_p=min_p,
            repetition_penalty=repetition_penalty, previous_ids=_recent_ids(ids, penalty_last_n)))
        if step == num_new_tokens - 1:
            break
        if cache.length < model.context_len:  # room left: feed only the new token
            logits = model.forward(ids[None, -1:], cache=cache)[0, -1]
        else:  # crop from the left and run the whole window
            logits = model.forward(ids[None, -model.context_len:])[0, -1]
    return ids
