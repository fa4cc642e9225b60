"""What a head does: scores from its attention weights, losses, and its circuits (chapter 18).

The scores read attention weights ``(..., H, T, T)`` as :func:`~attention_lib.hooks.capture`
records them and give one number per head and input, ``(..., H)``, so that a caller can average
over many inputs and report the spread. The diagonal scores follow Olsson et al. (2022):
a previous-token head puts weight on ``i - 1``, a duplicate-token head on the earlier copy of
the same token, an induction head on the token *after* the earlier copy. The circuit functions
follow Elhage et al. (2021): a head's OV circuit maps a source token to the logits it raises,
and a copying head has mostly positive eigenvalues.
"""

from __future__ import annotations

import numpy as np

from .softmax import log_softmax

__all__ = [
    "offset_score",
    "previous_token_score",
    "first_token_score",
    "duplicate_token_score",
    "induction_score",
    "repeated_random_tokens",
    "per_position_loss",
    "copy_losses",
    "head_ov",
    "ov_copying_ranks",
    "positive_eigenvalue_score",
    "logit_difference",
    "head_contributions",
    "direct_logit_attribution",
    "forward_from_layer",
]


def _square_weights(weights) -> np.ndarray:
    weights = np.asarray(weights)
    if weights.ndim < 3 or weights.shape[-1] != weights.shape[-2]:
        raise ValueError(f"weights must be self-attention weights (..., H, T, T); got shape "
                         f"{weights.shape}")
    return weights


