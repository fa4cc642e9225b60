"""Quantize weights the way llama.cpp stores them, and measure what it costs (chapter 17).

ggml cuts each row of a weight matrix into blocks of 32 numbers and stores every block as a
float16 scale (and, for ``Q4_1``, a float16 minimum) plus one small integer code per number:

- ``Q8_0`` (34 bytes a block, 8.5 bits a number): scale ``d = amax / 127`` (``amax`` the
  block's largest magnitude), codes ``c = round(x / d)`` in [-127, 127]; value ``d * c``.
- ``Q4_1`` (20 bytes, 5 bits): scale ``d = (max - min) / 15`` and the minimum, codes
  ``c = trunc((x - min) / d + 0.5)`` in [0, 15]; value ``d * c + min``.
- ``Q4_0`` (18 bytes, 4.5 bits): scale ``d = -x_big / 8`` where ``x_big`` is the entry of
  largest magnitude, sign kept (so it gets code 0, i.e. -8, exactly), codes
  ``c = min(15, trunc(x / d + 8.5))``; value ``d * (c - 8)``.

:func:`quantize` writes exactly the bytes of ggml's reference quantizers
(``quantize_row_q8_0_ref``, ``quantize_row_q4_1_ref``, ``quantize_row_q4_0_ref`` in ggml's
``src/ggml-quants.c``): the same float32 arithmetic, rounding rules and float16 conversion
(round to nearest even). :func:`~attention_lib.models.gguf.dequantize` reads them back.
:func:`quantize_model` gives a copy of SmolLM2 whose matrices went through that round trip,
and :func:`next_token_kl` and :func:`perplexity` measure how far its predictions moved.

The SmolLM2 file on this machine is itself quantized (its matrices ``Q4_1``, the token
embedding ``Q8_0``, the norms float32), and there is no float16 original here. So the
"unquantized" reference of this chapter is the file's weights dequantized to float32, and
quantizing it again measures the cost of a *second* rounding: a matrix that was ``Q4_1``
comes back from :func:`quantize` ``(..., "Q4_1")`` bit for bit (tested on all 210 of them).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..softmax import log_softmax
from .gguf import dequantize
from .smollm2 import SmolLM2

__all__ = [
    "QUANTIZE_TYPES",
    "next_token_kl",
    "perplexity",
    "quantize",
    "quantize_model",
    "quantized_nbytes",
    "round_trip",
]

QUANTIZE_TYPES = ("F32", "F16", "Q8_0", "Q4_1", "Q4_0")
"""The ggml types :func:`quantize` writes: two float types and three block types."""

BLOCK_SIZE = 32
"""Numbers per block of the ``Q*`` types (ggml's ``QK8_0``, ``QK4_0``, ``QK4_1``)."""

# Bytes per block (per number for the float types).
_BLOCK_BYTES = {"F32": 4, "F16": 2, "Q8_0": 34, "Q4_1": 20, "Q4_0": 18}
_FLOAT16_MAX = 65504.0


def _check_type(ggml_type) -> str:
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(f"ggml_type {ggml_type!r} is not supported; quantize knows "
                         f"{list(QUANTIZE_TYPES)}")
    return ggml_type


def _block_size(ggml_type: str) -> int:
    return 1 if ggml_type in ("F32", "F16") else BLOCK_SIZE


def quantized_nbytes(shape, ggml_type: str) -> int:
    """How many bytes a tensor of NumPy ``shape`` takes stored as ``ggml_type``.

    Parameters
    ----------
    shape : tuple of int
        Blocks run along the last axis (the file's ``ne[0]``), which for the ``Q*`` types
        must be a multiple of 32.
    ggml_type : str
        One of :data:`QUANTIZE_TYPES`.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If the type is unknown, ``shape`` has no axis, or its last axis is not a multiple
        of 32 for a block type.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> quantized_nbytes((1536, 576), "Q4_0"), quantized_nbytes((1536, 576), "F16")
    (497664, 1769472)
    """
    _check_type(ggml_type)
    shape = tuple(int(n) for n in shape)
    _check_last_axis(shape, ggml_type)
    count = int(np.prod(shape, dtype=np.int64))
    return count // _block_size(ggml_type) * _BLOCK_BYTES[ggml_type]


def _check_last_axis(shape: tuple, ggml_type: str) -> None:
    if not shape:
        raise ValueError(f"values must have at least one axis (blocks run along the last); "
                         f"got shape {shape}")
    if shape[-1] % _block_size(ggml_type):
        raise ValueError(f"{ggml_type} needs a last axis that is a multiple of {BLOCK_SIZE}; "
                         f"got shape {shape}")


def _float32_values(values) -> np.ndarray:
    """``values`` as a C-contiguous float32 array; raises unless they are finite reals."""
    array = np.asarray(values)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"values must be real numbers; got dtype {array.dtype}")
    with np.errstate(over="ignore"):  # float64 beyond the float32 range becomes inf
        array = np.asarray(array, dtype=np.float32, order="C")
    if not np.isfinite(array).all():
        bad = np.flatnonzero(~np.isfinite(array.reshape(-1)))
        raise ValueError(f"values must be finite float32 numbers; {bad.size} are not (the "
                         f"first at flat index {bad[0]}); ggml's quantizers give undefined "
                         "codes for them")
    return array


