"""Attention as models of 2025-2026 run it: latent (MLA), linear, delta-rule, gated and top-k
sparse attention, each in the forms that are proven equal (chapter 19)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ._checks import (
    as_float_array,
    broadcasts_to,
    check_mask,
    check_positive_int,
    check_scale,
)
from .attention import _attend, init_linear_weight, project
from .layers import LayerNorm, RMSNorm
from .multihead import (
    _gate,
    _heads_mask,
    _merge_heads,
    _split_heads,
)
from .positional import apply_rope
from .softmax import _row_max, _softmax_in_place

__all__ = [
    "LatentCache",
    "MultiHeadLatentAttention",
    "linear_attention",
    "delta_rule",
    "gated_attention_output",
    "LightningIndexer",
    "topk_indices",
    "topk_mask",
    "topk_sparse_attention",
    "sparse_attention_cost",
]


# ---------------------------------------------------------------------------------------------
# Multi-head latent attention (DeepSeek-V2, section 2.1)
# ---------------------------------------------------------------------------------------------

@dataclass
class LatentCache:
    """The decode cache of :class:`MultiHeadLatentAttention`: per token, only the normalized
    KV latent ``c`` and the RoPE key ``k_rope`` shared by all heads, side by side in one row.

    A token costs ``d_latent + d_rope`` numbers whatever the number of heads: 512 + 64 = 576
    in DeepSeek-V3 (``inference/configs/config_671B.json``), where caching the per-head keys
    and values, as the reference's naive path does, takes ``H * (d_head + d_rope + d_v)`` =
    128 * (128 + 64 + 128) = 40960. Storing the two side by side lets the absorbed path read
    every cached row as one key of width ``d_latent + d_rope``, with no copy.

    Attributes
    ----------
    entries : numpy.ndarray
        ``(*batch_shape, capacity, d_latent + d_rope)``: latents in the first ``d_latent``
        features, RoPE keys (already rotated) in the last ``d_rope``.
    d_latent : int
        Width of the latent part.
    length : int
        Positions filled so far.

    Shapes
    ------
    entries : (..., capacity, d_latent + d_rope)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> cache = LatentCache.init(capacity=8, d_latent=4, d_rope=2)
    >>> cache.append(np.ones((3, 6))).shape, cache.length
    ((3, 6), 3)
    """

    entries: np.ndarray
    d_latent: int
    length: int = 0

    @classmethod
    def init(cls, capacity: int, d_latent: int, d_rope: int, batch_shape: tuple[int, ...] = (),
             dtype=np.float64) -> LatentCache:
        """An empty cache for ``capacity`` positions."""
        capacity = check_positive_int(capacity, "capacity")
        d_latent = check_positive_int(d_latent, "d_latent")
        d_rope = check_positive_int(d_rope, "d_rope")
        return cls(np.zeros((*tuple(batch_shape), capacity, d_latent + d_rope), dtype=dtype),
                   d_latent)

    @property
    def capacity(self) -> int:
        return self.entries.shape[-2]

    @property
    def latent(self) -> np.ndarray:
        """The cached latents, ``(..., length, d_latent)`` (a view)."""
        return self.entries[..., : self.length, : self.d_latent]

    @property
    def rope_key(self) -> np.ndarray:
        """The cached RoPE keys, ``(..., length, d_rope)`` (a view)."""
        return self.entries[..., : self.length, self.d_latent:]

    @property
    def nbytes(self) -> int:
        """Bytes of the storage (the whole capacity)."""
        return self.entries.nbytes

    def append(self, new_entries) -> np.ndarray:
        """Store the rows of new tokens; return every row so far, ``(..., length, width)``."""
        new_entries = as_float_array(new_entries, "new_entries", min_ndim=1)
        slot = self.entries.shape[:-2] + self.entries.shape[-1:]
        if new_entries.ndim < 2 or new_entries.shape[:-2] + new_entries.shape[-1:] != slot:
            raise ValueError(f"new_entries of shape {new_entries.shape} do not fit the cache: "
                             f"expected (*batch, T_new, width) = "
                             f"{(*slot[:-1], 'T_new', slot[-1])}")
        end = self.length + new_entries.shape[-2]
        if end > self.capacity:
            raise ValueError(f"LatentCache is full: capacity {self.capacity}, holds "
                             f"{self.length} and cannot take {new_entries.shape[-2]} more")
        self.entries[..., self.length:end, :] = new_entries
        self.length = end
        return self.entries[..., :end, :]


@dataclass
class MultiHeadLatentAttention:
    """Multi-head latent attention (MLA) of DeepSeek-V2 (Liu et al. 2024, section 2.1).

    Keys and values come from one small latent per token, ``c = RMSNorm(x W_dkv)``, which
    is all the cache keeps (with the RoPE key): head ``h`` has content key ``c W_uk^h`` and
    value ``c W_uv^h``. Queries also pass through a latent, ``c_q = RMSNorm(x W_dq)``, then
    ``q^h = [c_q W_uq^h, RoPE(c_q W_qr^h)]``. RoPE cannot sit on the content keys (it would
    stand between ``W_uq`` and ``W_uk`` and stop their product from being folded), so
    position enters through extra "decoupled" features: a RoPE key ``RoPE(x W_kr)`` of
    ``d_rope`` features shared by all heads, ``k^h = [c W_uk^h, k_rope]``. The score scale
    is ``1/sqrt(d_head + d_rope)``. The RMSNorms on both latents follow the reference code
    (DeepSeek-V3 ``inference/model.py``, class ``MLA``: ``q_norm``, ``kv_norm``, eps 1e-6).

    Two paths give the same output up to rounding:

    - **naive**: up-project the latents of all cached tokens into per-head keys and values,
      then attend as multi-head attention (the reference's ``attn_impl="naive"``);
    - **absorbed**: since ``q^h . (c W_uk^h) = (q^h W_uk^h^T) . c``, fold ``W_uk`` into the
      query and score the latents directly; the softmax-weighted latents are mapped by
      ``W_uv^h`` afterwards (``W_uv`` could equally be folded into ``W_o``). It is
      multi-query attention with one key of width ``d_latent + d_rope`` (the cache row) and
      one value of width ``d_latent`` shared by every head; per-head keys never exist (the
      reference's ``attn_impl="absorb"``).

    RoPE uses :func:`~attention_lib.positional.apply_rope`, the interleaved (adjacent-pair)
    layout, which is the layout of the reference's ``apply_rotary_emb`` (it views adjacent
    feature pairs as complex numbers). The reference's YaRN frequency scaling for contexts
    beyond 4096 (and its ``mscale`` factor on the softmax scale) is not implemented.

    Attributes
    ----------
    W_dq : numpy.ndarray
        Query down-projection ``W^{DQ}``, ``(d_model, d_query_latent)``.
    W_uq : numpy.ndarray
        Query up-projection ``W^{UQ}``, ``(d_query_latent, H * d_head)``.
    W_qr : numpy.ndarray
        Query RoPE projection ``W^{QR}``, ``(d_query_latent, H * d_rope)``.
    W_dkv : numpy.ndarray
        KV down-projection ``W^{DKV}``, ``(d_model, d_latent)``.
    W_uk : numpy.ndarray
        Key up-projection ``W^{UK}``, ``(d_latent, H * d_head)``.
    W_uv : numpy.ndarray
        Value up-projection ``W^{UV}``, ``(d_latent, H * d_v)``.
    W_kr : numpy.ndarray
        RoPE-key projection ``W^{KR}``, ``(d_model, d_rope)``: one key for all heads.
    W_o : numpy.ndarray
        Output projection ``W^O``, ``(H * d_v, d_model)``.
    q_norm : RMSNorm
        On the query latent (``d_query_latent``).
    kv_norm : RMSNorm
        On the KV latent (``d_latent``).
    num_heads : int
    rope_base : float, default 10000.0
        DeepSeek-V3's ``rope_theta``.

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, Tk) with Tk = cached + T ->
    output : (..., T, d_model), weights : (..., H, T, Tk)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. The paper's sizes map to the
    reference's names as ``d_latent`` = ``kv_lora_rank`` (d_c), ``d_query_latent`` =
    ``q_lora_rank`` (d_c'), ``d_head`` = ``qk_nope_head_dim`` (d_h), ``d_rope`` =
    ``qk_rope_head_dim`` (d_h^R), ``d_v`` = ``v_head_dim``. Tested equal to a PyTorch
    transcription of both reference paths. No biases, as in the reference.

    Examples
    --------
    >>> mla = MultiHeadLatentAttention.init(16, 4, np.random.default_rng(0), d_latent=8,
    ...                                     d_query_latent=12, d_head=4, d_rope=2)
    >>> output, weights = mla(np.ones((2, 5, 16)))
    >>> output.shape, weights.shape
    ((2, 5, 16), (2, 4, 5, 5))
    """

    W_dq: np.ndarray
    W_uq: np.ndarray
    W_qr: np.ndarray
    W_dkv: np.ndarray
    W_uk: np.ndarray
    W_uv: np.ndarray
    W_kr: np.ndarray
    W_o: np.ndarray
    q_norm: RMSNorm
    kv_norm: RMSNorm
    num_heads: int
    rope_base: float = 10000.0

    def __post_init__(self):
        self.num_heads = check_positive_int(self.num_heads, "num_heads")
        H = self.num_heads
        for name in ("W_dq", "W_uq", "W_qr", "W_dkv", "W_uk", "W_uv", "W_kr", "W_o"):
            array = as_float_array(getattr(self, name), name)
            if array.ndim != 2:
                raise ValueError(f"{name} must be 2-d; got shape {array.shape}")
            setattr(self, name, array)
        for name in ("W_uq", "W_qr", "W_uv"):
            if getattr(self, name).shape[1] % H:
                raise ValueError(f"{name} has {getattr(self, name).shape[1]} columns, not a "
                                 f"multiple of num_heads={H}")
        d_model, d_cq, d_c = self.d_model, self.W_dq.shape[1], self.W_dkv.shape[1]
        expected = {"W_uq": (d_cq, H * self.d_head), "W_qr": (d_cq, H * self.d_rope),
                    "W_dkv": (d_model, d_c), "W_uk": (d_c, H * self.d_head),
                    "W_uv": (d_c, H * self.d_v), "W_kr": (d_model, self.d_rope),
                    "W_o": (H * self.d_v, d_model)}
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} must have shape {shape}; got "
                                 f"{getattr(self, name).shape} (d_model={d_model}, "
                                 f"num_heads={H}, d_latent={d_c}, d_head={self.d_head}, "
                                 f"d_rope={self.d_rope}, d_v={self.d_v})")
        for name, size in (("q_norm", d_cq), ("kv_norm", d_c)):
            if getattr(self, name).gamma.shape != (size,):
                raise ValueError(f"{name} must normalize {size} features; its gamma has "
                                 f"shape {getattr(self, name).gamma.shape}")

    @property
    def d_model(self) -> int:
        return self.W_dq.shape[0]

    @property
    def d_latent(self) -> int:
        return self.W_dkv.shape[1]

    @property
    def d_head(self) -> int:
        return self.W_uq.shape[1] // self.num_heads

    @property
    def d_rope(self) -> int:
        return self.W_kr.shape[1]

    @property
    def d_v(self) -> int:
        return self.W_uv.shape[1] // self.num_heads

    @property
    def scale(self) -> float:
        """``1/sqrt(d_head + d_rope)``: the width of a full per-head query."""
        return 1.0 / math.sqrt(self.d_head + self.d_rope)

    @classmethod
    def init(cls, d_model: int, num_heads: int, rng: np.random.Generator, *, d_latent: int,
             d_query_latent: int, d_head: int, d_rope: int, d_v: int | None = None,
             rope_base: float = 10000.0, dtype=np.float64) -> MultiHeadLatentAttention:
        """Random weights of standard deviation ``1/sqrt(d_in)``, RMSNorm gains of 1.

        ``d_v`` defaults to ``d_head``; ``d_rope`` must be even (RoPE rotates pairs)."""
        H = check_positive_int(num_heads, "num_heads")
        sizes = {name: check_positive_int(value, name) for name, value in (
            ("d_model", d_model), ("d_latent", d_latent), ("d_query_latent", d_query_latent),
            ("d_head", d_head), ("d_rope", d_rope), ("d_v", d_head if d_v is None else d_v))}
        if sizes["d_rope"] % 2:
            raise ValueError(f"d_rope must be even (RoPE rotates pairs); got {d_rope}")
        d_model, d_c, d_cq = sizes["d_model"], sizes["d_latent"], sizes["d_query_latent"]

        def weight(d_in, d_out):
            return init_linear_weight(d_in, d_out, rng, dtype)

        return cls(W_dq=weight(d_model, d_cq), W_uq=weight(d_cq, H * sizes["d_head"]),
                   W_qr=weight(d_cq, H * sizes["d_rope"]), W_dkv=weight(d_model, d_c),
                   W_uk=weight(d_c, H * sizes["d_head"]), W_uv=weight(d_c, H * sizes["d_v"]),
                   W_kr=weight(d_model, sizes["d_rope"]), W_o=weight(H * sizes["d_v"], d_model),
                   q_norm=RMSNorm.init(d_cq, dtype=dtype), kv_norm=RMSNorm.init(d_c, dtype=dtype),
                   num_heads=H, rope_base=rope_base)

    def new_cache(self, capacity: int, batch_shape: tuple[int, ...] = (),
                  dtype=None) -> LatentCache:
        """An empty :class:`LatentCache` for this layer (dtype of ``W_dkv`` by default)."""
        return LatentCache.init(capacity, self.d_latent, self.d_rope, batch_shape,
                                self.W_dkv.dtype if dtype is None else dtype)

    def cache_bytes_per_token(self, itemsize: int | None = None) -> int:
        """Bytes one token adds to the cache: ``(d_latent + d_rope) * itemsize``."""
        itemsize = self.W_dkv.itemsize if itemsize is None else itemsize
        return (self.d_latent + self.d_rope) * itemsize

    def __call__(self, x, mask=None, cache: LatentCache | None = None, *,
                 absorb: bool | None = None):
        """Attend from every token of ``x`` to itself, earlier tokens of ``x`` and the cache.

        ``absorb`` picks the path: True absorbed, False naive, None (the default) absorbed
        when there is a cache (decoding) and naive otherwise, as DeepSeek-V3.2's reference
        does. With ``cache``, the new rows are appended and positions count from the first
        cached token; ``mask`` must then cover all ``cached + T`` keys. Returns
        ``(output, weights)``; a fully masked query gets a zero attention output.
        """
        x = as_float_array(x, "x", min_ndim=2)
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x has {x.shape[-1]} features but the layer has "
                             f"d_model={self.d_model} (x.shape={x.shape})")
        if not np.isfinite(x).all():
            raise ValueError(f"x contains NaN or inf (shape {x.shape})")
        if cache is not None and cache.entries.shape[:-2] != x.shape[:-2]:
            raise ValueError(f"the cache holds batch shape {cache.entries.shape[:-2]} but x "
                             f"has {x.shape[:-2]} (x.shape={x.shape})")
        if mask is not None:
            Tk = x.shape[-2] + (0 if cache is None else cache.length)
            mask = check_mask(mask, (*x.shape[:-2], x.shape[-2], Tk), may_add_dims=False)
        return self.forward(x, mask, cache, absorb=cache is not None if absorb is None
                            else bool(absorb))

    def forward(self, x, mask=None, cache=None, *, absorb: bool = False):
        """MLA on checked inputs (see ``__call__``)."""
        H = self.num_heads
        start = 0 if cache is None else cache.length
        positions = start + np.arange(x.shape[-2])
        # 1. Queries through their latent: content part and RoPE part, per head.
        c_q = self.q_norm(project(x, self.W_dq))  # (..., T, d_query_latent)
        q_content = _split_heads(project(c_q, self.W_uq), H)  # (..., H, T, d_head)
        q_rope = apply_rope(_split_heads(project(c_q, self.W_qr), H), positions,
                            self.rope_base)  # (..., H, T, d_rope)
        # 2. One latent per token and one RoPE key shared by the heads: all the cache keeps.
        c_kv = self.kv_norm(project(x, self.W_dkv))  # (..., T, d_latent)
        k_rope = apply_rope(project(x, self.W_kr), positions, self.rope_base)  # (..., T, d_rope)
        entries = np.concatenate([c_kv, k_rope.astype(c_kv.dtype, copy=False)], axis=-1)
        if cache is not None:
            entries = cache.append(entries)  # (..., cached + T, d_latent + d_rope)
        # 3. Attend, with per-head keys (naive) or on the latents themselves (absorbed).
        attend = self._attend_absorbed if absorb else self._attend_naive
        heads, weights = attend(q_content, q_rope, entries, _heads_mask(mask))  # (..., H, T, d_v)
        return project(_merge_heads(heads), self.W_o), weights  # (..., T, d_model)

    def _attend_naive(self, q_content, q_rope, entries, mask):
        """Up-project every cached latent into per-head keys and values, then attend."""
        H, latent = self.num_heads, entries[..., : self.d_latent]  # (..., Tk, d_latent)
        k_content = _split_heads(project(latent, self.W_uk), H)  # (..., H, Tk, d_head)
        values = _split_heads(project(latent, self.W_uv), H)  # (..., H, Tk, d_v)
        k_rope = entries[..., None, :, self.d_latent:]  # (..., 1, Tk, d_rope)
        k_rope = np.broadcast_to(k_rope, (*k_content.shape[:-1], self.d_rope))
        queries = np.concatenate([q_content, q_rope], axis=-1)  # (..., H, T, d_head + d_rope)
        keys = np.concatenate([k_content, k_rope], axis=-1)  # (..., H, Tk, d_head + d_rope)
        return _attend(queries, keys, values, self.scale, mask)

    def _attend_absorbed(self, q_content, q_rope, entries, mask):
        """Fold W_uk into the queries and attend to the cache rows as one shared key head."""
        H, d_c = self.num_heads, self.d_latent
        latent = entries[..., :d_c]  # (..., Tk, d_latent), a view
        W_uk = self.W_uk.reshape(d_c, H, self.d_head).transpose(1, 2, 0)  # (H, d_head, d_c)
        q_latent = q_content @ W_uk  # (..., H, T, d_latent)
        queries = np.concatenate([q_latent, q_rope.astype(q_latent.dtype, copy=False)], axis=-1)
        # Every head reads the same cache rows: stack the heads' queries into one block of
        # H T rows, so the cache is read once per step by one matrix product (a batch of H
        # products would read it H times).
        lead, T, Tk = queries.shape[:-3], queries.shape[-2], entries.shape[-2]
        stacked = queries.reshape(*lead, 1, H * T, queries.shape[-1])  # (..., 1, H T, w)
        if mask is not None:
            mask = np.broadcast_to(mask, (*lead, H, T, Tk)).reshape(*lead, 1, H * T, Tk)
        keys = entries[..., None, :, :]  # (..., 1, Tk, d_latent + d_rope)
        latent_heads, weights = _attend(stacked, keys, latent[..., None, :, :], self.scale,
                                        mask)  # (..., 1, H T, d_latent)
        latent_heads = latent_heads.reshape(*lead, H, T, d_c)  # (..., H, T, d_latent)
        weights = weights.reshape(*lead, H, T, Tk)  # (..., H, T, Tk)
        W_uv = self.W_uv.reshape(d_c, H, self.d_v).transpose(1, 0, 2)  # (H, d_latent, d_v)
        return latent_heads @ W_uv, weights  # (..., H, T, d_v)


# ---------------------------------------------------------------------------------------------
# Shared checks of the sequence-mixing forms (linear attention, delta rule)
# ---------------------------------------------------------------------------------------------

def _check_chunk_size(chunk_size) -> int | None:
    return None if chunk_size is None else check_positive_int(chunk_size, "chunk_size")


def _check_qkv(q, k, v, *, same_length: bool, broadcast: bool = True):
    """q, k, v as float arrays of one dtype (broadcast to one batch shape if ``broadcast``),
    or a ValueError naming the argument and the shapes."""
    q = as_float_array(q, "q", min_ndim=2)
    k = as_float_array(k, "k", min_ndim=2)
    v = as_float_array(v, "v", min_ndim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has d_k={q.shape[-1]} but k has d_k={k.shape[-1]} "
                         f"(q.shape={q.shape}, k.shape={k.shape})")
    if k.shape[-2] != v.shape[-2] or (same_length and q.shape[-2] != k.shape[-2]):
        raise ValueError(f"q, k and v must have the same number of tokens T; got q.shape="
                         f"{q.shape}, k.shape={k.shape}, v.shape={v.shape}")
    for name, array in (("q", q), ("k", k), ("v", v)):
        if not np.isfinite(array).all():
            raise ValueError(f"{name} contains NaN or inf (shape {array.shape})")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except ValueError:
        raise ValueError(f"the batch dimensions of q {q.shape[:-2]}, k {k.shape[:-2]} and v "
                         f"{v.shape[:-2]} do not broadcast") from None
    dtype = np.result_type(q, k, v)
    if not broadcast:
        return tuple(array.astype(dtype, copy=False) for array in (q, k, v))
    return tuple(np.broadcast_to(array, (*batch, *array.shape[-2:])).astype(dtype, copy=False)
                 for array in (q, k, v))


# ---------------------------------------------------------------------------------------------
# Linear attention (Katharopoulos et al. 2020)
# ---------------------------------------------------------------------------------------------

def _elu_plus_one(x: np.ndarray) -> np.ndarray:
    """``elu(x) + 1``: ``x + 1`` for positive x, ``exp(x)`` otherwise; always > 0."""
    return np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))


def _features(feature_map, x: np.ndarray, name: str) -> np.ndarray:
    if isinstance(feature_map, str):
        if feature_map != "elu+1":
            raise ValueError(f'feature_map must be "elu+1" or a callable; got {feature_map!r}')
        return _elu_plus_one(x)
    if not callable(feature_map):
        raise TypeError(f'feature_map must be "elu+1" or a callable; got {feature_map!r}')
    features = as_float_array(feature_map(x), f"feature_map({name})", min_ndim=2)
    if features.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"feature_map({name}) must keep the shape (..., T); got "
                         f"{features.shape} from {x.shape}")
    if not (np.isfinite(features).all() and (features >= 0).all()):
        raise ValueError(f"feature_map({name}) must return finite features >= 0")
    return features.astype(x.dtype, copy=False)


def _divide(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, with 0 where the denominator underflowed to 0 (every
    feature 0: such a query matches nothing, like a fully masked row)."""
    return numerator / np.maximum(denominator, np.finfo(denominator.dtype).tiny)


def linear_attention(q, k, v, *, causal: bool = True, feature_map="elu+1",
                     chunk_size: int | None = None) -> np.ndarray:
    """Linear attention: softmax's ``exp(q . k)`` replaced by ``phi(q) . phi(k)``.

    ``o_i = sum_j phi(q_i).phi(k_j) v_j / sum_j phi(q_i).phi(k_j)`` over the keys ``j``
    (``j <= i`` if causal), with ``phi(x) = elu(x) + 1`` (Katharopoulos et al. 2020,
    arXiv:2006.16236). As the weights are positive and sum to 1, each output
    is a weighted average of values. Because ``phi(q_i).phi(k_j) v_j = phi(q_i)^T (phi(k_j)
    v_j^T)``, the sum over ``j`` can be kept as a state ``S_i = sum_{j<=i} phi(k_j) v_j^T``
    (``d_k x d_v``, whatever ``i``) and a normalizer ``z_i = sum_{j<=i} phi(k_j)``: the
    transformer becomes a recurrent network. Three forms, equal to rounding:

    - ``chunk_size=None``: the quadratic form, the ``(T, T)`` matrix of ``phi(q).phi(k)``,
      masked causally, times ``V``;
    - ``chunk_size=1``: the recurrent form, one state update per token (O(1) memory per
      step);
    - ``chunk_size=C``: chunks of ``C`` tokens, the quadratic form inside a chunk plus the
      state of all earlier chunks.

    Without ``causal``, every query sees every key and, with a ``chunk_size``, the state is
    the sum over all keys, ``phi(Q) (phi(K)^T V)`` (the chunk size then does not matter).

    Parameters
    ----------
    q, k : array_like
        Queries and keys (heads as leading dimensions).
    v : array_like
        Values.
    causal : bool, default True
    feature_map : "elu+1" or callable
        A callable maps ``(..., T, d_k)`` to ``(..., T, d_f)`` finite features >= 0.
    chunk_size : int, optional
        See above.

    Returns
    -------
    numpy.ndarray
        The outputs, in the dtype of the inputs.

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v) -> (..., Tq, d_v); causal
    needs Tq == Tk. Batch dimensions broadcast.

    Raises
    ------
    ValueError
        If shapes disagree, an input is not finite, ``chunk_size`` is not positive, or the
        feature map returns negative or non-finite features.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. The outputs stay bounded for any
    length (each is an average of values), but the state and normalizer are sums that grow
    linearly with the number of tokens: nothing is ever forgotten, which is what the
    decay of the gated delta rule (:func:`delta_rule`) changes. A query whose features all
    underflow to 0 gets a zero output, not NaN.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 6, 4))
    >>> bool(np.allclose(linear_attention(q, k, v), linear_attention(q, k, v, chunk_size=1)))
    True
    """
    q, k, v = _check_qkv(q, k, v, same_length=causal)
    chunk_size = _check_chunk_size(chunk_size)
    phi_q, phi_k = _features(feature_map, q, "q"), _features(feature_map, k, "k")
    if chunk_size is None:
        return _linear_quadratic(phi_q, phi_k, v, causal)
    if not causal:
        state = phi_k.swapaxes(-1, -2) @ v  # (..., d_f, d_v)
        return _divide(phi_q @ state, phi_q @ phi_k.sum(axis=-2)[..., None])
    if chunk_size == 1:
        return _linear_recurrent(phi_q, phi_k, v)
    return _linear_chunked(phi_q, phi_k, v, chunk_size)


def _linear_quadratic(phi_q, phi_k, v, causal: bool) -> np.ndarray:
    similarities = phi_q @ phi_k.swapaxes(-1, -2)  # (..., Tq, Tk), all >= 0
    if causal:
        similarities = np.tril(similarities)
    return _divide(similarities @ v, similarities.sum(axis=-1, keepdims=True))


def _linear_recurrent(phi_q, phi_k, v) -> np.ndarray:
    state = np.zeros((*v.shape[:-2], phi_k.shape[-1], v.shape[-1]), dtype=v.dtype)
    normalizer = np.zeros(phi_k.shape[:-2] + phi_k.shape[-1:], dtype=v.dtype)  # (..., d_f)
    output = np.empty_like(v)  # (..., T, d_v)
    for t in range(v.shape[-2]):
        state += phi_k[..., t, :, None] * v[..., t, None, :]  # S += phi(k_t) v_t^T
        normalizer += phi_k[..., t, :]
        query = phi_q[..., t, None, :]  # (..., 1, d_f)
        output[..., t, :] = _divide(query @ state, query @ normalizer[..., None])[..., 0, :]
    return output


def _linear_chunked(phi_q, phi_k, v, chunk_size: int) -> np.ndarray:
    state = np.zeros((*v.shape[:-2], phi_k.shape[-1], v.shape[-1]), dtype=v.dtype)
    normalizer = np.zeros((*v.shape[:-2], phi_k.shape[-1], 1), dtype=v.dtype)  # (..., d_f, 1)
    output = np.empty_like(v)
    for start in range(0, v.shape[-2], chunk_size):
        rows = slice(start, start + chunk_size)
        queries, keys, values = phi_q[..., rows, :], phi_k[..., rows, :], v[..., rows, :]
        inside = np.tril(queries @ keys.swapaxes(-1, -2))  # (..., C, C)
        numerator = queries @ state + inside @ values  # (..., C, d_v)
        denominator = queries @ normalizer + inside.sum(axis=-1, keepdims=True)  # (..., C, 1)
        output[..., rows, :] = _divide(numerator, denominator)
        state += keys.swapaxes(-1, -2) @ values
        normalizer += keys.sum(axis=-2)[..., None]
    return output


# ---------------------------------------------------------------------------------------------
# The delta rule and the gated delta rule (Schlag et al. 2021; Yang et al. 2024, 2025)
# ---------------------------------------------------------------------------------------------

def _check_gate(gate, name: str, batch_t: tuple[int, ...], dtype, *, low_open: bool):
    """beta in [0, 1] or decay in (0, 1], broadcast to (..., T), or a ValueError."""
    gate = as_float_array(gate, name, min_ndim=1)
    gate = gate.astype(dtype, copy=False)  # checked in the dtype used: 1e-50 is 0 in float32
    if not broadcasts_to(gate.shape, batch_t):
        raise ValueError(f"{name} of shape {gate.shape} does not broadcast to (..., T) = "
                         f"{batch_t}: one value per token (and head)")
    interval = "(0, 1]" if low_open else "[0, 1]"
    if not np.isfinite(gate).all():
        raise ValueError(f"{name} must lie in {interval}; it contains NaN or inf "
                         f"(shape {gate.shape})")
    low_ok = gate > 0 if low_open else gate >= 0
    if not (low_ok.all() and (gate <= 1).all()):
        raise ValueError(f"{name} must lie in {interval}; got values from "
                         f"{gate.min():.6g} to {gate.max():.6g} (shape {gate.shape})")
    return np.broadcast_to(gate, batch_t)


def delta_rule(q, k, v, beta, *, decay=None, chunk_size: int | None = None,
               initial_state=None, return_state: bool = False):
    """The delta rule (DeltaNet) and, with ``decay``, the gated delta rule (Gated DeltaNet).

    A state ``S`` (``d_v x d_k``) is a memory read as ``S k``. At each token it first decays
    by ``a_t``, then moves its answer for ``k_t`` a step ``b_t`` towards ``v_t``::

        S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T
            = a_t S_{t-1} - b_t (a_t S_{t-1} k_t - v_t) k_t^T,        o_t = S_t q_t

    one step of gradient descent on ``|S k_t - v_t|^2 / 2`` (Schlag et al. 2021,
    arXiv:2102.11174; the decay ``a_t``: Yang, Kautz, Hatamizadeh, arXiv:2412.06464). Linear
    attention is the case without the correction (``S_t = S_{t-1} + v_t k_t^T``); the delta
    rule overwrites what a key held instead of adding to it. Two forms, equal to rounding:

    - ``chunk_size=None``: the recurrence above, one token at a time;
    - ``chunk_size=C``: the chunkwise form of Yang et al. 2024 (arXiv:2406.06484): inside a
      chunk the product of the ``C`` matrices ``I - b k k^T`` has the WY form ``I - K^T W``,
      with ``W`` (and the values' ``U``) from one unit lower-triangular system per chunk
      (the "UT transform"; solved here with ``np.linalg.solve``), so a chunk needs matrix
      products and a single state update. The decay
      enters as ratios of cumulative products, computed from sums of ``log a``. Every
      chunk's solve runs at once; only the state is carried from chunk to chunk.

    Parameters
    ----------
    q, k : array_like
        Queries and keys (heads as leading dimensions). The rule does not normalize them:
        DeltaNet and Gated DeltaNet L2-normalize keys (and queries) first, and fla's kernels
        also scale queries by ``d_k ** -0.5``; do so before calling if you want that.
    v : array_like
        Values.
    beta : array_like
        The step ``b_t`` in [0, 1], one per token (and head).
    decay : array_like, optional
        The decay ``a_t`` in (0, 1], one per token (and head); None means 1 (DeltaNet).
        Gated DeltaNet computes ``a_t = exp(g_t)`` with ``g_t <= 0``.
    chunk_size : int, optional
        None: recurrent form; otherwise the chunkwise form (the last chunk may be shorter).
    initial_state : array_like, optional
        ``S_0``; zeros by default.
    return_state : bool, default False
        Also return the final state ``S_T``.

    Returns
    -------
    output : numpy.ndarray
    state : numpy.ndarray
        Only if ``return_state``.

    Shapes
    ------
    q, k : (..., T, d_k), v : (..., T, d_v), beta and decay : broadcastable to (..., T),
    initial_state : (..., d_v, d_k) -> output (..., T, d_v), state (..., d_v, d_k).
    Batch dimensions broadcast; the dtype is that of q, k and v (float32 stays float32).

    Raises
    ------
    ValueError
        If shapes disagree, an input is not finite, ``beta`` is outside [0, 1], ``decay``
        outside (0, 1], ``chunk_size`` not positive, or the state overflows.

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. Size of the state: with
    ``|k_t| = 1`` and ``b_t`` in [0, 1], ``I - b_t k_t k_t^T`` has eigenvalues ``1 - b_t``
    and 1, so ``|S_t| <= a_t |S_{t-1}| + b_t |v_t|`` (spectral norm): without decay the
    state grows at most linearly in ``t``, and with ``a_t <= a < 1`` it stays below
    ``max |v| / (1 - a)`` (from a zero state). Keys that are not normalized break this: where
    ``b_t |k_t|^2 > 2``, the factor has an eigenvalue below -1 and the state can grow
    geometrically; an overflow raises a ValueError rather than returning NaN. Tested equal
    to a PyTorch transcription of flash-linear-attention's ``naive`` recurrences.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 8, 4))
    >>> k /= np.linalg.norm(k, axis=-1, keepdims=True)
    >>> beta = np.full(8, 0.5)
    >>> bool(np.allclose(delta_rule(q, k, v, beta), delta_rule(q, k, v, beta, chunk_size=3)))
    True
    """
    q, k, v = _check_qkv(q, k, v, same_length=True)
    chunk_size = _check_chunk_size(chunk_size)
    batch_t = q.shape[:-1]  # (..., T)
    beta = _check_gate(beta, "beta", batch_t, q.dtype, low_open=False)
    if decay is not None:
        decay = _check_gate(decay, "decay", batch_t, q.dtype, low_open=True)
    state_shape = (*q.shape[:-2], v.shape[-1], k.shape[-1])  # (..., d_v, d_k)
    if initial_state is None:
        state = np.zeros(state_shape, dtype=q.dtype)
    else:
        state = as_float_array(initial_state, "initial_state", min_ndim=2)
        if not np.isfinite(state).all():
            raise ValueError(f"initial_state contains NaN or inf (shape {state.shape})")
        if not broadcasts_to(state.shape, state_shape):
            raise ValueError(f"initial_state of shape {state.shape} does not broadcast to "
                             f"(..., d_v, d_k) = {state_shape}")
        state = np.broadcast_to(state, state_shape).astype(q.dtype)  # a copy: updated in place
    with np.errstate(over="ignore", invalid="ignore"):
        if chunk_size is None:
            output, state = _delta_recurrent(q, k, v, beta, decay, state)
        else:
            output, state = _delta_chunked(q, k, v, beta, decay, state, chunk_size)
    if not (np.isfinite(output).all() and np.isfinite(state).all()):
        raise ValueError(f"the delta-rule state overflowed {q.dtype}: with b_t |k_t|^2 > 2 "
                         "the update amplifies the state; L2-normalize the keys (largest "
                         f"b_t |k_t|^2 here {float((beta * (k * k).sum(-1)).max()):.6g})")
    return (output, state) if return_state else output


def _delta_recurrent(q, k, v, beta, decay, state):
    """One token at a time: S <- a S - b (a S k - v) k^T, o = S q."""
    output = np.empty_like(v)  # (..., T, d_v)
    for t in range(v.shape[-2]):
        if decay is not None:
            state *= decay[..., t, None, None]
        key = k[..., t, :]  # (..., d_k)
        error = (state @ key[..., None])[..., 0] - v[..., t, :]  # (..., d_v): S k - v
        state -= beta[..., t, None, None] * error[..., :, None] * key[..., None, :]
        output[..., t, :] = (state @ q[..., t, :, None])[..., 0]
    return output, state


def _chunks(x: np.ndarray, chunk_size: int, pad: int) -> np.ndarray:
    """(..., T, n) -> (..., T_padded / C, C, n), zero-padded at the end."""
    x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])
    return x.reshape(*x.shape[:-2], -1, chunk_size, x.shape[-1])


