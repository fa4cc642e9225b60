"""Figures every chapter draws: attention heatmaps, 2-d vectors, a grid of heads.

All colours are colour-blind safe (viridis for weights, seaborn's "colorblind" palette
for arrows) and every axis says what it shows.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = ["attention_heatmap", "plot_vectors_2d", "plot_heads"]


def _check_labels(labels, size: int, name: str):
    if labels is None:
        return [str(i) for i in range(size)]
    labels = list(labels)
    if len(labels) != size:
        raise ValueError(f"{name} has {len(labels)} labels but the weights have {size} entries")
    return labels


def attention_heatmap(
    weights,
    query_tokens=None,
    key_tokens=None,
    *,
    ax=None,
    mask=None,
    title: str | None = None,
    annotate: bool = True,
    fmt: str = ".2f",
    cmap: str = "viridis",
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
    colorbar_label: str = "attention weight",
    colorbar: bool = True,
    xlabel: str = "key token (attended to)",
    ylabel: str = "query token (attending)",
):
    """Draw a ``(Tq, Tk)`` matrix of attention weights (or scores) with token labels.

    Row ``i`` is what query token ``i`` attends to. Blocked entries (``mask`` False) and
    entries that are not finite (``-inf`` scores) are left blank, so a blocked weight of 0 is
    not mistaken for a small one.

    Parameters
    ----------
    weights : array_like
        The matrix to draw; for scores pass ``vmin=None, vmax=None`` and a
        ``colorbar_label``.
    query_tokens, key_tokens : sequence of str, optional
        Row and column labels; for a square matrix ``key_tokens`` defaults to
        ``query_tokens``, otherwise to positions ``0, 1, ...``, as ``query_tokens`` does.
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new figure if omitted.
    mask : array_like of bool, optional
        The attention mask (True = may attend), broadcastable to ``weights``; cells where
        it is False are left blank.
    title : str, optional
        Axes title.
    annotate : bool, default True
        Write each value in its cell (formatted with ``fmt``).
    cmap, vmin, vmax, colorbar_label, colorbar, xlabel, ylabel
        Passed on to the colour scale and the axis labels.

    Returns
    -------
    matplotlib.axes.Axes

    Shapes
    ------
    weights : (Tq, Tk), mask : broadcastable to (Tq, Tk)

    Raises
    ------
    ValueError
        If ``weights`` is not 2-d, ``mask`` does not broadcast to it, or a label list has the
        wrong length.

    Notes
    -----
    Used from chapter 01, *Vectors and cosine similarity*, on.
    """
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 2:
        raise ValueError(f"weights must be 2-d (Tq, Tk); got shape {weights.shape}")
    if key_tokens is None and weights.shape[0] == weights.shape[1]:
        key_tokens = query_tokens  # self-attention: the same tokens on both axes
    query_tokens = _check_labels(query_tokens, weights.shape[0], "query_tokens")
    key_tokens = _check_labels(key_tokens, weights.shape[1], "key_tokens")
    if ax is None:
        size = (1.0 + 0.6 * weights.shape[1], 0.8 + 0.5 * weights.shape[0])
        _, ax = plt.subplots(figsize=(max(size[0], 4.0), max(size[1], 3.0)))
    hidden = ~np.isfinite(weights)
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        try:
            hidden |= ~np.broadcast_to(mask, weights.shape)
        except ValueError:
            raise ValueError(
                f"mask of shape {mask.shape} does not broadcast to weights of shape {weights.shape}"
            ) from None
    sns.heatmap(
        weights,
        mask=hidden,
        annot=annotate,
        fmt=fmt,
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        cbar=colorbar,
        cbar_kws={"label": colorbar_label} if colorbar else None,
        # Ticks are set below: seaborn's own labels trigger a full redraw to check overlap.
        xticklabels=False,
        yticklabels=False,
        square=False,
        linewidths=0.5,
        linecolor="white",
        annot_kws={"fontsize": 8},
        ax=ax,
    )
    # Rotated labels anchored at their right end, so that long tokens do not overlap.
    ax.set_xticks(np.arange(len(key_tokens)) + 0.5, key_tokens, rotation=45, ha="right",
                  rotation_mode="anchor")
    ax.set_yticks(np.arange(len(query_tokens)) + 0.5, query_tokens, rotation=0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def plot_vectors_2d(
    vectors,
    labels=None,
    *,
    ax=None,
    title: str | None = None,
    colors=None,
    xlabel: str = "component 1",
    ylabel: str = "component 2",
    linestyle: str = "-",
):
    """Draw 2-d vectors as arrows from the origin, each labelled at its tip.

    Parameters
    ----------
    vectors : array_like
        One vector per row.
    labels : sequence of str, optional
        One label per vector.
    ax : matplotlib.axes.Axes, optional
        Where to draw; a new square figure if omitted. Call again with the same ``ax``
        to overlay a second set (for example with ``linestyle="--"``).
    title, xlabel, ylabel : str, optional
        Axis texts.
    colors : sequence, optional
        One colour per vector; defaults to seaborn's colour-blind-safe palette.
    linestyle : str, default "-"
        Line style of the arrows.

    Returns
    -------
    matplotlib.axes.Axes

    Shapes
    ------
    vectors : (n, 2)

    Raises
    ------
    ValueError
        If ``vectors`` is not ``(n, 2)`` or ``labels`` has the wrong length.

    Notes
    -----
    Used from chapter 01, *Vectors and cosine similarity*, on.
    """
    vectors = np.asarray(vectors, dtype=float)
    if vectors.ndim != 2 or vectors.shape[1] != 2:
        raise ValueError(f"vectors must have shape (n, 2); got {vectors.shape}")
    labels = _check_labels(labels, len(vectors), "labels")
    if colors is None:
        colors = sns.color_palette("colorblind", len(vectors))
    elif len(colors) != len(vectors):
        raise ValueError(f"colors has {len(colors)} entries but there are {len(vectors)} vectors")
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 5))
    for vector, label, color in zip(vectors, labels, colors):
        ax.annotate(
            "",
            xy=vector,
            xytext=(0, 0),
            arrowprops={"arrowstyle": "-|>", "color": color, "lw": 2, "linestyle": linestyle},
        )
        # Put the label just beyond the arrowhead, outward along the arrow's direction.
        direction = vector / max(float(np.linalg.norm(vector)), 1e-12)
        ax.annotate(label, xy=vector, xytext=tuple(8 * direction), textcoords="offset points",
                    color=color, ha="left" if direction[0] >= -0.3 else "right",
                    va="bottom" if direction[1] >= -0.3 else "top")
    # Keep every earlier overlay in view: extend the current limits, never shrink them.
    points = np.vstack([vectors, np.zeros((1, 2))])
    low, high = points.min(axis=0), points.max(axis=0)
    margin = 0.15 * max(float(np.max(high - low)), 1e-9)
    if ax.get_autoscale_on() or not ax.has_data():
        ax.set_xlim(low[0] - margin, high[0] + margin)
        ax.set_ylim(low[1] - margin, high[1] + margin)
        ax.set_autoscale_on(False)
    else:
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        ax.set_xlim(min(x0, low[0] - margin), max(x1, high[0] + margin))
        ax.set_ylim(min(y0, low[1] - margin), max(y1, high[1] + margin))
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    # "box", not "datalim": the limits above are fixed, and "datalim" would override them.
    ax.set_aspect("equal", adjustable="box")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def plot_heads(
    weights,
    query_tokens=None,
    key_tokens=None,
    *,
    mask=None,
    head_names=None,
    ncols: int | None = None,
    annotate: bool = False,
    title: str | None = None,
    panel_size: float = 3.2,
    vmin: float | None = 0.0,
    vmax: float | None = 1.0,
):
    """Draw one attention heatmap per head in a grid that shares one colour scale.

    Parameters
    ----------
    weights : array_like
        Attention weights of each head.
    query_tokens, key_tokens : sequence of str, optional
        Row and column labels for every panel (as in :func:`attention_heatmap`).
    mask : array_like of bool, optional
        The attention mask (True = may attend), broadcastable to ``weights``; blocked cells
        are left blank.
    head_names : sequence of str, optional
        Panel titles; default ``"head 0"``, ``"head 1"``, ...
    ncols : int, optional
        Panels per row; default ``min(H, 4)``.
    annotate : bool, default False
        Write the values in the cells (readable for short sequences only).
    title : str, optional
        Title over the whole figure.
    panel_size : float, default 3.2
        Width of one panel in inches.
    vmin, vmax : float or None, default 0 and 1
        The shared colour scale; ``None`` fits it to the data (for soft patterns).

    Returns
    -------
    matplotlib.figure.Figure

    Shapes
    ------
    weights : (H, Tq, Tk), mask : broadcastable to (H, Tq, Tk)

    Raises
    ------
    ValueError
        If ``weights`` is not 3-d or ``head_names`` has the wrong length.

    Notes
    -----
    Used from chapter 06, *Multi-head attention*, on.
    """
    weights = np.asarray(weights, dtype=float)
    if weights.ndim != 3:
        raise ValueError(f"weights must be 3-d (H, Tq, Tk); got shape {weights.shape}")
    num_heads = weights.shape[0]
    if num_heads == 0:
        raise ValueError(f"weights has no heads (shape {weights.shape})")
    if ncols is not None and (isinstance(ncols, bool) or not isinstance(ncols, (int, np.integer))
                              or ncols < 1):
        raise ValueError(f"ncols must be a positive integer; got {ncols!r}")
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        try:
            mask = np.broadcast_to(mask, weights.shape)
        except ValueError:
            raise ValueError(
                f"mask of shape {mask.shape} does not broadcast to weights of shape {weights.shape}"
            ) from None
    head_names = _check_labels(
        head_names if head_names is not None else [f"head {h}" for h in range(num_heads)],
        num_heads,
        "head_names",
    )
    ncols = min(num_heads, 4) if ncols is None else ncols
    nrows = -(-num_heads // ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(panel_size * ncols + 1.0, panel_size * nrows), squeeze=False,
        layout="constrained",
    )
    for head, ax in enumerate(axes.flat):
        if head >= num_heads:
            ax.set_visible(False)
            continue
        first_column = head % ncols == 0
        last_row = head // ncols == nrows - 1 or head + ncols >= num_heads
        attention_heatmap(
            weights[head], query_tokens, key_tokens, ax=ax, title=head_names[head],
            mask=None if mask is None else mask[head],
            annotate=annotate, colorbar=False, vmin=vmin, vmax=vmax,
            xlabel="key token" if last_row else "", ylabel="query token" if first_column else "",
        )
        if not first_column:
            ax.set_yticklabels([])
    mappable = axes.flat[0].collections[0]
    fig.colorbar(mappable, ax=axes, label="attention weight", shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig
