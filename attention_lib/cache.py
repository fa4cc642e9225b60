"""A key/value cache for incremental decoding, and greedy decoding with it (chapter 10)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, check_positive_int

__all__ = ["KVCache", "LayerCache", "greedy_decode"]


@dataclass
class KVCache:
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

    @property
    def length(self) -> int:
        """Positions held (in every layer; layers are filled one after another in a step)."""
        return int(self.lengths.max())

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    def layer(self, index: int) -> LayerCache:
        """The part of the cache that belongs to layer ``index``."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"layer index must be an integer; got {index!r}")
        if not 0 <= index < len(self.lengths):
            raise ValueError(f"layer index {index} out of range for {len(self.lengths)} layers")
        return LayerCache(self, index)

    def append(self, index: int, k, v) -> tuple[np.ndarray, np.ndarray]:
        """Store new keys and values of layer ``index``; return all of that layer's so far."""
        k = as_float_array(k, "k", min_ndim=2)
        v = as_float_array(v, "v", min_ndim=2)
        slot_shape = self.keys.shape[1:-2] + self.keys.shape[-1:]  # (*batch, H_kv, d_head)
        for name, array in (("k", k), ("v", v)):
            if array.shape[:-2] + array.shape[-1:] != slot_shape:
                raise ValueError(
                    f"{name} of shape {array.shape} does not fit the cache: expected "
                    f"(*batch, num_kv_heads, T_new, d_head) = "
                    f"{(*slot_shape[:-1], 'T_new', slot_shape[-1])}"
                )
        if k.shape[-2] != v.shape[-2]:
            raise ValueError(f"k has {k.shape[-2]} new positions but v has {v.shape[-2]}")
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
    """A view of one layer's slot in a :class:`KVCache` (what an attention layer receives)."""

    cache: KVCache
    index: int

    @property
    def length(self) -> int:
        return int(self.cache.lengths[self.index])

    def append(self, k, v) -> tuple[np.ndarray, np.ndarray]:
        """Store new keys and values; return all of this layer's keys and values so far."""
        return self.cache.append(self.index, k, v)


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
