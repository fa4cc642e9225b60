"""A key/value cache for incremental decoding, and greedy decoding with it (chapter 10); a
cache of bounded size that keeps attention sinks and a rolling window (chapter 17)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, check_positive_int
from .positional import apply_rope
from .softmax import log_softmax

__all__ = ["KVCache", "LayerCache", "SinkCache", "greedy_decode", "next_token_nll"]


def _check_layer_index(index, num_layers: int) -> None:
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"layer index must be an integer; got {index!r}")
    if not 0 <= index < num_layers:
        raise ValueError(f"layer index {index} out of range for {num_layers} layers")


def _check_new_keys_values(storage: np.ndarray, k, v) -> tuple[np.ndarray, np.ndarray]:
    """``k`` and ``v`` as arrays, checked to fit a cache whose storage is ``storage``:
    ``(num_layers, *batch, num_kv_heads, slots, d_head)``."""
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    slot_shape = storage.shape[1:-2] + storage.shape[-1:]  # (*batch, H_kv, d_head)
    for name, array in (("k", k), ("v", v)):
        if array.shape[:-2] + array.shape[-1:] != slot_shape:
            raise ValueError(
                f"{name} of shape {array.shape} does not fit the cache: expected "
                f"(*batch, num_kv_heads, T_new, d_head) = "
                f"{(*slot_shape[:-1], 'T_new', slot_shape[-1])}"
            )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has {k.shape[-2]} new positions but v has {v.shape[-2]}")
    return k, v


class _PerLayerStore:
    """What :class:`KVCache` and :class:`SinkCache` share: ``keys`` and ``values`` arrays of
    shape (num_layers, ..., H_kv, capacity, d_head) and one fill count per layer."""

    @property
    def length(self) -> int:
        """Positions held (in every layer; layers are filled one after another in a step)."""
        return int(self.lengths.max())

    @property
    def nbytes(self) -> int:
        """Bytes of the key and value storage (the whole capacity, filled or not)."""
        return self.keys.nbytes + self.values.nbytes

    def layer(self, index: int) -> LayerCache:
        """The part of the cache that belongs to layer ``index``."""
        _check_layer_index(index, len(self.lengths))
        return LayerCache(self, index)


@dataclass
class KVCache(_PerLayerStore):
    """The keys and values every attention layer has computed so far, up to a capacity.

    Decoding one token at a time, a layer needs the keys and values of *all* earlier
    positions; they never change once computed, so the cache keeps them instead of
    recomputing them at every step. Storage is allocated once, for ``capacity``
    positions; appending past it raises a ``ValueError``. ``num_kv_heads`` is the number of
    heads whose keys and values are stored: ``num_heads`` for multi-head attention, fewer
    with grouped-query attention (chapter 11, *Attention at scale*).

    Attributes
    ----------
    keys : numpy.ndarray
        ``(num_layers, *batch_shape, num_kv_heads, capacity, d_head)``
    values : numpy.ndarray
        ``(num_layers, *batch_shape, num_kv_heads, capacity, d_head)``
    lengths : numpy.ndarray
        Positions filled so far, per layer, ``(num_layers,)``.

    Shapes
    ------
    one layer's append: ``k, v : (*batch_shape, num_kv_heads, T_new, d_head)`` -> keys and
    values so far ``(*batch_shape, num_kv_heads, length + T_new, d_head)``

    Notes
    -----
    Derived in chapter 10, *KV cache and decoding*. Memory:
    ``2 * num_layers * prod(batch_shape) * num_kv_heads * capacity * d_head * itemsize``
    bytes.

    Examples
    --------
    >>> cache = KVCache.init(num_layers=2, num_kv_heads=4, capacity=16, d_head=8)
    >>> cache.nbytes == 2 * 2 * 4 * 16 * 8 * 8
    True
    """

    keys: np.ndarray
    values: np.ndarray
    lengths: np.ndarray

    @classmethod
    def init(cls, num_layers: int, num_kv_heads: int, capacity: int, d_head: int,
             batch_shape: tuple[int, ...] = (), dtype=np.float64) -> KVCache:
        """An empty cache for ``num_layers`` layers of ``num_kv_heads`` heads."""
        num_layers = check_positive_int(num_layers, "num_layers")
        num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        capacity = check_positive_int(capacity, "capacity")
        d_head = check_positive_int(d_head, "d_head")
        shape = (num_layers, *tuple(batch_shape), num_kv_heads, capacity, d_head)
        return cls(np.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype),
                   np.zeros(num_layers, dtype=np.int64))

    @property
    def capacity(self) -> int:
        return self.keys.shape[-2]

    def append(self, index: int, k, v) -> tuple[np.ndarray, np.ndarray]:
        """Store new keys and values of layer ``index``; return all of that layer's so far."""
        k, v = _check_new_keys_values(self.keys, k, v)
        start = int(self.lengths[index])
        end = start + k.shape[-2]
        if end > self.capacity:
            raise ValueError(
                f"KVCache is full: capacity {self.capacity}, layer {index} holds {start} "
                f"positions and cannot take {k.shape[-2]} more"
            )
        self.keys[index][..., start:end, :] = k
        self.values[index][..., start:end, :] = v
        self.lengths[index] = end
        return self.keys[index][..., :end, :], self.values[index][..., :end, :]


