"""Figures every chapter draws: attention heatmaps, 2-d vectors, a grid of heads, and an
interactive viewer of a real text's attention (HTML for the notebook and the site).

All colours are colour-blind safe (viridis for weights, seaborn's "colorblind" palette
for arrows) and every axis says what it shows.
"""

from __future__ import annotations

import hashlib
import html
import json

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns

__all__ = [
    "attention_heatmap", "plot_vectors_2d", "plot_heads", "attention_viewer", "AttentionViewer",
]


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


# ------------------------------------------------------------------------ attention_viewer
# An interactive page element, not a matplotlib figure: the HTML below carries its own CSS
# and JavaScript (nothing is fetched, so it works offline and on Binder), and the object also
# offers a PNG (the heatmap of the head it opens on) for outputs that cannot run a script,
# such as the PDF.

# Colour classes: a weight w gets class round(10 w), clipped to 0..10 (the JavaScript uses the
# same formula). Class 0 (w < 0.05) keeps the page's own colours; classes 1-10 are the colour
# map at 0.1, ..., 1.0 with black or white text, whichever contrasts more (WCAG 1.4.3 asks
# for 4.5:1; every class reaches it, tests/test_plotting.py checks). Light pages use Blues
# (light to dark), dark pages viridis (dark to light): either way a larger weight stands
# further out from the page. Both are colour-blind safe, and the number is printed too.
_VIEWER_LEVELS = 10
_VIEWER_MAPS = {"light": "Blues", "dark": "viridis"}
# Where a dark page says so: the book's theme (pydata-sphinx-theme), JupyterLab, VS Code.
_DARK_SELECTORS = ('html[data-theme="dark"]', 'body[data-jp-theme-light="false"]',
                   "body.vscode-dark")


def _relative_luminance(rgb) -> float:
    """WCAG 2 relative luminance of an sRGB colour given as three floats in [0, 1]."""
    channels = np.asarray(rgb, dtype=float)[:3]
    linear = np.where(channels <= 0.03928, channels / 12.92, ((channels + 0.055) / 1.055) ** 2.4)
    return float(linear @ np.array([0.2126, 0.7152, 0.0722]))


def _contrast_ratio(rgb_a, rgb_b) -> float:
    """WCAG 2 contrast ratio of two colours, from 1 (none) to 21 (black on white)."""
    dark, light = sorted([_relative_luminance(rgb_a), _relative_luminance(rgb_b)])
    return (light + 0.05) / (dark + 0.05)