def _delta_chunked(q, k, v, beta, decay, state, chunk_size: int):
    """The chunkwise (WY / UT-transform) form, in rows: with H = S^T (d_k x d_v), o^T = q^T H.

    Per chunk, with g_r the cumulative sum of log a inside the chunk, gamma_r = exp(g_r) and
    Gamma_rs = exp(g_r - g_s) for r >= s:
      A = I + strictly_lower(diag(b) K K^T * Gamma)      (C x C, unit lower triangular)
      U = A^-1 diag(b) V,   W = A^-1 diag(b) (gamma K)   (the UT transform)
      V_new = U - W H                                    (values corrected by the memory)
      O = (gamma Q) H + lower(Q K^T * Gamma) V_new
      H <- gamma_C H + ((gamma_C / gamma) K)^T V_new
    Padding tokens have b = 0 and a = 1, so they leave the state unchanged.
    """
    T, C = q.shape[-2], chunk_size
    pad = -T % C
    Q, K, V = (_chunks(x, C, pad) for x in (q, k, v))  # (..., n, C, d)
    B = _chunks(beta[..., None], C, pad)  # (..., n, C, 1)
    log_decay = np.zeros_like(beta) if decay is None else np.log(decay)
    g = np.cumsum(_chunks(log_decay[..., None], C, pad), axis=-2)  # (..., n, C, 1)
    Gamma = np.tril(np.exp(np.minimum(g - g.swapaxes(-1, -2), 0)))  # (..., n, C, C), <= 1
    gamma = np.exp(g)  # (..., n, C, 1)
    A = np.eye(C, dtype=q.dtype) + np.tril(B * (K @ K.swapaxes(-1, -2)) * Gamma, -1)
    # One solve for both right-hand sides: one LU factorization of A, not two.
    UW = np.linalg.solve(A, np.concatenate([B * V, B * gamma * K], axis=-1))
    U, W = UW[..., : V.shape[-1]], UW[..., V.shape[-1]:]  # (..., n, C, d_v), (..., n, C, d_k)
    inside = np.tril(Q @ K.swapaxes(-1, -2) * Gamma)  # (..., n, C, C)
    Q_decayed = gamma * Q
    K_to_end = np.exp(g[..., -1:, :] - g) * K  # (gamma_C / gamma_r) k_r
    H = state.swapaxes(-1, -2).copy()  # (..., d_k, d_v)
    outputs = np.empty_like(V)  # (..., n, C, d_v)
    for n in range(Q.shape[-3]):
        V_new = U[..., n, :, :] - W[..., n, :, :] @ H  # (..., C, d_v)
        outputs[..., n, :, :] = Q_decayed[..., n, :, :] @ H + inside[..., n, :, :] @ V_new
        H = gamma[..., n, -1:, :] * H + K_to_end[..., n, :, :].swapaxes(-1, -2) @ V_new
    output = outputs.reshape(*V.shape[:-3], -1, V.shape[-1])[..., :T, :]
    return output, H.swapaxes(-1, -2)