@dataclass
class LayerCache:
    """A view of one layer's slot in a :class:`KVCache` or :class:`SinkCache` (what an
    attention layer receives)."""

    cache: KVCache | SinkCache
    index: int

    @property
    def length(self) -> int:
        return int(self.cache.lengths[self.index])

    def append(self, k, v) -> tuple[np.ndarray, np.ndarray]:
        """Store new keys and values; return all of this layer's keys and values so far."""
        return self.cache.append(self.index, k, v)


# ---------------------------------------------------------------------------------------------
# A bounded cache for long texts: attention sinks plus a rolling window (chapter 17)
# ---------------------------------------------------------------------------------------------

@dataclass
class SinkCache(_PerLayerStore):
    """A KV cache of bounded size: the first ``num_sinks`` positions plus the last ``window``.

    StreamingLLM (Xiao et al. 2024): a trained model gives much of its attention to the first
    tokens of a text whatever they say (*attention sinks*); a cache that keeps only the most
    recent ``window`` tokens throws them away and the model's predictions collapse, while
    keeping the first few tokens beside the window repairs it. ``num_sinks=0`` is the plain
    rolling window.

    Positions are positions *in the cache*, as StreamingLLM assigns them: the sinks sit at
    ``0 .. num_sinks - 1``, the window after them, and a new token right after the window,
    so no distance ever exceeds ``num_sinks + window``, however long the text. The keys are
    stored already rotated by RoPE (the attention layer rotates before it appends); when the
    oldest window token is dropped, every remaining window key is rotated back by one
    position (RoPE rotations compose: rotating by ``-1`` turns a key at ``p`` into the key at
    ``p - 1``). Until something is dropped it is exactly a :class:`KVCache`.

    A step's new tokens attend to the sinks, the window and themselves; only then is the
    cache cut back to ``num_sinks + window`` positions. Several new tokens at once are
    allowed while they fit; once the cache is full, tokens come one per step.

    Attributes
    ----------
    keys : numpy.ndarray
        ``(num_layers, *batch_shape, num_kv_heads, num_sinks + window + 1, d_head)``; one
        slot more than the cache keeps, for the new token of a step.
    values : numpy.ndarray
        The same shape as ``keys``.
    lengths : numpy.ndarray
        Positions held per layer, ``(num_layers,)``, at most ``num_sinks + window``.
    num_sinks : int
    window : int
    rope_base : float
        The attention layers' RoPE base (to rotate kept keys back).
    evicted : int
        How many positions each layer has dropped so far.

    Shapes
    ------
    one layer's append: ``k, v : (*batch_shape, num_kv_heads, T_new, d_head)`` -> the keys
    and values the new tokens attend to, ``(*batch_shape, num_kv_heads, length + T_new,
    d_head)``

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. After the first drop, step ``t`` gives
    the logits of a fresh forward pass over ``tokens[:num_sinks]`` followed by
    ``tokens[t - window : t + 1]`` (tested).

    Examples
    --------
    >>> cache = SinkCache.init(num_layers=1, num_kv_heads=1, d_head=2, num_sinks=1, window=2,
    ...                        rope_base=10000.0)
    >>> layer = cache.layer(0)
    >>> for step in range(5):
    ...     _ = layer.append(np.ones((1, 1, 2)), np.full((1, 1, 2), step))
    >>> cache.length, cache.values[0, 0, :3, 0].tolist()  # sink 0, then steps 3 and 4
    (3, [0.0, 3.0, 4.0])
    """

    keys: np.ndarray
    values: np.ndarray
    lengths: np.ndarray
    num_sinks: int
    window: int
    rope_base: float
    evicted: np.ndarray

    @classmethod
    def init(cls, num_layers: int, num_kv_heads: int, d_head: int, *, num_sinks: int,
             window: int, rope_base: float, batch_shape: tuple[int, ...] = (),
             dtype=np.float64) -> SinkCache:
        """An empty cache keeping ``num_sinks`` first and ``window`` last positions per layer."""
        num_layers = check_positive_int(num_layers, "num_layers")
        num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
        d_head = check_positive_int(d_head, "d_head")
        num_sinks = check_positive_int(num_sinks, "num_sinks", allow_zero=True)
        window = check_positive_int(window, "window")
        if (isinstance(rope_base, bool) or not isinstance(rope_base, numbers.Real)
                or not math.isfinite(rope_base) or rope_base <= 0):
            raise ValueError(f"rope_base must be a finite number > 0; got {rope_base!r}")
        shape = (num_layers, *tuple(batch_shape), num_kv_heads, num_sinks + window + 1, d_head)
        return cls(np.zeros(shape, dtype=dtype), np.zeros(shape, dtype=dtype),
                   np.zeros(num_layers, dtype=np.int64), num_sinks, window, float(rope_base),
                   np.zeros(num_layers, dtype=np.int64))

    @property
    def capacity(self) -> int:
        """How many positions the cache keeps between steps, ``num_sinks + window``."""
        return self.num_sinks + self.window

    def append(self, index: int, k, v) -> tuple[np.ndarray, np.ndarray]:
        """Store layer ``index``'s new keys and values; return what the new tokens attend to.

        Then, if the cache holds more than ``num_sinks + window`` positions, drop the oldest
        window position and rotate the rest of the window back by one position.
        """
        k, v = _check_new_keys_values(self.keys, k, v)
        start, new = int(self.lengths[index]), k.shape[-2]
        if start + new > self.capacity + 1 or (new > 1 and start + new > self.capacity):
            raise ValueError(
                f"SinkCache (num_sinks={self.num_sinks}, window={self.window}) holds {start} "
                f"positions in layer {index}: {new} new tokens at once would need dropping "
                "positions they attend to; once the cache is full, append one token per step"
            )
        end = start + new
        self.keys[index][..., start:end, :] = k
        self.values[index][..., start:end, :] = v
        attended = (self.keys[index][..., :end, :].copy(), self.values[index][..., :end, :].copy())
        if end > self.capacity:  # drop the oldest window position: slot num_sinks
            first = self.num_sinks
            kept = self.keys[index][..., first + 1:end, :]  # (..., window, d_head)
            self.keys[index][..., first:end - 1, :] = apply_rope(
                kept, np.full(kept.shape[-2], -1), base=self.rope_base)
            self.values[index][..., first:end - 1, :] = self.values[index][..., first + 1:end, :]
            end -= 1
            self.evicted[index] += 1
        self.lengths[index] = end
        return attended


