"""A two-layer attention-only transformer, its backward pass, and data where copying pays
(chapter 18).

Elhage et al. (2021) and Olsson et al. (2022) study transformers with no feed-forward
networks: every layer is attention alone, so whatever the model computes beyond bigram
statistics is done by its heads. :class:`AttentionOnlyLM` is such a model, built from the
library's parts: token embeddings plus learned position vectors, then per layer
``x = x + attn(norm(x))`` with a causal mask (the pre-LN block of chapter 14's GPT without its
feed-forward sub-layer), a final ``LayerNorm`` and a linear read-out.

Two forward passes agree: :meth:`AttentionOnlyLM.forward` runs the library's layers
(``LayerNorm``, ``MultiHeadAttention``) as they are; :func:`attn_only_forward` runs the
functional passes of :mod:`attention_lib.training.functional` and keeps what
:func:`attn_only_backward` needs. :func:`repeated_segment_batch` makes the training data:
random tokens in which a segment of random length, at a random place, is repeated, so that
inside the copy the next token is best predicted by finding the earlier occurrence of the
current token and reading what came after it, wherever the two copies are.
:func:`copy_positions` lists those tokens and :func:`segment_scores` measures how much each
head attends to the previous token and to the answer; :func:`head_scores` does the same on a
sequence followed by its copy (the probe of chapter 14).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_positive_int
from ..layers import LayerNorm
from ..masks import causal_mask
from ..multihead import MultiHeadAttention
from .functional import (
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
    mha_backward,
    mha_forward,
)
from .models import named_parameters

__all__ = ["AttentionOnlyLM", "attn_only_forward", "attn_only_backward",
           "attn_only_loss_and_grads", "repeated_segment_batch", "head_scores",
           "copy_positions", "segment_scores"]


@dataclass
class AttentionOnlyLM:
    """A decoder-only transformer whose layers are attention alone (no feed-forward networks).

    ``x = embedding[ids] + positions[:T]``; for each layer ``x = x + attn(norm(x))`` with a
    causal mask; ``logits = final_norm(x) @ W_out``.

    Attributes
    ----------
    embedding : numpy.ndarray
        ``(V, d_model)`` token vectors.
    positions : numpy.ndarray
        ``(context_len, d_model)`` learned position vectors.
    norms : list of LayerNorm
        The norm before each layer's attention.
    layers : list of MultiHeadAttention
        One causal self-attention per layer.
    final_norm : LayerNorm
    W_out : numpy.ndarray
        ``(d_model, V)``: the read-out (no bias).

    Shapes
    ------
    ids : (B, T) int with T <= context_len -> logits (B, T, V)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.

    Examples
    --------
    >>> model = AttentionOnlyLM.init(10, 8, 16, 2, 2, np.random.default_rng(0))
    >>> model.forward(np.zeros((3, 5), dtype=int)).shape
    (3, 5, 10)
    """

    embedding: np.ndarray
    positions: np.ndarray
    norms: list[LayerNorm]
    layers: list[MultiHeadAttention]
    final_norm: LayerNorm
    W_out: np.ndarray

    @classmethod
    def init(cls, vocab_size: int, context_len: int, d_model: int, num_heads: int,
             num_layers: int, rng: np.random.Generator, *, std: float = 0.02,
             dtype=np.float64) -> AttentionOnlyLM:
        """Random weights drawn as :meth:`~attention_lib.training.gpt.GPT.init` draws them.

        Every matrix and table has normal entries of standard deviation ``std`` (nanoGPT's
        0.02), ``W_o`` ``std / sqrt(2 num_layers)``; biases start at 0, norms at the identity.
        """
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        context_len = check_positive_int(context_len, "context_len")
        num_layers = check_positive_int(num_layers, "num_layers")

        def normal(*shape, scale=std):
            return (rng.standard_normal(shape) * scale).astype(dtype)

        embedding = normal(vocab_size, d_model)
        positions = normal(context_len, d_model)
        layers = []
        for _ in range(num_layers):
            attn = MultiHeadAttention.init(d_model, num_heads, rng, dtype=dtype)
            attn.W_q, attn.W_k, attn.W_v = (normal(d_model, d_model) for _ in range(3))
            attn.W_o = normal(d_model, d_model, scale=std / math.sqrt(2 * num_layers))
            layers.append(attn)
        return cls(embedding=embedding, positions=positions,
                   norms=[LayerNorm.init(d_model, dtype=dtype) for _ in range(num_layers)],
                   layers=layers, final_norm=LayerNorm.init(d_model, dtype=dtype),
                   W_out=normal(d_model, vocab_size))

    @property
    def context_len(self) -> int:
        return self.positions.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.embedding.shape[0]

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable arrays by dotted name (``"layers.0.W_q"``, ``"norms.1.gamma"``)."""
        return named_parameters(self)

    def check_ids(self, ids) -> np.ndarray:
        """``ids`` as a (B, T) integer array with ``1 <= T <= context_len`` and valid ids."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a (B, T) integer array; got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        if not 1 <= ids.shape[1] <= self.context_len:
            raise ValueError(f"ids have T={ids.shape[1]} positions; the model takes 1 to "
                             f"context_len={self.context_len}")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"ids must lie in [0, {self.vocab_size}); got min {ids.min()}, "
                             f"max {ids.max()}")
        return ids

    def forward(self, ids, return_weights: bool = False):
        """Logits for every position, with the library's own layers.

        With ``return_weights=True`` also returns each layer's attention weights
        ``(B, H, T, T)``, as a list.
        """
        ids = self.check_ids(ids)
        T = ids.shape[1]
        x = self.embedding[ids] + self.positions[:T]  # (B, T, d_model)
        mask = causal_mask(T)
        weights = []
        for norm, attn in zip(self.norms, self.layers):
            attended, layer_weights = attn(norm(x), mask=mask)
            weights.append(layer_weights)
            x = x + attended
        logits = self.final_norm(x) @ self.W_out  # (B, T, V)
        return (logits, weights) if return_weights else logits

    __call__ = forward


def attn_only_forward(model: AttentionOnlyLM, ids):
    """The training forward pass: ``(logits, weights, saved)``; equal to ``model.forward``.

    Shapes
    ------
    ids : (B, T) int -> logits (B, T, V), weights : list of (B, H, T, T)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    ids = model.check_ids(ids)
    T = ids.shape[1]
    x, embedding_saved = embedding_forward(model.embedding, ids)  # (B, T, d_model)
    x = x + model.positions[:T]
    mask = causal_mask(T)
    weights, layers_saved = [], []
    for norm, attn in zip(model.norms, model.layers):
        normed, norm_saved = layer_norm_forward(norm, x)
        attended, layer_weights, attn_saved = mha_forward(attn, normed, mask)
        x = x + attended  # the residual stream
        weights.append(layer_weights)
        layers_saved.append((norm_saved, attn_saved))
    x, final_saved = layer_norm_forward(model.final_norm, x)
    logits, out_saved = linear_forward(x, model.W_out)  # (B, T, V)
    saved = (embedding_saved, model.positions.shape, T, layers_saved, final_saved, out_saved)
    return logits, weights, saved


