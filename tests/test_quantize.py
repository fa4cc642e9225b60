"""Quantizing weights as ggml does (chapter 17): bytes, error bounds, the real file, the model.

The bounds below follow from the reference quantizers in ggml's ``src/ggml-quants.c``
(``quantize_row_q8_0_ref``, ``quantize_row_q4_1_ref``, ``quantize_row_q4_0_ref``). Each block
computes a float32 scale ``d`` (and ``Q4_1`` a minimum ``min``), picks codes from ``d``, but
*stores* the scale rounded to float16, ``d16``, and that is what dequantizing multiplies by.
So an entry's error is the rounding of its code (at most ``d / 2``, or ``|d|`` where ``Q4_0``
clamps) plus ``|code| * |d - d16|`` (plus ``|min - m16|`` for ``Q4_1``), plus a few float32
roundings, bounded by ``SLACK`` ulps of the block's largest magnitude.

The ``gguf`` package (pinned ``gguf==0.19.0``, a test-only dependency) ships NumPy
quantizers written to match ggml's bit for bit; the byte comparison with it skips when it is
not installed. Tests on the real file use the SmolLM2 weights guard of ``model_helpers``.
"""

from __future__ import annotations

import importlib.util
import os
import struct

import numpy as np
import pytest
from model_helpers import HAVE_SMOLLM2_WEIGHTS, SMOLLM2_WEIGHTS_INSTALL

from attention_lib.models.gguf import GGML_TYPES, GGUFTensorInfo, dequantize, read_gguf
from attention_lib.models.quantize import (
    LLAMA_FTYPES,
    QUANTIZE_TYPES,
    llama_quantize_model,
    llama_quantize_types,
    next_token_kl,
    perplexity,
    quantize,
    quantize_model,
    quantized_nbytes,
    requantized_in_place,
    round_trip,
)

EPS32 = float(np.finfo(np.float32).eps)
SLACK = 4 * EPS32  # float32 roundings of x * id, x - min, c * d16 (+ m16): a few ulps
HAVE_GGUF_PACKAGE = importlib.util.find_spec("gguf") is not None
GGUF_PACKAGE_PIN = "pip install gguf==0.19.0"
if os.environ.get("CI") and not HAVE_GGUF_PACKAGE:  # scripts/test.sh installs it
    raise RuntimeError(f"CI must install the `gguf` package ({GGUF_PACKAGE_PIN})")
BLOCK_BYTES = {"Q8_0": 34, "Q4_1": 20, "Q4_0": 18}


def random_rows(rng, rows=256, blocks=8):
    """Normal numbers whose scale varies by row over six orders of magnitude."""
    scales = 10.0 ** rng.uniform(-4, 2, size=(rows, 1))
    return (rng.normal(size=(rows, 32 * blocks)) * scales).astype(np.float32)


def split_blocks(raw, ggml_type):
    """Stored bytes -> (scale d16 (n,), minimum m16 (n,) or None, codes (n, 32))."""
    blocks = np.asarray(raw).reshape(-1, BLOCK_BYTES[ggml_type])
    d16 = blocks[:, :2].copy().view("<f2")[:, 0].astype(np.float64)
    if ggml_type == "Q8_0":
        return d16, None, blocks[:, 2:].view(np.int8).astype(np.int64)
    header = 4 if ggml_type == "Q4_1" else 2
    m16 = blocks[:, 2:4].copy().view("<f2")[:, 0].astype(np.float64) if header == 4 else None
    packed = blocks[:, header:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.int64)
    return d16, m16, codes


# --- the error bounds ------------------------------------------------------------------------

def test_q8_0_error_is_at_most_half_a_step_plus_the_float16_scale_error():
    """Q8_0: d = amax / 127, c = roundf(x / d), x_hat = c * d16, so
    |x - x_hat| <= d / 2 + |c| * |d - d16| + SLACK * amax."""
    x = random_rows(np.random.default_rng(0))
    raw = quantize(x, "Q8_0")
    d16, _, codes = split_blocks(raw, "Q8_0")
    blocks = x.reshape(-1, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=1)
    d = amax / 127
    error = np.abs(blocks - dequantize(raw, "Q8_0", x.shape).reshape(-1, 32))
    bound = d[:, None] / 2 + np.abs(codes) * np.abs(d - d16)[:, None] + SLACK * amax[:, None]
    assert np.all(error <= bound)
    # Rounding to nearest, not truncating: the worst code error comes close to half a step.
    assert (error / d[:, None]).max() > 0.45
    assert np.all(np.abs(codes).max(axis=1) == 127)  # the largest entry gets +-127