def _viewer_palette(cmap: str) -> list[tuple[str, str]]:
    """(background, text) hex colours of the weight classes 1..10 for one colour map."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    palette = []
    for level in range(1, _VIEWER_LEVELS + 1):
        background = colormaps[cmap](level / _VIEWER_LEVELS)
        on_black = _contrast_ratio(background, (0.0, 0.0, 0.0))
        on_white = _contrast_ratio(background, (1.0, 1.0, 1.0))
        palette.append((to_hex(background), "#000000" if on_black >= on_white else "#ffffff"))
    return palette


def _viewer_css() -> str:
    """The viewer's style sheet; every rule is scoped to ``.av-root``."""
    rules = [
        ".av-root{--av-fg:var(--pst-color-text-base,var(--jp-content-font-color1,currentColor));"
        "--av-border:var(--pst-color-border,var(--jp-border-color1,#8a8a8a));"
        "--av-focus:var(--pst-color-accent,var(--jp-brand-color1,#1a73e8));"
        "margin:0.5em 0;max-width:100%;line-height:1.35}",
        ".av-root p{margin:0.3em 0}",
        ".av-root .av-title{font-weight:600}",
        ".av-root .av-help,.av-root .av-heads-title{font-size:0.9em}",
        ".av-root .av-controls{display:flex;flex-wrap:wrap;gap:0.4em 1.2em;align-items:center;"
        "margin:0.4em 0}",
        ".av-root .av-controls label{margin-right:0.4em}",
        ".av-root select{font:inherit;font-size:0.95em;min-height:28px;max-width:100%}",
        ".av-root .av-tokens{display:flex;flex-wrap:wrap;gap:5px;margin:0.5em 0}",
        # Each token is a button: its text, and under it the weight it gets from the query.
        ".av-root .av-token{font:inherit;display:inline-flex;flex-direction:column;"
        "align-items:center;justify-content:center;min-width:2.75em;min-height:28px;"
        "margin:0;padding:2px 6px;border:1px solid var(--av-border);border-radius:4px;"
        "background:transparent;color:inherit;cursor:pointer}",
        ".av-root .av-tok{white-space:pre}",
        ".av-root .av-w{font-size:0.8em;font-variant-numeric:tabular-nums}",
        # The query token: a ring in the page's text colour and its text underlined (not only
        # a colour: WCAG 1.4.1). The keyboard focus ring sits outside it, in the accent colour.
        ".av-root .av-token.av-query{box-shadow:0 0 0 2px var(--av-fg);font-weight:700}",
        ".av-root .av-token.av-query .av-tok{text-decoration:underline}",
        ".av-root .av-token:focus-visible{outline:3px solid var(--av-focus);outline-offset:3px}",
        ".av-root .av-heads{display:flex;flex-wrap:wrap;gap:0.2em 1.2em;margin:0.2em 0 0.4em;"
        "padding:0;list-style:none;font-size:0.9em}",
        ".av-root .av-heads .av-current{font-weight:700}",
        ".av-root .av-legend{display:flex;align-items:center;gap:2px;font-size:0.8em}",
        ".av-root .av-swatch{display:inline-block;width:1.1em;height:1.1em;"
        "border:1px solid var(--av-border)}",
        ".av-root .av-legend-label{margin:0 0.4em}",
        ".av-root .av-c0{background:transparent;color:inherit}",
        # In dark mode the book's theme puts every HTML output on a light box, for outputs
        # drawn for light pages only. The viewer has its own dark colours: give it the page.
        'html[data-theme="dark"] body .bd-content div.cell_output div.text_html:has(div.av-root)'
        "{background-color:transparent;color:var(--pst-color-text-base);padding:0}",
    ]
    for mode, cmap in _VIEWER_MAPS.items():
        scopes = [""] if mode == "light" else [f"{selector} " for selector in _DARK_SELECTORS]
        for level, (background, text) in enumerate(_viewer_palette(cmap), start=1):
            selector = ",".join(f"{scope}.av-root .av-c{level}" for scope in scopes)
            rules.append(f"{selector}{{background:{background};color:{text}}}")
    return "\n".join(rules)


_VIEWER_CSS = _viewer_css()

