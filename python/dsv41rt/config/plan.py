"""The per-layer plan: what each layer is and where its shared state comes from.

Built once from the config; everything downstream (weights spec, executor, cache accounting, the
`inspect` CLI) reads the plan instead of re-deriving roles. Architecture spec §2.9 (V4.1 roles and
the released schedule), §2.10 (V4), §2.4 (rope base per layer).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .schema import ModelConfig


class Role(str, Enum):
    SWA = "SWA-only"  # window branch only (m = 0)
    FULL = "Full"  # V4.1: owns compressor + index keys, publishes top-k
    REINDEX = "Reindex"  # V4.1: own indexer queries over the group's shared keys
    REUSE = "Reuse"  # V4.1: reuses the latest top-k and the group's compressed KV
    CSA = "CSA"  # V4: ratio-4 overlapped compressor + own indexer
    HCA = "HCA"  # V4: ratio-128 compressor, attends every visible entry


class Stage(str, Enum):
    BACKBONE = "backbone"
    DSPARK = "dspark"  # V4.1 draft stage mtp.s
    MTP = "mtp"  # V4 next-token-prediction layer mtp.0


class Candidates(str, Enum):
    NONE = ""
    SOURCE = "source"  # builds and publishes the candidate-block mask
    USES = "uses"  # restricts its top-k to the published candidate pool


@dataclass(frozen=True)
class LayerPlan:
    index: int  # backbone layer index, or stage index for DSpark/MTP
    stage: Stage
    ratio: int
    role: Role
    kv_source: int | None  # layer whose compressed KV this layer attends (None: none)
    topk_source: int | None  # layer whose top-k selection this layer uses (None: none / all visible)
    candidates: Candidates
    engram: bool
    rope_base: float
    yarn: bool
    hash_routed: bool
    n_experts: int
    experts_per_tok: int

    @property
    def name_prefix(self) -> str:
        """Prefix of this layer's tensors in the released checkpoint."""
        return f"layers.{self.index}." if self.stage is Stage.BACKBONE else f"mtp.{self.index}."

    @property
    def owns_compressor(self) -> bool:
        return self.role in (Role.FULL, Role.CSA, Role.HCA)

    @property
    def owns_indexer(self) -> bool:
        return self.role in (Role.FULL, Role.REINDEX, Role.CSA)


@dataclass(frozen=True)
class ModelPlan:
    config: ModelConfig
    layers: tuple[LayerPlan, ...]  # backbone layers
    draft_layers: tuple[LayerPlan, ...]  # DSpark stages (V4.1) or MTP layers (V4)

    def role_counts(self) -> dict[Role, int]:
        counts: dict[Role, int] = {}
        for layer in self.layers:
            counts[layer.role] = counts.get(layer.role, 0) + 1
        return counts


def _rope(cfg: ModelConfig, ratio: int) -> tuple[float, bool]:
    # Ratio-0 layers (SWA-only, draft stages) use rope_theta without YaRN; every compressed layer uses
    # compress_rope_theta with YaRN for all of its rotations (query, window KV, compressed KV, indexer).
    if ratio == 0:
        return cfg.rope_theta, False
    return cfg.compress_rope_theta, cfg.rope_scaling is not None


def _v41_layer(cfg: ModelConfig, i: int) -> LayerPlan:
    m = cfg.compress_ratios[i]
    kv, idx = cfg.kv_source_layer_ids, cfg.index_source_layer_ids
    base, yarn = _rope(cfg, m)
    role, kv_src, topk_src, cand = Role.SWA, None, None, Candidates.NONE
    if m > 0:
        kv_src = max(s for s in kv if s <= i)  # the most recent KV source owns this ratio group
        topk_src = max(s for s in idx if s <= i)  # the most recently published selection
        role = Role.FULL if i in kv else Role.REINDEX if i in idx else Role.REUSE
        c = cfg.candidate_source_layer_id
        if i == c:
            cand = Candidates.SOURCE
        elif i in idx and 0 <= c < i:
            cand = Candidates.USES
    engram = cfg.engram is not None and i in cfg.engram.layer_ids
    return LayerPlan(
        i,
        Stage.BACKBONE,
        m,
        role,
        kv_src,
        topk_src,
        cand,
        engram,
        base,
        yarn,
        False,
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
    )


def _v4_layer(cfg: ModelConfig, i: int) -> LayerPlan:
    m = cfg.compress_ratios[i]
    base, yarn = _rope(cfg, m)
    role = {0: Role.SWA, 4: Role.CSA, 128: Role.HCA}[m]
    kv_src = i if m > 0 else None
    topk_src = i if m == 4 else None
    return LayerPlan(
        i,
        Stage.BACKBONE,
        m,
        role,
        kv_src,
        topk_src,
        Candidates.NONE,
        False,
        base,
        yarn,
        i < cfg.num_hash_layers,
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
    )


def _draft_layers(cfg: ModelConfig) -> tuple[LayerPlan, ...]:
    out = []
    for s in range(cfg.num_nextn_predict_layers):
        base, yarn = _rope(cfg, 0)
        if cfg.dspark is not None:
            stage, n_exp, k = Stage.DSPARK, cfg.dspark.n_routed_experts, cfg.dspark.num_experts_per_tok
        else:
            stage, n_exp, k = Stage.MTP, cfg.n_routed_experts, cfg.num_experts_per_tok
        out.append(LayerPlan(s, stage, 0, Role.SWA, None, None, Candidates.NONE, False, base, yarn, False, n_exp, k))
    return tuple(out)


def build_plan(cfg: ModelConfig) -> ModelPlan:
    make = _v41_layer if cfg.is_v41 else _v4_layer
    return ModelPlan(cfg, tuple(make(cfg, i) for i in range(cfg.num_hidden_layers)), _draft_layers(cfg))