def test_q4_1_error_is_at_most_half_a_step_plus_the_float16_errors():
    """Q4_1: d = (max - min) / 15, c = min(15, trunc((x - min) / d + 0.5)), x_hat = c * d16 +
    m16, so |x - x_hat| <= d / 2 + c * |d - d16| + |min - m16| + SLACK * (amax + max - min)."""
    x = random_rows(np.random.default_rng(1))
    raw = quantize(x, "Q4_1")
    d16, m16, codes = split_blocks(raw, "Q4_1")
    blocks = x.reshape(-1, 32).astype(np.float64)
    low, high = blocks.min(axis=1), blocks.max(axis=1)
    d = (high - low) / 15
    error = np.abs(blocks - dequantize(raw, "Q4_1", x.shape).reshape(-1, 32))
    slack = SLACK * (np.abs(blocks).max(axis=1) + high - low)
    bound = (d / 2 + np.abs(low - m16) + slack)[:, None] + codes * np.abs(d - d16)[:, None]
    assert np.all(error <= bound)
    assert (error / d[:, None]).max() > 0.45
    rows = np.arange(len(blocks))
    assert np.all(codes[rows, blocks.argmin(axis=1)] == 0)  # the minimum is code 0
    assert np.all(codes[rows, blocks.argmax(axis=1)] == 15)  # the maximum code 15
    assert codes.min() >= 0 and codes.max() <= 15


def test_q4_0_error_is_half_a_step_except_where_the_code_clamps_at_15():
    """Q4_0: d = x_big / -8 (x_big the entry of largest magnitude), c = min(15, trunc(x / d +
    8.5)), x_hat = (c - 8) * d16. Where x / d < 7.5 the code rounds, |x / d - (c - 8)| <= 1/2;
    entries of the other sign with x / d >= 7.5 are clamped to c = 15 and miss by up to |d|.
    So |x - x_hat| <= |d| * max(1/2, x / d - 7) + |c - 8| * |d - d16| + SLACK * amax."""
    x = random_rows(np.random.default_rng(2))
    raw = quantize(x, "Q4_0")
    d16, _, codes = split_blocks(raw, "Q4_0")
    blocks = x.reshape(-1, 32).astype(np.float64)
    rows = np.arange(len(blocks))
    x_big = blocks[rows, np.abs(blocks).argmax(axis=1)]
    d = x_big / -8
    ratio = blocks / d[:, None]
    error = np.abs(blocks - dequantize(raw, "Q4_0", x.shape).reshape(-1, 32))
    bound = (np.abs(d)[:, None] * np.maximum(0.5, ratio - 7)
             + np.abs(codes - 8) * np.abs(d - d16)[:, None]
             + SLACK * np.abs(x_big)[:, None])
    assert np.all(error <= bound)
    assert np.all(codes[rows, np.abs(blocks).argmax(axis=1)] == 0)  # x_big is -8 * d exactly
    assert codes.min() >= 0 and codes.max() <= 15


def test_q4_0_clamps_the_opposite_extreme_to_seven_steps():
    block = np.zeros(32, np.float32)
    block[0], block[1] = 1.0, -1.0  # x_big = 1 (the first), d = -1/8; -1 / d = 8 -> code 15
    raw = quantize(block, "Q4_0")
    assert raw[:2].view("<f2")[0] == np.float16(-0.125)
    values = dequantize(raw, "Q4_0", (32,))
    assert values[0] == 1.0 and values[1] == -0.875  # (15 - 8) * -0.125, off by |d|


def test_rounding_rules_of_the_c_code():
    # Q8_0 rounds halves away from zero (C roundf), where np.round would pick the even code.
    block = np.zeros(32, np.float32)
    block[:5] = [127.0, 2.5, -2.5, 3.5, 0.5]  # d = 1, id = 1
    codes = quantize(block, "Q8_0")[2:7].view(np.int8)
    assert codes.tolist() == [127, 3, -3, 4, 1]
    # Q4_1 adds 0.5 and truncates: halves round up.
    block = np.zeros(32, np.float32)
    block[:4] = [15.0, 2.5, 2.4999998, 7.5]  # min 0, max 15: d = 1
    _, _, codes = split_blocks(quantize(block, "Q4_1"), "Q4_1")
    assert codes[0, :4].tolist() == [15, 3, 2, 8]
    # Q4_0 adds 8.5 and truncates: halves round toward +infinity (2.5 -> 3, -2.5 -> -2).
    block = np.zeros(32, np.float32)
    block[:3] = [-8.0, 2.5, -2.5]  # x_big = -8: d = 1
    values = round_trip(block, "Q4_0")
    assert values[:3].tolist() == [-8.0, 3.0, -2.0]