def attn_only_backward(d_logits, saved) -> dict[str, np.ndarray]:
    """Every parameter's gradient from the gradient of the logits, keyed as
    ``model.parameters()``.

    Each layer is ``x + attn(norm(x))``: the gradient reaches ``x`` along the residual path
    unchanged and through the attention and the norm (chapter 12's rule for a residual).

    Shapes
    ------
    d_logits : (B, T, V) -> gradients of the parameters' shapes

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    embedding_saved, positions_shape, T, layers_saved, final_saved, out_saved = saved
    grads = {}
    dx, grads["W_out"], _ = linear_backward(d_logits, out_saved)
    dx, final_grads = layer_norm_backward(dx, final_saved)
    grads |= {f"final_norm.{name}": grad for name, grad in final_grads.items()}
    for index in reversed(range(len(layers_saved))):
        norm_saved, attn_saved = layers_saved[index]
        d_normed, attn_grads = mha_backward(dx, attn_saved)
        d_norm_in, norm_grads = layer_norm_backward(d_normed, norm_saved)
        dx = dx + d_norm_in
        grads |= {f"layers.{index}.{name}": grad for name, grad in attn_grads.items()}
        grads |= {f"norms.{index}.{name}": grad for name, grad in norm_grads.items()}
    d_positions = np.zeros(positions_shape, dtype=dx.dtype)
    d_positions[:T] = dx.sum(axis=0)  # every sequence of the batch used the same rows
    grads["positions"] = d_positions
    grads["embedding"] = embedding_backward(dx, embedding_saved)
    return grads


def attn_only_loss_and_grads(model: AttentionOnlyLM, ids, targets):
    """Mean cross-entropy of the next-token predictions, and every parameter's gradient.

    Returns
    -------
    loss : float
        In nats per token.
    grads : dict of numpy.ndarray
        Keyed as ``model.parameters()``.

    Shapes
    ------
    ids : (B, T) int, targets : (B, T) int

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    logits, _, saved = attn_only_forward(model, ids)
    loss, loss_saved = cross_entropy_forward(logits, targets)
    return loss, attn_only_backward(cross_entropy_backward(1.0, loss_saved), saved)