# ---------------------------------------------------------------------------------------------
# Gated attention (Qiu et al. 2025)
# ---------------------------------------------------------------------------------------------

def gated_attention_output(heads, x, W_g, b_g=None) -> np.ndarray:
    """Gate each head's attention output by ``sigmoid(x W_g + b_g)``, before ``W_o``.

    The gate of Qiu et al. 2025 (arXiv:2505.06708) at its best position, "G1": after
    scaled dot-product attention, before the heads are concatenated and mixed by ``W_o``,
    computed from the layer's own input ``x`` (the normalized hidden state), a different
    gate for every head. ``W_g`` of shape ``(d_model, H * d_head)`` gives an elementwise gate
    (one per head and channel, as Qwen3-Next uses); ``(d_model, H)`` a head-wise one (one
    scalar per head). A gate near 0 lets a head output nothing, so no head needs to park its
    attention on the first token to do so (the paper's "attention-sink-free").

    The layer with this gate is :class:`~attention_lib.multihead.MultiHeadAttention` with
    ``W_g`` and ``b_g`` set (``MultiHeadAttention.init(..., gate="elementwise")`` or
    ``gate="headwise"``), whose forward pass calls the same kernel.

    Parameters
    ----------
    heads : array_like
        The per-head attention outputs.
    x : array_like
        The input the layer's queries were computed from.
    W_g : array_like
        Gate projection, ``(d_model, H * d_head)`` or ``(d_model, H)``.
    b_g : array_like, optional
        Gate bias, ``(W_g.shape[1],)``; zeros if None.

    Returns
    -------
    numpy.ndarray
        ``heads * sigmoid(x W_g + b_g)``, in the heads' layout; float32 if ``heads``,
        ``x`` and ``W_g`` all are.

    Shapes
    ------
    heads : (..., H, T, d_head), x : (..., T, d_model) -> (..., H, T, d_head)

    Raises
    ------
    ValueError
        If the shapes do not fit together (the message names all three).

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> heads = np.ones((2, 3, 4))  # 2 heads, 3 tokens, d_head 4
    >>> gated_attention_output(heads, np.zeros((3, 5)), np.zeros((5, 8)))[0, 0]
    array([0.5, 0.5, 0.5, 0.5])
    """
    heads = as_float_array(heads, "heads", min_ndim=3)
    x = as_float_array(x, "x", min_ndim=2)
    W_g = as_float_array(W_g, "W_g", min_ndim=2)
    H, T, d_head = heads.shape[-3:]
    if (W_g.ndim != 2 or x.shape[-2] != T or W_g.shape[0] != x.shape[-1]
            or W_g.shape[1] not in (H, H * d_head)
            or not _broadcasts(heads.shape[:-3], x.shape[:-2])):
        raise ValueError(f"heads {heads.shape} (..., H, T, d_head), x {x.shape} (..., T, "
                         f"d_model) and W_g {W_g.shape} (d_model, H * d_head or H) do not fit "
                         "(the same T, the same d_model, batch dims that broadcast)")
    if b_g is not None:
        b_g = as_float_array(b_g, "b_g", min_ndim=1)
        if b_g.shape != (W_g.shape[1],):
            raise ValueError(f"b_g must have shape ({W_g.shape[1]},); got {b_g.shape}")
    return _gate(heads, x, W_g, b_g)