def test_the_scale_is_stored_rounded_to_float16():
    block = np.linspace(-1, 1, 32, dtype=np.float32)
    block[0] = -1.2345678  # amax
    raw = quantize(block, "Q8_0")
    d32 = np.float32(1.2345678) / np.float32(127)
    assert raw[:2].tobytes() == d32.astype("<f2").tobytes()
    assert raw[:2].view("<f2")[0] != d32  # float16 drops the low bits


def test_all_zero_and_constant_blocks():
    zeros = np.zeros((2, 32), np.float32)
    assert not quantize(zeros, "Q8_0").any()
    assert not quantize(zeros, "Q4_1").any()
    # Q4_0 keeps max = 0.0f, so d = 0.0f / -8 = -0.0 (bytes 00 80) and every code is 8.
    assert quantize(zeros[0], "Q4_0").tolist() == [0x00, 0x80] + [0x88] * 16
    for ggml_type in ("Q8_0", "Q4_1", "Q4_0"):
        restored = round_trip(zeros, ggml_type)
        assert np.array_equal(restored, zeros) and restored.dtype == np.float32
    constant = np.full(32, 0.3, np.float32)  # Q4_1: d = 0, every value its float16 minimum
    assert np.all(round_trip(constant, "Q4_1") == np.float32(0.3).astype(np.float16))


@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_1", "Q4_0", "F16"])
def test_quantizing_a_round_trip_again_changes_nothing(ggml_type):
    """Stored values are fixed points: their block's extremes are exact multiples of the
    stored scale (Q8_0: amax' = 127 * d16, so d' = d16; Q4_0: x_big' = -8 * d16; Q4_1:
    min' = m16 and max' = 15 * d16 + m16 up to a float32 rounding that float16 absorbs), so
    every code comes back. (Exceptions: a scale that float16 flushes to zero, below, and
    Q4_1 blocks whose range is a few float32 ulps of their minimum.)"""
    x = random_rows(np.random.default_rng(7), rows=512)
    raw = quantize(x, ggml_type)
    assert np.array_equal(quantize(dequantize(raw, ggml_type, x.shape), ggml_type), raw)


def test_a_scale_below_float16s_range_flushes_the_block_to_zero():
    # Q8_0: amax = 2e-6 gives d = 1.6e-8, under half float16's smallest step 2**-24 ~ 6e-8:
    # the scale is stored as 0 while the codes are not, and the block reads back as zeros.
    block = np.full(32, 1e-6, np.float32)
    block[0] = -2e-6
    raw = quantize(block, "Q8_0")
    codes = raw[2:].view(np.int8)
    assert raw[:2].tolist() == [0, 0] and codes[0] == -127 and codes[1:].min() > 60
    assert not round_trip(block, "Q8_0").any()


def test_float_types_are_the_plain_bytes():
    x = np.float32([[1.5, -2.0], [3.0e-3, 7.0]])
    assert np.array_equal(quantize(x, "F32"), x.astype("<f4").view(np.uint8))
    assert quantize(x, "F16").shape == (2, 4)
    assert np.array_equal(round_trip(x, "F16"), x.astype(np.float16).astype(np.float32))
    assert np.array_equal(round_trip(x.astype(np.float64), "F32"), x)


# --- shapes, sizes, bad input ------------------------------------------------------------------

@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_1", "Q4_0"])
def test_shapes_and_rows_are_independent(ggml_type):
    x = random_rows(np.random.default_rng(3), rows=6, blocks=3).reshape(2, 3, 96)
    raw = quantize(x, ggml_type)
    assert raw.dtype == np.uint8 and raw.shape == (2, 3, 3 * BLOCK_BYTES[ggml_type])
    assert raw.size == quantized_nbytes(x.shape, ggml_type)
    assert np.array_equal(raw[1, 2], quantize(x[1, 2], ggml_type))  # blocks never cross rows
    assert np.array_equal(quantize(x.astype(np.float64), ggml_type), raw)  # float32 first
    assert round_trip(x, ggml_type).shape == x.shape


def test_quantized_nbytes_of_smollm2_matrices():
    assert quantized_nbytes((1536, 576), "Q8_0") == 1536 * 18 * 34
    assert quantized_nbytes((1536, 576), "Q4_1") == 1536 * 18 * 20
    assert quantized_nbytes((1536, 576), "Q4_0") == 1536 * 18 * 18
    assert quantized_nbytes((576,), "F32") == 2304
    assert quantized_nbytes((3, 5), "F16") == 30
    assert QUANTIZE_TYPES == ("F32", "F16", "Q8_0", "Q4_1", "Q4_0")


