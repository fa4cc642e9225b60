"""The course's running examples, defined once so every chapter uses the same numbers.

The sentence "I prefer apple over orange because it is less acidic", its hand-made 10 x 8
embedding table (one column per named feature) and four 2-d tokens are toy data for seeing
what attention does, not learned embeddings. Chapter 03 adds a hand-made query and key
projection for the same sentence.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "SENTENCE_TOKENS", "FEATURE_NAMES", "sentence_embeddings", "TOKENS_2D", "tokens_2d",
    "hand_made_query_key", "difference_below",
]

SENTENCE_TOKENS = ("I", "prefer", "apple", "over", "orange", "because", "it", "is", "less",
                   "acidic")
"""The 10 tokens of "I prefer apple over orange because it is less acidic"."""

FEATURE_NAMES = ("speaker", "preference", "fruit", "comparison", "explanation", "pronoun",
                 "acidity", "degree")
"""What each of the 8 hand-made dimensions stands for (a reading aid, not a fact of nature)."""

_SENTENCE_EMBEDDINGS = (
    # spk  pref fruit comp expl pron acid degree
    (1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # I
    (0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0),  # prefer
    (0.0, 0.1, 1.0, 0.2, 0.0, 0.0, 0.1, 0.0),  # apple
    (0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0),  # over
    (0.0, 0.1, 1.0, 0.2, 0.0, 0.0, 0.3, 0.0),  # orange
    (0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.1, 0.0),  # because
    (0.0, 0.0, 0.4, 0.0, 0.0, 1.0, 0.1, 0.0),  # it
    (0.0, 0.0, 0.0, 0.0, 0.2, 0.0, 0.0, 0.0),  # is
    (0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.4, 1.0),  # less
    (0.0, 0.0, 0.2, 0.0, 0.4, 0.0, 1.0, 0.0),  # acidic
)

TOKENS_2D = ("token 1", "token 2", "token 3", "token 4")
"""Names of the four 2-d tokens of :func:`tokens_2d`."""

_TOKENS_2D = ((0.9, 0.1), (0.2, 0.8), (0.1, 0.9), (0.8, 0.2))


def sentence_embeddings() -> np.ndarray:
    """The hand-made embedding of each token of :data:`SENTENCE_TOKENS` (a fresh copy).

    Returns
    -------
    numpy.ndarray
        One row per token, one column per entry of :data:`FEATURE_NAMES`; float64.

    Shapes
    ------
    -> (10, 8)

    Notes
    -----
    Introduced in chapter 01, *Vectors and cosine similarity*; used throughout.

    Examples
    --------
    >>> sentence_embeddings().shape
    (10, 8)
    """
    return np.array(_SENTENCE_EMBEDDINGS, dtype=np.float64)


def tokens_2d() -> np.ndarray:
    """Four 2-d token vectors, two pointing along each axis, small enough to draw (a fresh copy).

    Returns
    -------
    numpy.ndarray
        One row per token of :data:`TOKENS_2D`; float64.

    Shapes
    ------
    -> (4, 2)

    Notes
    -----
    Introduced in chapter 03, *Scaled dot-product attention*.

    Examples
    --------
    >>> tokens_2d()[0]
    array([0.9, 0.1])
    """
    return np.array(_TOKENS_2D, dtype=np.float64)


def hand_made_query_key(strength: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    """Query and key projections written by hand for the running sentence: "it" looks for fruit.

    Each column of ``W_q`` and ``W_k`` is one question a token can ask. Column 0: the query
    reads the *pronoun* feature and the key the *fruit* feature, so a pronoun scores the
    fruit words highly. Column 1: the query reads the *degree* feature and the key the
    *acidity* feature, so "less" scores "acidic" highly. Every other entry is 0, so tokens
    with neither feature ask nothing (a zero query).

    Parameters
    ----------
    strength : float, default 3.0
        The value of the four nonzero entries; it sets how large the scores get.

    Returns
    -------
    W_q, W_k : numpy.ndarray
        The query and key projections (fresh copies), float64, to be used as
        ``Q = X @ W_q`` and ``K = X @ W_k`` with ``X = sentence_embeddings()``.

    Shapes
    ------
    -> W_q : (8, 2), W_k : (8, 2)

    Notes
    -----
    Introduced in chapter 03, *Scaled dot-product attention*. Real layers learn such
    projections instead: chapter 05 explains why, and chapter 12 trains them.

    Examples
    --------
    >>> W_q, W_k = hand_made_query_key()
    >>> (sentence_embeddings() @ W_q)[6]  # the query of "it"
    array([3., 0.])
    """
    feature = {name: index for index, name in enumerate(FEATURE_NAMES)}
    W_q = np.zeros((len(FEATURE_NAMES), 2))
    W_k = np.zeros((len(FEATURE_NAMES), 2))
    W_q[feature["pronoun"], 0] = strength  # pronouns ask ...
    W_k[feature["fruit"], 0] = strength  # ... and fruit answers
    W_q[feature["degree"], 1] = strength  # degree words ask ...
    W_k[feature["acidity"], 1] = strength  # ... and acidity answers
    return W_q, W_k


def difference_below(actual, expected, bound: float) -> str:
    """Check that two arrays agree to within ``bound`` and say so in words that hold everywhere.

    The largest absolute difference between two computations of the same thing is rounding
    noise: its digits change with the CPU, the BLAS kernel and the thread count, so a page
    that prints it cannot show the same output on every reader's machine. This prints the bound
    the computation supports instead, after checking it.

    Parameters
    ----------
    actual, expected : array_like
        The two results; they must have the same shape.
    bound : float
        A positive, finite bound on ``max |actual - expected|``.

    Returns
    -------
    str
        ``"largest |difference| below 1e-12"`` (with the bound given).

    Raises
    ------
    ValueError
        If the shapes differ or ``bound`` is not a positive finite number.
    AssertionError
        If the largest difference is not below ``bound`` (or either array holds NaN).

    Shapes
    ------
    actual, expected: any shape, the same for both.

    Notes
    -----
    Used by the chapters to print checks reproducibly (see the status page).

    Examples
    --------
    >>> difference_below([1.0, 2.0], [1.0, 2.0 + 1e-15], 1e-12)
    'largest |difference| below 1e-12'
    """
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ValueError(f"actual has shape {actual.shape} but expected has shape {expected.shape}")
    if isinstance(bound, bool) or not isinstance(bound, (int, float, np.floating, np.integer)) \
            or not np.isfinite(bound) or bound <= 0:
        raise ValueError(f"bound must be a positive finite number, got {bound!r}")
    largest = float(np.max(np.abs(actual - expected))) if actual.size else 0.0
    if not largest < bound:  # also catches NaN
        raise AssertionError(f"largest |difference| is {largest:.3g}, not below {bound:g}")
    return f"largest |difference| below {bound:g}"