# ---------------------------------------------------------------------------------------------
# Top-k sparse attention (DeepSeek-V3.2's lightning indexer)
# ---------------------------------------------------------------------------------------------

@dataclass
class LightningIndexer:
    """DeepSeek-V3.2's lightning indexer: a cheap score that picks the keys worth attending.

    ``I[t, s] = sum_j w[t, j] * ReLU(q[t, j] . k[s])`` over a few small index heads ``j``:
    each index head has its own query, all share one key per token (like multi-query
    attention), and the head weights ``w[t, j]`` come from the token itself (DeepSeek-V3.2
    tech report; reference ``deepseek-ai/DeepSeek-V3.2-Exp``, ``inference/model.py``, class
    ``Indexer``: 64 heads of 128 features, top 2048 keys). As there, the key is
    LayerNorm-ed, the first ``d_rope`` features of queries and keys get RoPE, and the head
    weights are scaled by ``H_I ** -0.5 * d_index ** -0.5``. Not reproduced: the Hadamard
    rotation (orthogonal, it leaves dot products unchanged) and the FP8 quantization (a
    speed measure). The reference computes index queries from MLA's query latent; here
    they come from ``query_input`` (``x`` by default).

    Attributes
    ----------
    W_q : numpy.ndarray
        ``(d_query_input, H_I * d_index)``.
    W_k : numpy.ndarray
        ``(d_model, d_index)``.
    W_w : numpy.ndarray
        ``(d_model, H_I)``: the per-token head weights.
    k_norm : LayerNorm
        On the index key, ``d_index`` features.
    num_heads : int
        ``H_I``.
    d_rope : int, default 0
        Features of queries and keys rotated by RoPE (even).
    rope_base : float, default 10000.0

    Shapes
    ------
    x : (..., T, d_model), query_input : (..., T, d_query_input) -> scores (..., T, T)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. The indexer itself is still
    quadratic in ``T``, but with ``H_I * d_index`` multiplications per pair in FP8, against
    the main attention's ``H * (d_head + d_rope)`` in BF16 (:func:`sparse_attention_cost`).

    Examples
    --------
    >>> indexer = LightningIndexer.init(16, 2, 8, np.random.default_rng(0))
    >>> indexer(np.ones((3, 5, 16))).shape
    (3, 5, 5)
    """

    W_q: np.ndarray
    W_k: np.ndarray
    W_w: np.ndarray
    k_norm: LayerNorm
    num_heads: int
    d_rope: int = 0
    rope_base: float = 10000.0

    def __post_init__(self):
        self.num_heads = check_positive_int(self.num_heads, "num_heads")
        self.d_rope = check_positive_int(self.d_rope, "d_rope", allow_zero=True)
        for name in ("W_q", "W_k", "W_w"):
            array = as_float_array(getattr(self, name), name)
            if array.ndim != 2:
                raise ValueError(f"{name} must be 2-d; got shape {array.shape}")
            setattr(self, name, array)
        d_model, d_index, H = self.W_k.shape[0], self.W_k.shape[1], self.num_heads
        if (self.W_q.shape[1] != H * d_index or self.W_w.shape != (d_model, H)
                or self.k_norm.gamma.shape != (d_index,)):
            raise ValueError(f"W_q {self.W_q.shape}, W_w {self.W_w.shape} and k_norm "
                             f"{self.k_norm.gamma.shape} must be (., {H * d_index}), "
                             f"({d_model}, {H}) and ({d_index},) for W_k {self.W_k.shape} "
                             f"and num_heads={H}")
        if self.d_rope % 2 or self.d_rope > d_index:
            raise ValueError(f"d_rope must be even and at most d_index={d_index}; "
                             f"got {self.d_rope}")

    @classmethod
    def init(cls, d_model: int, num_heads: int, d_index: int, rng: np.random.Generator, *,
             d_query_input: int | None = None, d_rope: int = 0, dtype=np.float64):
        """Random projections (standard deviation ``1/sqrt(d_in)``), a plain LayerNorm."""
        d_query_input = d_model if d_query_input is None else d_query_input
        return cls(init_linear_weight(d_query_input, num_heads * d_index, rng, dtype),
                   init_linear_weight(d_model, d_index, rng, dtype),
                   init_linear_weight(d_model, num_heads, rng, dtype),
                   LayerNorm.init(d_index, eps=1e-6, dtype=dtype), num_heads, d_rope)

    def __call__(self, x, query_input=None) -> np.ndarray:
        """The index scores of every query against every key of ``x``: ``(..., T, T)``."""
        x = as_float_array(x, "x", min_ndim=2)
        query_input = x if query_input is None else as_float_array(query_input, "query_input",
                                                                    min_ndim=2)
        if (x.shape[-1] != self.W_k.shape[0] or query_input.shape[-1] != self.W_q.shape[0]
                or query_input.shape[:-1] != x.shape[:-1]):
            raise ValueError(f"x {x.shape} and query_input {query_input.shape} must be "
                             f"(..., T, {self.W_k.shape[0]}) and (..., T, {self.W_q.shape[0]})")
        H, d_index = self.num_heads, self.W_k.shape[1]
        positions = np.arange(x.shape[-2])
        queries = self._rope(_split_heads(project(query_input, self.W_q), H), positions)
        keys = self._rope(self.k_norm(project(x, self.W_k)), positions)  # (..., T, d_index)
        head_weights = project(x, self.W_w) * (H ** -0.5 * d_index ** -0.5)  # (..., T, H_I)
        per_head = np.maximum(queries @ keys[..., None, :, :].swapaxes(-1, -2), 0)
        # per_head : (..., H_I, Tq, Tk); weight each head by its query token's weight.
        return (per_head * head_weights.swapaxes(-1, -2)[..., None]).sum(axis=-3)

    def _rope(self, x, positions):
        if self.d_rope == 0:
            return x
        rotated = apply_rope(x[..., : self.d_rope], positions, self.rope_base)
        return np.concatenate([rotated, x[..., self.d_rope:]], axis=-1)