# The viewer's behaviour. It finds its own root (the element around the script), so two
# viewers on one page, or the same one shown twice, never act on each other. It only sets
# textContent, never innerHTML: the tokens are data, not markup.
_VIEWER_JS = r"""
(function (script) {
  // The viewer is the element around this script. Where a notebook runs the script
  // elsewhere (the classic notebook evaluates it in <head>), it is found by its id.
  var root = script && script.parentNode;
  if (!root || !root.classList || !root.classList.contains("av-root")) {
    root = document.getElementById("__VIEWER_ID__");
  }
  if (!root || root.getAttribute("data-av-ready")) return;
  root.setAttribute("data-av-ready", "1");
  var data = JSON.parse(root.querySelector("script.av-data").textContent);
  var buttons = Array.prototype.slice.call(root.querySelectorAll(".av-token"));
  var layerSelect = root.querySelector("select.av-layer");
  var headSelect = root.querySelector("select.av-head");
  var state = {layer: data.start[0], head: data.start[1], query: data.start[2]};
  var levels = data.levels;
  function argmax(row) {
    var best = 0;
    for (var j = 1; j < row.length; j++) if (row[j] > row[best]) best = j;
    return best;
  }
  // The weights are already rounded to data.digits decimals: printing them with as many
  // decimals shows exactly the embedded number (no second rounding).
  function fixed(weight) { return (weight + 0).toFixed(data.digits); }
  function token(j, word) {
    return (word || "token") + " " + j + " \u201c" + data.labels[j] + "\u201d";
  }
  function where(layer, head) {
    return data.showLayer ? data.layers[layer] + ", " + data.heads[head] : data.heads[head];
  }
  function render() {
    var heads = data.weights[state.layer];
    var row = heads[state.head][state.query];
    buttons.forEach(function (button, j) {
      var level = Math.max(0, Math.min(levels, Math.floor(row[j] * levels + 0.5)));
      var isQuery = j === state.query;
      button.className = "av-token av-c" + level + (isQuery ? " av-query" : "");
      button.setAttribute("aria-pressed", isQuery ? "true" : "false");
      button.tabIndex = isQuery ? 0 : -1;
      button.setAttribute("data-weight", String(row[j]));
      button.querySelector(".av-w").textContent = fixed(row[j]);
    });
    var top = argmax(row);
    var status = root.querySelector(".av-status");
    var sentence = token(state.query, "Token") + " attends most to " + token(top) +
      " (weight " + fixed(row[top]) + ") in " + where(state.layer, state.head) + ".";
    if (status.textContent !== sentence) status.textContent = sentence;
    root.querySelector(".av-heads-title").textContent = "Where each head" +
      (data.showLayer ? " of " + data.layers[state.layer] : "") + " attends most from " +
      token(state.query) + ":";
    var items = root.querySelectorAll(".av-heads li");
    for (var h = 0; h < items.length; h++) {
      var headRow = heads[h][state.query], k = argmax(headRow);
      items[h].textContent = data.heads[h] + ": \u201c" + data.labels[k] + "\u201d " +
        fixed(headRow[k]);
      items[h].className = h === state.head ? "av-current" : "";
    }
  }
  function select(query) {
    if (query === state.query) return;
    state.query = query;
    render();
  }
  var keys = {ArrowLeft: -1, ArrowUp: -1, ArrowRight: 1, ArrowDown: 1};
  root.querySelector(".av-tokens").addEventListener("keydown", function (event) {
    var last = buttons.length - 1, next;
    var current = buttons.indexOf(document.activeElement);  // not the hovered one
    if (current < 0) current = state.query;
    if (Object.prototype.hasOwnProperty.call(keys, event.key)) next = current + keys[event.key];
    else if (event.key === "Home") next = 0;
    else if (event.key === "End") next = last;
    else return;
    event.preventDefault();
    next = Math.max(0, Math.min(last, next));
    select(next);
    buttons[next].focus();
  });
  buttons.forEach(function (button, j) {
    button.addEventListener("focus", function () { select(j); });
    button.addEventListener("mouseenter", function () { select(j); });
    button.addEventListener("click", function () { select(j); });
  });
  if (layerSelect) layerSelect.addEventListener("change", function () {
    state.layer = Number(layerSelect.value); render();
  });
  headSelect.addEventListener("change", function () {
    state.head = Number(headSelect.value); render();
  });
  root.querySelector(".av-nojs").hidden = true;
  render();
})(document.currentScript);
"""

# How often each input has been shown, so that two viewers of the same input get two ids.
_viewer_id_counts: dict[str, int] = {}


def _json_number(value: float, digits: int) -> str:
    """A rounded weight as short JSON text: 0.25 -> "0.25", 1.0 -> "1", 0.0 -> "0"."""
    text = f"{value:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _token_label(token: str) -> str:
    """How a token is shown: white space made visible, so that no token is blank."""
    if token == "":
        return "\u2205"  # the empty set sign
    label = token.replace("\r\n", "\n").replace("\n", "\u23ce").replace("\t", "\u21e5")
    return label.replace(" ", "\u2423") if not label.strip() else label


def _script_safe_json(text: str) -> str:
    """JSON that cannot end the <script> element it sits in (no '<', '>' or '&' left)."""
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