def test_bad_input_raises_clear_errors():
    x = np.ones(32, np.float32)
    with pytest.raises(ValueError, match="'Q5_K' is not supported"):
        quantize(x, "Q5_K")
    with pytest.raises(ValueError, match="'q8_0' is not supported"):
        quantize(x, "q8_0")
    with pytest.raises(ValueError, match=r"multiple of 32; got shape \(2, 33\)"):
        quantize(np.ones((2, 33)), "Q4_0")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantized_nbytes((4, 48), "Q8_0")
    with pytest.raises(ValueError, match="at least one axis"):
        quantize(np.float32(1.0), "F32")
    bad = x.copy()
    bad[5] = np.nan
    with pytest.raises(ValueError, match="1 are not .the first at flat index 5"):
        quantize(bad, "Q4_1")
    bad[5] = np.inf
    with pytest.raises(ValueError, match="must be finite"):
        quantize(bad, "Q8_0")
    with pytest.raises(ValueError, match="must be finite"):  # beyond float32: inf
        quantize(np.full(32, 1e39), "Q8_0")
    # A scale beyond float16's 65504 would be stored as infinity.
    with pytest.raises(ValueError, match="scale 1.25e.06 overflows float16"):
        quantize(np.full(32, -1e7, np.float32), "Q4_0")
    with pytest.raises(ValueError, match="minimum .* overflows float16"):
        quantize(np.full(32, -7e4, np.float32), "Q4_1")
    with pytest.raises(ValueError, match="overflows float16"):
        quantize(np.full(4, 7e4), "F16")
    with pytest.raises(TypeError, match="real numbers; got dtype complex128"):
        quantize(np.ones(32, complex), "Q8_0")


def test_q4_0_dequantize_reads_the_block_layout():
    """An independent, slow reading of a Q4_0 block: float16 d, then code j in the low nibble
    of byte j and code j + 16 in its high nibble; value d * (code - 8)."""
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 16, size=32)
    block = struct.pack("<e", 0.375) + bytes(int(codes[j] | codes[j + 16] << 4)
                                            for j in range(16))
    values = dequantize(np.frombuffer(block, np.uint8), "Q4_0", (32,))
    assert values.tolist() == [0.375 * (int(c) - 8) for c in codes]
    assert GGML_TYPES["Q4_0"] == 2
    with pytest.raises(ValueError, match="raw has 18 bytes, but .* takes 36 bytes"):
        dequantize(np.frombuffer(block, np.uint8), "Q4_0", (2, 32))


# --- against the gguf package ------------------------------------------------------------------

@pytest.mark.skipif(not HAVE_GGUF_PACKAGE,
                    reason=f"the `gguf` package is not installed ({GGUF_PACKAGE_PIN})")
@pytest.mark.parametrize("ggml_type", ["Q8_0", "Q4_1", "Q4_0", "F16"])
def test_bytes_equal_the_gguf_package(ggml_type):
    import gguf

    x = random_rows(np.random.default_rng(5), rows=512)
    qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
    expected = np.asarray(gguf.quants.quantize(x, qtype)).view(np.uint8)
    mine = quantize(x, ggml_type)
    assert mine.shape == expected.shape and np.array_equal(mine, expected)
    np.testing.assert_array_equal(dequantize(mine, ggml_type, x.shape),
                                  gguf.quants.dequantize(expected, qtype))


# --- the real file -------------------------------------------------------------------------------

needs_weights = pytest.mark.skipif(not HAVE_SMOLLM2_WEIGHTS,
                                   reason=f"weights not installed ({SMOLLM2_WEIGHTS_INSTALL})")


@pytest.fixture(scope="module")
def smollm2_file():
    if not HAVE_SMOLLM2_WEIGHTS:
        pytest.skip(f"weights not installed ({SMOLLM2_WEIGHTS_INSTALL})")
    from attention_lib.models.smollm2 import smollm2_path

    return read_gguf(smollm2_path())


@pytest.fixture(scope="module")
def model(smollm2_file):
    from attention_lib.models.smollm2 import SmolLM2

    return SmolLM2.from_gguf(smollm2_file)


@needs_weights
def test_requantizing_the_file_reproduces_every_stored_byte(smollm2_file):
    """Dequantize each quantized tensor of the file and quantize it again: the bytes come
    back unchanged, for the Q8_0 embedding and all 210 Q4_1 matrices."""
    checked = {"Q8_0": 0, "Q4_1": 0}
    for name, info in smollm2_file.tensors.items():
        if info.ggml_type not in checked:
            continue
        values = smollm2_file.tensor(name)
        again = quantize(values, info.ggml_type)
        assert np.array_equal(again.reshape(-1), smollm2_file.raw(name)), name
        checked[info.ggml_type] += 1
    assert checked == {"Q8_0": 1, "Q4_1": 210}