def _check_top_k(index_scores, top_k, mask):
    index_scores = as_float_array(index_scores, "index_scores", min_ndim=2)
    if np.isnan(index_scores).any() or np.isposinf(index_scores).any():
        raise ValueError(f"index_scores contain NaN or +inf (shape {index_scores.shape})")
    top_k = check_positive_int(top_k, "top_k")
    if mask is not None:
        mask = check_mask(mask, index_scores.shape)
    return index_scores, top_k, mask


def topk_indices(index_scores, top_k: int, mask=None):
    """The ``top_k`` keys with the highest index scores, for every query, in position order.

    Keys the ``mask`` blocks are never preferred to allowed ones; a query with fewer than
    ``top_k`` allowed keys still gets ``top_k`` indices, and ``allowed`` says which of them
    it may attend to (as the reference adds the causal mask again after its ``topk``).
    With ``top_k >= Tk`` every key is selected.

    Parameters
    ----------
    index_scores : array_like
        One score per query and key (:class:`LightningIndexer`).
    top_k : int
    mask : array_like of bool, optional
        True = may attend, broadcastable to ``index_scores``.

    Returns
    -------
    indices : numpy.ndarray of int
        Sorted along the last axis.
    allowed : numpy.ndarray of bool

    Shapes
    ------
    index_scores : (..., Tq, Tk) -> indices, allowed : (..., Tq, min(top_k, Tk))

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> topk_indices(np.array([[0.1, 0.9, 0.5, 0.7]]), 2)[0]
    array([[1, 3]])
    """
    index_scores, top_k, mask = _check_top_k(index_scores, top_k, mask)
    return _topk_indices(index_scores, top_k, mask)


