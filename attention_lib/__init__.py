"""attention_lib: the library that the course *Attention, step by step* derives, chapter by chapter.

Every public function names, in its docstring, the chapter that derives it.
"""

from .attention import scaled_dot_product_attention
from .masks import causal_mask, padding_mask
from .similarity import angle_degrees, cosine_similarity
from .softmax import log_softmax, softmax

__version__ = "0.1.0"

__all__ = [
    "angle_degrees",
    "causal_mask",
    "cosine_similarity",
    "log_softmax",
    "padding_mask",
    "scaled_dot_product_attention",
    "softmax",
]
