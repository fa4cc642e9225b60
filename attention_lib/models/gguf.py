"""A small NumPy reader for GGUF files, the weights format of llama.cpp (chapter 16).

A GGUF file is a header, a list of typed key/value pairs (the model's configuration and its
tokenizer), a list of tensor descriptions, then the tensor data, each tensor starting at a
multiple of the file's alignment. Layout (all integers little-endian)::

    magic "GGUF" | version u32 | tensor count u64 | key/value count u64
    key/value pairs: key (string), value type u32, value
    tensor infos: name (string), n_dims u32, ne[0..n_dims) u64, ggml type u32, offset u64
    padding to the alignment, then the data section (tensor offsets count from its start)

A string is a u64 byte length then UTF-8 bytes; an array is an element type u32, a u64
count, then the elements. ``ne[0]`` is the fastest-varying dimension, so a NumPy array has
the reversed shape: a weight with ``ne = [576, 1536]`` is a ``(1536, 576)`` row-major array,
PyTorch's ``(out, in)`` layout.

Weights are often stored quantized. ggml has three families of formats; this module
dequantizes the ones SmolLM2's file uses, ``Q4_0`` (which chapter 17 quantizes to), the two
K-quants that ``llama-quantize`` picks most often, and the plain float types:

- The *legacy* formats cut each row into blocks of 32 numbers, each stored as one or two
  float16 numbers and a small integer code per number:

  - ``Q8_0``: a float16 scale ``s`` and 32 int8 codes ``c``; value ``s * c`` (34 bytes).
  - ``Q4_1``: a float16 scale ``s`` and minimum ``z``, then 16 bytes of 4-bit codes ``c``
    (low nibbles are elements 0-15, high nibbles elements 16-31); value ``s * c + z``
    (20 bytes).
  - ``Q4_0``: a float16 scale ``s``, then 16 bytes of 4-bit codes ``c`` packed as in
    ``Q4_1``; value ``s * (c - 8)`` (18 bytes).

- The *K-quants* cut each row into super-blocks of 256 numbers (``QK_K``), themselves cut
  into sub-blocks with their own small integer scales, which a float16 number per
  super-block scales in turn:

  - ``Q4_K`` (144 bytes, 4.5 bits a number): float16 ``d`` and ``dmin``, 12 bytes holding
    eight 6-bit sub-block scales ``sc`` and eight 6-bit minima ``mn``, then 128 bytes of
    4-bit codes; sub-block ``j`` (32 numbers) reads ``d * sc[j] * c - dmin * mn[j]``.
    Bytes ``32 i .. 32 i + 31`` of the codes hold sub-block ``2 i`` in their low nibbles
    and ``2 i + 1`` in their high nibbles.
  - ``Q6_K`` (210 bytes, 6.5625 bits): 128 bytes of low 4 bits, 64 bytes of high 2 bits,
    sixteen int8 sub-block scales (16 numbers each), then float16 ``d``; value
    ``d * scale[i // 16] * (c - 32)`` with 6-bit codes ``c``.

- The *i-quants* (``IQ2_XXS`` ... ``IQ4_XS``) store indices into fixed codebooks of
  vectors; this module does not read them.

- ``F32`` and ``F16``: stored as they are.

:mod:`attention_lib.models.quantize` (chapter 17) writes the legacy blocks.

ggml calls the scale and the minimum ``d`` and ``m`` (the code below keeps its names).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np

__all__ = ["GGML_TYPES", "GGUFFile", "GGUFTensorInfo", "read_gguf", "dequantize"]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Metadata value types (the GGUF specification's gguf_metadata_value_type).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY = range(10)
_UINT64, _INT64, _FLOAT64 = 10, 11, 12
_SCALAR_DTYPES = {
    _UINT8: np.dtype("<u1"), _INT8: np.dtype("<i1"), _UINT16: np.dtype("<u2"),
    _INT16: np.dtype("<i2"), _UINT32: np.dtype("<u4"), _INT32: np.dtype("<i4"),
    _FLOAT32: np.dtype("<f4"), _BOOL: np.dtype("<u1"), _UINT64: np.dtype("<u8"),
    _INT64: np.dtype("<i8"), _FLOAT64: np.dtype("<f8"),
}
_STRUCT_FORMATS = {_UINT8: "B", _INT8: "b", _UINT16: "H", _INT16: "h", _UINT32: "I",
                   _INT32: "i", _FLOAT32: "f", _BOOL: "B", _UINT64: "Q", _INT64: "q",
                   _FLOAT64: "d"}

GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
"""The ggml tensor types this reader dequantizes, each name mapped to its number in the file."""

_TYPE_NAMES = {number: name for name, number in GGML_TYPES.items()}
# (elements per block, bytes per block) of each supported type.
_BLOCKS = {"F32": (1, 4), "F16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20),
           "Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor lives in a GGUF file and how it is stored.

    Attributes
    ----------
    name : str
        E.g. ``"blk.0.attn_q.weight"``.
    shape : tuple of int
        NumPy (row-major) shape: the file's ``ne`` reversed.
    ggml_type : str
        ``"F32"``, ``"F16"``, ``"Q4_0"``, ``"Q4_1"``, ``"Q8_0"``, ``"Q4_K"`` or ``"Q6_K"``.
    offset : int
        Absolute byte offset of the tensor's data in the file.
    nbytes : int
        Size of the stored (possibly quantized) data in bytes.
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    offset: int
    nbytes: int


@dataclass
class GGUFFile:
    """A parsed GGUF file: its metadata, tensor infos, and (memory-mapped) raw bytes.

    Tensor data is not read until :meth:`tensor` asks for it.

    Attributes
    ----------
    path : str
    version : int
        GGUF version (2 or 3).
    metadata : dict
        Key -> value: ``int``, ``float``, ``bool``, ``str``, a list of ``str`` (string
        arrays such as a tokenizer's vocabulary), a NumPy array (numeric arrays) or a list
        of such (nested arrays).
    tensors : dict
        Tensor name -> :class:`GGUFTensorInfo`, in file order.
    alignment : int
        ``general.alignment`` (32 when absent).
    data_offset : int
        Where the data section starts.

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*.
    """

    path: str
    version: int
    metadata: dict
    tensors: dict[str, GGUFTensorInfo]
    alignment: int
    data_offset: int
    _buffer: np.ndarray = field(repr=False)

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor ``name`` (a read-only view of the mapped file)."""
        info = self._info(name)
        return self._buffer[info.offset:info.offset + info.nbytes]

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        """Tensor ``name`` dequantized to a new ``dtype`` array of its NumPy shape.

        Shapes
        ------
        -> ``GGUFTensorInfo.shape`` (the file's ``ne`` reversed)
        """
        info = self._info(name)
        return dequantize(self.raw(name), info.ggml_type, info.shape).astype(dtype, copy=False)

    def _info(self, name: str) -> GGUFTensorInfo:
        if name not in self.tensors:
            some = ", ".join(list(self.tensors)[:5])
            raise KeyError(f"no tensor named {name!r} in {self.path} ({len(self.tensors)} "
                           f"tensors, e.g. {some})")
        return self.tensors[name]


def dequantize(raw, ggml_type: str, shape) -> np.ndarray:
    """Turn the stored bytes of a tensor into float32 numbers of NumPy ``shape``.

    All blocks are decoded at once (array operations over a ``(n_blocks, block_bytes)``
    view of the bytes), not one block at a time.

    Parameters
    ----------
    raw : array_like of uint8
        The tensor's bytes, as stored.
    ggml_type : str
        ``"F32"``, ``"F16"``, ``"Q4_0"``, ``"Q4_1"``, ``"Q8_0"``, ``"Q4_K"`` or ``"Q6_K"``.
    shape : tuple of int
        NumPy shape of the result; for block types its last axis (the file's ``ne[0]``)
        must be a multiple of the block size (32, or 256 for the K-quants).

    Returns
    -------
    numpy.ndarray of float32

    Shapes
    ------
    raw : (nbytes,) -> shape

    Raises
    ------
    ValueError
        If the type is not supported, ``shape`` does not split into whole blocks, or ``raw``
        does not hold exactly the bytes of ``shape`` (for instance a byte count that is not
        a multiple of the block's bytes).

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*; ``Q4_0``, ``Q4_K`` and ``Q6_K`` in
    chapter 17, *From weights to a chat*. Follows ``dequantize_row_q8_0``,
    ``dequantize_row_q4_1``, ``dequantize_row_q4_0``, ``dequantize_row_q4_K`` (with
    ``get_scale_min_k4``) and ``dequantize_row_q6_K`` of ggml's ``src/ggml-quants.c``, in the
    same float32 operations, so the values are equal to ggml's (and the ``gguf`` package's)
    bit for bit.

    Examples
    --------
    >>> block = np.float16([0.5, 1.0]).tobytes() + bytes([0x21] * 16)  # c = 1 then 2
    >>> dequantize(np.frombuffer(block, np.uint8), "Q4_1", (32,))[[0, 16]]
    array([1.5, 2. ], dtype=float32)
    """
    if ggml_type not in _BLOCKS:
        raise ValueError(f"ggml_type {ggml_type!r} is not supported; this reader knows "
                         f"{sorted(_BLOCKS)}")
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    shape = tuple(int(n) for n in shape)
    count = int(np.prod(shape, dtype=np.int64))
    block_size, block_bytes = _BLOCKS[ggml_type]
    if count % block_size or (shape and shape[-1] % block_size):
        raise ValueError(f"a {ggml_type} tensor needs rows of a multiple of {block_size} "
                         f"numbers; got shape {shape}")
    expected = count // block_size * block_bytes
    if raw.size != expected:
        raise ValueError(f"raw has {raw.size} bytes, but a {ggml_type} tensor of shape {shape} "
                         f"takes {expected} bytes ({block_bytes} per block of {block_size})")
    if ggml_type == "F32":
        return raw.view("<f4").astype(np.float32).reshape(shape)
    if ggml_type == "F16":
        return raw.view("<f2").astype(np.float32).reshape(shape)
    blocks = raw.reshape(-1, block_bytes)  # (n_blocks, block_bytes)
    if ggml_type == "Q4_K":
        return _dequantize_q4_k(blocks).reshape(shape)
    if ggml_type == "Q6_K":
        return _dequantize_q6_k(blocks).reshape(shape)
    if ggml_type == "Q8_0":
        d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # (n_blocks, 1) scales
        q = blocks[:, 2:].view(np.int8).astype(np.float32)  # (n_blocks, 32)
        q *= d
        return q.reshape(shape)
    # Q4_0 and Q4_1: float16 scale d (Q4_1: and minimum m), then 16 bytes holding elements i
    # (low nibble) and i + 16 (high nibble).
    header = 2 if ggml_type == "Q4_0" else 4
    scales = blocks[:, 0:header].copy().view("<f2").astype(np.float32)  # (n_blocks, 1 or 2)
    packed = blocks[:, header:]  # (n_blocks, 16)
    q = np.empty((blocks.shape[0], block_size), dtype=np.uint8)  # (n_blocks, 32)
    np.bitwise_and(packed, 0x0F, out=q[:, :16])
    np.right_shift(packed, 4, out=q[:, 16:])
    if ggml_type == "Q4_0":
        values = q.astype(np.int8)
        values -= 8  # codes 0..15 stand for -8..7
        values = values.astype(np.float32)
        values *= scales  # d * (q - 8)
        return values.reshape(shape)
    values = q.astype(np.float32)
    values *= scales[:, :1]  # d * q
    values += scales[:, 1:]  # + m
    return values.reshape(shape)


def _float16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 number at byte ``start`` of every block, as float32 ``(n_blocks, 1)``."""
    return blocks[:, start:start + 2].copy().view("<f2").astype(np.float32)


def _dequantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    """``dequantize_row_q4_K`` on ``(n, 144)`` blocks -> ``(n, 256)`` float32 values.

    A block is ``d`` (float16), ``dmin`` (float16), 12 bytes of scales, 128 bytes of codes.
    The 12 bytes hold eight 6-bit scales ``sc`` and eight 6-bit minima ``mn``
    (``get_scale_min_k4``): for ``j < 4`` the low 6 bits of bytes ``j`` and ``j + 4``; for
    ``j >= 4`` the nibbles of byte ``j + 4`` (low: ``sc``, high: ``mn``) completed by the top
    2 bits of bytes ``j - 4`` (``sc``) and ``j`` (``mn``).
    """
    n = blocks.shape[0]
    d, dmin = _float16(blocks, 0), _float16(blocks, 2)  # (n, 1) each
    packed = blocks[:, 4:16]  # (n, 12)
    sc = np.empty((n, 8), np.uint8)
    mn = np.empty((n, 8), np.uint8)
    sc[:, :4] = packed[:, 0:4] & 63
    mn[:, :4] = packed[:, 4:8] & 63
    sc[:, 4:] = (packed[:, 8:12] & 0x0F) | ((packed[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (packed[:, 8:12] >> 4) | ((packed[:, 4:8] >> 6) << 4)
    scale = d * sc.astype(np.float32)  # (n, 8): d1 = d * sc, exact in float32
    minimum = dmin * mn.astype(np.float32)  # (n, 8): m1 = min * m
    qs = blocks[:, 16:].reshape(n, 4, 1, 32)  # 4 runs of 32 bytes
    codes = (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # (n, 4, 2, 32)
    codes = codes.reshape(n, 8, 32).astype(np.float32)  # sub-block 2i low, 2i + 1 high
    values = scale[:, :, None] * codes - minimum[:, :, None]  # d1 * q - m1
    return values.reshape(n, 256)


def _dequantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    """``dequantize_row_q6_K`` on ``(n, 210)`` blocks -> ``(n, 256)`` float32 values.

    A block is ``ql`` (128 bytes: low 4 bits), ``qh`` (64 bytes: high 2 bits), 16 int8
    scales, ``d`` (float16). Each half of 128 values uses 64 bytes of ``ql`` and 32 of
    ``qh``: value ``32 k + l`` of the half (``k`` in 0..3, ``l`` in 0..31) takes the low
    (``k`` = 0, 1) or high (``k`` = 2, 3) nibble of ``ql[l + 32 (k % 2)]`` and bits
    ``2k, 2k + 1`` of ``qh[l]``; the 6-bit code minus 32 is multiplied by
    ``d * scales[i // 16]``.
    """
    n = blocks.shape[0]
    ql = blocks[:, :128].reshape(n, 2, 1, 2, 32)  # (half, nibble, k % 2, l)
    low = (ql >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1, 1)) & 0x0F
    low = low.reshape(n, 2, 4, 32)  # k = 2 * nibble + k % 2
    qh = blocks[:, 128:192].reshape(n, 2, 1, 32)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03  # (n, 2, 4, 32)
    codes = (low | (high << 4)).astype(np.int8) - np.int8(32)  # in [-32, 31]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)  # (n, 16)
    d = _float16(blocks, 208)  # (n, 1)
    step = d * scales  # (n, 16): d * sc[is], exact in float32
    values = step[:, :, None] * codes.reshape(n, 16, 16).astype(np.float32)
    return values.reshape(n, 256)


class _Cursor:
    """Reads little-endian values from a buffer, advancing an offset."""

    def __init__(self, buffer, path: str):
        self.buffer, self.offset, self.path = buffer, 0, path

    def unpack(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.offset + size > len(self.buffer):
            raise ValueError(f"{self.path} is truncated: wanted {size} bytes at offset "
                             f"{self.offset} of {len(self.buffer)}")
        values = struct.unpack_from("<" + fmt, self.buffer, self.offset)
        self.offset += size
        return values[0] if len(values) == 1 else values

    def string(self) -> str:
        length = self.unpack("Q")
        end = self.offset + length
        if end > len(self.buffer):
            raise ValueError(f"{self.path} is truncated: a string of {length} bytes at offset "
                             f"{self.offset} runs past the end ({len(self.buffer)} bytes)")
        text = str(self.buffer[self.offset:end], "utf-8")
        self.offset = end
        return text

    def strings(self, count: int) -> list[str]:
        buffer, offset, size, strings = self.buffer, self.offset, len(self.buffer), []
        unpack_length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if offset + 8 > size:
                raise ValueError(f"{self.path} is truncated inside an array of {count} strings")
            end = offset + 8 + unpack_length(buffer, offset)[0]
            if end > size:
                raise ValueError(f"{self.path} is truncated inside an array of {count} strings")
            strings.append(str(buffer[offset + 8:end], "utf-8"))
            offset = end
        self.offset = offset
        return strings

    def value(self, value_type: int):
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element_type, count = self.unpack("IQ")
            if element_type in _SCALAR_DTYPES:  # numbers: one vectorized read
                dtype = _SCALAR_DTYPES[element_type]
                end = self.offset + count * dtype.itemsize
                if end > len(self.buffer):
                    raise ValueError(f"{self.path} is truncated inside an array of {count}")
                array = np.frombuffer(self.buffer, dtype, count, self.offset).copy()
                self.offset = end
                return array.astype(bool) if element_type == _BOOL else array
            if element_type == _STRING:  # e.g. a vocabulary: the hot loop of the header
                return self.strings(count)
            return [self.value(element_type) for _ in range(count)]
        if value_type not in _SCALAR_DTYPES:
            raise ValueError(f"{self.path}: unknown metadata value type {value_type} at offset "
                             f"{self.offset}")
        number = self.unpack(_STRUCT_FORMATS[value_type])
        return bool(number) if value_type == _BOOL else number


def read_gguf(path) -> GGUFFile:
    """Parse a GGUF file's header, metadata and tensor infos; map its data for reading.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    GGUFFile

    Shapes
    ------
    tensor infos carry NumPy shapes: the file's ``(ne[0], ne[1], ...)`` reversed.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the file does not start with the magic ``b"GGUF"``, has an unsupported version,
        is truncated, or a tensor lies outside the file or has an unsupported type.

    Notes
    -----
    Derived in chapter 16, *A real decoder: SmolLM2*. Follows the GGUF specification of
    the ggml project (versions 2 and 3, little-endian).
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no GGUF file at {path}")
    if os.path.getsize(path) < 4:
        raise ValueError(f"{path} is not a GGUF file: it has fewer than 4 bytes")
    buffer = np.memmap(path, dtype=np.uint8, mode="r")
    magic = bytes(buffer[:4])
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    cursor = _Cursor(memoryview(buffer), path)  # memoryview: cheap slices for the header
    cursor.offset = 4
    version = cursor.unpack("I")
    if version not in (2, 3):
        raise ValueError(f"{path} has GGUF version {version}; this reader reads versions 2 and 3")
    tensor_count, kv_count = cursor.unpack("QQ")
    metadata = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.unpack("I"))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    if alignment <= 0 or alignment % 8:
        raise ValueError(f"{path}: general.alignment must be a positive multiple of 8; "
                         f"got {alignment}")
    infos = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.unpack("I")
        ne = [cursor.unpack("Q") for _ in range(n_dims)]
        type_number, offset = cursor.unpack("IQ")
        infos.append((name, tuple(reversed(ne)), type_number, offset))
    data_offset = -(-cursor.offset // alignment) * alignment  # round up to the alignment
    tensors = {}
    for name, shape, type_number, offset in infos:
        if type_number not in _TYPE_NAMES:
            raise ValueError(f"{path}: tensor {name!r} has ggml type {type_number}, which this "
                             f"reader does not dequantize (it knows {GGML_TYPES})")
        ggml_type = _TYPE_NAMES[type_number]
        block_size, block_bytes = _BLOCKS[ggml_type]
        nbytes = int(np.prod(shape, dtype=np.int64)) // block_size * block_bytes
        start = data_offset + offset
        if start + nbytes > len(buffer):
            raise ValueError(f"{path}: tensor {name!r} ({ggml_type}, shape {shape}) runs past "
                             f"the end of the file; is the file truncated?")
        tensors[name] = GGUFTensorInfo(name, shape, ggml_type, start, nbytes)
    return GGUFFile(path, version, metadata, tensors, alignment, data_offset, buffer)
