"""Boolean attention masks, True = may attend (chapter 04; the sliding window, chapter 11)."""

from __future__ import annotations

import numpy as np

from ._checks import check_positive_int

__all__ = ["causal_mask", "padding_mask", "sliding_window_mask"]


def causal_mask(Tq: int, Tk: int | None = None) -> np.ndarray:
    """A mask that lets each query attend only to keys at its own position or earlier.

    Queries are taken to be the *last* ``Tq`` positions of the ``Tk`` keys (aligned at
    the bottom right), which is what incremental decoding needs: with ``Tq=1`` the one
    new query sees every key. For ``Tq == Tk`` this is the lower triangle.

    Parameters
    ----------
    Tq : int
        Number of queries.
    Tk : int, optional
        Number of keys; defaults to ``Tq``.

    Returns
    -------
    numpy.ndarray of bool
        ``mask[i, j]`` is True when key ``j`` is not in query ``i``'s future.

    Shapes
    ------
    -> (Tq, Tk)

    Raises
    ------
    TypeError, ValueError
        If ``Tq`` or ``Tk`` is not a positive integer, or ``Tq > Tk`` (a query would
        have no key at or before its own position).

    Notes
    -----
    Derived in chapter 04, *Masking*. PyTorch's ``is_causal=True`` aligns at the top
    left instead; the two agree whenever ``Tq == Tk``.

    Examples
    --------
    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    Tq = check_positive_int(Tq, "Tq")
    Tk = Tq if Tk is None else check_positive_int(Tk, "Tk")
    if Tq > Tk:
        raise ValueError(
            f"Tq={Tq} > Tk={Tk}: with the queries as the last Tq of Tk positions, "
            "the first queries would have no key to attend to"
        )
    return np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)


def padding_mask(lengths, T: int) -> np.ndarray:
    """A mask that hides the padding at the end of each sequence in a batch.

    Sequence ``b`` has ``lengths[b]`` real tokens followed by padding up to ``T``.
    Every query may attend to the real keys and to none of the padded ones.

    Parameters
    ----------
    lengths : array_like of int
        Number of real tokens in each sequence, each in ``[0, T]``.
    T : int
        The padded length (the size of the key axis).

    Returns
    -------
    numpy.ndarray of bool
        ``mask[b, 0, j]`` is True when key ``j`` is a real token of sequence ``b``.
        The axis of length 1 stands for the queries, so the mask broadcasts to
        ``(B, Tq, T)`` scores and combines with :func:`causal_mask` by ``&``.

    Shapes
    ------
    lengths : (B,) -> (B, 1, T); in general (...) -> (..., 1, T)

    Raises
    ------
    TypeError, ValueError
        If ``lengths`` is not integer, or a length is negative or larger than ``T``,
        or ``T`` is not a positive integer.

    Notes
    -----
    Derived in chapter 04, *Masking*. Query rows at padded positions are left
    unmasked (they attend to the real keys); leave their outputs out of the loss. A
    length of 0 blocks every key, and :func:`~attention_lib.attention.scaled_dot_product_attention`
    gives such queries zero weights and zero outputs. This is
    right padding only; for left padding (pads first, as in batched generation) the
    mask is ``np.arange(T) >= T - lengths[..., None]`` with a query axis inserted.

    Examples
    --------
    >>> padding_mask([2, 3], 3).astype(int)
    array([[[1, 1, 0]],
    <BLANKLINE>
           [[1, 1, 1]]])
    """
    T = check_positive_int(T, "T")
    lengths = np.asarray(lengths)
    if not np.issubdtype(lengths.dtype, np.integer):
        raise TypeError(f"lengths must be integers; got dtype {lengths.dtype}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > T):
        raise ValueError(
            f"every length must be between 0 and T={T}; got lengths={lengths.tolist()}"
        )
    positions = np.arange(T)  # (T,)
    is_real = positions < lengths[..., None]  # (..., T)
    return is_real[..., None, :]  # (..., 1, T)


def sliding_window_mask(Tq: int, Tk: int | None = None, *, window: int) -> np.ndarray:
    """A causal mask that also hides keys more than ``window - 1`` positions back.

    Query ``i`` (aligned at the bottom right, as :func:`~attention_lib.masks.causal_mask`)
    sees keys ``j`` with ``i - window < j <= i``: itself and the ``window - 1`` before it,
    as in Mistral's sliding-window attention.

    Parameters
    ----------
    Tq : int
    Tk : int, optional
        Defaults to ``Tq``.
    window : int
        How many positions each query sees, itself included.

    Returns
    -------
    numpy.ndarray of bool

    Shapes
    ------
    -> (Tq, Tk)

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive integer or ``Tq > Tk``.

    Notes
    -----
    Derived in chapter 11, *Attention at scale*.

    Examples
    --------
    >>> sliding_window_mask(4, window=2).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0],
           [0, 1, 1, 0],
           [0, 0, 1, 1]])
    """
    Tq = check_positive_int(Tq, "Tq")
    Tk = Tq if Tk is None else check_positive_int(Tk, "Tk")
    window = check_positive_int(window, "window")
    if Tq > Tk:
        raise ValueError(f"Tq={Tq} > Tk={Tk}: the queries are the last Tq of the Tk positions")
    offset = (np.arange(Tk - Tq, Tk)[:, None] - np.arange(Tk)[None, :])  # i - j, (Tq, Tk)
    return (offset >= 0) & (offset < window)