@needs_weights
def test_quantize_model_layout_sizes_and_no_mutation(smollm2_file, model):
    before = [model.embedding[:2].copy(), model.blocks[0].self_attn.W_q.copy(),
              model.blocks[29].ff.W_down.copy()]
    q4_1, nbytes = quantize_model(model, "Q4_1")
    # The file's matrices are Q4_1 already: storing them as Q4_1 again changes nothing...
    for ours, theirs in zip(q4_1.blocks, model.blocks):
        assert np.array_equal(ours.self_attn.W_k, theirs.self_attn.W_k)
        assert np.array_equal(ours.ff.W_down, theirs.ff.W_down)
        assert ours.ff.W_down.flags.c_contiguous and ours.ff.W_down.shape == (1536, 576)
        assert not np.shares_memory(ours.ff.W_down, theirs.ff.W_down)
        assert not np.shares_memory(ours.norm1.gamma, theirs.norm1.gamma)
    # ...but the Q8_0 embedding moves (and the output layer, tied to it, with it).
    assert not np.array_equal(q4_1.embedding, model.embedding)
    assert np.shares_memory(q4_1.W_out, q4_1.embedding)
    # The size: the file's bytes with the embedding at 20 bytes per 32 instead of 34.
    file_bytes = sum(info.nbytes for info in smollm2_file.tensors.values())
    embedding = smollm2_file.tensors["token_embd.weight"]
    assert nbytes == file_bytes - embedding.nbytes + quantized_nbytes(embedding.shape, "Q4_1")
    q8_0, q8_bytes = quantize_model(model, "Q8_0")
    assert np.array_equal(q8_0.embedding, model.embedding)  # Q8_0 already
    # Blocks of 32 run along each matrix's input axis (the rows of the file's (out, in)).
    W_q = model.blocks[0].self_attn.W_q
    assert np.array_equal(q8_0.blocks[0].self_attn.W_q, round_trip(W_q.T, "Q8_0").T)
    assert not np.array_equal(q8_0.blocks[0].self_attn.W_q, round_trip(W_q, "Q8_0"))
    assert quantize_model(model, "F32")[1] == 4 * model.num_parameters
    assert q8_bytes == 34 * (model.num_parameters - 61 * 576) // 32 + 4 * 61 * 576
    for array, copy in zip([model.embedding[:2], model.blocks[0].self_attn.W_q,
                            model.blocks[29].ff.W_down], before):
        assert np.array_equal(array, copy)
    with pytest.raises(TypeError, match="model must be a SmolLM2"):
        quantize_model(model.blocks[0], "Q8_0")
    with pytest.raises(ValueError, match="'Q2_K' is not supported"):
        quantize_model(model, "Q2_K")


@needs_weights
def test_fewer_bits_move_the_predictions_more(model):
    tokens = np.array([[504, 314, 28, 355, 441, 288, 314, 28, 527, 314, 260, 1789]])
    reference = model(tokens)
    kl = {ggml_type: next_token_kl(reference, quantize_model(model, ggml_type)[0](tokens))
          for ggml_type in ("F16", "Q8_0", "Q4_0")}
    assert 0 < kl["F16"] < kl["Q8_0"] < kl["Q4_0"]


def test_committed_measurement_matches_the_library(smollm2_file):
    """attention_lib/data/smollm2_quantization.json (scripts/measure_quantization.py): its
    sizes and layouts are the library's rule applied to the file, its text starts at chapter
    14's validation cut, its summaries are the means of its windows, and the 8-bit tied
    embedding is what separates the Q4_0 layout from --pure."""
    import json

    from attention_lib.training.gpt import DATA_DIR, load_shakespeare_text

    results = json.loads((DATA_DIR / "smollm2_quantization.json").read_text())
    versions = results["versions"]
    assert list(versions) == ["reference (Q4_1 file)", "F16", "Q8_0", "Q4_0", "Q4_0 --pure",
                              "Q4_1 + Q4_0 embedding"]
    arguments = {"F16": ("F16", {}), "Q8_0": ("Q8_0", {}), "Q4_0": ("Q4_0", {}),
                 "Q4_0 --pure": ("Q4_0", {"pure": True}),
                 "Q4_1 + Q4_0 embedding": ("Q4_1", {"token_embedding_type": "Q4_0"})}
    for name, (ftype, kwargs) in arguments.items():
        types = llama_quantize_types(smollm2_file, ftype, **kwargs)
        row = versions[name]
        assert row["nbytes"] == sum(quantized_nbytes(info.shape, types[tensor])
                                    for tensor, info in smollm2_file.tensors.items()), name
        changed = sum(types[tensor] != info.ggml_type
                      for tensor, info in smollm2_file.tensors.items())
        assert row["requantized_tensors"] == changed, name
    assert versions["Q4_0"]["requantized_tensors"] == 210  # the embedding stays Q8_0
    assert versions["Q4_0 --pure"]["requantized_tensors"] == 211
    assert versions["Q4_1 + Q4_0 embedding"]["requantized_tensors"] == 1
    assert versions["reference (Q4_1 file)"]["nbytes"] == results["file"]["tensor_nbytes"]
    settings = results["settings"]
    text = load_shakespeare_text()
    start, end = settings["text_span"]
    assert start == int(0.9 * len(text)) and end > start
    assert settings["num_tokens"] == settings["windows"] * settings["n_ctx"]
    for row in versions.values():
        windows = row["windows"]
        assert len(windows) == settings["windows"]
        nll = np.mean([w["nll"] for w in windows])
        assert row["perplexity"] == pytest.approx(np.exp(nll), rel=1e-12)
        assert row["mean_kl"] == pytest.approx(np.mean([w["kl"] for w in windows]), rel=1e-12)
    assert versions["reference (Q4_1 file)"]["mean_kl"] == 0
    kl = {name: row["mean_kl"] for name, row in versions.items()}
    assert 0 < kl["F16"] < kl["Q8_0"] < kl["Q4_0"] < kl["Q4_0 --pure"]


