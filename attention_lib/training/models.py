"""A small trainable encoder-only transformer, its parameters and its gradients (chapter 12).

:class:`EncoderModel` is token embeddings plus positions, a stack of the library's
``EncoderBlock`` s, a final norm and a linear read-out: one prediction
per position (sequence tagging, such as reversing a sequence) or, with attention pooling,
one per sequence (classification). Its forward pass has two implementations that agree:
``__call__`` uses the library's layers as they are; :func:`model_forward` uses the
functional passes of :mod:`attention_lib.training.functional` and keeps what
:func:`model_backward` needs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from .._checks import check_positive_int
from ..attention import init_linear_weight, scaled_dot_product_attention
from ..blocks import EncoderBlock
from ..layers import LayerNorm
from ..masks import padding_mask
from ..positional import sinusoidal_encoding
from .functional import (
    attention_backward,
    attention_forward,
    cross_entropy_backward,
    cross_entropy_forward,
    embedding_backward,
    embedding_forward,
    encoder_block_backward,
    encoder_block_forward,
    layer_norm_backward,
    layer_norm_forward,
    linear_backward,
    linear_forward,
)

__all__ = ["EncoderModel", "named_parameters", "model_forward", "model_backward",
           "loss_and_grads"]

POSITIONS = ("learned", "sinusoidal", None)


def named_parameters(obj, prefix: str = "") -> dict[str, np.ndarray]:
    """Every array inside a (nested) library dataclass, by dotted name, in field order.

    The arrays are the objects themselves, not copies: an optimizer that updates them in
    place updates the model. Lists are numbered (``"blocks.0.ff.W1"``); ``None`` fields
    and non-array fields (``eps``, ``num_heads``) are skipped.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> sorted(named_parameters(LayerNorm.init(3)))
    ['beta', 'gamma']
    """
    found = {}
    if isinstance(obj, np.ndarray):
        found[prefix] = obj
    elif isinstance(obj, (list, tuple)):
        for index, item in enumerate(obj):
            found |= named_parameters(item, f"{prefix}{index}.")
    elif dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            value = getattr(obj, field.name)
            name = f"{prefix}{field.name}"
            if isinstance(value, np.ndarray):
                found[name] = value
            elif value is not None:
                found |= named_parameters(value, f"{name}.")
    return found


@dataclass
class EncoderModel:
    """Embeddings and positions, encoder blocks, a final norm, and a linear read-out.

    ``x = embedding[tokens] + position vectors``, then each block, then ``norm`` (pre-LN
    blocks need it), then ``logits = x @ W_out + b_out`` at every position. With a
    ``pool_query``, a learned query first attends over the positions (attention pooling,
    padding masked) and the read-out gives one row of logits per sequence.

    Attributes
    ----------
    embedding : numpy.ndarray
        ``(V, d_model)`` token vectors.
    positions : numpy.ndarray or None
        ``(max_len, d_model)`` learned position vectors; None for no learned positions.
    blocks : list of EncoderBlock
        With ``init(attention=False)`` the blocks have no attention sub-layer (each position
        is processed on its own).
    norm : LayerNorm or None
        Final norm.
    W_out : numpy.ndarray
        ``(d_model, num_outputs)``.
    b_out : numpy.ndarray
        ``(num_outputs,)``.
    pool_query : numpy.ndarray or None
        ``(d_model,)``: the query of attention pooling; None for per-position outputs.
    sinusoidal : bool
        Add the fixed sinusoidal encoding of chapter 07 (instead of, or on top of, learned
        positions).

    Shapes
    ------
    tokens : (B, T) int, lengths : (B,) -> logits (B, T, num_outputs), or (B, num_outputs)
    with pooling

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.

    Examples
    --------
    >>> model = EncoderModel.init(10, 8, 16, 2, 32, 1, 10, np.random.default_rng(0))
    >>> model(np.zeros((3, 8), dtype=int)).shape
    (3, 8, 10)
    """

    embedding: np.ndarray
    positions: np.ndarray | None
    blocks: list[EncoderBlock]
    norm: LayerNorm | None
    W_out: np.ndarray
    b_out: np.ndarray
    pool_query: np.ndarray | None = None
    sinusoidal: bool = False

    @classmethod
    def init(cls, vocab_size: int, max_len: int, d_model: int, num_heads: int, d_ff: int,
             num_layers: int, num_outputs: int, rng: np.random.Generator, *,
             positions: str | None = "learned", attention: bool = True, pooling: bool = False,
             norm_first: bool = True, activation: str = "relu",
             dtype=np.float64) -> EncoderModel:
        """A randomly initialised model.

        ``positions`` is ``"learned"``, ``"sinusoidal"`` or None (no positional information:
        the model is then permutation-equivariant). ``attention=False`` drops every block's
        self-attention (each position is processed on its own). ``pooling=True`` gives one
        output per sequence through attention pooling. Embeddings, positions and the pooling
        query start with entries of standard deviation ``1/sqrt(d_model)`` (vectors of
        length about 1), linear maps as ``init_linear_weight`` (chapter 05).
        """
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}; got {positions!r}")
        vocab_size = check_positive_int(vocab_size, "vocab_size")
        max_len = check_positive_int(max_len, "max_len")
        num_layers = check_positive_int(num_layers, "num_layers")
        num_outputs = check_positive_int(num_outputs, "num_outputs")
        blocks = [EncoderBlock.init(d_model, num_heads, d_ff, rng, activation=activation,
                                    norm_first=norm_first, dtype=dtype, attention=attention)
                  for _ in range(num_layers)]
        scale = 1.0 / math.sqrt(d_model)
        return cls(
            embedding=(rng.standard_normal((vocab_size, d_model)) * scale).astype(dtype),
            positions=((rng.standard_normal((max_len, d_model)) * scale).astype(dtype)
                       if positions == "learned" else None),
            blocks=blocks,
            norm=LayerNorm.init(d_model, dtype=dtype) if norm_first else None,
            W_out=init_linear_weight(d_model, num_outputs, rng, dtype),
            b_out=np.zeros(num_outputs, dtype=dtype),
            pool_query=(rng.standard_normal(d_model) * scale).astype(dtype) if pooling else None,
            sinusoidal=positions == "sinusoidal",
        )

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable arrays by name (see :func:`named_parameters`)."""
        return named_parameters(self)

    def _add_positions(self, x: np.ndarray) -> np.ndarray:
        T = x.shape[-2]
        if self.positions is not None:
            x = x + self.positions[:T]  # the same vector for position t in every sequence
        if self.sinusoidal:
            x = x + sinusoidal_encoding(T, x.shape[-1]).astype(x.dtype)
        return x

    def _check_tokens(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must have shape (B, T); got {tokens.shape}")
        if self.positions is not None and tokens.shape[1] > self.positions.shape[0]:
            raise ValueError(f"tokens have T={tokens.shape[1]} positions but the model has "
                             f"learned only max_len={self.positions.shape[0]}")
        return tokens

    def __call__(self, tokens, lengths=None) -> np.ndarray:
        """The forward pass with the library's own layers (``EncoderBlock.__call__``)."""
        tokens = self._check_tokens(tokens)
        mask = None if lengths is None else padding_mask(lengths, tokens.shape[1])
        x = self._add_positions(self.embedding[tokens])  # (B, T, d_model)
        for block in self.blocks:
            x = block(x, mask=mask)
        if self.norm is not None:
            x = self.norm(x)
        if self.pool_query is not None:
            # A learned query attends over the positions: (B, 1, d) -> (B, d).
            query = np.broadcast_to(self.pool_query, (x.shape[0], 1, x.shape[-1]))
            x = scaled_dot_product_attention(query, x, x, mask=mask)[0][:, 0]
        return x @ self.W_out + self.b_out


def model_forward(model: EncoderModel, tokens, lengths=None):
    """The forward pass that keeps what the backward pass needs: ``(logits, weights, saved)``.

    ``weights`` lists each block's attention weights ``(B, H, T, T)`` (None for a block
    without attention) and, with pooling, last, the pooling weights ``(B, T)``.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*. Equal to ``model(tokens, lengths)``.
    """
    tokens = model._check_tokens(tokens)
    mask = None if lengths is None else padding_mask(lengths, tokens.shape[1])  # (B, 1, T)
    x, embedding_saved = embedding_forward(model.embedding, tokens)  # (B, T, d_model)
    x = model._add_positions(x)
    T = tokens.shape[1]
    weights, blocks_saved = [], []
    for block in model.blocks:
        x, block_weights, block_saved = encoder_block_forward(block, x, mask)
        weights.append(block_weights)
        blocks_saved.append(block_saved)
    norm_saved = pool_saved = None
    if model.norm is not None:
        x, norm_saved = layer_norm_forward(model.norm, x)
    if model.pool_query is not None:
        query = model.pool_query[None, None, :]  # (1, 1, d_model), shared by the batch
        x, pool_weights, pool_saved = attention_forward(query, x, x, mask=mask)  # (B, 1, d)
        x = x[:, 0]  # (B, d_model)
        weights.append(pool_weights[:, 0])  # (B, T)
    logits, out_saved = linear_forward(x, model.W_out, model.b_out)
    positions_shape = None if model.positions is None else model.positions.shape
    saved = (embedding_saved, positions_shape, T, blocks_saved, norm_saved, pool_saved,
             out_saved)
    return logits, weights, saved


def model_backward(d_logits, saved) -> dict[str, np.ndarray]:
    """The gradient of the loss with respect to every parameter of the model, from the
    gradient of its logits; keyed as :func:`named_parameters` names the model's arrays.

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    (embedding_saved, positions_shape, T, blocks_saved, norm_saved, pool_saved,
     out_saved) = saved
    grads = {}
    dx, grads["W_out"], grads["b_out"] = linear_backward(d_logits, out_saved)
    if pool_saved is not None:
        d_query, d_keys, d_values = attention_backward(dx[:, None, :], pool_saved)
        dx = d_keys + d_values  # the keys and the values are both x
        grads["pool_query"] = d_query.reshape(-1)
    if norm_saved is not None:
        dx, norm_grads = layer_norm_backward(dx, norm_saved)
        grads |= {f"norm.{name}": grad for name, grad in norm_grads.items()}
    for index in reversed(range(len(blocks_saved))):
        dx, block_grads = encoder_block_backward(dx, blocks_saved[index])
        grads |= {f"blocks.{index}.{name}": grad for name, grad in block_grads.items()}
    if positions_shape is not None:
        d_positions = np.zeros(positions_shape, dtype=dx.dtype)
        d_positions[:T] = dx.sum(axis=0)  # every sequence of the batch used the same rows
        grads["positions"] = d_positions
    grads["embedding"] = embedding_backward(dx, embedding_saved)
    return grads


def loss_and_grads(model: EncoderModel, tokens, targets, lengths=None, *,
                   ignore_index: int = -100):
    """Cross-entropy of the model's logits against ``targets``, and every gradient.

    Returns
    -------
    loss : float
    grads : dict of numpy.ndarray
        Keyed as :func:`named_parameters` names the model's arrays.

    Shapes
    ------
    tokens : (B, T) int, targets : (B, T) int (per position; ``ignore_index`` where the
    loss must not count) or (B,) int (with pooling), lengths : (B,) int

    Notes
    -----
    Derived in chapter 12, *Training a transformer*.
    """
    logits, _, saved = model_forward(model, tokens, lengths)
    loss, loss_saved = cross_entropy_forward(logits, targets, ignore_index=ignore_index)
    d_logits = cross_entropy_backward(1.0, loss_saved)
    return loss, model_backward(d_logits, saved)
