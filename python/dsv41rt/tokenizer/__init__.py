"""Tokenizer-side tables the runtime precomputes offline (no transformers / tokenizers needed)."""

from .engram_token_map import compressed_token_map, engram_multipliers

__all__ = ["compressed_token_map", "engram_multipliers"]