def _topk_indices(index_scores, top_k, mask):
    Tk = index_scores.shape[-1]
    top_k = min(top_k, Tk)
    if mask is not None:
        index_scores = np.where(mask, index_scores, -np.inf)
    indices = np.sort(np.argpartition(-index_scores, top_k - 1, axis=-1)[..., :top_k], axis=-1)
    if mask is None:
        return indices, np.ones(indices.shape, dtype=bool)
    mask = np.broadcast_to(mask, index_scores.shape)
    return indices, np.take_along_axis(mask, indices, axis=-1)


def topk_mask(index_scores, top_k: int, mask=None) -> np.ndarray:
    """The dense boolean mask of the keys :func:`topk_indices` selects (and ``mask`` allows).

    Dense attention with this mask equals :func:`topk_sparse_attention` (tested): the
    sparse form only skips the keys this mask blocks.

    Shapes
    ------
    index_scores : (..., Tq, Tk) -> (..., Tq, Tk)

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> topk_mask(np.array([[0.1, 0.9, 0.5, 0.7]]), 2).astype(int)
    array([[0, 1, 0, 1]])
    """
    index_scores, top_k, mask = _check_top_k(index_scores, top_k, mask)
    indices, allowed = _topk_indices(index_scores, top_k, mask)
    selected = np.zeros((*indices.shape[:-1], index_scores.shape[-1]), dtype=bool)
    np.put_along_axis(selected, indices, allowed, axis=-1)
    return selected


