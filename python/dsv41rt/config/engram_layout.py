"""Engram hash-bucket layout: the distinct primes of every (layer, n-gram size, head).

For each Engram layer in order, for each n-gram size n = 2..max, for each head: the next prime above
`engram_vocab_size - 1` not used by any earlier (layer, size, head). A layer's table has (at least)
the sum of its primes as rows; bucket (n, h) starts at the sum of the earlier primes of that layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .schema import EngramConfig


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def _next_unused_prime(after: int, used: set[int]) -> int:
    candidate = after + 1
    while not (_is_prime(candidate) and candidate not in used):
        candidate += 1
    return candidate


@dataclass(frozen=True)
class EngramLayerLayout:
    layer_id: int
    primes: tuple[int, ...]  # order [n=2 h0..h(H-1), n=3 ..., ...]
    offsets: tuple[int, ...]

    @property
    def required_rows(self) -> int:
        return sum(self.primes)


def engram_layouts(engram: EngramConfig) -> tuple[EngramLayerLayout, ...]:
    used: set[int] = set()
    layouts = []
    for layer_id in engram.layer_ids:
        primes: list[int] = []
        for _ in range(engram.max_ngram_size - 1):
            current = engram.vocab_size - 1
            for _ in range(engram.n_heads):
                current = _next_unused_prime(current, used)
                used.add(current)
                primes.append(current)
        offsets = tuple(sum(primes[:i]) for i in range(len(primes)))
        layouts.append(EngramLayerLayout(layer_id, tuple(primes), offsets))
    return tuple(layouts)