def repeated_segment_batch(rng: np.random.Generator, batch_size: int, seq_len: int,
                           vocab_size: int, min_segment: int, max_segment: int, *,
                           follow=None, follow_prob: float = 0.0,
                           return_positions: bool = False):
    """Random tokens in which one segment is repeated: ``(batch_size, seq_len + 1)`` ids.

    Each row is ``seq_len + 1`` independent uniform tokens; then a segment of ``L`` distinct
    tokens (``L`` uniform in ``[min_segment, max_segment]``) is written at a uniform place
    and again at a uniform later place where the copy fits (right after the segment or after
    a gap). Inside the copy, every token's next token is the one after the same token in the
    segment. Inputs are ``row[:-1]`` and targets ``row[1:]``.

    Where the copy starts varies from row to row, so no single offset between positions finds
    the earlier occurrence in every row: a model that does it everywhere must match tokens
    (an induction head). A head that looks back by a fixed offset still finds it in the rows
    whose offset it is (measured: with segments of up to half the row, such heads form).

    With ``follow`` (a ``(vocab_size,)`` array of token ids), the tokens outside the segments
    are drawn left to right, and each one from the third on is, with probability
    ``follow_prob``, ``follow[token two places before]`` instead of a uniform draw: a rule that
    a previous-token head can use on its own (at position ``t`` the token at ``t - 1`` tells
    the next one), as the statistics of natural text reward it.

    Returns
    -------
    ids : numpy.ndarray
    sources, copies, lengths : numpy.ndarray
        Only with ``return_positions=True``: where each row's segment starts, where its copy
        starts, and its length.

    Shapes
    ------
    -> ids (batch_size, seq_len + 1) int; sources, copies, lengths (batch_size,) int

    Raises
    ------
    ValueError
        If two segments of ``max_segment`` tokens do not fit in ``seq_len + 1`` tokens, or
        ``max_segment`` exceeds ``vocab_size``.

    Notes
    -----
    Derived in chapter 18, *What the heads do*.

    Examples
    --------
    >>> ids = repeated_segment_batch(np.random.default_rng(0), 2, 11, 20, 3, 4)
    >>> ids.shape
    (2, 12)
    """
    batch_size = check_positive_int(batch_size, "batch_size")
    seq_len = check_positive_int(seq_len, "seq_len")
    min_segment = check_positive_int(min_segment, "min_segment")
    if not min_segment <= max_segment <= vocab_size or 2 * max_segment > seq_len + 1:
        raise ValueError(f"need min_segment <= max_segment <= vocab_size and 2 max_segment <= "
                         f"seq_len + 1; got min_segment={min_segment}, max_segment="
                         f"{max_segment}, vocab_size={vocab_size}, seq_len={seq_len}")
    total = seq_len + 1
    ids = rng.integers(0, vocab_size, size=(batch_size, total))
    if follow is not None:
        follow = np.asarray(follow)
        if follow.shape != (vocab_size,) or follow.min() < 0 or follow.max() >= vocab_size:
            raise ValueError(f"follow must hold one token id in [0, {vocab_size}) per token; "
                             f"got shape {follow.shape}")
        if not 0.0 <= follow_prob <= 1.0:
            raise ValueError(f"follow_prob must lie in [0, 1]; got {follow_prob!r}")
        use_rule = rng.random((batch_size, total)) < follow_prob
        for t in range(2, total):  # left to right: each token depends on an earlier one
            ids[:, t] = np.where(use_rule[:, t], follow[ids[:, t - 2]], ids[:, t])
    lengths = rng.integers(min_segment, max_segment + 1, size=batch_size)  # (B,)
    sources = rng.integers(0, total - 2 * lengths + 1)  # where each segment starts
    copies = rng.integers(sources + lengths, total - lengths + 1)  # where its copy starts
    # Distinct tokens per row: the first max_segment of a random order of the vocabulary.
    segments = rng.permuted(np.tile(np.arange(vocab_size), (batch_size, 1)),
                            axis=1)[:, :max_segment]  # (B, max_segment)
    rows, offsets = np.nonzero(np.arange(max_segment) < lengths[:, None])
    ids[rows, sources[rows] + offsets] = segments[rows, offsets]
    ids[rows, copies[rows] + offsets] = segments[rows, offsets]
    return (ids, sources, copies, lengths) if return_positions else ids


