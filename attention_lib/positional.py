"""Positional information: sinusoidal encodings, rotary embeddings, ALiBi (chapter 07)."""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_positive_int

__all__ = ["sinusoidal_encoding", "apply_rope", "alibi_slopes", "alibi_bias"]


def sinusoidal_encoding(T: int, d: int, base: float = 10000.0, *, start: int = 0) -> np.ndarray:
    """The fixed sine/cosine position vectors of "Attention Is All You Need" (section 3.5).

    ``PE[t, 2i] = sin(t / base^(2i/d))`` and ``PE[t, 2i+1] = cos(t / base^(2i/d))``, for
    positions ``t = 0 .. T-1``. Each pair of columns is a clock turning at its own speed;
    shifting the position by ``k`` rotates every pair by a fixed angle, which is why a
    model can read relative offsets from it. An odd ``d`` is handled by dropping the last
    cosine column (the final column is a sine).

    Parameters
    ----------
    T : int
        Number of positions.
    d : int
        Size of each position vector (the model width it is added to).
    base : float, default 10000.0
        Sets the slowest clock: pair ``i`` has wavelength ``2 pi base^(2i/d)``, so for even
        ``d`` the longest is ``2 pi base^((d-2)/d)``, below ``2 pi base`` (about 47,000
        positions for ``d = 64`` and the default base).
    start : int, default 0
        Position of the first row: rows are positions ``start .. start + T - 1`` (what a
        decoder needs for its new tokens, without recomputing the earlier rows).

    Returns
    -------
    numpy.ndarray
        float64 values in ``[-1, 1]``.

    Shapes
    ------
    -> (T, d)

    Raises
    ------
    TypeError, ValueError
        If ``T`` or ``d`` is not a positive integer, or ``base`` is not larger than 1.

    Notes
    -----
    Derived in chapter 07, *Positional encoding*.

    Examples
    --------
    >>> sinusoidal_encoding(2, 4).round(4)
    array([[0.    , 1.    , 0.    , 1.    ],
           [0.8415, 0.5403, 0.01  , 1.    ]])
    """
    T = check_positive_int(T, "T")
    d = check_positive_int(d, "d")
    start = check_positive_int(start, "start", allow_zero=True)
    if not np.isfinite(base) or base <= 1:
        raise ValueError(f"base must be a finite number > 1; got {base!r}")
    positions = np.arange(start, start + T)[:, None]  # (T, 1)
    pair_index = np.arange((d + 1) // 2)[None, :]  # (1, ceil(d/2))
    angles = positions / base ** (2 * pair_index / d)  # (T, ceil(d/2))
    encoding = np.empty((T, 2 * angles.shape[1]))
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles)
    return encoding[:, :d]


