"""Transformer blocks and whole models built from them (chapters 08-10).

An encoder block is self-attention then a feed-forward network, each wrapped in a
residual connection and a LayerNorm; a decoder block adds cross-attention over the
encoder's output in between. ``norm_first=False`` is the 2017 paper's post-LN
(``x = norm(x + sublayer(x))``); ``norm_first=True`` is pre-LN
(``x = x + sublayer(norm(x))``), what GPT-2 and most later models use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, is_dataclass

import numpy as np

from ._checks import as_float_array, check_positive_int, check_token_ids
from .cache import KVCache
from .hooks import unhooked
from .layers import FeedForward, LayerNorm, _check_features
from .masks import causal_mask, padding_mask
from .multihead import MultiHeadAttention
from .positional import sinusoidal_encoding

__all__ = ["EncoderBlock", "DecoderBlock", "Encoder", "Decoder", "EncoderDecoder",
           "DecoderOnlyLM", "embed_tokens", "count_parameters"]


def count_parameters(*layers) -> int:
    """Total number of entries of every array held by the given layers and their sublayers.

    Walks the fields of each dataclass (attention layers, norms, feed-forward networks,
    blocks, stacks, whole models), into nested dataclasses and lists of them, and adds up
    the sizes of the NumPy arrays it finds. An array held in two places counts once, like
    PyTorch's ``parameters()``, only when the second is the same array object or a view of
    all its entries with the axes reordered, such as its transpose (tied embeddings,
    ``W_out = embedding.T`` as in GPT-2 and SmolLM2). Any other view counts again, even
    though it shares memory: ``W`` and ``W[:5]`` count ``W.size + W[:5].size``.

    Parameters
    ----------
    *layers : dataclass instances, NumPy arrays, or lists of them

    Returns
    -------
    int

    Notes
    -----
    Derived in chapter 08, *The transformer block*; used again in chapter 09.

    Examples
    --------
    >>> count_parameters(LayerNorm.init(8))  # gamma and beta
    16
    >>> norm = LayerNorm.init(8)
    >>> count_parameters(norm, norm)  # the same arrays, counted once
    16
    >>> W = np.zeros((10, 4))
    >>> count_parameters(W, W.T)  # a transposed view: counted once
    40
    >>> count_parameters(W, W[:5])  # a slice is counted again
    60
    """
    seen = set()

    def walk(layer) -> int:
        if isinstance(layer, np.ndarray):
            # The same entries, whatever the order of the axes: the same object, or a view
            # such as its transpose, has the same address, dtype and (length, stride) pairs.
            key = (layer.__array_interface__["data"][0], layer.dtype.str,
                   tuple(sorted(zip(layer.shape, layer.strides))))
            if key in seen:
                return 0
            seen.add(key)
            return layer.size
        if isinstance(layer, (list, tuple)):
            return sum(walk(item) for item in layer)
        if is_dataclass(layer) and not isinstance(layer, type):
            return sum(walk(getattr(layer, f.name)) for f in fields(layer))
        if is_dataclass(layer) or not isinstance(layer, (int, float, str, bool, type(None),
                                                         np.generic)):
            raise TypeError(f"count_parameters takes layers (dataclasses) or arrays; got "
                            f"{type(layer).__name__}")
        return 0

    return walk(list(layers))


@dataclass
class EncoderBlock:
    """Self-attention and a feed-forward network, each with a residual connection and a norm.

    Attributes
    ----------
    self_attn : MultiHeadAttention or None
        None: no attention sub-layer, so each position goes through the feed-forward network
        on its own (chapter 12's model without attention, made by ``init(attention=False)``).
    ff : FeedForward
    norm1 : LayerNorm or None
        ``norm1`` goes with attention (None without it), ``norm2`` with the feed-forward
        network.
    norm2 : LayerNorm
        ``norm1`` goes with attention (None without it), ``norm2`` with the feed-forward
        network.
    norm_first : bool, default False
        False: post-LN, ``x = norm1(x + attn(x)); x = norm2(x + ff(x))`` (the 2017 paper).
        True: pre-LN, ``x = x + attn(norm1(x)); x = x + ff(norm2(x))``.

    Shapes
    ------
    x : (..., T, d_model), mask : broadcastable to (..., T, T) -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 08, *The transformer block*. Equal to
    ``torch.nn.TransformerEncoderLayer`` (``batch_first=True``, dropout 0), tested for both
    ``norm_first`` settings. With ``cache`` and a causal mask it is a GPT block (chapter 10).
    Its forward pass has the hook points ``resid_pre``, ``attn_out``, ``resid_mid``,
    ``ff_out`` and ``resid_post``, each ``(..., T, d_model)``, which
    :func:`~attention_lib.hooks.capture` records and :func:`~attention_lib.hooks.intervene`
    changes (chapter 18); with nothing installed each is one call that returns its value.

    Examples
    --------
    >>> block = EncoderBlock.init(16, 4, 64, np.random.default_rng(0))
    >>> block(np.ones((2, 5, 16))).shape
    (2, 5, 16)
    """

    self_attn: MultiHeadAttention | None
    ff: FeedForward
    norm1: LayerNorm | None
    norm2: LayerNorm
    norm_first: bool = False
    # Not a field: the hook points' functions, set only while attention_lib.hooks.capture()
    # or intervene() is active (chapter 18).
    _hooks = None

    def __post_init__(self):
        if (self.self_attn is None) != (self.norm1 is None):
            raise ValueError("self_attn and norm1 go together: both None (no attention "
                             "sub-layer) or neither")

    @classmethod
    def init(cls, d_model: int, num_heads: int, d_ff: int, rng: np.random.Generator, *,
             activation: str = "relu", norm_first: bool = False, eps: float = 1e-5,
             dtype=np.float64, num_kv_heads: int | None = None,
             attention: bool = True) -> EncoderBlock:
        """Random weights; ``num_kv_heads`` below ``num_heads`` gives grouped-query attention,
        ``attention=False`` a block without its attention sub-layer."""
        # Drawn even when dropped, so that with or without attention the feed-forward weights
        # are the same draws: a comparison of the two changes one thing only.
        self_attn = MultiHeadAttention.init(d_model, num_heads, rng, dtype=dtype,
                                            num_kv_heads=num_kv_heads)
        return cls(
            self_attn=self_attn if attention else None,
            ff=FeedForward.init(d_model, d_ff, rng, activation=activation, dtype=dtype),
            norm1=LayerNorm.init(d_model, eps, dtype) if attention else None,
            norm2=LayerNorm.init(d_model, eps, dtype),
            norm_first=norm_first,
        )

    def __call__(self, x, mask=None, cache=None, *, return_weights: bool = False):
        """The block's output, and with ``return_weights=True`` also its attention weights
        ``(..., H, T, T)``. Without them the attention never stores its weights whole."""
        if self.self_attn is None:  # no attention: only x to check, nothing to attend with
            if cache is not None:
                raise ValueError("a block without attention has no keys and values to cache; "
                                 "pass cache=None")
            x = as_float_array(x, "x", min_ndim=2)
            _check_features(x, self.ff.W1.shape[0], "EncoderBlock")
        else:
            x, _, mask = self.self_attn.check_inputs(x, None, mask, cache)
        return self.forward(x, mask, cache, return_weights=return_weights)

    def forward(self, x, mask=None, cache=None, *, return_weights: bool = False):
        """``__call__`` on checked inputs (a stack checks once, then calls this).

        Each ``at(point, value)`` line is a hook point (:mod:`attention_lib.hooks`, chapter
        18): it returns ``value`` unchanged unless :func:`~attention_lib.hooks.capture` or
        :func:`~attention_lib.hooks.intervene` installed something there.
        """
        at = unhooked if self._hooks is None else self._hooks  # at(point, value) -> value
        x = at("resid_pre", x)  # hook point: the residual stream entering the block
        if self.self_attn is None:  # the feed-forward sub-layer alone; no weights to return
            if self.norm_first:
                x = x + at("ff_out", self.ff(self.norm2(x)))  # hook point: what the FFN adds
            else:
                x = self.norm2(x + at("ff_out", self.ff(x)))
            x = at("resid_post", x)  # hook point: the stream leaving the block
            return (x, None) if return_weights else x
        attend = self.self_attn.forward
        if self.norm_first:
            attended, weights = attend(self.norm1(x), mask=mask, cache=cache,
                                       need_weights=return_weights)
            x = x + at("attn_out", attended)  # hook point: what attention adds
            x = at("resid_mid", x)  # hook point: the stream between the sub-layers
            x = x + at("ff_out", self.ff(self.norm2(x)))  # hook point: what the FFN adds
        else:
            attended, weights = attend(x, mask=mask, cache=cache, need_weights=return_weights)
            x = self.norm1(x + at("attn_out", attended))  # hook point: what attention adds
            x = at("resid_mid", x)  # hook point: the (normalized) stream between sub-layers
            x = self.norm2(x + at("ff_out", self.ff(x)))  # hook point: what the FFN adds
        x = at("resid_post", x)  # hook point: the stream leaving the block
        return (x, weights) if return_weights else x


@dataclass
class DecoderBlock:
    """Causal self-attention, cross-attention over the encoder's output, a feed-forward net.

    Attributes
    ----------
    self_attn : MultiHeadAttention
    cross_attn : MultiHeadAttention
    ff : FeedForward
    norm1 : LayerNorm
        For self-attention, cross-attention and the feed-forward network.
    norm2 : LayerNorm
        For self-attention, cross-attention and the feed-forward network.
    norm3 : LayerNorm
        For self-attention, cross-attention and the feed-forward network.
    norm_first : bool, default False
        Post-LN (False, the 2017 paper) or pre-LN (True), as in :class:`EncoderBlock`.

    Shapes
    ------
    x : (..., T, d_model), memory : (..., S, d_model), self_mask : broadcastable to
    (..., T, T), memory_mask : broadcastable to (..., T, S) -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 09, *Decoder and cross-attention*. Equal to
    ``torch.nn.TransformerDecoderLayer`` (``batch_first=True``, dropout 0), tested.

    Examples
    --------
    >>> block = DecoderBlock.init(16, 4, 64, np.random.default_rng(0))
    >>> block(np.ones((2, 5, 16)), memory=np.ones((2, 7, 16))).shape
    (2, 5, 16)
    """

    self_attn: MultiHeadAttention
    cross_attn: MultiHeadAttention
    ff: FeedForward
    norm1: LayerNorm
    norm2: LayerNorm
    norm3: LayerNorm
    norm_first: bool = False

    @classmethod
    def init(cls, d_model: int, num_heads: int, d_ff: int, rng: np.random.Generator, *,
             activation: str = "relu", norm_first: bool = False, eps: float = 1e-5,
             dtype=np.float64) -> DecoderBlock:
        return cls(
            self_attn=MultiHeadAttention.init(d_model, num_heads, rng, dtype=dtype),
            cross_attn=MultiHeadAttention.init(d_model, num_heads, rng, dtype=dtype),
            ff=FeedForward.init(d_model, d_ff, rng, activation=activation, dtype=dtype),
            norm1=LayerNorm.init(d_model, eps, dtype),
            norm2=LayerNorm.init(d_model, eps, dtype),
            norm3=LayerNorm.init(d_model, eps, dtype),
            norm_first=norm_first,
        )

    def __call__(self, x, memory, self_mask=None, memory_mask=None, cache=None) -> np.ndarray:
        x, _, self_mask = self.self_attn.check_inputs(x, None, self_mask, cache)
        x, memory, memory_mask = self.cross_attn.check_inputs(x, memory, memory_mask)
        return self.forward(x, memory, self_mask, memory_mask, cache)

    def forward(self, x, memory, self_mask=None, memory_mask=None, cache=None) -> np.ndarray:
        """``__call__`` on checked inputs (a stack checks once, then calls this)."""
        def self_attend(x):
            return self.self_attn.forward(x, mask=self_mask, cache=cache, need_weights=False)[0]

        def cross_attend(x):
            return self.cross_attn.forward(x, memory, memory_mask, need_weights=False)[0]

        if self.norm_first:
            x = x + self_attend(self.norm1(x))
            x = x + cross_attend(self.norm2(x))
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + self_attend(x))
        x = self.norm2(x + cross_attend(x))
        return self.norm3(x + self.ff(x))


@dataclass
class Encoder:
    """A stack of :class:`EncoderBlock` s, with an optional final norm (needed for pre-LN).

    Shapes
    ------
    x : (..., S, d_model), mask : broadcastable to (..., S, S) -> (..., S, d_model)

    Notes
    -----
    Derived in chapter 09, *Decoder and cross-attention*.
    """

    layers: list[EncoderBlock]
    norm: LayerNorm | None = None

    def __call__(self, x, mask=None) -> np.ndarray:
        x, _, mask = self.layers[0].self_attn.check_inputs(x, None, mask)
        for layer in self.layers:
            x = layer.forward(x, mask=mask)
        return x if self.norm is None else self.norm(x)


@dataclass
class Decoder:
    """A stack of :class:`DecoderBlock` s, with an optional final norm (needed for pre-LN).

    Shapes
    ------
    x : (..., T, d_model), memory : (..., S, d_model) -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 09, *Decoder and cross-attention*.
    """

    layers: list[DecoderBlock]
    norm: LayerNorm | None = None

    def __call__(self, x, memory, self_mask=None, memory_mask=None) -> np.ndarray:
        first = self.layers[0]
        x, _, self_mask = first.self_attn.check_inputs(x, None, self_mask)
        x, memory, memory_mask = first.cross_attn.check_inputs(x, memory, memory_mask)
        for layer in self.layers:
            x = layer.forward(x, memory, self_mask=self_mask, memory_mask=memory_mask)
        return x if self.norm is None else self.norm(x)


def embed_tokens(embedding: np.ndarray, tokens, start: int = 0) -> np.ndarray:
    """Look up token vectors, scale them by ``sqrt(d_model)`` and add sinusoidal positions.

    The scaling is the paper's (section 3.4, which gives no reason for it). With the
    library's initialization (entries of size ``1/sqrt(d_model)``) it brings the token
    vectors' entries to size about 1, comparable to the positions' (RMS ``1/sqrt(2)``).
    ``start`` is the position of the first token (the cache length when decoding). An
    empty batch (``tokens`` of shape ``(0, T)``) gives an empty ``(0, T, d_model)`` array,
    as the library's layers do.

    Shapes
    ------
    embedding : (V, d_model), tokens : (..., T) int -> (..., T, d_model)

    Notes
    -----
    Derived in chapter 09, *Decoder and cross-attention*.
    """
    embedding = np.asarray(embedding)
    if embedding.ndim != 2:
        raise ValueError(f"embedding must be 2-d (V, d_model); got shape {embedding.shape}")
    vocab_size, d_model = embedding.shape
    tokens = check_token_ids(tokens, vocab_size)
    T = tokens.shape[-1]
    positions = sinusoidal_encoding(T, d_model, start=start).astype(embedding.dtype)
    return embedding[tokens] * math.sqrt(d_model) + positions  # (..., T, d_model)


def _init_embedding(vocab_size: int, d_model: int, rng, dtype) -> np.ndarray:
    vocab_size = check_positive_int(vocab_size, "vocab_size")
    return (rng.standard_normal((vocab_size, d_model)) / math.sqrt(d_model)).astype(dtype)


@dataclass
class EncoderDecoder:
    """The full encoder-decoder transformer of "Attention Is All You Need".

    ``logits = Decoder(embed(target), Encoder(embed(source))) @ W_out``, with sinusoidal
    positions, padding masks for the source, and a causal mask for the target.

    Attributes
    ----------
    src_embedding : numpy.ndarray
        ``(V_src, d_model)``.
    tgt_embedding : numpy.ndarray
        ``(V_tgt, d_model)``.
    encoder : Encoder
    decoder : Decoder
    W_out : numpy.ndarray
        ``(d_model, V_tgt)``: turns each decoder output into one logit per target token.

    Shapes
    ------
    source : (B, S) int, target : (B, T) int, source_lengths : (B,) -> logits (B, T, V_tgt)

    Notes
    -----
    Derived in chapter 09, *Decoder and cross-attention*.

    Examples
    --------
    >>> model = EncoderDecoder.init(11, 13, 16, 4, 32, 2, np.random.default_rng(0))
    >>> model(np.zeros((2, 5), dtype=int), np.zeros((2, 3), dtype=int)).shape
    (2, 3, 13)
    """

    src_embedding: np.ndarray
    tgt_embedding: np.ndarray
    encoder: Encoder
    decoder: Decoder
    W_out: np.ndarray

    @classmethod
    def init(cls, src_vocab_size: int, tgt_vocab_size: int, d_model: int, num_heads: int,
             d_ff: int, num_layers: int, rng: np.random.Generator, *,
             activation: str = "relu", norm_first: bool = False,
             dtype=np.float64) -> EncoderDecoder:
        num_layers = check_positive_int(num_layers, "num_layers")
        options = {"activation": activation, "norm_first": norm_first, "dtype": dtype}
        final_norm = (lambda: LayerNorm.init(d_model, dtype=dtype)) if norm_first else None
        return cls(
            src_embedding=_init_embedding(src_vocab_size, d_model, rng, dtype),
            tgt_embedding=_init_embedding(tgt_vocab_size, d_model, rng, dtype),
            encoder=Encoder([EncoderBlock.init(d_model, num_heads, d_ff, rng, **options)
                             for _ in range(num_layers)], final_norm and final_norm()),
            decoder=Decoder([DecoderBlock.init(d_model, num_heads, d_ff, rng, **options)
                             for _ in range(num_layers)], final_norm and final_norm()),
            W_out=(rng.standard_normal((d_model, tgt_vocab_size)) / math.sqrt(d_model)
                   ).astype(dtype),
        )

    def encode(self, source, source_lengths=None) -> tuple[np.ndarray, np.ndarray | None]:
        """Run the encoder; return the memory ``(B, S, d_model)`` and its key mask."""
        source = np.asarray(source)
        mask = None if source_lengths is None else padding_mask(source_lengths, source.shape[-1])
        return self.encoder(embed_tokens(self.src_embedding, source), mask=mask), mask

    def decode(self, target, memory, memory_mask=None) -> np.ndarray:
        """Run the decoder on ``target`` given the encoder's ``memory``; return logits."""
        target = np.asarray(target)
        hidden = self.decoder(embed_tokens(self.tgt_embedding, target), memory,
                              self_mask=causal_mask(target.shape[-1]), memory_mask=memory_mask)
        return hidden @ self.W_out  # (B, T, V_tgt)

    def __call__(self, source, target, source_lengths=None) -> np.ndarray:
        memory, memory_mask = self.encode(source, source_lengths)
        return self.decode(target, memory, memory_mask)


@dataclass
class DecoderOnlyLM:
    """A GPT-style language model: embeddings, causal pre-LN blocks, a final norm, logits.

    Each block is an :class:`EncoderBlock` used with a causal mask (a decoder block
    without cross-attention). Pass a :class:`~attention_lib.cache.KVCache` from
    :meth:`new_cache` to decode one token at a time without recomputing the past.

    Attributes
    ----------
    embedding : numpy.ndarray
        ``(V, d_model)``.
    blocks : list of EncoderBlock
    norm : LayerNorm
        The final norm (pre-LN stacks need one).
    W_out : numpy.ndarray
        ``(d_model, V)``.

    Shapes
    ------
    tokens : (..., T) int -> logits (..., T, V)

    Notes
    -----
    Derived in chapter 10, *KV cache and decoding*. What a forward pass computes inside its
    blocks (residual stream, each head's output, attention weights) is read with
    :func:`~attention_lib.hooks.capture` and changed with
    :func:`~attention_lib.hooks.intervene` (chapter 18), by the names
    :func:`~attention_lib.hooks.hook_points` lists.

    Examples
    --------
    >>> model = DecoderOnlyLM.init(20, 16, 4, 32, 2, np.random.default_rng(0))
    >>> model(np.array([[1, 2, 3]])).shape
    (1, 3, 20)
    """

    embedding: np.ndarray
    blocks: list[EncoderBlock]
    norm: LayerNorm
    W_out: np.ndarray
    num_heads: int = field(init=False)

    def __post_init__(self):
        self.num_heads = self.blocks[0].self_attn.num_heads

    @classmethod
    def init(cls, vocab_size: int, d_model: int, num_heads: int, d_ff: int, num_layers: int,
             rng: np.random.Generator, *, activation: str = "gelu",
             dtype=np.float64, num_kv_heads: int | None = None) -> DecoderOnlyLM:
        """Random weights; ``num_kv_heads`` below ``num_heads`` gives grouped-query attention."""
        num_layers = check_positive_int(num_layers, "num_layers")
        return cls(
            embedding=_init_embedding(vocab_size, d_model, rng, dtype),
            blocks=[EncoderBlock.init(d_model, num_heads, d_ff, rng, activation=activation,
                                      norm_first=True, dtype=dtype, num_kv_heads=num_kv_heads)
                    for _ in range(num_layers)],
            norm=LayerNorm.init(d_model, dtype=dtype),
            W_out=(rng.standard_normal((d_model, vocab_size)) / math.sqrt(d_model)
                   ).astype(dtype),
        )

    def new_cache(self, batch_shape=(), capacity: int = 512) -> KVCache:
        """An empty cache with room for ``capacity`` positions of every layer."""
        d_model = self.embedding.shape[1]
        # Only the key/value heads are cached (fewer than num_heads with grouped queries).
        return KVCache.init(len(self.blocks), self.blocks[0].self_attn.num_kv_heads, capacity,
                            d_model // self.num_heads, tuple(batch_shape),
                            dtype=self.embedding.dtype)

    def embed(self, tokens, start: int = 0) -> np.ndarray:
        """Token vectors with their positions added (:func:`embed_tokens`); ``start`` is the
        position of the first token. A model with RoPE adds none here (SmolLM2)."""
        return embed_tokens(self.embedding, tokens, start=start)

    def forward(self, tokens, cache: KVCache | None = None, *, return_attention: bool = False):
        """Logits for every position; with ``return_attention``, also every layer's weights.

        With ``cache``, ``tokens`` are the new positions only: their keys and values are
        appended to the cache and they attend to everything cached before them.

        Returns
        -------
        logits : numpy.ndarray
            ``(..., T, V)``.
        attention : numpy.ndarray, only if ``return_attention``
            ``(num_layers, ..., H, T, T_total)`` where ``T_total`` counts cached positions.
        """
        tokens = check_token_ids(tokens, self.embedding.shape[0])
        start = 0 if cache is None else cache.length
        T = tokens.shape[-1]
        x = self.embed(tokens, start)  # (..., T, d_model)
        mask = causal_mask(T, start + T)  # the new queries see every earlier position
        attention = []
        for index, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layer(index)
            if return_attention:
                x, weights = block.forward(x, mask, layer_cache, return_weights=True)
                attention.append(weights)  # (..., H, T, T_total)
            else:
                x = block.forward(x, mask, layer_cache)
        logits = self.norm(x) @ self.W_out  # (..., T, V)
        return (logits, np.stack(attention)) if return_attention else logits

    def __call__(self, tokens, cache: KVCache | None = None) -> np.ndarray:
        """``model(tokens, cache=None) -> logits (..., T, V)``, as ``greedy_decode`` wants."""
        return self.forward(tokens, cache)