class AttentionViewer:
    """An interactive view of attention weights; make it with :func:`attention_viewer`.

    In a notebook or on the course's site it shows as HTML (``_repr_html_``); where no
    script can run (the PDF), as a PNG heatmap of the head it opens on (``_repr_png_``).

    Attributes
    ----------
    tokens : list of str
        The text's tokens.
    weights : numpy.ndarray
        The weights as embedded in the page: rounded to ``digits`` decimals, float64.
    layer_names : list of str
        The layers' names, as the layer menu shows them.
    head_names : list of str
        The heads' names, as the head menu shows them.
    title : str
        The viewer's heading.
    start : tuple of int
        The layer, head and query token it opens on.
    digits : int
        Decimals kept and shown.
    element_id : str
        The id of its root element, derived from the inputs (so the HTML is reproducible);
        a second viewer of the same inputs gets a numbered id.

    Shapes
    ------
    weights : (L, H, T, T)
    """

    def __init__(self, tokens, weights, layer_names, head_names, title, start, digits,
                 show_layer):
        self.tokens = tokens
        self.weights = weights
        self.layer_names = layer_names
        self.head_names = head_names
        self.title = title
        self.start = start
        self.digits = digits
        self._show_layer = show_layer
        self._labels = [_token_label(token) for token in tokens]
        self._data_json = self._embedded_json()
        digest = hashlib.sha256(
            json.dumps([title, tokens, layer_names, head_names, list(start)]).encode()
            + self._data_json.encode()).hexdigest()[:12]
        count = _viewer_id_counts.get(digest, 0)
        _viewer_id_counts[digest] = count + 1
        self.element_id = f"av-{digest}" + (f"-{count}" if count else "")

    def _embedded_json(self) -> str:
        def nested(array) -> str:
            if array.ndim == 1:
                return "[" + ",".join(_json_number(x, self.digits) for x in array) + "]"
            return "[" + ",".join(nested(part) for part in array) + "]"

        header = json.dumps({
            "tokens": self.tokens, "labels": self._labels, "layers": self.layer_names,
            "heads": self.head_names, "showLayer": self._show_layer, "start": list(self.start),
            "levels": _VIEWER_LEVELS, "digits": self.digits,
        }, ensure_ascii=False)
        return _script_safe_json(header[:-1] + ',"weights":' + nested(self.weights) + "}")

    def _fixed(self, weight: float) -> str:
        # As the script prints it (toFixed): the embedded number, with all its decimals.
        return f"{weight:.{self.digits}f}"

    def _where(self, layer: int, head: int) -> str:
        if self._show_layer:
            return f"{self.layer_names[layer]}, {self.head_names[head]}"
        return self.head_names[head]

    def _token(self, index: int, word: str = "token") -> str:
        return f"{word} {index} \u201c{self._labels[index]}\u201d"

    def _repr_html_(self) -> str:
        """The viewer as self-contained HTML: markup, style sheet, data and script."""
        esc = html.escape
        vid = self.element_id
        layer, head, query = self.start
        heads = self.weights[layer]
        row = heads[head, query]
        top = int(np.argmax(row))
        parts = [f'<div class="av-root" id="{vid}">', f"<style>\n{_VIEWER_CSS}\n</style>",
                 f'<p class="av-title" id="{vid}-title">{esc(self.title)}</p>',
                 f'<p class="av-help" id="{vid}-help">Hover over a token, or move to one with '
                 "Tab and the arrow keys: every token is coloured by the attention weight it "
                 "gets from that one (the query), and the number under it is that weight.</p>",
                 '<div class="av-controls">']
        menus = [("layer", "Layer", self.layer_names, layer)] if self._show_layer else []
        menus.append(("head", "Head", self.head_names, head))
        for key, label, names, chosen in menus:
            options = "".join(
                f'<option value="{i}"{" selected" if i == chosen else ""}>{esc(name)}</option>'
                for i, name in enumerate(names))
            parts.append(f'<span><label for="{vid}-{key}">{label}</label>'
                         f'<select id="{vid}-{key}" class="av-{key}">{options}</select></span>')
        parts.append("</div>")
        parts.append(f'<div class="av-tokens" role="group" aria-labelledby="{vid}-title" '
                     f'aria-describedby="{vid}-help">')
        for j, label in enumerate(self._labels):
            weight = row[j]
            level = min(_VIEWER_LEVELS, max(0, int(np.floor(weight * _VIEWER_LEVELS + 0.5))))
            is_query = j == query
            parts.append(
                f'<button type="button" class="av-token av-c{level}'
                f'{" av-query" if is_query else ""}" aria-pressed="{str(is_query).lower()}" '
                f'tabindex="{0 if is_query else -1}" title="token {j}" '
                f'data-weight="{_json_number(weight, self.digits)}">'
                f'<span class="av-tok">{esc(label)}</span>'
                f'<span class="av-w">{self._fixed(weight)}</span></button>')
        parts.append("</div>")
        parts.append(f'<p class="av-status" role="status">{esc(self._token(query, "Token"))}'
                     f" attends most to {esc(self._token(top))} (weight {self._fixed(row[top])})"
                     f" in {esc(self._where(layer, head))}.</p>")
        of_layer = f" of {self.layer_names[layer]}" if self._show_layer else ""
        parts.append(f'<p class="av-heads-title">Where each head{esc(of_layer)} attends most '
                     f"from {esc(self._token(query))}:</p>")
        parts.append('<ul class="av-heads">')
        for h, name in enumerate(self.head_names):
            k = int(np.argmax(heads[h, query]))
            current = ' class="av-current"' if h == head else ""
            parts.append(f"<li{current}>{esc(name)}: \u201c{esc(self._labels[k])}\u201d "
                         f"{self._fixed(heads[h, query, k])}</li>")
        parts.append("</ul>")
        swatches = "".join(f'<span class="av-swatch av-c{level}"></span>'
                           for level in range(_VIEWER_LEVELS + 1))
        parts.append(f'<div class="av-legend" aria-hidden="true"><span class="av-legend-label">'
                     f'weight 0</span>{swatches}<span class="av-legend-label">1</span></div>')
        parts.append('<p class="av-nojs">A still picture: this page runs no scripts (in Jupyter, '
                     "trust the notebook or run the cell) so the tokens do not respond.</p>")
        parts.append(f'<script type="application/json" class="av-data">{self._data_json}'
                     "</script>")
        parts.append(f"<script>{_VIEWER_JS.replace('__VIEWER_ID__', vid)}</script>")
        parts.append("</div>")
        return "\n".join(parts)

    def to_figure(self):
        """The static view: a heatmap of the head the viewer opens on, as a Figure.

        Made without pyplot, so it is not shown a second time by a notebook.
        """
        from matplotlib.figure import Figure

        layer, head, _ = self.start
        num_tokens = len(self.tokens)
        side = min(max(4.0, 1.0 + 0.35 * num_tokens), 12.0)
        fig = Figure(figsize=(side + 1.2, side), layout="constrained")
        attention_heatmap(self.weights[layer, head], self._labels, ax=fig.add_subplot(),
                          title=f"{self.title}: {self._where(layer, head)}",
                          annotate=num_tokens <= 10)
        return fig

    def _repr_png_(self) -> bytes:
        """The static fallback (the PDF shows it): :meth:`to_figure` as PNG bytes."""
        import io

        buffer = io.BytesIO()
        self.to_figure().savefig(buffer, format="png", dpi=100, metadata={"Software": None})
        return buffer.getvalue()

    def __repr__(self) -> str:
        num_layers, num_heads, num_tokens, _ = self.weights.shape
        return (f"AttentionViewer(title={self.title!r}, layers={num_layers}, heads={num_heads}, "
                f"tokens={num_tokens})")