def apply_rope(x, positions, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding: rotate each pair of features by an angle set by position.

    Features ``(x[2i], x[2i+1])`` of the token at position ``p`` are rotated by the angle
    ``p * base^(-2i/d)``. Applied to queries and keys, the dot product of a query at ``m``
    and a key at ``n`` then depends on the positions only through ``m - n``. This is the
    interleaved (adjacent-pair) layout of the RoFormer paper; treating each pair as the
    complex number ``x[2i] + 1j*x[2i+1]``, RoPE multiplies it by ``exp(1j*angle)``.

    Parameters
    ----------
    x : array_like
        Queries or keys, per head if there are heads.
    positions : array_like of int
        The position of each of the ``T`` tokens (broadcastable to ``x.shape[:-1]``).
    base : float, default 10000.0
        Sets the slowest rotation; Llama 1 and 2 use 10000, Llama 3 500000, SmolLM2-135M 100000.

    Returns
    -------
    numpy.ndarray
        The rotated vectors, same shape and float dtype as ``x``.

    Shapes
    ------
    x : (..., T, d) with even d, positions : (T,) (or broadcastable to (..., T)) -> (..., T, d)

    Raises
    ------
    ValueError
        If ``d`` is odd, ``x`` has fewer than 2 dimensions, or ``positions`` does not
        broadcast to ``x.shape[:-1]``.

    Notes
    -----
    Derived in chapter 07, *Positional encoding*.

    Examples
    --------
    >>> apply_rope(np.array([[1.0, 0.0]]), positions=[1]).round(4)
    array([[0.5403, 0.8415]])
    """
    x = as_float_array(x, "x", min_ndim=2)
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"apply_rope needs an even number of features; x has d={d} ({x.shape})")
    positions = np.asarray(positions)
    try:
        fits = np.broadcast_shapes(positions.shape, x.shape[:-1]) == x.shape[:-1]
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"positions of shape {positions.shape} do not broadcast to x.shape[:-1]="
            f"{x.shape[:-1]} (one position per token)"
        )
    frequencies = base ** (-np.arange(0, d, 2) / d)  # (d/2,)
    angles = positions[..., None] * frequencies  # (..., T, d/2)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    rotated = np.empty(np.broadcast_shapes(x.shape, (*angles.shape[:-1], d)), dtype=x.dtype)
    rotated[..., 0::2] = even * cos - odd * sin
    rotated[..., 1::2] = even * sin + odd * cos
    return rotated


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The per-head slopes of ALiBi: geometric from ``2^(-8/H)`` when ``H`` is a power of two.

    For a power of two ``H`` the slopes are ``2^(-8/H), 2^(-16/H), ..., 2^(-8)`` (the paper
    trains only such models). Otherwise this follows ``get_slopes`` of the authors' reference
    code (github.com/ofirpress/attention_with_linear_biases, a "workaround" in its own
    words): the slopes of the next lower power of two, filled up with every other slope of
    the next higher one.

    Parameters
    ----------
    num_heads : int

    Returns
    -------
    numpy.ndarray

    Shapes
    ------
    -> (H,)

    Notes
    -----
    Derived in chapter 07, *Positional encoding*.

    Examples
    --------
    >>> alibi_slopes(4) * 256
    array([64., 16.,  4.,  1.])
    """
    num_heads = check_positive_int(num_heads, "num_heads")

    def power_of_two_slopes(n):
        start = 2.0 ** (-8.0 / n)
        return start ** np.arange(1, n + 1)

    lower = 2 ** int(np.floor(np.log2(num_heads)))
    slopes = power_of_two_slopes(lower)
    if lower < num_heads:
        extra = power_of_two_slopes(2 * lower)[0::2][: num_heads - lower]
        slopes = np.concatenate([slopes, extra])
    return slopes


def alibi_bias(num_heads: int, Tq: int, Tk: int | None = None) -> np.ndarray:
    """ALiBi: a penalty on the scores that grows linearly with the distance to the key.

    ``bias[h, i, j] = -slope_h * |i - j|``, with the queries taken as the last ``Tq`` of the
    ``Tk`` positions (as in :func:`~attention_lib.masks.causal_mask`). Add it to the scores
    (``bias=`` of :func:`~attention_lib.attention.scaled_dot_product_attention`); with a causal mask
    only ``j <= i`` matters, where it equals the paper's ``slope_h * (j - i)``.

    Parameters
    ----------
    num_heads : int
        One slope per head (:func:`alibi_slopes`).
    Tq : int
        Number of queries.
    Tk : int, optional
        Number of keys; defaults to ``Tq``.

    Returns
    -------
    numpy.ndarray
        float64, zero where a query meets its own position and negative elsewhere.

    Shapes
    ------
    -> (H, Tq, Tk)

    Raises
    ------
    TypeError, ValueError
        If a size is not a positive integer, or ``Tq > Tk``.

    Notes
    -----
    Derived in chapter 07, *Positional encoding*.

    Examples
    --------
    >>> alibi_bias(1, 3)[0] * 256
    array([[ 0., -1., -2.],
           [-1.,  0., -1.],
           [-2., -1.,  0.]])
    """
    Tq = check_positive_int(Tq, "Tq")
    Tk = Tq if Tk is None else check_positive_int(Tk, "Tk")
    if Tq > Tk:
        raise ValueError(f"Tq={Tq} > Tk={Tk}: the queries are the last Tq of the Tk positions")
    query_positions = np.arange(Tk - Tq, Tk)[:, None]  # (Tq, 1)
    key_positions = np.arange(Tk)[None, :]  # (1, Tk)
    distance = np.abs(query_positions - key_positions)  # (Tq, Tk)
    # 0.0 - x rather than -x: the diagonal stays 0.0 instead of -0.0.
    return 0.0 - alibi_slopes(num_heads)[:, None, None] * distance  # (H, Tq, Tk)
