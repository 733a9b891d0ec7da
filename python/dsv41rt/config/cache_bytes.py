"""Closed-form cache footprint per token and per request (architecture spec §5.3, §5.4, §7.1).

V4.1 (stored quantised as the runtime keeps it):
  window row     = head_dim FP8 + head_dim/32 UE8M0 scales            (512 + 16 = 528 B)
  compressed KV  = head_dim/2 packed E2M1 + head_dim/16 E4M3 scales   (256 + 32 = 288 B)
  index key      = index_head_dim/2 E2M1 + index_head_dim/32 UE8M0    (64 + 4 = 68 B)
Global KV per token = sum over Full layers of (compressed + index key) / ratio (890 B for V4.1-Flash).
V4: window and compressed rows share one layout: nope FP8 + one UE8M0 scale per 64 (padded to 8 B)
+ rope tail BF16 (448 + 8 + 128 = 584 B); CSA index keys 68 B.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import ModelPlan, Role


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


def _v4_row(head_dim: int, rope_dim: int) -> int:
    nope = head_dim - rope_dim
    scales = -(-nope // 64)
    return nope + ((scales + 7) // 8) * 8 + 2 * rope_dim


def cache_bytes(plan: ModelPlan) -> CacheBytes:
    cfg = plan.config
    d, di = cfg.head_dim, cfg.index_head_dim
    index_key = di // 2 + di // 32
    window_layers = len(plan.layers) + len(plan.draft_layers)
    compressor_state = 0
    if cfg.is_v41:
        window_row = d + d // 32
        compressed = d // 2 + d // 16
        per_token = 0.0
        for layer in plan.layers:
            if layer.role is Role.FULL:
                per_token += (compressed + index_key) / layer.ratio
                # A ratio-m source keeps at most m-1 pending tokens (a and s, FP32, head_dim each).
                compressor_state += (layer.ratio - 1) * 2 * d * 4
    else:
        window_row = _v4_row(d, cfg.qk_rope_head_dim)
        per_token = 0.0
        for layer in plan.layers:
            if layer.role is Role.CSA:
                per_token += (window_row + index_key) / layer.ratio
                # Previous group's A halves + the partial group, value and score, main + indexer compressor.
                compressor_state += 2 * layer.ratio * 2 * (2 * d + 2 * di) * 4
            elif layer.role is Role.HCA:
                per_token += window_row / layer.ratio
                compressor_state += (layer.ratio - 1) * 2 * d * 4
    engram = (cfg.engram.max_ngram_size - 1) * 4 if cfg.engram is not None else 0
    return CacheBytes(
        window_row=window_row,
        window_layers=window_layers,
        window_per_request=cfg.sliding_window * window_row * window_layers,
        global_per_token=per_token,
        compressor_state_per_request=compressor_state,
        engram_history_per_request=engram,
    )
