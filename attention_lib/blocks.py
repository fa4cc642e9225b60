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

from ._checks import check_positive_int
from .cache import KVCache
from .layers import FeedForward, LayerNorm
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
    self_attn : MultiHeadAttention
    ff : FeedForward
    norm1 : LayerNorm
        ``norm1`` goes with attention, ``norm2`` with the feed-forward network.
    norm2 : LayerNorm
        ``norm1`` goes with attention, ``norm2`` with the feed-forward network.
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

    Examples
    --------
    >>> block = EncoderBlock.init(16, 4, 64, np.random.default_rng(0))
    >>> block(np.ones((2, 5, 16))).shape
    (2, 5, 16)
    """

    self_attn: MultiHeadAttention
    ff: FeedForward
    norm1: LayerNorm
    norm2: LayerNorm
    norm_first: bool = False

    @classmethod
    def init(cls, d_model: int, num_heads: int, d_ff: int, rng: np.random.Generator, *,
             activation: str = "relu", norm_first: bool = False, eps: float = 1e-5,
             dtype=np.float64, num_kv_heads: int | None = None) -> EncoderBlock:
        """Random weights; ``num_kv_heads`` below ``num_heads`` gives grouped-query attention."""
        return cls(
            self_attn=MultiHeadAttention.init(d_model, num_heads, rng, dtype=dtype,
                                              num_kv_heads=num_kv_heads),
            ff=FeedForward.init(d_model, d_ff, rng, activation=activation, dtype=dtype),
            norm1=LayerNorm.init(d_model, eps, dtype),
            norm2=LayerNorm.init(d_model, eps, dtype),
            norm_first=norm_first,
        )

    def __call__(self, x, mask=None, cache=None) -> np.ndarray:
        if self.norm_first:
            x = x + self.self_attn(self.norm1(x), mask=mask, cache=cache)[0]
            return x + self.ff(self.norm2(x))
        x = self.norm1(x + self.self_attn(x, mask=mask, cache=cache)[0])
        return self.norm2(x + self.ff(x))


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
        if self.norm_first:
            x = x + self.self_attn(self.norm1(x), mask=self_mask, cache=cache)[0]
            x = x + self.cross_attn(self.norm2(x), context=memory, mask=memory_mask)[0]
            return x + self.ff(self.norm3(x))
        x = self.norm1(x + self.self_attn(x, mask=self_mask, cache=cache)[0])
        x = self.norm2(x + self.cross_attn(x, context=memory, mask=memory_mask)[0])
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
        for layer in self.layers:
            x = layer(x, mask=mask)
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
        for layer in self.layers:
            x = layer(x, memory, self_mask=self_mask, memory_mask=memory_mask)
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
    tokens = np.asarray(tokens)
    embedding = np.asarray(embedding)
    if embedding.ndim != 2:
        raise ValueError(f"embedding must be 2-d (V, d_model); got shape {embedding.shape}")
    if not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"tokens must be integer ids; got dtype {tokens.dtype}")
    if tokens.ndim < 1 or tokens.shape[-1] < 1:
        raise ValueError(f"tokens must have shape (..., T) with T >= 1; got {tokens.shape}")
    vocab_size, d_model = embedding.shape
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"tokens must be ids in [0, {vocab_size}); got min {tokens.min()}, "
                         f"max {tokens.max()}")
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
    Derived in chapter 10, *KV cache and decoding*.

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

    def __call__(self, tokens, cache: KVCache | None = None) -> np.ndarray:
        tokens = np.asarray(tokens)
        start = 0 if cache is None else cache.length
        T = tokens.shape[-1]
        x = embed_tokens(self.embedding, tokens, start=start)  # (..., T, d_model)
        mask = causal_mask(T, start + T)  # the new queries see every earlier position
        for index, block in enumerate(self.blocks):
            x = block(x, mask=mask, cache=None if cache is None else cache.layer(index))
        return self.norm(x) @ self.W_out  # (..., T, V)
