"""attention_lib: the library that the course *Attention, step by step* derives, chapter by chapter.

Every public function names, in its docstring, the chapter that derives it.
"""

from .attention import SelfAttention, init_linear_weight, scaled_dot_product_attention
from .blocks import (
    Decoder,
    DecoderBlock,
    DecoderOnlyLM,
    Encoder,
    EncoderBlock,
    EncoderDecoder,
    count_parameters,
    embed_tokens,
)
from .cache import KVCache, SinkCache, greedy_decode, next_token_nll
from .flash import (
    online_softmax,
    peak_extra_bytes,
    tiled_attention,
    tiled_attention_backward,
)
from .layers import FeedForward, GatedFeedForward, LayerNorm, RMSNorm, gelu, gelu_tanh, relu, silu
from .masks import causal_mask, padding_mask, sliding_window_mask
from .multihead import MultiHeadAttention, grouped_attention, merge_heads, split_heads
from .positional import alibi_bias, alibi_slopes, apply_rope, sinusoidal_encoding
from .similarity import angle_degrees, cosine_similarity
from .softmax import log_softmax, softmax, softmax_jacobian
from .training.gpt import load_shakespeare_gpt
from .variants import (
    LatentCache,
    LightningIndexer,
    MultiHeadLatentAttention,
    delta_rule,
    gated_attention_output,
    linear_attention,
    sparse_attention_cost,
    topk_indices,
    topk_mask,
    topk_sparse_attention,
)

__version__ = "0.1.0"

__all__ = [
    "Decoder",
    "DecoderBlock",
    "DecoderOnlyLM",
    "Encoder",
    "EncoderBlock",
    "EncoderDecoder",
    "FeedForward",
    "GatedFeedForward",
    "KVCache",
    "LayerNorm",
    "RMSNorm",
    "SinkCache",
    "count_parameters",
    "embed_tokens",
    "gelu",
    "gelu_tanh",
    "greedy_decode",
    "grouped_attention",
    "relu",
    "silu",
    "MultiHeadAttention",
    "SelfAttention",
    "alibi_bias",
    "alibi_slopes",
    "angle_degrees",
    "apply_rope",
    "causal_mask",
    "cosine_similarity",
    "init_linear_weight",
    "load_shakespeare_gpt",
    "log_softmax",
    "merge_heads",
    "online_softmax",
    "padding_mask",
    "peak_extra_bytes",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
    "sliding_window_mask",
    "softmax",
    "softmax_jacobian",
    "split_heads",
    "tiled_attention",
    "tiled_attention_backward",
    "next_token_nll",
    # chapter 19, attention in today's models (attention_lib.variants)
    "LatentCache",
    "LightningIndexer",
    "MultiHeadLatentAttention",
    "delta_rule",
    "gated_attention_output",
    "linear_attention",
    "sparse_attention_cost",
    "topk_indices",
    "topk_mask",
    "topk_sparse_attention",
]
