"""Random but well-conditioned initial values for released tensor names.

Unit-variance activations throughout: matrices N(0, gain^2 / fan_in), embeddings N(0, 1), head with
logit std about 3, norm-like weights 1 + 0.1 N, non-zero biases, sinks and mHC parameters (so a
runtime that ignores any of them fails parity tests). Gains damp cascades of discrete decisions
(routing, top-k, cache rounding): larger router logits, smaller branch outputs.
"""

from __future__ import annotations

import re

import numpy as np

_GAINS = (
    (re.compile(r"ffn\.gate\.weight$"), 3.0),
    (re.compile(r"ffn\.experts\.\d+\.w2\.weight$"), 0.3),
    (re.compile(r"ffn\.shared_experts\.w2\.weight$"), 0.5),
    (re.compile(r"attn\.wo_b\.weight$"), 0.5),
    (re.compile(r"attn\.wq_b\.weight$"), 0.5),  # main query only; indexer.wq_b keeps gain 1
)
_NORM_LIKE = re.compile(r"(^|\.)\w*norm\.weight$|\.engram\.(q|k)_weight$")


def matrix_std(name: str, fan_in: int) -> float:
    gain = next((g for pattern, g in _GAINS if pattern.search(name)), 1.0)
    return gain / np.sqrt(fan_in)


def init_values(name: str, shape: tuple[int, ...], rng: np.random.Generator, *, hidden: int) -> np.ndarray:
    """float32 values of one logical tensor (or a row-chunk of it: rules depend only on the name)."""

    def normal(std: float, mean: float = 0.0) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std) + np.float32(mean)).astype(np.float32)

    if re.search(r"hc_(attn|ffn|head)_fn$", name):
        return normal(shape[-1] ** -0.5)
    if re.search(r"hc_(attn|ffn|head)_base$", name):
        return normal(0.5)
    if re.search(r"hc_(attn|ffn|head)_scale$", name):
        return (rng.random(shape, dtype=np.float32) + np.float32(0.5)).astype(np.float32)
    if name.endswith("attn_sink"):
        return normal(1.0)
    if name.endswith(".ape"):
        return normal(0.5)
    if name.endswith("ffn.gate.bias"):  # selection-only bias: a wide spread gives clear routing margins
        return normal(0.5)
    if name.endswith("ffn.gate.bias_vl"):
        return normal(0.1)
    if name.endswith("compressor.norm.weight"):  # halves compressed-KV magnitude (fewer top-k flips)
        return normal(0.05, 0.5)
    if _NORM_LIKE.search(name):
        return normal(0.1, 1.0)
    if name == "embed.weight" or name.endswith("engram.embed.weight") or name.endswith("markov_head.embed.weight"):
        return normal(1.0)
    if name == "head.weight":
        return normal(3.0 / np.sqrt(hidden))
    if name.endswith(".weight") and len(shape) == 2:
        return normal(matrix_std(name, shape[1]))
    raise KeyError(f"no initialisation rule for tensor {name} {shape}")


def tid2eid(rows: int, n_experts: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Hash-routing table: k distinct random experts per token id."""
    return np.argsort(rng.random((rows, n_experts)), axis=1)[:, :k].astype(np.int64)
