"""Engram hash-bucket layout: the distinct primes of every (layer, n-gram size, head).

Computed by the C++ config validator's layout (cpp/runtime/model/engram_layout.h): for each Engram
layer in order, for each n-gram size n = 2..max, for each head, the next prime above
`engram_vocab_size - 1` not used by any earlier (layer, size, head). A layer's table has (at least)
the sum of its primes as rows; bucket (n, h) starts at the sum of the earlier primes of that layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _core
from .schema import EngramConfig


@dataclass(frozen=True)
class EngramLayerLayout:
    layer_id: int
    primes: tuple[int, ...]  # order [n=2 h0..h(H-1), n=3 ..., ...]
    offsets: tuple[int, ...]
    required_rows: int  # sum of primes


def engram_layouts(engram: EngramConfig) -> tuple[EngramLayerLayout, ...]:
    """Reads layer_ids, max_ngram_size, vocab_size and n_heads (num_embeddings may be empty)."""
    layouts = _core.engram_layouts(list(engram.layer_ids), engram.max_ngram_size, engram.vocab_size, engram.n_heads)
    return tuple(EngramLayerLayout(**d) for d in layouts)