# --- llama-quantize's per-tensor rule ----------------------------------------------------------

class FakeFile:
    """The tensor table of a GGUF file: names, NumPy shapes, stored types."""

    def __init__(self, tensors):
        self.tensors = {name: GGUFTensorInfo(name, shape, ggml_type, 0, 0)
                        for name, shape, ggml_type in tensors}


def smollm2_table(num_layers=30, output=None):
    """SmolLM2-135M's tensors as its file lists them (d_model 576, 192 = 3 key/value heads
    of 64, d_ff 1536), optionally with an untied output matrix of ``output`` columns."""
    tensors = [("token_embd.weight", (49152, 576), "Q8_0")]
    for i in range(num_layers):
        tensors += [(f"blk.{i}.attn_norm.weight", (576,), "F32"),
                    (f"blk.{i}.attn_q.weight", (576, 576), "Q4_1"),
                    (f"blk.{i}.attn_k.weight", (192, 576), "Q4_1"),
                    (f"blk.{i}.attn_v.weight", (192, 576), "Q4_1"),
                    (f"blk.{i}.attn_output.weight", (576, 576), "Q4_1"),
                    (f"blk.{i}.ffn_norm.weight", (576,), "F32"),
                    (f"blk.{i}.ffn_gate.weight", (1536, 576), "Q4_1"),
                    (f"blk.{i}.ffn_up.weight", (1536, 576), "Q4_1"),
                    (f"blk.{i}.ffn_down.weight", (576, 1536), "Q4_1")]
    tensors.append(("output_norm.weight", (576,), "F32"))
    if output is not None:
        tensors.append(("output.weight", (49152, output), "F16"))
    return FakeFile(tensors)


def count(types, part=""):
    counts = {}
    for name, ggml_type in types.items():
        if part in name:
            counts[ggml_type] = counts.get(ggml_type, 0) + 1
    return counts


def test_the_tied_embedding_is_kept_at_8_bits_as_the_output_tensor():
    table = smollm2_table()
    for ftype in ("Q4_0", "Q4_1", "Q8_0"):
        types = llama_quantize_types(table, ftype)
        # Q6_K first (the output tensor's type), which falls back to Q8_0: 576 % 256 != 0.
        assert types["token_embd.weight"] == "Q8_0", ftype
        assert count(types, "blk.") == {ftype: 210, "F32": 60}, ftype
        assert types["output_norm.weight"] == "F32"
    # A Q4_1 file asked for Q4_1 comes back with every type unchanged: nothing is requantized.
    assert llama_quantize_types(table, "Q4_1") == {name: info.ggml_type
                                                   for name, info in table.tensors.items()}
    # --pure and --token-embedding-type put the embedding in 4 bits.
    assert llama_quantize_types(table, "Q4_0", pure=True)["token_embd.weight"] == "Q4_0"
    embedding_only = llama_quantize_types(table, "Q4_1", token_embedding_type="Q4_0")
    assert embedding_only["token_embd.weight"] == "Q4_0"
    assert count(embedding_only, "blk.") == {"Q4_1": 210, "F32": 60}
    # Float file types are not adjusted: the embedding is F16 like the rest.
    assert count(llama_quantize_types(table, "F16")) == {"F16": 211, "F32": 61}


def test_an_untied_output_matrix_gets_q6_k_and_the_embedding_the_file_type():
    types = llama_quantize_types(smollm2_table(num_layers=2, output=4096), "Q4_0")
    assert types["output.weight"] == "Q6_K"  # 4096 = 16 x 256: no fallback needed
    assert types["token_embd.weight"] == "Q4_0"  # not the output tensor any more
    narrow = llama_quantize_types(smollm2_table(num_layers=2, output=576), "Q4_0")
    assert narrow["output.weight"] == "Q8_0"