def _to_float16_bytes(scales: np.ndarray, what: str, ggml_type: str) -> np.ndarray:
    """float32 ``(n, 1)`` -> ``(n, 2)`` little-endian float16 bytes, as GGML_FP32_TO_FP16
    rounds them (to nearest, ties to even); raises if one overflows float16."""
    with np.errstate(over="ignore"):
        half = scales.astype("<f2")
    if not np.isfinite(half).all():
        raise ValueError(f"values too large for {ggml_type}: {what} {np.abs(scales).max():.6g} "
                         f"overflows float16 (largest {_FLOAT16_MAX:g})")
    return half.view(np.uint8)


def _reciprocal(d: np.ndarray) -> np.ndarray:
    """ggml's ``id = d ? 1.0f/d : 0.0f``, in float32."""
    inverse = np.zeros_like(d)
    np.divide(np.float32(1), d, out=inverse, where=d != 0)
    return inverse


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's ``roundf``: to nearest, halves away from zero (``np.round`` sends them to even).

    Done in float64, where ``|x| + 0.5`` is exact for every float32 ``x`` of the size met
    here (a float32 ``x + 0.5`` could round ``0.49999997`` up to 1)."""
    x = x.astype(np.float64)
    return np.trunc(x + np.copysign(0.5, x))


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """``(n, 32)`` codes in [0, 15] -> ``(n, 16)`` bytes: element j in the low nibble of
    byte j, element j + 16 in its high nibble (``qs[j] = xi0 | xi1 << 4``)."""
    codes = codes.astype(np.uint8)
    return codes[:, :16] | (codes[:, 16:] << 4)


def _q8_0(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_0_ref`` on ``(n, 32)`` float32 blocks -> ``(n, 34)`` bytes."""
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)  # amax / ((1 << 7) - 1)
    codes = _roundf(x * _reciprocal(d)).astype(np.int8)  # qs[j] = roundf(x0), x0 = x * id
    return np.concatenate([_to_float16_bytes(d, "a block's scale", "Q8_0"),
                           codes.view(np.uint8)], axis=1)