def topk_sparse_attention(q, k, v, index_scores, top_k: int, mask=None, *, scale=None):
    """Attention in which each query reads only its ``top_k`` keys by ``index_scores``.

    The keys and values are gathered per query, ``(..., Tq, top_k, d)``, and attention runs
    on those alone: ``top_k`` scores per query instead of ``Tk``. Index scores without a
    head axis select the same keys for every head (as DeepSeek-V3.2 does), and keys with
    one head shared by all (multi-query, or MLA's absorbed cache) are gathered once.

    Parameters
    ----------
    q, k, v : array_like
        Queries, keys and values (heads as leading dimensions).
    index_scores : array_like
        Broadcastable with the scores ``(..., Tq, Tk)``.
    top_k : int
    mask : array_like of bool, optional
        True = may attend, broadcastable to ``index_scores``. A query left with no allowed
        key gets a zero output.
    scale : float, optional
        Defaults to ``1/sqrt(d_k)``.

    Returns
    -------
    output : numpy.ndarray
    weights : numpy.ndarray
        The weight of each selected key (0 where the mask blocks it).
    indices : numpy.ndarray of int
        Which keys were selected.

    Shapes
    ------
    q : (..., Tq, d_k), k : (..., Tk, d_k), v : (..., Tk, d_v), index_scores : (..., Tq, Tk)
    -> output (..., Tq, d_v), weights and indices (..., Tq, min(top_k, Tk))

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*. Equal to dense attention with
    :func:`topk_mask` (tested); with ``top_k >= Tk``, to dense attention.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q, k, v = rng.normal(size=(3, 5, 4))
    >>> output, weights, indices = topk_sparse_attention(q, k, v, q @ k.T, 2)
    >>> output.shape, indices.shape
    ((5, 4), (5, 2))
    """
    q, k, v = _check_qkv(q, k, v, same_length=False, broadcast=False)
    index_scores, top_k, mask = _check_top_k(index_scores, top_k, mask)
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    scores_shape = (*batch, q.shape[-2], k.shape[-2])
    if not _broadcasts(index_scores.shape, scores_shape):
        raise ValueError(f"index_scores of shape {index_scores.shape} do not broadcast with "
                         f"the scores (..., Tq, Tk) = {scores_shape}")
    scale = check_scale(scale, q.shape[-1])
    indices, allowed = _topk_indices(index_scores, top_k, mask)  # (..., Tq, top_k)
    keys, values = (_gather_rows(x, indices) for x in (k, v))
    # keys, values : (..., Tq, top_k, d): only the selected rows, per query
    scores = (q[..., None, :] @ keys.swapaxes(-1, -2))[..., 0, :] * scale  # (..., Tq, top_k)
    scores = np.where(allowed, scores, -np.inf).astype(q.dtype, copy=False)
    with np.errstate(over="ignore"):
        weights = _softmax_in_place(scores, row_max=_row_max(scores, -1))
    output = (weights[..., None, :] @ values)[..., 0, :]  # (..., Tq, d_v)
    return output, weights, np.broadcast_to(indices, weights.shape)


