"""The per-layer plan: what each layer is and where its shared state comes from.

Built once from the config by the C++ plan builder (cpp/runtime/model/layer_plan.{h,cc}); the
dataclasses here hold what it returns. Everything downstream (tensor spec, executor, cache accounting,
the `inspect` CLI) reads the plan instead of re-deriving roles. Architecture spec §2.9 (V4.1 roles
and the released schedule), §2.10 (V4), §2.4 (rope base per layer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .. import _core
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


@dataclass(frozen=True)
class ModelPlan:
    config: ModelConfig
    layers: tuple[LayerPlan, ...]  # backbone layers
    draft_layers: tuple[LayerPlan, ...]  # DSpark stages (V4.1) or MTP layers (V4)
    # The C++ plan these were filled from (`_core.ModelPlan`), for the tensor spec and cache bytes.
    native: Any = field(default=None, compare=False, repr=False)

    def role_counts(self) -> dict[Role, int]:
        counts: dict[Role, int] = {}
        for layer in self.layers:
            counts[layer.role] = counts.get(layer.role, 0) + 1
        return counts


def _layers(dicts: list[dict[str, Any]]) -> tuple[LayerPlan, ...]:
    return tuple(
        LayerPlan(
            **d | {"stage": Stage(d["stage"]), "role": Role(d["role"]), "candidates": Candidates(d["candidates"])}
        )
        for d in dicts
    )


def plan_of(cfg: ModelConfig, native: _core.ModelPlan) -> ModelPlan:
    """The dataclass view of a C++ plan built from `cfg`."""
    return ModelPlan(cfg, _layers(native.layers()), _layers(native.draft_layers()), native)


def build_plan(cfg: ModelConfig) -> ModelPlan:
    """The per-layer plan of a config from config_from_dict / load_config."""
    if cfg.native is None:
        raise TypeError("build_plan needs a ModelConfig from config_from_dict or load_config")
    return plan_of(cfg, _core.build_model_plan(cfg.native))
