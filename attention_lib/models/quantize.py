"""Quantize weights the way llama.cpp stores them, and measure what it costs (chapter 17).

ggml has three families of block formats. The *legacy* ones, which this module writes, cut
each row of a weight matrix into blocks of 32 numbers and store every block as a float16
scale (and, for ``Q4_1``, a float16 minimum) plus one small integer code per number:

- ``Q8_0`` (34 bytes a block, 8.5 bits a number): scale ``d = amax / 127`` (``amax`` the
  block's largest magnitude), codes ``c = round(x / d)`` in [-127, 127]; value ``d * c``.
- ``Q4_1`` (20 bytes, 5 bits): scale ``d = (max - min) / 15`` and the minimum, codes
  ``c = trunc((x - min) / d + 0.5)`` in [0, 15]; value ``d * c + min``.
- ``Q4_0`` (18 bytes, 4.5 bits): scale ``d = -x_big / 8`` where ``x_big`` is the entry of
  largest magnitude, sign kept (so it gets code 0, i.e. -8, exactly), codes
  ``c = min(15, trunc(x / d + 8.5))``; value ``d * (c - 8)``.

The *K-quants* (``Q2_K`` ... ``Q6_K``) use super-blocks of 256 numbers whose sub-blocks have
their own 6- or 8-bit scales (and minima), and the *i-quants* (``IQ*``) store indices into
codebooks; :func:`~attention_lib.models.gguf.dequantize` reads ``Q4_K`` and ``Q6_K``, this
module does not write them. Nor does it take an *importance matrix* (llama.cpp's
``--imatrix``: per-column weights, from activations on sample text, that the quantizers of
most formats use to choose scales minimizing a weighted error rather than the plain rules
above).

:func:`quantize` writes exactly the bytes of ggml's reference quantizers
(``quantize_row_q8_0_ref``, ``quantize_row_q4_1_ref``, ``quantize_row_q4_0_ref`` in ggml's
``src/ggml-quants.c``): the same float32 arithmetic, rounding rules and float16 conversion
(round to nearest even). :func:`~attention_lib.models.gguf.dequantize` reads them back.

Which tensor gets which type is llama.cpp's rule, ``llama_tensor_get_type`` in
``src/llama-quant.cpp``: :func:`llama_quantize_types` follows it for a few file types, and
:func:`llama_quantize_model` builds the model ``llama-quantize`` would write, tensor by tensor
from the file (one float32 copy of the model in memory). Its main point for SmolLM2: the
token embedding, which is also the output matrix (tied), is treated as the output tensor and
kept at ``Q6_K``, which falls back to ``Q8_0`` because a row of 576 numbers is not a whole
number of 256-number super-blocks. :func:`quantize_model` instead stores *every* matrix, the
tied one included, as one type (``llama-quantize --pure``). :func:`next_token_kl` and
:func:`perplexity` measure how far a version's predictions moved.

The SmolLM2 file on this machine is itself quantized (its matrices ``Q4_1``, the token
embedding ``Q8_0``, the norms float32), and there is no float16 original here. So the
"unquantized" reference of this chapter is the file's weights dequantized to float32, and
quantizing it again measures the cost of a *second* rounding, starting from a ``Q4_1`` file
(what ``llama-quantize --allow-requantize`` does; without that flag it refuses): a matrix
that was ``Q4_1`` comes back from :func:`quantize` ``(..., "Q4_1")`` bit for bit (tested on
all 210 of them).
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ..softmax import log_softmax
from .gguf import dequantize
from .smollm2 import SmolLM2

__all__ = [
    "LLAMA_FTYPES",
    "QUANTIZE_TYPES",
    "QuantizedFile",
    "llama_quantize_model",
    "llama_quantize_types",
    "next_token_kl",
    "perplexity",
    "quantize",
    "quantize_model",
    "quantized_nbytes",
    "requantized_in_place",
    "round_trip",
]

QUANTIZE_TYPES = ("F32", "F16", "Q8_0", "Q4_1", "Q4_0")
"""The ggml types :func:`quantize` writes: two float types and three block types."""

BLOCK_SIZE = 32
"""Numbers per block of the ``Q*`` types (ggml's ``QK8_0``, ``QK4_0``, ``QK4_1``)."""

# Bytes per block (per number for the float types).
_BLOCK_BYTES = {"F32": 4, "F16": 2, "Q8_0": 34, "Q4_1": 20, "Q4_0": 18}
_FLOAT16_MAX = 65504.0
# (numbers per block, bytes per block) of every type llama_quantize_types can choose
# (ggml-common.h's block structs; tests compare them with the gguf package's table).
_TYPE_SIZES = {"F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20),
               "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q4_K": (256, 144),
               "Q5_K": (256, 176), "Q6_K": (256, 210)}
# Blocks quantized per step: bounds the temporaries (a few float32/float64 copies of a
# chunk, not of a whole 28-million-number embedding); blocks are independent, so the bytes
# are the same.
_CHUNK_BLOCKS = 1 << 15


def _check_type(ggml_type) -> str:
    if ggml_type not in _BLOCK_BYTES:
        raise ValueError(f"ggml_type {ggml_type!r} is not supported; quantize knows "
                         f"{list(QUANTIZE_TYPES)}")
    return ggml_type


def quantized_nbytes(shape, ggml_type: str) -> int:
    """How many bytes a tensor of NumPy ``shape`` takes stored as ``ggml_type``.

    Parameters
    ----------
    shape : tuple of int
        Blocks run along the last axis (the file's ``ne[0]``), which for the ``Q*`` types
        must be a multiple of 32.
    ggml_type : str
        One of :data:`QUANTIZE_TYPES`, or a type :func:`llama_quantize_types` can choose
        (``Q5_0``, ``Q5_1``, ``Q4_K``, ``Q5_K``, ``Q6_K``; 256 numbers a block for the
        K-quants).

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If the type is unknown, ``shape`` has no axis, or its last axis is not a multiple
        of the type's block size.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.

    Examples
    --------
    >>> quantized_nbytes((1536, 576), "Q4_0"), quantized_nbytes((1536, 576), "F16")
    (497664, 1769472)
    """
    if ggml_type not in _TYPE_SIZES:
        raise ValueError(f"ggml_type {ggml_type!r} is not supported; quantized_nbytes knows "
                         f"{list(_TYPE_SIZES)}")
    shape = tuple(int(n) for n in shape)
    _check_last_axis(shape, ggml_type)
    count = int(np.prod(shape, dtype=np.int64))
    block_size, block_bytes = _TYPE_SIZES[ggml_type]
    return count // block_size * block_bytes


def _check_last_axis(shape: tuple, ggml_type: str) -> None:
    if not shape:
        raise ValueError(f"values must have at least one axis (blocks run along the last); "
                         f"got shape {shape}")
    block_size = _TYPE_SIZES[ggml_type][0]
    if shape[-1] % block_size:
        raise ValueError(f"{ggml_type} needs a last axis that is a multiple of {block_size}; "
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
    numbers = array.reshape(-1, BLOCK_SIZE)  # (n_blocks, 32)
    blocks = np.empty((numbers.shape[0], _BLOCK_BYTES[ggml_type]), np.uint8)
    quantizer = _BLOCK_QUANTIZERS[ggml_type]
    for start in range(0, numbers.shape[0], _CHUNK_BLOCKS):  # bounded memory, same bytes
        blocks[start:start + _CHUNK_BLOCKS] = quantizer(numbers[start:start + _CHUNK_BLOCKS])
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
    This is ``llama-quantize --pure``: one type for every matrix, the tied embedding
    included, which llama.cpp's default rule would keep at 8 bits (see
    :func:`llama_quantize_model`). It holds two float32 copies of the model at once.

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


LLAMA_FTYPES = ("F32", "F16", "Q8_0", "Q4_1", "Q4_0", "Q6_K", "Q4_K_M")
"""``llama-quantize`` file types whose layout :func:`llama_quantize_types` reproduces."""

# llama_ftype_get_default_type: the type a file type gives a tensor before the rule adjusts it.
_FTYPE_DEFAULT = {"F32": "F32", "F16": "F16", "Q8_0": "Q8_0", "Q4_1": "Q4_1", "Q4_0": "Q4_0",
                  "Q6_K": "Q6_K", "Q4_K_M": "Q4_K"}
# tensor_type_fallback: a type whose block does not divide a row's length is replaced.
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def _use_more_bits(layer: int, num_layers: int) -> bool:
    """llama-quant.cpp's ``use_more_bits``: the first and last eighth, and every third layer
    in between, get more bits in ``Q4_K_M`` (C integer division)."""
    return (layer < num_layers // 8 or layer >= 7 * num_layers // 8
            or (layer - num_layers // 8) % 3 == 2)


def _layer_of(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def llama_quantize_types(gguf, ftype: str, *, token_embedding_type: str | None = None,
                         pure: bool = False) -> dict[str, str]:
    """The ggml type ``llama-quantize`` gives each tensor of a GGUF file, for ``ftype``.

    This is the part of llama.cpp's rule (``llama_tensor_get_type`` and the helpers it calls
    in ``src/llama-quant.cpp``) that applies to a Llama-style model with no importance matrix
    and one of :data:`LLAMA_FTYPES`:

    1. Only 2-D tensors whose name ends in ``weight`` and that are not norms are quantized;
       the others keep their type (``tensor_allows_quantization``).
    2. ``--token-embedding-type`` overrides the type of ``token_embd.weight``.
    3. A float ``ftype`` (``F32``, ``F16``) gives every quantizable tensor that type.
    4. Otherwise every tensor starts at the ftype's type (``Q4_K`` for ``Q4_K_M``), and,
       unless ``pure``: ``output.weight``, or ``token_embd.weight`` when there is no
       ``output.weight`` (the tied embedding *is* the output matrix), becomes ``Q6_K``, or
       ``Q8_0`` when its rows are not a whole number of the starting type's blocks (a
       ``Q8_0`` file keeps ``Q8_0``); with ``Q4_K_M``, ``attn_v`` and ``ffn_down`` become
       ``Q6_K`` in the layers where ``use_more_bits`` holds.
    5. A type whose block does not divide a row's length falls back
       (``tensor_type_fallback``): ``Q4_K`` to ``Q5_0``, ``Q5_K`` to ``Q5_1``, ``Q6_K`` to
       ``Q8_0``.

    Parameters
    ----------
    gguf : GGUFFile
        The file to quantize (its tensor names, shapes and types).
    ftype : str
        One of :data:`LLAMA_FTYPES`.
    token_embedding_type : str, optional
        ``llama-quantize --token-embedding-type``.
    pure : bool, default False
        ``llama-quantize --pure``: skip step 4's adjustments (every matrix gets the ftype's
        type, the tied embedding included), keep steps 2 and 5.

    Returns
    -------
    dict
        Tensor name -> ggml type, in file order. A tensor whose type equals its type in the
        file is copied unchanged by ``llama-quantize``.

    Raises
    ------
    ValueError
        If ``ftype`` or ``token_embedding_type`` is not supported.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*, from ``src/llama-quant.cpp`` of
    llama.cpp (read at commit 007dbbf3fd17eefe9b47fee45f48f7ba5e62b714). Not covered:
    other architectures' special cases, the i-quant and ``Q2_K``/``Q3_K``/``Q5_K`` file types,
    mixtures of experts, and the rules that depend on an importance matrix (with one, a
    ``Q4_0`` file stores the first eighth of the ``ffn_down`` matrices as ``Q4_1``).
    Tensors are counted in layer order, as llama.cpp's loader sorts them.

    Examples
    --------
    >>> from attention_lib.models.smollm2 import smollm2_path
    >>> from attention_lib.models.gguf import read_gguf
    >>> types = llama_quantize_types(read_gguf(smollm2_path()), "Q4_0")  # doctest: +SKIP
    >>> types["token_embd.weight"], types["blk.0.attn_q.weight"]  # doctest: +SKIP
    ('Q8_0', 'Q4_0')
    """
    if ftype not in _FTYPE_DEFAULT:
        raise ValueError(f"ftype {ftype!r} is not supported; llama_quantize_types knows "
                         f"{list(LLAMA_FTYPES)}")
    if token_embedding_type is not None and token_embedding_type not in _TYPE_SIZES:
        raise ValueError(f"token_embedding_type {token_embedding_type!r} is not supported; "
                         f"use one of {list(_TYPE_SIZES)}")
    default = _FTYPE_DEFAULT[ftype]
    tied = "output.weight" not in gguf.tensors
    num_layers = 1 + max([_layer_of(name) for name in gguf.tensors] + [-1])
    types = {}
    for name, info in gguf.tensors.items():
        quantizable = (len(info.shape) >= 2 and name.endswith("weight")
                       and "_norm.weight" not in name)
        if not quantizable:
            types[name] = info.ggml_type
            continue
        if token_embedding_type is not None and name == "token_embd.weight":
            types[name] = token_embedding_type
            continue
        new_type = default
        if default not in ("F32", "F16"):
            row = info.shape[-1]  # the file's ne[0]
            if not pure:
                if name == "output.weight" or (tied and name == "token_embd.weight"):
                    if row % _TYPE_SIZES[new_type][0]:
                        new_type = "Q8_0"
                    elif new_type != "Q8_0":
                        new_type = "Q6_K"
                elif ftype == "Q4_K_M" and (name.endswith("attn_v.weight")
                                            or name.endswith("ffn_down.weight")):
                    if _use_more_bits(_layer_of(name), num_layers):
                        new_type = "Q6_K"
            if row % _TYPE_SIZES[new_type][0]:
                new_type = _FALLBACK.get(new_type, new_type)
                if row % _TYPE_SIZES[new_type][0]:
                    new_type = "F16"
        types[name] = new_type
    return types


@dataclasses.dataclass(frozen=True)
class QuantizedFile:
    """What :func:`llama_quantize_model` stored: each tensor's type and the total size.

    Attributes
    ----------
    types : dict
        Tensor name -> ggml type, as :func:`llama_quantize_types` chose it.
    nbytes : int
        Bytes of all the tensors stored that way (the file's data section without padding).
    requantized : tuple of str
        The tensors whose type changed, which were dequantized and quantized again; every
        other tensor is the file's, unchanged.
    """

    types: dict
    nbytes: int
    requantized: tuple


class _RequantizedFile:
    """A stand-in for a GGUFFile whose tensors read back as ``llama-quantize`` stores them."""

    def __init__(self, gguf, types: dict):
        self._gguf, self._types = gguf, types
        self.metadata, self.tensors = gguf.metadata, gguf.tensors

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        values = self._gguf.tensor(name)  # float32, as the file stores it
        if self._types[name] != self._gguf.tensors[name].ggml_type:
            values = round_trip(values, self._types[name])  # blocks along ne[0], as in a file
        return values.astype(dtype, copy=False)


def _requantize_plan(gguf, ftype, token_embedding_type, pure, allow_requantize):
    """(type of every tensor, names whose type changes), refusing what llama-quantize refuses
    (a quantized tensor without ``allow_requantize``) and what :func:`quantize` cannot write."""
    types = llama_quantize_types(gguf, ftype, token_embedding_type=token_embedding_type,
                                 pure=pure)
    requantized = tuple(name for name, new_type in types.items()
                        if new_type != gguf.tensors[name].ggml_type)
    for name in requantized:
        old, new = gguf.tensors[name].ggml_type, types[name]
        if old not in ("F32", "F16") and not allow_requantize:
            raise ValueError(f"{name} is stored as {old}: requantizing it to {new} needs "
                             "allow_requantize=True (llama-quantize refuses it without "
                             "--allow-requantize: the file is not the original weights)")
        if new not in _BLOCK_BYTES:
            raise ValueError(f"llama-quantize would store {name} as {new}, which quantize "
                             f"cannot write (it writes {list(QUANTIZE_TYPES)})")
    return types, requantized


def llama_quantize_model(gguf, ftype: str, *, token_embedding_type: str | None = None,
                         pure: bool = False, allow_requantize: bool = False,
                         dtype=np.float32) -> tuple[SmolLM2, QuantizedFile]:
    """The SmolLM2 that ``llama-quantize`` would write for ``ftype``, read back to ``dtype``.

    Each tensor gets the type :func:`llama_quantize_types` gives it. A tensor whose type does
    not change is the file's, unchanged; any other is dequantized to float32 and stored in
    its new type (:func:`round_trip`), as ``llama-quantize`` does. The model is built by
    :meth:`SmolLM2.from_gguf <attention_lib.models.smollm2.SmolLM2.from_gguf>`, one tensor at
    a time: one copy of the model in memory, plus one tensor's temporaries.

    Parameters
    ----------
    gguf : GGUFFile
        E.g. ``read_gguf(smollm2_path())``.
    ftype : str
        One of :data:`LLAMA_FTYPES`.
    token_embedding_type : str, optional
        ``--token-embedding-type``: the token embedding's type, overriding the rule.
    pure : bool, default False
        ``--pure``: every matrix gets the ftype's type, the tied embedding included.
    allow_requantize : bool, default False
        ``--allow-requantize``: without it, as in ``llama-quantize``, a tensor already
        stored in a quantized type may not be quantized again.
    dtype : numpy dtype, default float32
        The model's dtype.

    Returns
    -------
    model : SmolLM2
    stored : QuantizedFile
        Each tensor's type, the size of the tensors stored that way, which were requantized.

    Raises
    ------
    ValueError
        If the arguments are not supported, a quantized tensor would be requantized without
        ``allow_requantize``, or a tensor would get a type :func:`quantize` cannot write
        (the K-quants, ``Q5_0``, ``Q5_1``).

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*.
    """
    types, requantized = _requantize_plan(gguf, ftype, token_embedding_type, pure,
                                          allow_requantize)
    nbytes = sum(quantized_nbytes(info.shape, types[name])
                 for name, info in gguf.tensors.items())
    model = SmolLM2.from_gguf(_RequantizedFile(gguf, types), dtype)
    return model, QuantizedFile(types, nbytes, requantized)


_LAYER_MATRICES = {"attn_q": ("self_attn", "W_q"), "attn_k": ("self_attn", "W_k"),
                   "attn_v": ("self_attn", "W_v"), "attn_output": ("self_attn", "W_o"),
                   "ffn_gate": ("ff", "W_gate"), "ffn_up": ("ff", "W_up"),
                   "ffn_down": ("ff", "W_down")}


def _model_array(model: SmolLM2, name: str) -> tuple[np.ndarray, bool]:
    """The model's array for file tensor ``name``, and whether it is stored transposed."""
    if name == "token_embd.weight":
        return model.embedding, False  # (V, d_model), as in the file
    parts = name.split(".")  # blk.{i}.{kind}.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_MATRICES:
        layer, field = _LAYER_MATRICES[parts[2]]
        return getattr(getattr(model.blocks[int(parts[1])], layer), field), True  # (in, out)
    raise ValueError(f"requantized_in_place does not know where {name} lives in the model")


@contextlib.contextmanager
def requantized_in_place(model: SmolLM2, gguf, ftype: str, *,
                         token_embedding_type: str | None = None, pure: bool = False,
                         allow_requantize: bool = False):
    """Inside the ``with`` block, ``model`` computes with the weights ``llama-quantize`` would
    write for ``ftype``; on leaving it, the file's weights are back, bit for bit.

    The same versions as :func:`llama_quantize_model`, without a second copy of the model:
    every tensor whose type changes is overwritten in place, one at a time, by its round
    trip through the new type, and restored from the file at the end (also after an error).
    ``model`` must be the file's model, ``SmolLM2.from_gguf(gguf)``.

    Parameters
    ----------
    model : SmolLM2
    gguf : GGUFFile
    ftype, token_embedding_type, pure, allow_requantize
        As :func:`llama_quantize_model`.

    Yields
    ------
    QuantizedFile
        Each tensor's type, the size, which tensors were requantized.

    Raises
    ------
    ValueError
        As :func:`llama_quantize_model`.

    Notes
    -----
    Derived in chapter 17, *From weights to a chat*, where the page keeps one float32 copy
    of the model in memory.
    """
    if not isinstance(model, SmolLM2):
        raise TypeError(f"model must be a SmolLM2; got {type(model).__name__}")
    types, requantized = _requantize_plan(gguf, ftype, token_embedding_type, pure,
                                          allow_requantize)
    for name in requantized:
        _model_array(model, name)  # every target exists before anything changes
    nbytes = sum(quantized_nbytes(info.shape, types[name])
                 for name, info in gguf.tensors.items())
    done = []
    try:
        for name in requantized:
            array, transposed = _model_array(model, name)
            values = round_trip(gguf.tensor(name), types[name])  # (out, in), as in the file
            array[...] = values.T if transposed else values
            done.append(name)
        yield QuantizedFile(types, nbytes, requantized)
    finally:
        for name in done:
            array, transposed = _model_array(model, name)
            values = gguf.tensor(name)
            array[...] = values.T if transposed else values


def _check_logits(name: str, logits) -> np.ndarray:
    logits = np.asarray(logits)
    if not (np.issubdtype(logits.dtype, np.floating) or np.issubdtype(logits.dtype, np.integer)):
        raise TypeError(f"{name} must be real numbers; got dtype {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{name} must have shape (..., V) with V >= 1; got {logits.shape}")
    return logits


# Positions per step: float64 copies of a few rows of logits at a time, not of all of them
# (64 x 49,152 logits in float64 are 25 MB, and the KL needs several such arrays). Each
# position is computed on its own, so the values are the same.
_ROWS = 8


def _kl_rows(ref: np.ndarray, quant: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(quant)) of each row, in float64: (n, V) -> (n,)."""
    log_p = log_softmax(ref.astype(np.float64))
    log_q = log_softmax(quant.astype(np.float64))
    p = np.exp(log_p)
    with np.errstate(invalid="ignore"):  # -inf - -inf where both give a token zero mass
        terms = np.where(p > 0, p * (log_p - log_q), 0.0)
    return terms.sum(axis=-1)


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
    --kl-divergence`` computes the same per-position KL, but averages it only over the
    second half of each context chunk it scores (``first = n_ctx/2`` in
    ``tools/perplexity/perplexity.cpp``), as it does for the perplexity; pass it those
    positions to get its number.

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
    ref_rows = ref.reshape(-1, ref.shape[-1])  # (positions, V)
    quant_rows = quant.reshape(-1, quant.shape[-1])
    kl = np.empty(ref_rows.shape[0])
    for start in range(0, kl.size, _ROWS):
        kl[start:start + _ROWS] = _kl_rows(ref_rows[start:start + _ROWS],
                                           quant_rows[start:start + _ROWS])
    kl = kl.reshape(ref.shape[:-1])
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
    logits = _check_logits("logits", logits)
    targets = np.asarray(targets)
    if not np.issubdtype(targets.dtype, np.integer):
        raise TypeError(f"targets must be integer token ids; got dtype {targets.dtype}")
    if targets.shape != logits.shape[:-1] or targets.size == 0:
        raise ValueError(f"targets must have shape {logits.shape[:-1]} (the logits' shape "
                         f"without V) and not be empty; got {targets.shape}")
    vocab = logits.shape[-1]
    if targets.min() < 0 or targets.max() >= vocab:
        raise ValueError(f"targets must lie in [0, {vocab}); got min {targets.min()}, "
                         f"max {targets.max()}")
    rows, ids = logits.reshape(-1, vocab), targets.reshape(-1, 1)  # (positions, V), (positions, 1)
    picked = np.empty(ids.shape)
    for start in range(0, ids.shape[0], _ROWS):  # a few rows in float64 at a time
        log_probs = log_softmax(rows[start:start + _ROWS].astype(np.float64))
        picked[start:start + _ROWS] = np.take_along_axis(log_probs, ids[start:start + _ROWS],
                                                         axis=-1)
    picked = picked.reshape(*targets.shape, 1)
    return float(np.exp(-picked.mean()))
