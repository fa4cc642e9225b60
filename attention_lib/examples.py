"""The course's running examples, defined once so every chapter uses the same numbers.

The sentence and its hand-made 10 x 8 embedding table come from the tutorial the course grew
from; so do the four 2-d tokens. They are toy data for seeing what attention does, not learned
embeddings.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SENTENCE_TOKENS", "FEATURE_NAMES", "sentence_embeddings", "TOKENS_2D", "tokens_2d"]

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