def test_q4_k_m_on_smollm2_is_mostly_q5_0():
    """Q4_K needs rows that are multiples of 256; only ffn_down's 1536 are. The rest falls
    back to Q5_0, and the Q6_K that use_more_bits asks for (layers 0-2, 26-29 and every
    third in between: 14 of 30) falls back to Q8_0 on the 576-wide attn_v."""
    types = llama_quantize_types(smollm2_table(), "Q4_K_M")
    more_bits = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    for i in range(30):
        expected = "Q6_K" if i in more_bits else "Q4_K"
        assert types[f"blk.{i}.ffn_down.weight"] == expected, i
        assert types[f"blk.{i}.attn_v.weight"] == ("Q8_0" if i in more_bits else "Q5_0"), i
        assert types[f"blk.{i}.attn_q.weight"] == "Q5_0"
    assert types["token_embd.weight"] == "Q8_0"
    assert count(types, "blk.") == {"Q5_0": 166, "Q8_0": 14, "Q6_K": 14, "Q4_K": 16,
                                    "F32": 60}
    q6_k = llama_quantize_types(smollm2_table(), "Q6_K")
    assert count(q6_k, "blk.") == {"Q8_0": 180, "Q6_K": 30, "F32": 60}


def test_llama_quantize_types_rejects_unknown_types():
    assert LLAMA_FTYPES == ("F32", "F16", "Q8_0", "Q4_1", "Q4_0", "Q6_K", "Q4_K_M")
    with pytest.raises(ValueError, match="ftype 'Q4_K_S' is not supported"):
        llama_quantize_types(smollm2_table(1), "Q4_K_S")
    with pytest.raises(ValueError, match="token_embedding_type 'q4_0' is not supported"):
        llama_quantize_types(smollm2_table(1), "Q4_0", token_embedding_type="q4_0")


@pytest.mark.skipif(not HAVE_GGUF_PACKAGE,
                    reason=f"the `gguf` package is not installed ({GGUF_PACKAGE_PIN})")
def test_type_sizes_equal_the_gguf_package():
    import gguf

    for ggml_type in ("F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K",
                      "Q6_K"):
        block_size, block_bytes = gguf.constants.GGML_QUANT_SIZES[
            getattr(gguf.GGMLQuantizationType, ggml_type)]
        assert quantized_nbytes((3, 2 * 256), ggml_type) == 3 * 512 // block_size * block_bytes


@needs_weights
def test_llama_quantize_model_on_the_file(smollm2_file, model):
    # Without --allow-requantize, llama-quantize refuses to quantize Q4_1 tensors again.
    with pytest.raises(ValueError, match="blk.0.ffn_down.weight is stored as Q4_1: requantizing "
                                         "it to Q4_0 needs allow_requantize=True"):
        llama_quantize_model(smollm2_file, "Q4_0")
    with pytest.raises(ValueError, match="would store blk.0.ffn_down.weight as Q6_K, which "
                                         "quantize cannot write"):
        llama_quantize_model(smollm2_file, "Q4_K_M", allow_requantize=True)
    q4_0, stored = llama_quantize_model(smollm2_file, "Q4_0", allow_requantize=True)
    assert len(stored.requantized) == 210 and "token_embd.weight" not in stored.requantized
    assert np.array_equal(q4_0.embedding, model.embedding)  # the Q8_0 embedding, unchanged
    assert np.shares_memory(q4_0.W_out, q4_0.embedding)
    file_q = smollm2_file.tensor("blk.4.attn_q.weight")  # (out, in): blocks along `in`
    assert np.array_equal(q4_0.blocks[4].self_attn.W_q, round_trip(file_q, "Q4_0").T)
    assert q4_0.blocks[4].self_attn.W_q.flags.c_contiguous
    assert np.array_equal(q4_0.blocks[4].norm1.gamma, model.blocks[4].norm1.gamma)
    assert stored.nbytes == sum(quantized_nbytes(info.shape, stored.types[name])
                                for name, info in smollm2_file.tensors.items())
    del q4_0
    # --pure is what quantize_model does: every matrix, the tied embedding included.
    pure, _ = llama_quantize_model(smollm2_file, "Q4_0", pure=True, allow_requantize=True)
    assert np.array_equal(pure.embedding, round_trip(model.embedding, "Q4_0"))
    W_down = model.blocks[29].ff.W_down  # (in, out)
    assert np.array_equal(pure.blocks[29].ff.W_down, round_trip(W_down.T, "Q4_0").T)