def _gather_rows(x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """x[..., indices[..., i, j], :] for every query i: (..., Tk, d) -> (..., Tq, top_k, d).

    Leading axes broadcast: keys without the index scores' head axis (or with one head for
    all) are gathered once, not once per head."""
    ndim = max(x.ndim - 2, indices.ndim - 2) + 2
    x = x.reshape((1,) * (ndim - x.ndim) + x.shape)
    indices = indices.reshape((1,) * (ndim - indices.ndim) + indices.shape)
    return np.take_along_axis(x[..., None, :, :], indices[..., None], axis=-2)


def _broadcasts(shape, target) -> bool:
    try:
        np.broadcast_shapes(shape, target)
        return True
    except ValueError:
        return False


def sparse_attention_cost(Tq: int, Tk: int, top_k: int, *, num_heads: int, d_qk: int,
                          kv_bytes_per_token: int, index_heads: int = 0, d_index: int = 0,
                          index_bytes_per_token: int = 0, causal: bool = True) -> dict:
    """Count what top-k selection saves: scores computed and cache bytes read, dense vs sparse.

    Queries are the last ``Tq`` of ``Tk`` positions; with ``causal``, query ``i`` may see
    ``n_i = Tk - Tq + i + 1`` keys, else ``Tk``. Dense attention computes ``sum n_i`` scores
    per head and reads ``sum n_i`` cache rows; sparse attention ``sum min(n_i, top_k)`` of
    each, plus the indexer: ``sum n_i`` scores per index head and ``sum n_i`` index keys.
    Bytes read count each query's pass over the cache rows it uses (what decoding reads per
    generated token); a kernel that shares rows between queries reads fewer.

    Parameters
    ----------
    Tq, Tk, top_k : int
    num_heads, d_qk : int
        Heads of the main attention and the width of a query-key dot product.
    kv_bytes_per_token : int
        Bytes of one cache row (MLA in BF16: ``(512 + 64) * 2``).
    index_heads, d_index, index_bytes_per_token : int
        The indexer's heads, width and key bytes per token (0: no indexer counted).
    causal : bool, default True

    Returns
    -------
    dict
        ``dense_scores``, ``sparse_scores``, ``index_scores`` (counts over all heads),
        ``dense_flops``, ``sparse_flops`` (the sparse count includes the indexer's; 2
        flops per multiply-add of a dot product, scores only), ``dense_kv_bytes``,
        ``sparse_kv_bytes`` (the sparse count includes the index keys).

    Notes
    -----
    Derived in chapter 19, *Attention in today's models*.

    Examples
    --------
    >>> cost = sparse_attention_cost(1, 8192, 2048, num_heads=1, d_qk=1, kv_bytes_per_token=1)
    >>> cost["dense_scores"], cost["sparse_scores"]
    (8192, 2048)
    """
    Tq, Tk, top_k = (check_positive_int(value, name) for value, name in
                     ((Tq, "Tq"), (Tk, "Tk"), (top_k, "top_k")))
    for name, value in (("num_heads", num_heads), ("d_qk", d_qk),
                        ("kv_bytes_per_token", kv_bytes_per_token)):
        check_positive_int(value, name)
    for name, value in (("index_heads", index_heads), ("d_index", d_index),
                        ("index_bytes_per_token", index_bytes_per_token)):
        check_positive_int(value, name, allow_zero=True)
    if Tq > Tk:
        raise ValueError(f"Tq={Tq} > Tk={Tk}: the queries are the last Tq of Tk positions")
    visible = Tk - Tq + 1 + np.arange(Tq) if causal else np.full(Tq, Tk)  # n_i
    dense_rows, sparse_rows = int(visible.sum()), int(np.minimum(visible, top_k).sum())
    index_scores = index_heads * dense_rows
    return {
        "dense_scores": num_heads * dense_rows,
        "sparse_scores": num_heads * sparse_rows,
        "index_scores": index_scores,
        "dense_flops": 2 * d_qk * num_heads * dense_rows,
        "sparse_flops": 2 * d_qk * num_heads * sparse_rows + 2 * d_index * index_scores,
        "dense_kv_bytes": kv_bytes_per_token * dense_rows,
        "sparse_kv_bytes": kv_bytes_per_token * sparse_rows + index_bytes_per_token * dense_rows,
    }