def offset_score(weights, offset: int, first_query: int = 0) -> np.ndarray:
    """Mean weight from query ``i`` to key ``i - offset``, over queries ``i >= first_query``.

    Parameters
    ----------
    weights : array_like
        Self-attention weights, rows are queries.
    offset : int
        How far back the key is (1: the previous token); ``0 <= offset < T``.
    first_query : int, default 0
        The first query counted; queries before ``offset`` have no such key and are never
        counted.

    Shapes
    ------
    weights : (..., H, T, T) -> (..., H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    weights = _square_weights(weights)
    T = weights.shape[-1]
    if not 0 <= offset < T:
        raise ValueError(f"offset={offset} must be in [0, T={T}) for weights of shape "
                         f"{weights.shape}")
    first = max(first_query, offset)
    if first >= T:
        raise ValueError(f"first_query={first_query} leaves no query with a key {offset} "
                         f"back (T={T})")
    diagonal = np.diagonal(weights, offset=-offset, axis1=-2, axis2=-1)  # [j] = w[j+offset, j]
    return diagonal[..., first - offset:].mean(axis=-1)


def previous_token_score(weights) -> np.ndarray:
    """Mean weight each query ``i >= 1`` gives to key ``i - 1``: 1 for a pure previous-token head.

    Shapes
    ------
    weights : (..., H, T, T) -> (..., H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    return offset_score(weights, 1)


def first_token_score(weights) -> np.ndarray:
    """Mean weight each query ``i >= 1`` gives to key 0 (an attention sink's score).

    Query 0 is left out: it can only attend to itself.

    Shapes
    ------
    weights : (..., H, T, T) -> (..., H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    weights = _square_weights(weights)
    if weights.shape[-1] < 2:
        raise ValueError(f"first_token_score needs T >= 2; got weights of shape {weights.shape}")
    return weights[..., 1:, 0].mean(axis=-1)


def duplicate_token_score(weights, period: int) -> np.ndarray:
    """On a sequence whose last ``period`` tokens repeat the ``period`` before them: the mean
    weight each token of the second copy gives to the same token in the first copy.

    Parameters
    ----------
    weights : array_like
    period : int
        The length of the repeated block: token ``i`` equals token ``i - period`` for the
        queries ``i >= T - period`` (what :func:`repeated_random_tokens` makes, with or without
        a prefix token).

    Shapes
    ------
    weights : (..., H, T, T) -> (..., H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    T = _square_weights(weights).shape[-1]
    _check_period(period, T)
    return offset_score(weights, period, T - period)


def induction_score(weights, period: int) -> np.ndarray:
    """On a repeated sequence: the mean weight each token of the second copy gives to the token
    *after* its earlier occurrence, key ``i - period + 1`` (Olsson et al., 2022).

    Parameters
    ----------
    weights : array_like
    period : int
        As in :func:`duplicate_token_score`; ``period >= 2`` (with 1, the "next" token is the
        query itself).

    Shapes
    ------
    weights : (..., H, T, T) -> (..., H)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    T = _square_weights(weights).shape[-1]
    _check_period(period, T)
    if period < 2:
        raise ValueError(f"induction_score needs period >= 2; got {period}")
    return offset_score(weights, period - 1, T - period)


def _check_period(period: int, T: int):
    if not isinstance(period, (int, np.integer)) or not 1 <= period <= T // 2:
        raise ValueError(f"period must be an int in [1, T // 2 = {T // 2}] (two copies fit in "
                         f"T={T}); got {period!r}")


def repeated_random_tokens(rng: np.random.Generator, batch: int, length: int,
                           vocab_size: int, *, low: int = 0, prefix: int | None = None
                           ) -> np.ndarray:
    """Sequences of ``length`` uniformly random tokens followed by the same tokens again.

    Nothing in the first copy can be predicted; every token of the second copy can, by a model
    that looks back for the earlier occurrence of the current token and copies what came next.

    Parameters
    ----------
    rng : numpy.random.Generator
    batch, length : int
        How many sequences, and the length of one copy.
    vocab_size : int
        Tokens are drawn from ``[low, vocab_size)``.
    low : int, default 0
        The smallest token drawn (to leave out control tokens).
    prefix : int, optional
        A token put in front of every sequence (a beginning-of-text token).

    Returns
    -------
    numpy.ndarray
        ``(batch, 2 * length)``, or ``(batch, 1 + 2 * length)`` with a prefix; int64.

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    if batch < 1 or length < 1 or not 0 <= low < vocab_size:
        raise ValueError(f"need batch >= 1, length >= 1 and 0 <= low < vocab_size; got "
                         f"batch={batch}, length={length}, low={low}, vocab_size={vocab_size}")
    half = rng.integers(low, vocab_size, size=(batch, length), dtype=np.int64)
    tokens = np.concatenate([half, half], axis=1)
    if prefix is not None:
        tokens = np.concatenate([np.full((batch, 1), prefix, np.int64), tokens], axis=1)
    return tokens


def per_position_loss(logits, tokens) -> np.ndarray:
    """Cross-entropy (natural log) of each next token: entry ``t`` is ``-log p(tokens[t + 1])``
    given the logits at position ``t``.

    Shapes
    ------
    logits : (..., T, V), tokens : (..., T) int -> (..., T - 1)

    Notes
    -----
    Derived in chapter 18, *What the heads do*. The log-probabilities are made one sequence
    at a time: for a real vocabulary (SmolLM2's 49152 tokens) those of a whole batch would
    take several times the memory of its logits.
    """
    logits, tokens = np.asarray(logits), np.asarray(tokens)
    if logits.shape[:-1] != tokens.shape or tokens.shape[-1] < 2:
        raise ValueError(f"logits (..., T, V) and tokens (..., T) with T >= 2 must agree; got "
                         f"logits {logits.shape} and tokens {tokens.shape}")
    T, V = logits.shape[-2:]
    sequences, targets = logits.reshape(-1, T, V), tokens.reshape(-1, T)
    losses = []
    for sequence, target in zip(sequences, targets):
        log_probs = log_softmax(sequence[:-1], axis=-1)  # (T-1, V)
        losses.append(-np.take_along_axis(log_probs, target[1:, None], axis=-1)[:, 0])
    if not losses:  # no sequence: an empty result of the dtype log_softmax would give
        return np.zeros((*tokens.shape[:-1], T - 1), log_softmax(logits[..., :1, :1]).dtype)
    return np.stack(losses).reshape(*tokens.shape[:-1], T - 1)


def copy_losses(losses, period: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean loss over the first copy and over the second copy of a repeated sequence.

    ``losses`` is :func:`per_position_loss` of a sequence whose last ``2 * period`` tokens are
    two copies (with or without a prefix). The first copy's loss counts the predictions of its
    tokens 2 to ``period`` (its first token follows the prefix or nothing); the second copy's
    counts all ``period`` of its tokens' predictions (entry ``t`` predicts token ``t + 1``),
    including its first token, which nothing announces: a model that copies perfectly still
    pays for that one.

    Shapes
    ------
    losses : (..., T - 1) -> two arrays (...)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    losses = np.asarray(losses)
    T = losses.shape[-1] + 1
    _check_period(period, T)
    start = T - 2 * period  # position of the first copy's first token
    first = losses[..., start:start + period - 1]  # predict tokens start+1 .. start+period-1
    second = losses[..., T - period - 1:]  # predict tokens T-period .. T-1
    return first.mean(axis=-1), second.mean(axis=-1)


def head_ov(W_v, W_o, num_heads: int, num_kv_heads: int | None = None) -> np.ndarray:
    """Each head's OV matrix ``W_V^h W_O^h``: what it writes for a vector it attends to.

    With grouped-query attention, query head ``h`` reads the values of key/value head
    ``h // (num_heads // num_kv_heads)``.

    Parameters
    ----------
    W_v : array_like
        ``(d_model, num_kv_heads * d_head)``.
    W_o : array_like
        ``(num_heads * d_head, d_model)``.

    Shapes
    ------
    -> (H, d_model, d_model), as the product of ``(H, d_model, d_head)`` and
    ``(H, d_head, d_model)`` factors; see :func:`positive_eigenvalue_score` for the cheap
    route through the factors.

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    W_v_heads, W_o_heads = _ov_factors(W_v, W_o, num_heads, num_kv_heads)
    return W_v_heads @ W_o_heads


def _ov_factors(W_v, W_o, num_heads, num_kv_heads):
    W_v, W_o = np.asarray(W_v), np.asarray(W_o)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads="
                         f"{num_kv_heads}")
    d_model = W_o.shape[-1]
    if W_o.ndim != 2 or W_o.shape[0] % num_heads:
        raise ValueError(f"W_o must be (num_heads * d_head, d_model); got {W_o.shape} with "
                         f"num_heads={num_heads}")
    d_head = W_o.shape[0] // num_heads
    if W_v.shape != (d_model, num_kv_heads * d_head):
        raise ValueError(f"W_v must be (d_model, num_kv_heads * d_head) = "
                         f"({d_model}, {num_kv_heads * d_head}); got {W_v.shape}")
    group = num_heads // num_kv_heads
    W_v_heads = W_v.reshape(d_model, num_kv_heads, d_head).transpose(1, 0, 2)
    W_v_heads = np.repeat(W_v_heads, group, axis=0)  # (H, d_model, d_head)
    return W_v_heads, W_o.reshape(num_heads, d_head, d_model)  # and (H, d_head, d_model)


def ov_copying_ranks(source, ov, target, ids) -> np.ndarray:
    """Where each source token's own logit ranks in its row of a head's OV circuit.

    Row ``k`` of ``source @ ov @ target.T`` is how much attending to token ``ids[k]`` raises
    each token's logit (Elhage et al., 2021). A copying head raises the same token most: its
    rank is 0 (ties count against it).

    Parameters
    ----------
    source : array_like
        The source tokens' vectors as the head reads them (e.g. their embedding rows after the
        block's input norm), ``(n, d_model)``.
    ov : array_like
        One head's OV matrix, ``(d_model, d_model)`` (see :func:`head_ov`), with any fixed map
        that follows it (the final norm's gain) folded in.
    target : array_like
        The unembedding rows of every token, ``(V, d_model)``.
    ids : array_like of int
        ``(n,)``: the token of each source row.

    Shapes
    ------
    source (n, d), ov (d, d), target (V, d), ids (n,) -> (n,) int

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    source, ov, target = np.asarray(source), np.asarray(ov), np.asarray(target)
    ids = np.asarray(ids)
    d = source.shape[-1] if source.ndim == 2 else -1
    if source.ndim != 2 or ov.shape != (d, d) or target.ndim != 2 or target.shape[1] != d or \
            ids.shape != (source.shape[0],):
        raise ValueError(f"need source (n, d), ov (d, d), target (V, d), ids (n,); got "
                         f"{source.shape}, {ov.shape}, {target.shape}, {ids.shape}")
    if ids.min() < 0 or ids.max() >= target.shape[0]:
        raise ValueError(f"ids must be in [0, V={target.shape[0]})")
    logits = (source @ ov) @ target.T  # (n, V)
    own = np.take_along_axis(logits, ids[:, None], axis=1)  # (n, 1)
    return (logits >= own).sum(axis=1) - 1  # tokens scoring at least as high, itself left out


def positive_eigenvalue_score(left, right) -> float:
    """``sum(lambda) / sum(|lambda|)`` over the eigenvalues of the circuit ``left @ right``.

    1 when every eigenvalue is positive (a map that raises what it reads: copying), -1 when
    every one is negative (Elhage et al., 2021). The nonzero eigenvalues of an ``n x n``
    product ``A @ B`` with ``A (n, k)``, ``B (k, n)`` are those of the ``k x k`` product
    ``B @ A``; pass the factors so that the small product is the one formed:
    ``score = f(B @ A)``.

    Parameters
    ----------
    left : array_like
        ``A``, ``(..., n, k)``.
    right : array_like
        ``B``, ``(..., k, n)``.

    Shapes
    ------
    (..., n, k), (..., k, n) -> (...)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    left, right = np.asarray(left), np.asarray(right)
    if left.shape[-1] != right.shape[-2] or left.shape[-2] != right.shape[-1]:
        raise ValueError(f"left (..., n, k) and right (..., k, n) must agree; got "
                         f"{left.shape} and {right.shape}")
    small = right @ left  # (..., k, k): same nonzero eigenvalues as left @ right
    eigenvalues = np.linalg.eigvals(small.astype(np.float64))
    return eigenvalues.real.sum(axis=-1) / np.abs(eigenvalues).sum(axis=-1)


def logit_difference(logits, correct, wrong) -> np.ndarray:
    """``logits[correct] - logits[wrong]`` for each prompt (its last position's logits).

    Shapes
    ------
    logits : (..., V) or (..., T, V) (the last position is used), correct, wrong : (...) int
    -> (...)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    logits = np.asarray(logits)
    correct, wrong = np.asarray(correct), np.asarray(wrong)
    if logits.ndim == correct.ndim + 2:
        logits = logits[..., -1, :]
    if logits.shape[:-1] != correct.shape or correct.shape != wrong.shape:
        raise ValueError(f"logits (..., V) and answers (...) must agree; got logits "
                         f"{logits.shape}, correct {correct.shape}, wrong {wrong.shape}")
    pick = np.take_along_axis
    return (pick(logits, correct[..., None], -1) - pick(logits, wrong[..., None], -1))[..., 0]


def head_contributions(head_out, W_o) -> np.ndarray:
    """What each head adds to the residual stream: its output times its rows of ``W_o``.

    Their sum over heads, plus ``b_o``, is the attention layer's output.

    Shapes
    ------
    head_out : (..., H, T, d_head), W_o : (H * d_head, d_model) -> (..., H, T, d_model)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    head_out, W_o = np.asarray(head_out), np.asarray(W_o)
    H, d_head = head_out.shape[-3], head_out.shape[-1]
    if W_o.ndim != 2 or W_o.shape[0] != H * d_head:
        raise ValueError(f"W_o must be (H * d_head, d_model) = ({H * d_head}, d_model) for "
                         f"head_out {head_out.shape}; got {W_o.shape}")
    return head_out @ W_o.reshape(H, d_head, -1)  # (..., H, T, d_head) @ (H, d_head, d)


def direct_logit_attribution(contributions, final_resid, gamma, directions,
                             eps: float) -> np.ndarray:
    """The part of a logit difference each residual-stream term writes directly.

    The final RMSNorm divides the stream by its RMS (one number per position) and multiplies
    by ``gamma``; with that RMS taken from the run (frozen), the logits are linear in the
    stream, so a term ``c`` adds ``(c * gamma / rms) @ direction`` and the terms' parts sum
    to the logit difference exactly.

    Parameters
    ----------
    contributions : array_like
        Terms of the final stream at the answer position, ``(..., n, d_model)`` (each head's
        :func:`head_contributions`, each feed-forward output, the embedding).
    final_resid : array_like
        The stream entering the final norm at that position, ``(..., d_model)``.
    gamma : array_like
        The final RMSNorm's gain, ``(d_model,)``.
    directions : array_like
        ``W_out[:, correct] - W_out[:, wrong]`` for each prompt, ``(..., d_model)``.
    eps : float
        The final RMSNorm's epsilon.

    Shapes
    ------
    -> (..., n)

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    contributions = np.asarray(contributions)
    final_resid, directions = np.asarray(final_resid), np.asarray(directions)
    if contributions.shape[-1] != final_resid.shape[-1] or \
            final_resid.shape != directions.shape or \
            contributions.shape[:-2] != final_resid.shape[:-1]:
        raise ValueError(f"need contributions (..., n, d), final_resid (..., d) and directions "
                         f"(..., d); got {contributions.shape}, {final_resid.shape}, "
                         f"{directions.shape}")
    rms = np.sqrt(np.mean(final_resid ** 2, axis=-1, keepdims=True) + eps)  # (..., 1)
    scaled = directions * np.asarray(gamma) / rms  # (..., d)
    return np.einsum("...nd,...d->...n", contributions, scaled)


def forward_from_layer(model, resid, layer: int, positions=None) -> np.ndarray:
    """Finish a forward pass from the stream entering block ``layer``: the logits.

    An intervention at block ``layer`` or later changes nothing before it, so a sweep over
    heads can keep a recording's ``blocks.{layer}.resid_pre`` and run only the blocks from
    ``layer`` on (hooks installed with :func:`~attention_lib.hooks.intervene` still apply).
    Equal to the model's own forward pass (tested).

    Parameters
    ----------
    model : DecoderOnlyLM or SmolLM2
    resid : array_like
        ``blocks.{layer}.resid_pre``, ``(..., T, d_model)``, for a sequence that starts at
        position 0 (no cache).
    layer : int
        ``0 <= layer <= num_layers`` (``num_layers``: only the final norm and the output map).
    positions : int, list of int or slice, optional
        The positions whose logits are wanted (the output map is the costliest product for a
        short sequence); ``None``: all.

    Shapes
    ------
    resid : (..., T, d_model) -> (..., T', V), T' the chosen positions

    Notes
    -----
    Derived in chapter 18, *What the heads do*.
    """
    from .masks import causal_mask  # here: masks does not need this module at import

    num_layers = len(model.blocks)
    if not 0 <= layer <= num_layers:
        raise ValueError(f"layer={layer} must be in [0, {num_layers}]")
    x = np.asarray(resid)
    d_model = model.embedding.shape[1]
    if x.ndim < 2 or x.shape[-1] != d_model:
        raise ValueError(f"resid must be (..., T, d_model={d_model}); got {x.shape}")
    T = x.shape[-2]
    mask = causal_mask(T, T)
    for block in model.blocks[layer:]:
        x = block.forward(x, mask)
    if positions is not None:
        x = x[..., positions, :]
    return model.norm(x) @ model.W_out