@needs_weights
def test_requantized_in_place_equals_the_built_model_and_restores_the_file(smollm2_file,
                                                                           model):
    built, stored = llama_quantize_model(smollm2_file, "Q4_1", token_embedding_type="Q4_0",
                                         allow_requantize=True)
    W_up = model.blocks[7].ff.W_up.copy()
    embedding_before = model.embedding[:100].copy()
    with requantized_in_place(model, smollm2_file, "Q4_1", token_embedding_type="Q4_0",
                              allow_requantize=True) as inside:
        assert inside.requantized == stored.requantized == ("token_embd.weight",)
        assert np.array_equal(model.embedding, built.embedding)
        assert np.shares_memory(model.W_out, model.embedding)  # still tied
        assert np.array_equal(model.blocks[7].ff.W_up, W_up)  # Q4_1 already: untouched
    assert np.array_equal(model.embedding[:100], embedding_before)
    del built
    tokens = np.array([504, 314, 28, 355, 441, 288])
    reference = model.forward(tokens)
    with requantized_in_place(model, smollm2_file, "Q4_0", allow_requantize=True) as inside:
        assert len(inside.requantized) == 210
        W_q = model.blocks[3].self_attn.W_q
        assert np.array_equal(W_q, round_trip(smollm2_file.tensor("blk.3.attn_q.weight"),
                                              "Q4_0").T)
        assert next_token_kl(reference, model.forward(tokens)) > 0
    assert np.array_equal(model.forward(tokens), reference)  # the file's weights, bit for bit
    assert np.array_equal(model.blocks[7].ff.W_up, W_up)
    with pytest.raises(ValueError, match="needs allow_requantize=True"):
        with requantized_in_place(model, smollm2_file, "Q8_0"):
            pass
    assert np.array_equal(model.forward(tokens), reference)


# --- next_token_kl and perplexity --------------------------------------------------------------

def test_next_token_kl_by_hand_and_its_properties():
    # KL([1/2, 1/2] || [1/4, 3/4]) = 1/2 ln 2 + 1/2 ln(2/3) = 1/2 ln(4/3).
    assert next_token_kl([[0.0, 0.0]], [[0.0, np.log(3.0)]]) == pytest.approx(0.5 * np.log(4 / 3),
                                                                           rel=1e-12)
    rng = np.random.default_rng(6)
    p, q = rng.normal(size=(2, 5, 7, 11)) * 3
    assert next_token_kl(p, p) == 0.0
    assert abs(next_token_kl(p, p + 5.0)) < 1e-14  # logits are defined up to a constant
    per = next_token_kl(p, q, per_position=True)
    assert per.shape == (5, 7) and per.dtype == np.float64 and np.all(per > 0)
    assert next_token_kl(p, q) == pytest.approx(per.mean(), rel=1e-14)
    assert next_token_kl(p, q) != pytest.approx(next_token_kl(q, p), rel=1e-3)  # not symmetric
    direct = np.exp(p) / np.exp(p).sum(-1, keepdims=True)
    other = np.exp(q) / np.exp(q).sum(-1, keepdims=True)
    assert per == pytest.approx((direct * np.log(direct / other)).sum(-1), rel=1e-10)
    # float32 logits are compared in float64.
    p32, q32 = p.astype(np.float32), q.astype(np.float32)
    assert next_token_kl(p32, q32) == next_token_kl(p32.astype(np.float64), q32.astype(np.float64))


def test_next_token_kl_edges_and_errors():
    assert next_token_kl([[1e4, -1e4, 0.0]], [[-1e4, 1e4, 0.0]]) == pytest.approx(2e4)
    # A token the reference gives no mass adds nothing, even where the other also gives none.
    assert next_token_kl([[0.0, -np.inf]], [[0.0, -np.inf]]) == 0.0
    assert next_token_kl([[0.0, 0.0]], [[0.0, -np.inf]]) == np.inf
    with pytest.raises(ValueError, match=r"shape \(2, 3\) but quant_logits has shape \(2, 4\)"):
        next_token_kl(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(TypeError, match="ref_logits must be real numbers"):
        next_token_kl(np.zeros(3, complex), np.zeros(3))


def test_perplexity():
    assert perplexity(np.zeros((2, 3, 5)), np.zeros((2, 3), int)) == pytest.approx(5.0)
    logits = np.log([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]])
    assert perplexity(logits, [0, 1]) == pytest.approx(1 / np.sqrt(0.5 * 0.8))
    sure = np.where(np.eye(4, dtype=bool), 0.0, -1e4)
    assert perplexity(sure, np.arange(4)) == 1.0
    with pytest.raises(ValueError, match=r"targets must have shape \(2,\)"):
        perplexity(logits, [0, 1, 2])
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 3\); got min 0, max 3"):
        perplexity(logits, [0, 3])
    with pytest.raises(TypeError, match="integer token ids"):
        perplexity(logits, [0.0, 1.0])