def greedy_decode(model, prompt, num_new_tokens: int, *, use_cache: bool = True) -> np.ndarray:
    """Extend ``prompt`` by ``num_new_tokens`` tokens, each the most likely next token.

    Without the cache every step runs the model on the whole sequence so far and keeps
    only the last position's logits. With it, the prompt is run once (filling the
    cache), then every step runs the model on the one new token. Both give the same
    tokens (chapter 10 proves it and measures the difference in cost).

    Parameters
    ----------
    model : DecoderOnlyLM or any callable ``model(tokens, cache=None) -> logits`` with a
        ``new_cache(batch_shape, capacity)`` method.
    prompt : array_like of int
        Token ids, at least one per sequence.
    num_new_tokens : int
        How many tokens to generate.
    use_cache : bool, default True

    Returns
    -------
    numpy.ndarray of int64
        The prompt followed by the generated tokens.

    Shapes
    ------
    prompt : (..., T) -> (..., T + num_new_tokens)

    Notes
    -----
    Derived in chapter 10, *KV cache and decoding*.
    """
    tokens = np.asarray(prompt)
    if not np.issubdtype(tokens.dtype, np.integer) or tokens.ndim < 1 or tokens.shape[-1] < 1:
        raise ValueError(f"prompt must be integer token ids of shape (..., T>=1); got "
                         f"{tokens.dtype} {tokens.shape}")
    num_new_tokens = check_positive_int(num_new_tokens, "num_new_tokens", allow_zero=True)
    tokens = tokens.astype(np.int64)
    if not use_cache:
        for _ in range(num_new_tokens):
            logits = model(tokens)  # (..., T, V): recomputes every position
            next_token = logits[..., -1, :].argmax(axis=-1)  # (...,)
            tokens = np.concatenate([tokens, next_token[..., None]], axis=-1)
        return tokens
    cache = model.new_cache(tokens.shape[:-1], tokens.shape[-1] + num_new_tokens)
    step_input = tokens  # first the whole prompt, then one token at a time
    for _ in range(num_new_tokens):
        logits = model(step_input, cache=cache)  # (..., T_step, V)
        next_token = logits[..., -1, :].argmax(axis=-1)  # (...,)
        step_input = next_token[..., None]  # (..., 1)
        tokens = np.concatenate([tokens, step_input], axis=-1)
    return tokens