def attention_viewer(tokens, weights, *, layer_names=None, head_names=None,
                     title: str = "Where each token attends", layer: int = 0, head: int = 0,
                     query: int | None = None, digits: int = 3) -> AttentionViewer:
    """An interactive view of a text's attention weights, every head of every layer.

    Shown in a notebook or on the course's site, it lists the tokens as buttons: hover over
    one, or move to it with Tab and the arrow keys, and every token is coloured by the weight
    it gets from that query token, with the weight written under it. Menus choose the layer
    and the head; a list says where each head of the layer attends most, and a status line
    (read out by screen readers) which token the query attends to most. The HTML carries its
    own style sheet and script: nothing is fetched, so it works offline and on Binder. Where
    no script can run (the PDF), the viewer shows as a PNG heatmap of the head it opens on.

    Parameters
    ----------
    tokens : sequence of str
        The text's tokens, one per row of the weights. They are shown as text, never run as
        markup.
    weights : array_like
        Self-attention weights: row ``i`` of head ``h`` is what token ``i`` attends to. Rows
        need not sum to 1, but every value must be finite.
    layer_names, head_names : sequence of str, optional
        Names in the menus; default ``"layer 0"``, ... and ``"head 0"``, ...
    title : str
        The viewer's heading (and the PNG's title).
    layer, head, query : int, optional
        Where it opens: layer, head and query token (default the last token).
    digits : int, default 3
        Decimals kept in the embedded data, and shown. The page holds ``L * H * T * T``
        numbers: keep the layers you discuss (30 layers of 9 heads over 40 tokens of a causal
        model are about 1.8 MB).

    Returns
    -------
    AttentionViewer
        Displays itself in a notebook; ``_repr_html_()`` gives the HTML.

    Shapes
    ------
    weights : (L, H, T, T) or (H, T, T), tokens : (T,)

    Raises
    ------
    ValueError
        If ``weights`` is not ``(L, H, T, T)`` or ``(H, T, T)``, has no entries or a value
        that is not finite, if ``tokens``, ``layer_names`` or ``head_names`` have the wrong
        length, or ``layer``, ``head``, ``query`` or ``digits`` are out of range.
    TypeError
        If ``tokens`` is a single string.

    Notes
    -----
    Used in chapters 15 and 16 (every head of MiniLM and SmolLM2 on one sentence) and 18 (what
    the heads of a real model do).

    Examples
    --------
    >>> viewer = attention_viewer(["the", "cat"], [[[1.0, 0.0], [0.25, 0.75]]])
    >>> viewer
    AttentionViewer(title='Where each token attends', layers=1, heads=1, tokens=2)
    >>> "0.75" in viewer._repr_html_()
    True
    """
    if isinstance(tokens, (str, bytes)):
        raise TypeError("tokens must be a sequence of strings, one per token; got one string")
    tokens = [str(token) for token in tokens]
    raw = np.asarray(weights)
    if raw.ndim not in (3, 4) or raw.shape[-1] != raw.shape[-2]:
        raise ValueError(f"weights must have shape (L, H, T, T) or (H, T, T); got {raw.shape}")
    if not np.issubdtype(raw.dtype, np.number) or np.issubdtype(raw.dtype, np.complexfloating):
        raise ValueError(f"weights must be real numbers; got dtype {raw.dtype}")
    if raw.size == 0:
        raise ValueError(f"weights has no entries (shape {raw.shape})")
    show_layer = raw.ndim == 4 or layer_names is not None
    weights = raw.astype(np.float64).reshape((-1,) + raw.shape[-3:])  # (L, H, T, T)
    num_layers, num_heads, num_tokens, _ = weights.shape
    if len(tokens) != num_tokens:
        raise ValueError(f"tokens has {len(tokens)} entries but weights of shape {raw.shape} "
                         f"have T={num_tokens}")
    bad = ~np.isfinite(weights)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"weights must be finite; weights{where[-raw.ndim:]} of shape "
                         f"{raw.shape} is {weights[where]}")
    layer_names = _check_labels(layer_names if layer_names is not None
                                else [f"layer {i}" for i in range(num_layers)],
                                num_layers, "layer_names")
    head_names = _check_labels(head_names if head_names is not None
                               else [f"head {h}" for h in range(num_heads)],
                               num_heads, "head_names")
    layer_names = [str(name) for name in layer_names]
    head_names = [str(name) for name in head_names]
    query = num_tokens - 1 if query is None else query
    for name, value, size in (("layer", layer, num_layers), ("head", head, num_heads),
                              ("query", query, num_tokens)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                or not 0 <= value < size:
            raise ValueError(f"{name} must be an integer in 0..{size - 1} for weights of shape "
                             f"{raw.shape}; got {value!r}")
    if isinstance(digits, bool) or not isinstance(digits, (int, np.integer)) \
            or not 1 <= digits <= 8:
        raise ValueError(f"digits must be an integer from 1 to 8; got {digits!r}")
    rounded = np.round(weights, int(digits)) + 0.0  # + 0.0 turns -0.0 into 0.0
    return AttentionViewer(tokens, rounded, layer_names, head_names, str(title),
                           (int(layer), int(head), int(query)), int(digits), show_layer)
