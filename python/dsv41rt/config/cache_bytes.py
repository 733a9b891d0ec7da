"""Cache footprint per token and per request (architecture spec §5.3, §5.4, §7.1).

Computed by the C++ cache accounting (cpp/runtime/model/cache_bytes.h: row formats and what each
layer role keeps), the same that sizes the runtime's paged state; this module holds the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _core
from .plan import ModelPlan


@dataclass(frozen=True)
class CacheBytes:
    window_row: int  # bytes of one window-KV row (one position, one layer)
    window_layers: int  # layers (incl. draft stages) that keep a window ring
    window_per_request: int  # sliding_window * window_row * window_layers
    global_per_token: float  # compressed KV + index keys, all sources, per token of context
    compressor_state_per_request: int  # pending compressor tokens (FP32 a and s)
    engram_history_per_request: int  # last (max_ngram - 1) compressed ids, int32

    def per_request(self, tokens: int) -> float:
        """Total cache bytes of one request with `tokens` tokens of context."""
        fixed = self.window_per_request + self.compressor_state_per_request + self.engram_history_per_request
        return fixed + self.global_per_token * tokens


def cache_bytes(plan: ModelPlan) -> CacheBytes:
    return CacheBytes(**_core.cache_bytes(plan.native))