def next_token_nll(model, ids, *, num_sinks: int | None = None, window: int | None = None,
                   chunk: int = 512) -> np.ndarray:
    """The negative log-likelihood of every next token of ``ids``, read through a KV cache.

    With ``window=None`` the cache keeps everything (the model's ``new_cache``), and the text goes
    through the model ``chunk`` tokens at a time. With a ``window``, the cache keeps the
    first ``num_sinks`` tokens and the last ``window`` (:class:`SinkCache`, from the model's
    ``new_sink_cache``): the first ``num_sinks + window`` tokens go in as one chunk, then one
    token per step, each step predicting the next token from what the cache still holds.

    Parameters
    ----------
    model
        A decoder with ``forward(ids, cache=...)`` (1-d ids -> ``(T, V)`` logits),
        ``new_cache(capacity=...)`` and ``new_sink_cache(num_sinks, window)``: a
        :class:`~attention_lib.models.smollm2.SmolLM2`.
    ids : array_like of int
        ``(T,)``, T >= 2.
    num_sinks : int, optional
        First positions kept; only with ``window`` (default 0 then: a plain rolling window).
    window : int, optional
        Most recent positions kept; None keeps everything.
    chunk : int, default 512
        Tokens per forward pass while nothing is dropped.

    Returns
    -------
    numpy.ndarray of float64
        ``(T - 1,)``: ``-log p(ids[t + 1] | what the cache holds at step t)``, natural log.

    Raises
    ------
    ValueError
        If ``ids`` is not 1-d with at least 2 tokens, ``num_sinks`` is given without
        ``window``, or ``chunk`` is not a positive integer.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. The perplexity is
    ``exp(next_token_nll(...).mean())``.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.size < 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be a 1-d integer array of at least 2 tokens; got shape "
                         f"{ids.shape}, dtype {ids.dtype}")
    if num_sinks is not None and window is None:
        raise ValueError("num_sinks needs a window: with window=None the cache keeps everything")
    chunk = check_positive_int(chunk, "chunk")
    if window is None:
        cache, full_until = model.new_cache(capacity=ids.size), ids.size
    else:
        cache = model.new_sink_cache(0 if num_sinks is None else num_sinks, window)
        full_until = min(cache.capacity, ids.size)  # nothing is dropped before this
    pieces = [(start, min(start + chunk, full_until)) for start in range(0, full_until, chunk)]
    pieces += [(t, t + 1) for t in range(full_until, ids.size)]  # one token per step
    nll = []
    for start, stop in pieces:
        logits = model.forward(ids[start:stop], cache=cache)  # (stop - start, V)
        log_p = log_softmax(logits.astype(np.float64), axis=-1)
        targets = ids[start + 1:stop + 1]  # the token after each position (none after the last)
        nll.append(-log_p[np.arange(targets.size), targets])
    return np.concatenate(nll)