def head_scores(weights, half: int) -> tuple[np.ndarray, np.ndarray]:
    """Each head's previous-token and induction scores on sequences repeated once.

    On inputs of length ``2 half`` whose second half repeats the first: the
    *previous-token score* of a head is the mean weight a query gives the position just
    before it (queries 1 to ``2 half - 1``); the *induction score* the mean weight a query
    of the second copy, at ``t``, gives the token after the earlier occurrence of its
    token, at ``t - half + 1`` (Olsson et al. 2022). The same scores as
    :func:`~attention_lib.training.gpt.induction_probe`.

    Shapes
    ------
    weights : list of (B, H, 2 half, 2 half) -> previous, induction : (num_layers, H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    half = check_positive_int(half, "half")
    steps = np.arange(1, 2 * half)
    queries = np.arange(half, 2 * half)
    previous = np.array([w[:, :, steps, steps - 1].mean(axis=(0, 2)) for w in weights])
    induction = np.array([w[:, :, queries, queries - half + 1].mean(axis=(0, 2))
                          for w in weights])
    return previous, induction


def copy_positions(sources, copies, lengths, seq_len: int):
    """The queries inside each row's second copy, and where their answers are.

    For a row whose segment of length ``L`` starts at ``s`` and whose copy starts at ``c``
    (as :func:`repeated_segment_batch` returns them), the queries are ``c + i`` for
    ``i = 0 .. L - 2`` (their next token is inside the copy) and each query's *source* is
    ``s + i + 1``, the token after the earlier occurrence of the query's token: what an
    induction head attends to, and what the next token equals. Queries past ``seq_len - 1``
    (the model's inputs are ``ids[:, :-1]``) are left out.

    Shapes
    ------
    sources, copies, lengths : (B,) int -> rows, queries, keys : (N,) int

    Notes
    -----
    Derived in chapter 18, *What the heads do*.

    Examples
    --------
    >>> copy_positions(np.array([1]), np.array([5]), np.array([3]), 10)
    (array([0, 0]), array([5, 6]), array([2, 3]))
    """
    sources, copies, lengths = (np.asarray(a).reshape(-1) for a in (sources, copies, lengths))
    if not sources.shape == copies.shape == lengths.shape:
        raise ValueError(f"sources, copies and lengths must have one entry per row; got "
                         f"shapes {sources.shape}, {copies.shape}, {lengths.shape}")
    seq_len = check_positive_int(seq_len, "seq_len")
    rows, offsets = np.nonzero(np.arange(max(int(lengths.max()) - 1, 0)) < (lengths - 1)[:, None])
    queries = copies[rows] + offsets
    keep = queries < seq_len
    return rows[keep], queries[keep], sources[rows][keep] + offsets[keep] + 1


def segment_scores(weights, rows, queries, keys) -> tuple[np.ndarray, np.ndarray]:
    """Each head's previous-token and induction scores on rows with a repeated segment.

    The *previous-token score* is the mean weight a query gives the position just before
    it (all queries from 1 on, all rows); the *induction score* the mean weight the queries
    of the second copy give the token after the earlier occurrence of their token (``rows,
    queries, keys`` from :func:`copy_positions`). Unlike :func:`head_scores`, the copy starts
    at a different place in each row, so a head that looks back a fixed distance scores
    little: a high induction score needs token matching.

    Shapes
    ------
    weights : list of (B, H, T, T); rows, queries, keys : (N,) int
    -> previous, induction : (num_layers, H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    rows, queries, keys = (np.asarray(a) for a in (rows, queries, keys))
    previous, induction = [], []
    for layer_weights in weights:  # (B, H, T, T)
        T = layer_weights.shape[-1]
        steps = np.arange(1, T)
        previous.append(layer_weights[:, :, steps, steps - 1].mean(axis=(0, 2)))
        induction.append(layer_weights[rows, :, queries, keys].mean(axis=0))  # (N, H) -> (H,)
    return np.array(previous), np.array(induction)