def _q4_1(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_1_ref`` on ``(n, 32)`` float32 blocks -> ``(n, 20)`` bytes."""
    # argmin/argmax take the first extreme entry, as the C loop's strict `v < min` does
    # (it matters only for the sign of a zero minimum).
    rows = np.arange(x.shape[0])[:, None]
    low = x[rows, x.argmin(axis=1)[:, None]]  # (n, 1)
    high = x[rows, x.argmax(axis=1)[:, None]]
    d = (high - low) / np.float32(15)  # (max - min) / ((1 << 4) - 1)
    scaled = (x - low) * _reciprocal(d)  # x0 = (x - min) * id
    codes = np.minimum(15, np.trunc(scaled + np.float32(0.5)))  # MIN(15, (int8_t)(x0 + 0.5f))
    return np.concatenate([_to_float16_bytes(d, "a block's scale", "Q4_1"),
                           _to_float16_bytes(low, "a block's minimum", "Q4_1"),
                           _pack_nibbles(codes)], axis=1)


def _q4_0(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q4_0_ref`` on ``(n, 32)`` float32 blocks -> ``(n, 18)`` bytes."""
    magnitudes = np.abs(x)
    first = magnitudes.argmax(axis=1)[:, None]  # the first entry of largest |x|
    rows = np.arange(x.shape[0])[:, None]
    signed_max = x[rows, first]
    # The C loop keeps max = 0.0f when no |v| exceeds 0: a block of zeros gets d = -0.0.
    signed_max = np.where(magnitudes[rows, first] > 0, signed_max, np.float32(0))
    d = signed_max / np.float32(-8)  # max / -8: the largest entry gets code 0, i.e. -8
    scaled = x * _reciprocal(d)  # x0 = x * id, in [-8, 8]
    codes = np.minimum(15, np.trunc(scaled + np.float32(8.5)))  # MIN(15, (int8_t)(x0 + 8.5f))
    return np.concatenate([_to_float16_bytes(d, "a block's scale", "Q4_0"), _pack_nibbles(codes)],
                          axis=1)


_BLOCK_QUANTIZERS = {"Q8_0": _q8_0, "Q4_1": _q4_1, "Q4_0": _q4_0}


def quantize(values, ggml_type: str) -> np.ndarray:
    """The bytes ggml stores for ``values`` as ``ggml_type``, blocks of 32 along the last axis.

    The values are first rounded to float32 (ggml's quantizers read float32 rows), then
    each block of 32 is encoded as ggml's reference quantizer does it (see the module
    docstring): float32 arithmetic, one rounding per operation, the float16 conversion of
    the scale (and minimum) rounding to nearest even.

    Parameters
    ----------
    values : array_like of real numbers
        Any shape ``(..., n)``; ``n`` a multiple of 32 for the block types.
    ggml_type : str
        ``"Q8_0"``, ``"Q4_1"`` or ``"Q4_0"``; also ``"F16"`` and ``"F32"`` (the values as
        little-endian float16 or float32 bytes).

    Returns
    -------
    numpy.ndarray of uint8
        Row ``(i, ...)`` holds the blocks of ``values[i, ...]`` one after another; read it
        back with ``dequantize(raw, ggml_type, values.shape)``.

    Shapes
    ------
    values : (..., n) -> (..., n // 32 * block_bytes) with block_bytes 34 (Q8_0), 20 (Q4_1),
    18 (Q4_0); (..., 2n) for F16 and (..., 4n) for F32.

    Raises
    ------
    ValueError
        If ``ggml_type`` is unknown, ``values`` has no axis or a last axis that is not a
        multiple of 32, or holds NaN or infinity (ggml's C code gives undefined codes for
        them: a float-to-int8 cast of NaN), or is so large that a block's scale or minimum
        overflows float16 (ggml would store infinity and read back NaN).
    TypeError
        If ``values`` are not real numbers.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. Bit-exact with ggml's
    ``quantize_row_q8_0_ref``, ``quantize_row_q4_1_ref`` and ``quantize_row_q4_0_ref``
    (``src/ggml-quants.c``) as built by default, and with the ``gguf`` package's NumPy
    quantizers (both tested), except that ``gguf`` may give an all-zero ``Q4_0`` scale or a
    zero ``Q4_1`` minimum the other sign (bytes ``00 00`` for ``00 80``; the same values).
    A build of ggml whose compiler fuses ``x * id + 8.5f`` into one multiply-add (GCC's
    default ``-ffp-contract=fast`` on a target with FMA: ``-march=native`` on x86-64, or
    ARM64) can pick the next ``Q4_0`` code where ``x * id + 8.5`` lies within a rounding of an
    integer (values on exact fractions of the scale). An x86-64 build of ggml as configured
    by default does not fuse: ``ggml-quants.c`` is part of ``ggml-base``, compiled for the
    base instruction set.

    Examples
    --------
    >>> raw = quantize(np.arange(32.0), "Q8_0")  # d = 31 / 127, codes round(x / d)
    >>> raw.shape, raw[2:6].view(np.int8).tolist()
    ((34,), [0, 4, 8, 12])
    """
    _check_type(ggml_type)
    array = _float32_values(values)
    _check_last_axis(array.shape, ggml_type)
    if ggml_type == "F32":
        return array.astype("<f4").view(np.uint8)
    if ggml_type == "F16":
        return _to_float16_bytes(array.reshape(-1, 1), "the value", "F16").reshape(
            *array.shape[:-1], -1)
    blocks = _BLOCK_QUANTIZERS[ggml_type](array.reshape(-1, BLOCK_SIZE))
    return blocks.reshape(*array.shape[:-1], -1)


def round_trip(values, ggml_type: str) -> np.ndarray:
    """``values`` after being stored as ``ggml_type`` and read back, in float32.

    ``dequantize(quantize(values, ggml_type), ggml_type, values.shape)``: what a model whose
    weights were stored that way computes with.

    Shapes
    ------
    values : (..., n) -> (..., n)

    Raises
    ------
    ValueError, TypeError
        As :func:`quantize`.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> round_trip(np.linspace(0, 1, 32), "Q4_1")[:4]  # 16 levels 1/15 apart
    array([0.        , 0.        , 0.06665039, 0.06665039], dtype=float32)
    """
    shape = np.shape(values)
    return dequantize(quantize(values, ggml_type), ggml_type, shape)


def quantize_model(model: SmolLM2, ggml_type: str) -> tuple[SmolLM2, int]:
    """A copy of ``model`` whose weight matrices were stored as ``ggml_type`` and read back.

    Every 2-D weight (the seven matrices of each block and the token embedding, which SmolLM2
    also uses as its output layer) is replaced by ``round_trip`` of it, with the blocks of 32
    running along each matrix's input axis as in a GGUF file; the norm vectors stay as they
    are (float32 in the file, as llama.cpp keeps 1-D tensors). ``model`` is not changed.

    Parameters
    ----------
    model : SmolLM2
        E.g. from :func:`~attention_lib.models.smollm2.load_smollm2`. For the installed file
        that is already a quantized model (``Q4_1``, embedding ``Q8_0``) read into float32.
    ggml_type : str
        One of :data:`QUANTIZE_TYPES`.

    Returns
    -------
    quantized : SmolLM2
        New arrays throughout (of ``model``'s dtype); a tied output layer stays tied
        (``W_out`` is a view of the new embedding).
    nbytes : int
        Bytes the weights take stored that way: every matrix as ``ggml_type`` (the tied one
        counted once) plus the norms as float32.

    Raises
    ------
    TypeError
        If ``model`` is not a :class:`~attention_lib.models.smollm2.SmolLM2`.
    ValueError
        If ``ggml_type`` is unknown.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. The library keeps attention and
    feed-forward weights as ``(in, out)`` copies of the file's ``(out, in)`` matrices, so
    they are transposed before quantizing and back after.
    """
    if not isinstance(model, SmolLM2):
        raise TypeError(f"model must be a SmolLM2; got {type(model).__name__}")
    _check_type(ggml_type)
    nbytes = 0

    def stored(out_in):  # a matrix as the file holds it, (out, in): blocks along `in`
        nonlocal nbytes
        nbytes += quantized_nbytes(out_in.shape, ggml_type)
        return round_trip(out_in, ggml_type).astype(out_in.dtype, copy=False)

    def matrix(weight):  # a library (in, out) matrix: transposed to the file's layout and back
        return np.ascontiguousarray(stored(weight.T).T)  # row-major, as the loader keeps it

    def norm(layer):  # kept as float32, copied
        nonlocal nbytes
        nbytes += quantized_nbytes(layer.gamma.shape, "F32")
        return dataclasses.replace(layer, gamma=layer.gamma.copy())

    tied = np.shares_memory(model.W_out, model.embedding)
    embedding = stored(model.embedding)  # (V, d_model): the file's layout already
    W_out = embedding.T if tied else matrix(model.W_out)
    blocks = []
    for block in model.blocks:
        attention, ff = block.self_attn, block.ff
        blocks.append(dataclasses.replace(
            block,
            self_attn=dataclasses.replace(attention, W_q=matrix(attention.W_q),
                                          W_k=matrix(attention.W_k), W_v=matrix(attention.W_v),
                                          W_o=matrix(attention.W_o)),
            ff=dataclasses.replace(ff, W_gate=matrix(ff.W_gate), W_up=matrix(ff.W_up),
                                   W_down=matrix(ff.W_down)),
            norm1=norm(block.norm1), norm2=norm(block.norm2)))
    quantized = SmolLM2(embedding, blocks, norm(model.norm), W_out, model.config)
    return quantized, nbytes


def _check_logits(name: str, logits) -> np.ndarray:
    logits = np.asarray(logits)
    if not (np.issubdtype(logits.dtype, np.floating) or np.issubdtype(logits.dtype, np.integer)):
        raise TypeError(f"{name} must be real numbers; got dtype {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., V) with V >= 1; got {logits.shape}")
    return logits.astype(np.float64)


def next_token_kl(ref_logits, quant_logits, *, per_position: bool = False):
    """Mean KL divergence ``KL(p_ref || p_quant)`` between two models' next-token predictions.

    ``KL(p || q) = sum_v p_v (log p_v - log q_v)`` for every position, with ``p`` and ``q``
    the softmax of the logits, computed as log-softmax in float64; then the mean over all
    positions. It is 0 only where the two distributions agree, and it weighs each token by
    how likely the reference finds it. Tokens of zero reference probability add 0.

    Parameters
    ----------
    ref_logits, quant_logits : array_like
        Logits of the reference and of the quantized model for the same tokens.
    per_position : bool, default False
        Return the KL of every position instead of their mean.

    Returns
    -------
    float, or numpy.ndarray of float64 of shape ``(...)`` if ``per_position``

    Shapes
    ------
    ref_logits, quant_logits : (..., V) -> () or (...)

    Raises
    ------
    ValueError
        If the two shapes differ or the last axis is empty.
    TypeError
        If the logits are not real numbers.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*. llama.cpp's ``llama-perplexity
    --kl-divergence`` reports the same mean.

    Examples
    --------
    >>> round(next_token_kl([[0.0, 0.0]], [[0.0, np.log(3.0)]]), 4)  # KL([.5 .5] || [.25 .75])
    0.1438
    """
    ref = _check_logits("ref_logits", ref_logits)
    quant = _check_logits("quant_logits", quant_logits)
    if ref.shape != quant.shape:
        raise ValueError(f"ref_logits has shape {ref.shape} but quant_logits has shape "
                         f"{quant.shape}; they must match")
    log_p, log_q = log_softmax(ref), log_softmax(quant)
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both give a token zero mass
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    kl = terms.sum(axis=-1)
    return kl if per_position else float(kl.mean())


def perplexity(logits, targets) -> float:
    """``exp`` of the mean negative log-likelihood of ``targets`` under ``softmax(logits)``.

    Parameters
    ----------
    logits : array_like
        The model's logits at each position (log-softmax taken in float64).
    targets : array_like of int
        The token that follows each position (for a sequence ``tokens``: ``logits[:-1]``
        against ``tokens[1:]``).

    Returns
    -------
    float
        ``exp(-mean_t log p_t(targets_t))``; 1 for a model sure of every target, the
        vocabulary size for a uniform one.

    Shapes
    ------
    logits : (..., T, V), targets : (..., T) -> ()

    Raises
    ------
    ValueError
        If the shapes do not fit or a target is not in ``[0, V)``.
    TypeError
        If ``targets`` are not integers or the logits not real numbers.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> perplexity(np.zeros((3, 4)), [0, 1, 2])  # uniform over 4 tokens
    4.0
    """
    log_probs = log_softmax(_check_logits("logits", logits))
    targets = np.asarray(targets)
    if not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets must be integer token ids; got dtype {targets.dtype}")
    if targets.shape != log_probs.shape[:-1] or targets.size == 0:
        raise ValueError(f"targets must have shape {log_probs.shape[:-1]} (the logits' shape "
                         f"without V) and not be empty; got {targets.shape}")
    vocab = log_probs.shape[-1]
    if targets.min() < 0 or targets.max() >= vocab:
        raise ValueError(f"targets must lie in [0, {vocab}); got min {targets.min()}, "
                         f"max {targets.max()}")
    picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)
    return float(np.exp(-picked.mean()))
