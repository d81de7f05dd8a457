"""Building blocks: masks, attention, positional encodings, feed-forward, norms, layers."""

from .attention import (
    AttentionOutput,
    KVCache,
    MultiHeadAttention,
    fused_attention,
    reference_attention,
)
from .layers import DecoderLayer, EncoderLayer, FeedForward, LayerNorm, RMSNorm
from .masks import causal_mask, combine_masks, left_padding_mask, pad_mask_from_ids, padding_mask
from .positional import LearnedPositions, RotaryEmbedding, SinusoidalPositions, sinusoidal_table

__all__ = [
    "AttentionOutput", "DecoderLayer", "EncoderLayer", "FeedForward", "KVCache", "LayerNorm",
    "LearnedPositions", "MultiHeadAttention", "RMSNorm", "RotaryEmbedding", "SinusoidalPositions",
    "causal_mask", "combine_masks", "fused_attention", "left_padding_mask", "pad_mask_from_ids",
    "padding_mask", "reference_attention", "sinusoidal_table",
]
