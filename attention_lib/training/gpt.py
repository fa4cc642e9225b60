"""A character-level GPT, its hand-written backward pass, and Tiny Shakespeare (chapter 14).

The model is GPT-2's decoder-only, pre-LN transformer (as nanoGPT writes it, but with a read-out
not tied to the token embedding) made of the library's parts:
token embeddings plus learned position vectors, a stack of ``EncoderBlock`` s used with a
causal mask (GPT-2's block: ``x = x + attn(norm1(x))``, ``x = x + ff(norm2(x))``, GELU),
a final ``LayerNorm`` and a linear read-out to one logit per character. Dropout goes on the
embeddings and on each sub-layer's output before it joins the residual stream.

Two forward passes agree: :meth:`GPT.forward` runs the library's layers as they are (for
sampling and evaluation); :func:`gpt_forward` runs the functional passes of
:mod:`attention_lib.training.functional` and keeps what :func:`gpt_backward` needs.

Checkpoint format (:func:`save_gpt`, :func:`load_gpt`): one ``.npz`` file holding every
parameter under its dotted name (``"blocks.0.self_attn.W_q"``, as ``training.named_parameters``
names them), plus ``"config"`` (a JSON string: ``vocab_size``, ``context_len``, ``d_model``,
``num_heads``, ``d_ff``, ``num_layers``, ``dropout``, and ``activation`` when it is not the
default ``"gelu"``) and ``"vocabulary"`` (the characters, in id order). Its sha256 is pinned
in :data:`SHAKESPEARE_GPT_SHA256` and checked at load.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import erf

from .._checks import check_positive_int
from ..blocks import EncoderBlock
from ..cache import KVCache
from ..layers import LayerNorm
from ..masks import causal_mask
from .functional import (
    cross_entropy_backward,
    cross_entropy_forward,
    dropout_backward,
    dropout_forward,
    embedding_backward,
    embedding_forward,
    encoder_block_backward,
    encoder_block_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)
from .models import named_parameters

__all__ = [
    "CharCodec",
    "GPT",
    "SHAKESPEARE_SHA256",
    "SHAKESPEARE_GPT_SHA256",
    "evaluate_loss",
    "gpt_backward",
    "gpt_forward",
    "gpt_loss_and_grads",
    "induction_probe",
    "load_gpt",
    "load_shakespeare_gpt",
    "load_shakespeare_text",
    "random_windows",
    "repeated_random_sequences",
    "repeated_snippets",
    "save_gpt",
    "sliding_window_losses",
    "token_losses",
    "train_val_split",
    "window_losses",
]

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
"""Where the package keeps the corpus, the trained checkpoint and its training log."""

SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
"""sha256 of ``tinyshakespeare.txt`` (Karpathy's char-rnn ``data/tinyshakespeare/input.txt``)."""

SHAKESPEARE_GPT_SHA256 = "ee891c9da90ae37f987ca221f32d2730caa6d0ee268f8852a154c004d93b2b86"
"""sha256 of the committed checkpoint ``shakespeare_gpt.npz``."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _verified(path, expected: str, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {path}")
    actual = _sha256(path)
    if actual != expected:
        raise ValueError(f"{what} at {path} has sha256 {actual}, expected {expected}: the file "
                         "is damaged or not the one this library was written for")
    return path


# ---------------------------------------------------------------------------------------------
# Data: the corpus, its characters, the split, the mini-batches
# ---------------------------------------------------------------------------------------------

def load_shakespeare_text(path=None) -> str:
    """The Tiny Shakespeare corpus as one string, after checking its sha256.

    Parameters
    ----------
    path : str or Path, optional
        Defaults to the copy inside the package (``attention_lib/data/tinyshakespeare.txt``).

    Raises
    ------
    FileNotFoundError, ValueError
        If the file is missing or its sha256 is not :data:`SHAKESPEARE_SHA256`.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    path = _verified(DATA_DIR / "tinyshakespeare.txt" if path is None else path,
                     SHAKESPEARE_SHA256, "tinyshakespeare.txt")
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class CharCodec:
    """Characters to integer ids and back: id ``i`` is ``chars[i]``.

    Attributes
    ----------
    chars : str
        The vocabulary, each character once, in id order.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*. There is no ``<unk>`` token: text
    with a character outside the vocabulary raises a ``ValueError`` that names it.

    Examples
    --------
    >>> codec = CharCodec.from_text("hello")
    >>> codec.chars, codec.encode("hole"), codec.decode([3, 1])
    ('ehlo', array([1, 3, 2, 0]), 'oh')
    """

    chars: str

    def __post_init__(self):
        if not isinstance(self.chars, str) or len(set(self.chars)) != len(self.chars):
            raise ValueError(f"chars must be a string of distinct characters; got {self.chars!r}")

    @classmethod
    def from_text(cls, text: str) -> CharCodec:
        """The codec of every distinct character of ``text``, sorted by code point."""
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """``(len(text),)`` int64 ids. Raises ``ValueError`` naming the first unknown character."""
        lookup = {char: index for index, char in enumerate(self.chars)}
        try:
            return np.array([lookup[char] for char in text], dtype=np.int64)
        except KeyError as error:
            char = error.args[0]
            raise ValueError(f"character {char!r} (U+{ord(char):04X}) at position "
                             f"{text.index(char)} is not in the vocabulary of "
                             f"{self.vocab_size} characters") from None

    def decode(self, ids) -> str:
        """The text of a 1-d sequence of ids."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a 1-d integer array; got shape {ids.shape}, dtype "
                             f"{ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"ids must lie in [0, {self.vocab_size}); got min {ids.min()}, "
                             f"max {ids.max()}")
        return "".join(self.chars[i] for i in ids)


def train_val_split(ids, train_fraction: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    """The first ``int(n * train_fraction)`` ids train, the rest validate (nanoGPT's cut).

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.

    Examples
    --------
    >>> train, val = train_val_split(np.arange(10))
    >>> train.size, val.tolist()
    (9, [9])
    """
    ids = np.asarray(ids)
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must lie in (0, 1); got {train_fraction!r}")
    cut = int(len(ids) * train_fraction)
    return ids[:cut], ids[cut:]


def random_windows(data, batch_size: int, context_len: int,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``batch_size`` windows at random starts: inputs and the same windows shifted by one.

    ``targets[b, t] = data[start_b + t + 1]``: at every position the model predicts the next
    character, so one window of ``context_len`` characters gives ``context_len`` examples.

    Shapes
    ------
    data : (N,) int -> inputs (batch_size, context_len), targets (batch_size, context_len)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    data = np.asarray(data)
    batch_size = check_positive_int(batch_size, "batch_size")
    context_len = check_positive_int(context_len, "context_len")
    if data.ndim != 1 or data.size <= context_len:
        raise ValueError(f"data must be 1-d and longer than context_len={context_len}; got "
                         f"shape {data.shape}")
    starts = rng.integers(0, data.size - context_len, size=batch_size)
    offsets = starts[:, None] + np.arange(context_len)  # (B, T)
    return data[offsets], data[offsets + 1]


# ---------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------

@dataclass
class GPT:
    """A decoder-only, pre-LN transformer language model (GPT-2's layout, untied read-out).

    ``x = dropout(embedding[ids] + positions[:T])``, then each block with a causal mask,
    then ``logits = norm(x) @ W_out``.

    Attributes
    ----------
    embedding : numpy.ndarray
        ``(V, d_model)`` token vectors.
    positions : numpy.ndarray
        ``(context_len, d_model)`` learned position vectors; ``context_len`` is the longest
        input the model accepts.
    blocks : list of EncoderBlock
        Pre-LN blocks (``norm_first=True``) with GELU feed-forward networks.
    norm : LayerNorm
        The final norm.
    W_out : numpy.ndarray
        ``(d_model, V)``: the read-out to one logit per token (no bias). Its own matrix:
        GPT-2 and nanoGPT instead reuse ``embedding.T`` (weight tying).
    dropout : float, default 0.0
        Dropout probability during training (:func:`gpt_forward` with an ``rng``).

    Shapes
    ------
    ids : (B, T) int with T <= context_len -> logits (B, T, V)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.

    Examples
    --------
    >>> model = GPT.init(65, 16, 32, 4, 2, np.random.default_rng(0))
    >>> model.forward(np.zeros((2, 5), dtype=int)).shape
    (2, 5, 65)
    """

    embedding: np.ndarray
    positions: np.ndarray
    blocks: list[EncoderBlock]
    norm: LayerNorm
    W_out: np.ndarray
    dropout: float = 0.0

    @classmethod
    def init(cls, vocab_size: int, context_len: int, d_model: int, num_heads: int,
             num_layers: int, rng: np.random.Generator, *, d_ff: int | None = None,
             dropout: float = 0.0, activation: str = "gelu", dtype=np.float32) -> GPT:
        """Random weights as nanoGPT's ``model.py`` draws them.

        Every weight matrix and embedding has normal entries of standard deviation 0.02;
        the two matrices that write into the residual stream in each block (``W_o`` and
        ``ff.W2``) get ``0.02 / sqrt(2 num_layers)``, so the stream's variance does not grow
        with depth. That formula is nanoGPT's; the idea, scaling the weights of residual
        layers by ``1 / sqrt(N)`` for ``N`` residual layers, is the GPT-2 paper's (OpenAI's
        released GPT-2 code has no such scaling). Biases start at 0 and norms at the
        identity. ``d_ff`` defaults to ``4 d_model``.

        ``activation`` is ``"gelu"`` (the exact ``x Phi(x)``, through ``erf``) or
        ``"gelu_tanh"``, the tanh approximation of Hendrycks and Gimpel (2016) that GPT-2's
        code uses (``gelu`` in openai/gpt-2's ``src/model.py``). The two differ by at most
        4.7e-4, at ``|x|`` near 2.7, and their derivatives by at most 8.7e-4 (measured on a
        grid of ``[-10, 10]``). The weights are drawn the same way for both, so the same
        ``rng`` gives the same initial model.
        """
        if activation not in ("gelu", "gelu_tanh"):
            raise ValueError(f"activation must be 'gelu' or 'gelu_tanh'; got {activation!r}")
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        context_len = check_positive_int(context_len, "context_len")
        num_layers = check_positive_int(num_layers, "num_layers")
        d_ff = 4 * d_model if d_ff is None else d_ff
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1); got {dropout!r}")
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * num_layers)

        def normal(*shape, scale=std):
            return (rng.standard_normal(shape) * scale).astype(dtype)

        blocks = []
        for _ in range(num_layers):
            block = EncoderBlock.init(d_model, num_heads, d_ff, rng, activation=activation,
                                      norm_first=True, dtype=dtype)
            attn, ff = block.self_attn, block.ff
            attn.W_q, attn.W_k, attn.W_v = (normal(d_model, d_model) for _ in range(3))
            attn.W_o = normal(d_model, d_model, scale=residual_std)
            ff.W1, ff.W2 = normal(d_model, d_ff), normal(d_ff, d_model, scale=residual_std)
            blocks.append(block)
        return cls(embedding=normal(vocab_size, d_model), positions=normal(context_len, d_model),
                   blocks=blocks, norm=LayerNorm.init(d_model, dtype=dtype),
                   W_out=normal(d_model, vocab_size), dropout=float(dropout))

    @property
    def context_len(self) -> int:
        return self.positions.shape[0]

    @property
    def vocab_size(self) -> int:
        return self.embedding.shape[0]

    @property
    def activation(self) -> str:
        """The feed-forward networks' activation, ``"gelu"`` or ``"gelu_tanh"``."""
        return self.blocks[0].ff.activation

    def config(self) -> dict:
        """The sizes that, with the parameters, define the model (stored in checkpoints).

        ``"activation"`` is included only when it is not the default ``"gelu"``, so a model
        of the default kind writes the same config (and checkpoint bytes) as before the
        option existed.
        """
        attn = self.blocks[0].self_attn
        config = {"vocab_size": self.vocab_size, "context_len": self.context_len,
                  "d_model": self.embedding.shape[1], "num_heads": attn.num_heads,
                  "d_ff": self.blocks[0].ff.W1.shape[1], "num_layers": len(self.blocks),
                  "dropout": self.dropout}
        if self.activation != "gelu":
            config["activation"] = self.activation
        return config

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable arrays by dotted name (see ``training.named_parameters``)."""
        return named_parameters(self)

    def astype(self, dtype) -> GPT:
        """A copy of the model with every parameter cast to ``dtype`` (e.g. float64, to
        evaluate a float32 model with results that do not depend on the BLAS)."""
        model = copy.deepcopy(self)
        for name, param in model.parameters().items():
            *path, field = name.split(".")
            owner = model
            for part in path:
                owner = owner[int(part)] if part.isdigit() else getattr(owner, part)
            setattr(owner, field, param.astype(dtype))
        return model

    def no_decay_names(self) -> list[str]:
        """Parameters exempt from weight decay: norms and biases (every 1-d array, as in
        nanoGPT) and, as in minGPT, the token and position tables."""
        return [name for name, param in self.parameters().items()
                if param.ndim == 1 or name in ("embedding", "positions")]

    def check_ids(self, ids) -> np.ndarray:
        """``ids`` as a (B, T) integer array with ``1 <= T <= context_len`` and valid ids."""
        ids = np.asarray(ids)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"ids must be a (B, T) integer array; got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        if not 1 <= ids.shape[1] <= self.context_len:
            raise ValueError(f"ids have T={ids.shape[1]} positions; the model takes 1 to "
                             f"context_len={self.context_len} (crop longer inputs first)")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(f"ids must lie in [0, {self.vocab_size}); got min {ids.min()}, "
                             f"max {ids.max()}")
        return ids

    def new_cache(self, batch_size: int = 1) -> KVCache:
        """An empty key/value cache (chapter 10) for ``context_len`` positions of every layer."""
        attn = self.blocks[0].self_attn
        return KVCache.init(len(self.blocks), attn.num_heads, self.context_len,
                            attn.d_model // attn.num_heads, (batch_size,),
                            dtype=self.embedding.dtype)

    def forward(self, ids, return_weights: bool = False, cache: KVCache | None = None):
        """Logits for every position, with the library's own layers (no dropout).

        With ``return_weights=True`` also returns each block's attention weights
        ``(B, H, T, T)``, as a list. With a ``cache`` from :meth:`new_cache`, ``ids`` are
        the positions after the ones already cached (chapter 10's decoding loop); the cache
        holds at most ``context_len`` positions.
        """
        ids = self.check_ids(ids)
        T = ids.shape[1]
        start = 0 if cache is None else cache.length
        if start + T > self.context_len:
            raise ValueError(f"the cache holds {start} positions and ids add {T}: more than "
                             f"context_len={self.context_len}")
        x = self.embedding[ids] + self.positions[start:start + T]  # (B, T, d_model)
        mask = causal_mask(T, start + T)  # the new positions see every earlier one
        weights = []
        for index, block in enumerate(self.blocks):
            # The block's own forward pass (pre-LN: x + attn(norm1(x)), then x + ff(norm2(x))),
            # so that its hook points (chapter 18) fire on this model too.
            x, block_weights = block.forward(x, mask, None if cache is None else cache.layer(index),
                                             return_weights=True)
            weights.append(block_weights)
        logits = self.norm(x) @ self.W_out  # (B, T, V)
        return (logits, weights) if return_weights else logits

    __call__ = forward


def gpt_forward(model: GPT, ids, *, rng: np.random.Generator | None = None,
                fused: bool = False):
    """The training forward pass, which saves what the backward needs: ``(logits, weights, saved)``.

    With an ``rng`` and ``model.dropout > 0``, dropout is applied (training); without, the
    result equals ``model.forward(ids)``.

    ``fused=False`` runs the library's functional layers one by one (chapter 12's passes).
    ``fused=True`` computes the same function with fewer passes over memory: the query, key
    and value projections as one product with ``[W_q | W_k | W_v]`` (as GPT-2's ``c_attn``),
    the causal mask added in place, softmax, GELU, dropout and the residual additions
    written into existing arrays, and the embedding's gradient as a product with the
    one-hot matrix of the ids. It draws the same dropout masks from ``rng``; its numbers
    differ from the unfused pass by rounding only (sums taken in another order). The
    committed checkpoint was trained with the fused pass (its log's ``config`` records
    ``fused``).

    Shapes
    ------
    ids : (B, T) int -> logits (B, T, V), weights : list of (B, H, T, T)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    ids = model.check_ids(ids)
    if fused:
        return _fused_gpt_forward(model, ids, rng)
    T = ids.shape[1]
    x, embedding_saved = embedding_forward(model.embedding, ids)  # (B, T, d_model)
    x, drop_saved = dropout_forward(x + model.positions[:T], model.dropout, rng)
    mask = causal_mask(T)
    weights, blocks_saved = [], []
    for block in model.blocks:
        x, block_weights, block_saved = encoder_block_forward(block, x, mask,
                                                              dropout=model.dropout, rng=rng)
        weights.append(block_weights)
        blocks_saved.append(block_saved)
    x, norm_saved = layer_norm_forward(model.norm, x)
    logits, out_saved = linear_forward(x, model.W_out)  # (B, T, V)
    saved = (embedding_saved, drop_saved, model.positions.shape, T, blocks_saved, norm_saved,
             out_saved)
    return logits, weights, saved


def gpt_backward(d_logits, saved) -> dict[str, np.ndarray]:
    """Every parameter's gradient from the gradient of the logits, keyed as
    ``model.parameters()``.

    Shapes
    ------
    d_logits : (B, T, V) -> gradients of the parameters' shapes

    ``saved`` from a fused forward pass (``fused=True``) is used up: some of its arrays are
    overwritten, so call this once per forward pass.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    if saved[0] == "fused":
        return _fused_gpt_backward(d_logits, saved)
    (embedding_saved, drop_saved, positions_shape, T, blocks_saved, norm_saved,
     out_saved) = saved
    grads = {}
    dx, grads["W_out"], _ = linear_backward(d_logits, out_saved)
    dx, norm_grads = layer_norm_backward(dx, norm_saved)
    grads |= {f"norm.{name}": grad for name, grad in norm_grads.items()}
    for index in reversed(range(len(blocks_saved))):
        dx, block_grads = encoder_block_backward(dx, blocks_saved[index])
        grads |= {f"blocks.{index}.{name}": grad for name, grad in block_grads.items()}
    dx = dropout_backward(dx, drop_saved)
    d_positions = np.zeros(positions_shape, dtype=dx.dtype)
    d_positions[:T] = dx.sum(axis=0)  # every sequence of the batch used the same rows
    grads["positions"] = d_positions
    grads["embedding"] = embedding_backward(dx, embedding_saved)
    return grads


def gpt_loss_and_grads(model: GPT, ids, targets, *, rng: np.random.Generator | None = None,
                       fused: bool = False):
    """Mean cross-entropy of the next-token predictions, and every parameter's gradient.

    ``fused`` chooses the training pass (see :func:`gpt_forward`).

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
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    logits, _, saved = gpt_forward(model, ids, rng=rng, fused=fused)
    loss, loss_saved = cross_entropy_forward(logits, targets)
    return loss, gpt_backward(cross_entropy_backward(1.0, loss_saved), saved)


def evaluate_loss(model: GPT, data, *, context_len: int | None = None,
                  batch_size: int = 64, per_position: bool = False):
    """Mean next-character loss over ``data`` cut into consecutive windows, no dropout.

    The windows ``data[i T : (i + 1) T + 1]`` cover every character once (a last partial
    window is dropped); in each, the prediction at position ``t`` (of the window's character
    ``t + 1``) sees the ``t + 1`` characters before it, as in training.

    Returns
    -------
    float or numpy.ndarray
        The mean loss in nats per character; with ``per_position=True``, the mean loss at
        each position of the window, ``(T,)``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    data = np.asarray(data)
    T = model.context_len if context_len is None else check_positive_int(context_len,
                                                                         "context_len")
    num_windows = (data.size - 1) // T
    if num_windows < 1:
        raise ValueError(f"data of {data.size} ids is too short for one window of {T}")
    inputs = data[:num_windows * T].reshape(num_windows, T)
    targets = data[1:num_windows * T + 1].reshape(num_windows, T)
    total = np.zeros(T)
    for start in range(0, num_windows, batch_size):
        logits = model.forward(inputs[start:start + batch_size])  # (b, T, V)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=-1))  # (b, T)
        picked = np.take_along_axis(shifted, targets[start:start + batch_size, :, None],
                                    axis=-1)[..., 0]
        total += (log_norm - picked).astype(np.float64).sum(axis=0)
    per_position_loss = total / num_windows
    return per_position_loss if per_position else float(per_position_loss.mean())


def token_losses(model: GPT, ids, targets, *, batch_size: int = 64) -> np.ndarray:
    """The loss of every prediction, ``-log p(targets[b, t] | ids[b, :t + 1])``, no dropout.

    The log-softmax is taken in the model's dtype (as :func:`evaluate_loss` does), the
    result returned in float64.

    Shapes
    ------
    ids : (B, T) int, targets : (B, T) int -> (B, T) float64

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.

    Examples
    --------
    >>> model = GPT.init(65, 8, 16, 2, 1, np.random.default_rng(0))
    >>> ids = np.arange(10).reshape(2, 5)
    >>> token_losses(model, ids, ids + 1).shape
    (2, 5)
    """
    ids = model.check_ids(ids)
    targets = np.asarray(targets)
    if targets.shape != ids.shape or not np.issubdtype(targets.dtype, np.integer):
        raise ValueError(f"targets must be an integer array of the shape of ids {ids.shape}; "
                         f"got shape {targets.shape}, dtype {targets.dtype}")
    batch_size = check_positive_int(batch_size, "batch_size")
    losses = np.empty(ids.shape, dtype=np.float64)
    for start in range(0, ids.shape[0], batch_size):
        logits = model.forward(ids[start:start + batch_size])  # (b, T, V)
        shifted = logits - logits.max(axis=-1, keepdims=True)
        log_norm = np.log(np.exp(shifted).sum(axis=-1))  # (b, T)
        picked = np.take_along_axis(shifted, targets[start:start + batch_size, :, None],
                                    axis=-1)[..., 0]
        losses[start:start + batch_size] = log_norm - picked
    return losses


def window_losses(model: GPT, data, *, context_len: int | None = None,
                  batch_size: int = 64) -> np.ndarray:
    """The loss of every prediction in :func:`evaluate_loss`'s consecutive windows.

    Window ``i`` is ``data[i T : (i + 1) T]`` and its targets ``data[i T + 1 : (i + 1) T + 1]``:
    entry ``[i, t]`` is the loss of character ``i T + t + 1`` predicted from the ``t + 1``
    characters of its window before it (the context starts again at every window). Its mean
    over axis 0 is ``evaluate_loss(..., per_position=True)``; its spread over windows gives
    error bars.

    Shapes
    ------
    data : (N,) int -> ((N - 1) // T, T) float64

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    data = np.asarray(data)
    T = model.context_len if context_len is None else check_positive_int(context_len,
                                                                         "context_len")
    num_windows = (data.size - 1) // T
    if data.ndim != 1 or num_windows < 1:
        raise ValueError(f"data must be 1-d with more than context_len={T} ids; got shape "
                         f"{data.shape}")
    inputs = data[:num_windows * T].reshape(num_windows, T)
    targets = data[1:num_windows * T + 1].reshape(num_windows, T)
    return token_losses(model, inputs, targets, batch_size=batch_size)


def sliding_window_losses(model: GPT, data, stride: int = 1, *, context_len: int | None = None,
                          batch_size: int = 64) -> np.ndarray:
    """The loss of each character from ``data[T]`` on, predicted with (almost) full context.

    A window of ``T`` characters slides along ``data`` by ``stride``; each window scores only
    its last ``stride`` predictions, so every scored character is predicted from at least
    ``T - stride + 1`` and at most ``T`` characters before it (exactly ``T`` with
    ``stride=1``). This is how a model that reads a long text, cropping the context from the
    left, predicts it; it costs ``T / stride`` times the forward passes of :func:`window_losses`.

    Shapes
    ------
    data : (N,) int -> ((N - T) // stride * stride,) float64

    Returns
    -------
    numpy.ndarray
        ``(K stride,)`` float64 with ``K = (N - T) // stride``: entry ``j`` is the loss of
        ``data[T + j]``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*. A key/value cache cannot make the
    slide cheaper for this model: its positions are absolute, so when the window moves every
    character changes position and every key and value changes.
    """
    data = np.asarray(data)
    T = model.context_len if context_len is None else check_positive_int(context_len,
                                                                         "context_len")
    stride = check_positive_int(stride, "stride")
    if stride > T:
        raise ValueError(f"stride must lie in [1, context_len={T}]; got {stride}")
    num_windows = (data.size - T) // stride
    if data.ndim != 1 or num_windows < 1:
        raise ValueError(f"data must be 1-d with at least context_len + stride = {T + stride} "
                         f"ids; got shape {data.shape}")
    # Window k ends just before target T + k stride + stride - 1: inputs
    # data[k stride + stride - 1 : k stride + stride - 1 + T].
    offsets = (np.arange(num_windows) * stride + stride - 1)[:, None] + np.arange(T)  # (K, T)
    losses = np.empty((num_windows, stride), dtype=np.float64)
    for start in range(0, num_windows, batch_size):
        chunk = offsets[start:start + batch_size]
        losses[start:start + batch_size] = token_losses(
            model, data[chunk], data[chunk + 1], batch_size=batch_size)[:, T - stride:]
    return losses.reshape(-1)


def repeated_snippets(data, num_sequences: int, half_len: int,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Snippets of ``data`` said twice, and the same snippets after the text before them.

    Snippet ``i`` is ``half_len`` consecutive ids at a random start ``s`` (at least
    ``half_len`` from the beginning). ``repeated[i]`` is the snippet followed by itself;
    ``control[i]`` is the snippet in its place in ``data``, after the ``half_len`` ids that
    precede it. The second halves are the same ids at the same positions, so a difference of
    loss there comes from what the first half holds: the same text (something to copy) or
    the text's own context.

    Shapes
    ------
    data : (N,) int -> repeated (num_sequences, 2 half_len), control (num_sequences,
    2 half_len)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    data = np.asarray(data)
    num_sequences = check_positive_int(num_sequences, "num_sequences")
    half_len = check_positive_int(half_len, "half_len")
    if data.ndim != 1 or data.size < 2 * half_len:
        raise ValueError(f"data must be 1-d with at least 2 half_len = {2 * half_len} ids; "
                         f"got shape {data.shape}")
    starts = rng.integers(half_len, data.size - half_len + 1, size=num_sequences)
    control = data[(starts - half_len)[:, None] + np.arange(2 * half_len)]  # (n, 2 half_len)
    second = control[:, half_len:]
    return np.concatenate([second, second], axis=1), control


def repeated_random_sequences(rng: np.random.Generator, num_sequences: int, half_len: int,
                              vocab_size: int) -> np.ndarray:
    """Random sequences of ``half_len`` distinct ids, each followed by a copy of itself.

    The ids of one sequence are drawn without replacement, so every token of the second copy
    has exactly one earlier occurrence, at ``t - half_len``, and the token that followed it
    there, at ``t - half_len + 1``, is the right next prediction.

    Shapes
    ------
    -> (num_sequences, 2 half_len)

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    num_sequences = check_positive_int(num_sequences, "num_sequences")
    half_len = check_positive_int(half_len, "half_len")
    if half_len > vocab_size:
        raise ValueError(f"half_len={half_len} distinct ids need vocab_size >= half_len; got "
                         f"vocab_size={vocab_size}")
    orders = rng.permuted(np.tile(np.arange(vocab_size), (num_sequences, 1)), axis=1)
    first = orders[:, :half_len]  # (n, half_len), distinct within each row
    return np.concatenate([first, first], axis=1)


def induction_probe(model: GPT, rng: np.random.Generator, num_sequences: int = 16) -> dict:
    """How well ``model`` copies a repeated random sequence, and which heads do it.

    On :func:`repeated_random_sequences` of ``half_len = context_len // 2`` (at most the
    vocabulary size): the mean loss of the predictions inside the first copy (nothing to
    copy from) and inside the second (each next token appeared once before); and, for every
    head, the mean attention weight from a token of the second copy to the token *after*
    its previous occurrence (the *induction score*; Olsson et al. 2022) and from every token
    to the one just before it (the *previous-token score*).

    Returns
    -------
    dict
        ``loss_first``, ``loss_second`` (nats per token), ``induction_scores`` and
        ``previous_token_scores`` (lists of ``num_layers`` lists of ``num_heads`` floats).

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    half = min(model.context_len // 2, model.vocab_size)
    ids = repeated_random_sequences(rng, num_sequences, half, model.vocab_size)  # (n, 2h)
    logits, weights = model.forward(ids, return_weights=True)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    losses = -np.take_along_axis(log_probs[:, :-1], ids[:, 1:, None], axis=-1)[..., 0]
    queries = np.arange(half, 2 * half)  # the second copy
    induction = [w[:, :, queries, queries - half + 1].mean(axis=(0, 2)) for w in weights]
    steps = np.arange(1, 2 * half)
    previous = [w[:, :, steps, steps - 1].mean(axis=(0, 2)) for w in weights]
    return {"loss_first": float(losses[:, :half - 1].mean(dtype=np.float64)),
            "loss_second": float(losses[:, half:].mean(dtype=np.float64)),
            "induction_scores": np.array(induction, dtype=np.float64).tolist(),
            "previous_token_scores": np.array(previous, dtype=np.float64).tolist()}


# ---------------------------------------------------------------------------------------------
# The fused training pass (``fused=True``): the same model, fewer passes over memory
# ---------------------------------------------------------------------------------------------
# Each helper below is one kind of work, so a profile (cProfile, by function) splits a step
# into matrix products (_mm), GELU (_gelu_*), softmax (_softmax_*), layer norm and the rest.

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


def _mm(a, b, out=None):
    """A matrix product (2-d, or stacked over leading axes)."""
    return np.matmul(a, b, out=out)


def _rows_mm(a, b):
    """``a @ b`` with ``a`` of any leading shape, as one 2-d product of all its rows."""
    return _mm(a.reshape(-1, a.shape[-1]), b)


def _ln_forward(norm, x):
    """Layer norm of the rows of ``x`` (..., d): ``(y, (normalized, rstd, gamma))``."""
    mean = x.mean(axis=-1, keepdims=True)
    normalized = x - mean  # (..., d), the only full-size temporary
    variance = np.einsum("...i,...i->...", normalized, normalized)[..., None]
    variance /= x.shape[-1]
    variance += norm.eps
    rstd = np.sqrt(variance, out=variance)
    np.reciprocal(rstd, out=rstd)  # 1 / std, (..., 1)
    normalized *= rstd
    y = normalized * norm.gamma
    y += norm.beta
    return y, (normalized, rstd, norm.gamma)


def _ln_backward(dy, saved):
    """``dx = (g - mean(g) - n mean(g n)) / std`` with ``g = dy gamma``; ``dgamma``, ``dbeta``."""
    normalized, rstd, gamma = saved
    d = normalized.shape[-1]
    dy_rows, n_rows = dy.reshape(-1, d), normalized.reshape(-1, d)
    grads = {"gamma": np.einsum("ij,ij->j", dy_rows, n_rows), "beta": dy_rows.sum(axis=0)}
    g = dy * gamma
    mean_g = g.mean(axis=-1, keepdims=True)
    mean_gn = np.einsum("...i,...i->...", g, normalized)[..., None]
    mean_gn /= d
    g -= mean_g
    g -= normalized * mean_gn
    g *= rstd
    return g, grads


def _dropout_inplace(x, p, rng):
    """Inverted dropout written into ``x``; the same draws as :func:`dropout_forward`."""
    if p == 0.0 or rng is None:
        return None
    keep = rng.random(x.shape, dtype=np.float32) >= p
    multipliers = keep.astype(x.dtype)
    multipliers *= np.asarray(1.0 / (1.0 - p), dtype=x.dtype)
    x *= multipliers
    return multipliers


def _dropout_backward_inplace(dy, multipliers):
    if multipliers is not None:
        dy *= multipliers
    return dy


def _gelu_forward(pre, name):
    """GELU of ``pre`` into new arrays: ``(hidden, saved)``; ``pre`` is left as it is."""
    if name == "gelu_tanh":  # 0.5 x (1 + tanh(c (x + a x^3)))
        t = pre * pre
        t *= _GELU_A * _GELU_C
        t += _GELU_C
        t *= pre
        np.tanh(t, out=t)
        hidden = t + 1.0
        hidden *= pre
        hidden *= 0.5
        return hidden, (pre, name, t)
    cdf = pre * (1.0 / math.sqrt(2.0))  # exact: x Phi(x), Phi through erf
    erf(cdf, out=cdf)
    cdf += 1.0
    cdf *= 0.5
    return pre * cdf, (pre, name, cdf)


def _gelu_backward(dy, saved):
    """``dy * gelu'(x)``, written into ``dy``; the tanh form also overwrites its saved ``t``."""
    pre, name, kept = saved
    if name == "gelu_tanh":
        # With t = tanh(c (x + a x^3)) and s = 0.5 x c (1 + 3 a x^2):
        # gelu'(x) = 0.5 (1 + t) + s (1 - t^2) = (1 + t) (0.5 + s (1 - t)).
        t = kept
        slope = pre * pre
        slope *= 3 * _GELU_A * _GELU_C
        slope += _GELU_C
        slope *= pre
        slope *= 0.5  # s
        np.subtract(1.0, t, out=t)  # 1 - t
        slope *= t
        slope += 0.5
        np.subtract(2.0, t, out=t)  # 1 + t
        slope *= t
    else:
        # d/dx = Phi(x) + x phi(x)
        slope = pre * pre
        slope *= -0.5
        np.exp(slope, out=slope)
        slope *= pre
        slope *= 1.0 / math.sqrt(2.0 * math.pi)
        slope += kept
    dy *= slope
    return dy


def _softmax_inplace(scores):
    """Softmax over the last axis, written into ``scores`` (``-inf`` entries become 0)."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    total = scores.sum(axis=-1, keepdims=True)
    np.reciprocal(total, out=total)
    scores *= total
    return scores


def _softmax_backward_inplace(d_weights, weights):
    """``P * (dP - rowsum(dP * P))``, written into ``dP``."""
    row = np.einsum("...i,...i->...", d_weights, weights)[..., None]
    d_weights -= row
    d_weights *= weights
    return d_weights


def _fused_block_forward(block, x, causal_bias, dropout, rng):
    """A pre-LN causal block, ``x`` updated in place: ``(x, weights, saved)``.

    The query, key and value projections are one product with ``[W_q | W_k | W_v]``;
    softmax, GELU and dropout run in place.
    """
    attn, ff = block.self_attn, block.ff
    B, T, C = x.shape
    H = attn.num_heads
    d_head = C // H
    normed1, norm1_saved = _ln_forward(block.norm1, x)
    W_qkv = np.concatenate([attn.W_q, attn.W_k, attn.W_v], axis=1)  # (C, 3C)
    qkv = _rows_mm(normed1, W_qkv)  # (N, 3C)
    qkv += np.concatenate([attn.b_q, attn.b_k, attn.b_v])
    q, k, v = qkv.reshape(B, T, 3, H, d_head).transpose(2, 0, 3, 1, 4)  # (B, H, T, d_head)
    scale = 1.0 / math.sqrt(d_head)
    # k^T copied to a contiguous array first: NumPy's stacked product with the transposed
    # view is several times slower with 2 BLAS threads (measured: 10 ms against 1.3 ms).
    weights = _mm(q, np.ascontiguousarray(k.swapaxes(-1, -2)))  # (B, H, T, T), the scores
    weights *= np.asarray(scale, dtype=weights.dtype)
    weights += causal_bias
    _softmax_inplace(weights)
    heads = _mm(weights, v)  # (B, H, T, d_head)
    merged = heads.transpose(0, 2, 1, 3).reshape(B * T, C)
    attended = _mm(merged, attn.W_o)
    attended += attn.b_o
    drop1 = _dropout_inplace(attended, dropout, rng)
    x += attended.reshape(B, T, C)
    normed2, norm2_saved = _ln_forward(block.norm2, x)
    pre = _rows_mm(normed2, ff.W1)  # (N, d_ff)
    pre += ff.b1
    hidden, gelu_saved = _gelu_forward(pre, ff.activation)
    transformed = _mm(hidden, ff.W2)  # (N, C)
    transformed += ff.b2
    drop2 = _dropout_inplace(transformed, dropout, rng)
    x += transformed.reshape(B, T, C)
    saved = (normed1, norm1_saved, W_qkv, q, k, v, weights, scale, merged, attn.W_o, drop1,
             normed2, norm2_saved, ff.W1, gelu_saved, hidden, ff.W2, drop2, H)
    return x, weights, saved


def _fused_block_backward(dy, saved):
    """Gradients of :func:`_fused_block_forward`: ``(dx, grads)``; ``dy`` is not changed."""
    (normed1, norm1_saved, W_qkv, q, k, v, weights, scale, merged, W_o, drop1,
     normed2, norm2_saved, W1, gelu_saved, hidden, W2, drop2, H) = saved
    B, T, C = dy.shape
    N = B * T
    dy_rows = dy.reshape(N, C)
    # The feed-forward sub-layer.
    d_out = dy_rows if drop2 is None else dy_rows * drop2  # (N, C)
    grads = {"ff.W2": _mm(hidden.T, d_out), "ff.b2": d_out.sum(axis=0)}
    d_pre = _gelu_backward(_mm(d_out, W2.T), gelu_saved)  # (N, d_ff)
    grads["ff.W1"], grads["ff.b1"] = _mm(normed2.reshape(N, C).T, d_pre), d_pre.sum(axis=0)
    dx, norm2_grads = _ln_backward(_mm(d_pre, W1.T).reshape(B, T, C), norm2_saved)
    dx += dy  # the residual path
    # The attention sub-layer.
    d_out = dx.reshape(N, C) if drop1 is None else dx.reshape(N, C) * drop1
    grads["self_attn.W_o"], grads["self_attn.b_o"] = _mm(merged.T, d_out), d_out.sum(axis=0)
    d_heads = _mm(d_out, W_o.T).reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
    d_qkv = np.empty((B, T, 3, H, C // H), dtype=dy.dtype)
    dq, dk, dv = d_qkv.transpose(2, 0, 3, 1, 4)  # views, (B, H, T, d_head)
    dv[...] = _mm(weights.swapaxes(-1, -2), d_heads)
    v_t = np.ascontiguousarray(v.swapaxes(-1, -2))  # contiguous, as k^T in the forward
    d_scores = _softmax_backward_inplace(_mm(d_heads, v_t), weights)
    d_scores *= np.asarray(scale, dtype=d_scores.dtype)
    dq[...] = _mm(d_scores, k)
    dk[...] = _mm(d_scores.swapaxes(-1, -2), q)
    d_qkv = d_qkv.reshape(N, 3 * C)
    dW_qkv = _mm(normed1.reshape(N, C).T, d_qkv)  # (C, 3C)
    db_qkv = d_qkv.sum(axis=0)
    for index, part in enumerate("qkv"):
        grads[f"self_attn.W_{part}"] = dW_qkv[:, index * C:(index + 1) * C]
        grads[f"self_attn.b_{part}"] = db_qkv[index * C:(index + 1) * C]
    d_norm1_in, norm1_grads = _ln_backward(_mm(d_qkv, W_qkv.T).reshape(B, T, C), norm1_saved)
    dx += d_norm1_in
    grads |= {f"norm1.{name}": grad for name, grad in norm1_grads.items()}
    grads |= {f"norm2.{name}": grad for name, grad in norm2_grads.items()}
    return dx, grads


def _fused_gpt_forward(model, ids, rng):
    B, T = ids.shape
    x = model.embedding[ids]  # (B, T, d_model), a new array
    x += model.positions[:T]
    drop = _dropout_inplace(x, model.dropout, rng)
    causal_bias = np.where(np.tri(T, dtype=bool), 0.0, -np.inf).astype(x.dtype)  # (T, T)
    weights, blocks_saved = [], []
    for block in model.blocks:
        x, block_weights, block_saved = _fused_block_forward(block, x, causal_bias,
                                                             model.dropout, rng)
        weights.append(block_weights)
        blocks_saved.append(block_saved)
    normed, norm_saved = _ln_forward(model.norm, x)
    logits = _rows_mm(normed, model.W_out).reshape(B, T, -1)  # (B, T, V)
    saved = ("fused", ids, model.embedding.shape, drop, model.positions.shape, T,
             blocks_saved, normed, norm_saved, model.W_out)
    return logits, weights, saved


def _fused_gpt_backward(d_logits, saved):
    (_, ids, embedding_shape, drop, positions_shape, T, blocks_saved, normed, norm_saved,
     W_out) = saved
    V = d_logits.shape[-1]
    d_rows = d_logits.reshape(-1, V)
    grads = {"W_out": _mm(normed.reshape(-1, normed.shape[-1]).T, d_rows)}
    dx, norm_grads = _ln_backward(_mm(d_rows, W_out.T).reshape(normed.shape), norm_saved)
    grads |= {f"norm.{name}": grad for name, grad in norm_grads.items()}
    for index in reversed(range(len(blocks_saved))):
        dx, block_grads = _fused_block_backward(dx, blocks_saved[index])
        grads |= {f"blocks.{index}.{name}": grad for name, grad in block_grads.items()}
    dx = _dropout_backward_inplace(dx, drop)
    d_positions = np.zeros(positions_shape, dtype=dx.dtype)
    d_positions[:T] = dx.sum(axis=0)
    grads["positions"] = d_positions
    # Row i of the embedding's gradient sums dx over the occurrences of token i: a product
    # with the one-hot matrix of the ids, (V, N) @ (N, d), instead of a scattered np.add.at.
    one_hot = np.zeros((embedding_shape[0], ids.size), dtype=dx.dtype)
    one_hot[ids.reshape(-1), np.arange(ids.size)] = 1
    grads["embedding"] = _mm(one_hot, dx.reshape(ids.size, -1))
    return grads


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------

def save_gpt(model: GPT, codec: CharCodec, path) -> str:
    """Write ``model`` and ``codec`` to ``path`` (an ``.npz``; see the module's docstring).

    Returns the file's sha256. The file's bytes depend only on the arrays and the config
    (no time stamps), so the same model always gives the same hash.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    if codec.vocab_size != model.vocab_size:
        raise ValueError(f"codec has {codec.vocab_size} characters but the model "
                         f"{model.vocab_size}")
    arrays = dict(model.parameters())
    arrays["config"] = np.array(json.dumps(model.config(), sort_keys=True))
    arrays["vocabulary"] = np.array(codec.chars)
    path = Path(path)
    with open(path, "wb") as file:
        np.savez(file, **arrays)
    return _sha256(path)


def load_gpt(path, sha256: str | None = None) -> tuple[GPT, CharCodec]:
    """Read a checkpoint written by :func:`save_gpt`, checking its sha256 if given.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    path = Path(path) if sha256 is None else _verified(path, sha256, "the GPT checkpoint")
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    config = json.loads(str(arrays.pop("config")))
    codec = CharCodec(str(arrays.pop("vocabulary")))
    model = GPT.init(config["vocab_size"], config["context_len"], config["d_model"],
                     config["num_heads"], config["num_layers"], np.random.default_rng(0),
                     d_ff=config["d_ff"], dropout=config["dropout"],
                     activation=config.get("activation", "gelu"),
                     dtype=arrays["embedding"].dtype)
    params = model.parameters()
    if params.keys() != arrays.keys():
        raise ValueError(f"{path} does not hold this model's parameters: missing "
                         f"{sorted(params.keys() - arrays.keys())}, unexpected "
                         f"{sorted(arrays.keys() - params.keys())}")
    for name, param in params.items():
        if arrays[name].shape != param.shape:
            raise ValueError(f"{name} has shape {arrays[name].shape} in {path}, expected "
                             f"{param.shape}")
        param[...] = arrays[name]
    return model, codec


def load_shakespeare_gpt(path=None) -> tuple[GPT, CharCodec]:
    """The GPT trained on Tiny Shakespeare by ``scripts/train_shakespeare_gpt.py``, and its
    character codec.

    Parameters
    ----------
    path : str or Path, optional
        A checkpoint; defaults to the one inside the package
        (``attention_lib/data/shakespeare_gpt.npz``), whose sha256 is checked against
        :data:`SHAKESPEARE_GPT_SHA256`. Another path is read without a hash check.

    Returns
    -------
    model : GPT
        ``model.forward(ids)`` maps ids ``(B, T)``, ``T <= model.context_len``, to logits
        ``(B, T, 65)``.
    codec : CharCodec
        ``codec.encode(text)``, ``codec.decode(ids)``.

    Notes
    -----
    Derived in chapter 14, *Train a GPT on Shakespeare*.
    """
    if path is None:
        return load_gpt(DATA_DIR / "shakespeare_gpt.npz", SHAKESPEARE_GPT_SHA256)
    return load_gpt(path)
