"""Where each weight lives under tensor and expert parallelism, and what that costs per GPU.

The placement (issue 20; docs/design/parallelism.md) follows SGLang's layout for V4-class models:
`tensor_parallel_size` GPUs, attention heads split over all of them, routed experts split over
`expert_parallel_size` groups (each expert's intermediate width split over the tp / ep GPUs of its
group). Per weight (the scale of an FP8 / FP4 matrix goes with it):

| weight | placement |
|---|---|
| `embed`, `head` | vocabulary rows split over tp (vocab-parallel) |
| `attn.wq_b`, `attn.attn_sink`, `attn.wo_a` | heads (output groups) split over tp |
| `attn.wo_b` | input columns split over tp (row-parallel: an all-reduce after it) |
| `ffn.shared_experts.w1 / w3`, `w2` | intermediate rows / columns split over tp |
| `ffn.experts.E.*` | expert E on EP group E // (E_total / ep); its intermediate split over tp / ep |
| `engram.embed` | host memory, once per host (shared by the host's ranks) |
| everything else (wq_a, wkv: the latent all heads share; compressor, indexer, | replicated |
| router, norms, mHC, Engram projections, DSpark heads) | |

The runtime does not run this split yet; this module is the plan `dsv41rt inspect` reports and the
loader will follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..checkpoint.tensor_spec import PhysicalTensor
from ..errors import ConfigError
from .plan import ModelPlan

_EXPERT = re.compile(r"^((?:layers|mtp)\.\d+)\.ffn\.experts\.(\d+)\.(w[123])\.weight$")
_SHARED = re.compile(r"\.ffn\.shared_experts\.(w[123])\.weight$")
_ROWS_BY_TP = re.compile(
    r"(^embed\.weight$|^head\.weight$|\.attn\.wq_b\.weight$|\.attn\.wo_a\.weight$|\.attn\.attn_sink$)"
)
_COLS_BY_TP = re.compile(r"\.attn\.wo_b\.weight$")
_HOST = re.compile(r"\.engram\.embed\.weight$")


@dataclass(frozen=True)
class Placement:
    kind: str  # "replicated", "split" (one slice per GPU), "expert" (one EP group's GPUs), "host"
    dim: int = 0  # the split dimension ("split" and "expert")
    parts: int = 1  # slices of that dimension
    expert: int = -1  # the expert index ("expert")


@dataclass(frozen=True)
class GpuBytes:
    """The weight bytes of one GPU (all GPUs hold the same amount) and of the host tier."""

    tensor_parallel_size: int
    expert_parallel_size: int
    split: int  # this GPU's slices of split weights
    experts: int  # this GPU's slices of its EP group's routed experts
    replicated: int  # weights every GPU holds whole
    host: int  # bytes in host memory, once per host

    @property
    def device(self) -> int:
        return self.split + self.experts + self.replicated


def check_sizes(plan: ModelPlan, tp: int, ep: int) -> None:
    """ConfigError naming the first size that does not divide (before any tensor is looked at)."""
    c = plan.config
    if tp < 1 or ep < 1:
        raise ConfigError(f"tensor-parallel-size ({tp}) and expert-parallel-size ({ep}) must be >= 1")
    if tp % ep:
        raise ConfigError(
            f"expert-parallel-size ({ep}) must divide tensor-parallel-size ({tp}): the expert groups "
            "are made of the tensor-parallel GPUs"
        )
    for what, n, by in (
        ("num_attention_heads", c.num_attention_heads, tp),
        ("o_groups", c.o_groups, tp),
        ("n_routed_experts", c.n_routed_experts, ep),
    ):
        if n % by:
            raise ConfigError(f"{what} ({n}) is not divisible by {by} (the parallel sizes)")


def placement(t: PhysicalTensor, plan: ModelPlan, tp: int, ep: int) -> Placement:
    name = t.logical.name
    if m := _EXPERT.match(name):
        return Placement("expert", 1 if m.group(3) == "w2" else 0, tp // ep, int(m.group(2)))
    if m := _SHARED.search(name):
        return Placement("split", 1 if m.group(1) == "w2" else 0, tp)
    if _ROWS_BY_TP.search(name):
        return Placement("split", 0, tp)
    if _COLS_BY_TP.search(name):
        return Placement("split", 1, tp)
    if _HOST.search(name):
        return Placement("host")
    return Placement("replicated")


def gpu_bytes(tensors: list[PhysicalTensor], plan: ModelPlan, tp: int, ep: int) -> GpuBytes:
    """Per-GPU weight bytes under (tp, ep); every split dimension must divide evenly."""
    check_sizes(plan, tp, ep)
    # Experts per MoE layer (the DSpark stages may have fewer than the backbone).
    counts: dict[str, int] = {}
    for t in tensors:
        if m := _EXPERT.match(t.logical.name):
            counts[m.group(1)] = max(counts.get(m.group(1), 0), int(m.group(2)) + 1)
    for layer, n in counts.items():
        if n % ep:
            raise ConfigError(f"{layer}: {n} routed experts do not split over expert-parallel-size {ep}")
    split = experts = replicated = host = 0
    for t in tensors:
        p = placement(t, plan, tp, ep)
        if p.kind in ("split", "expert"):
            size = t.shape[p.dim]
            if size % p.parts:
                raise ConfigError(
                    f"{t.name} {list(t.shape)}: dimension {p.dim} ({size}) does not split into {p.parts} "
                    f"equal parts (tensor-parallel-size {tp}, expert-parallel-size {ep})"
                )
        if p.kind == "split":
            split += t.nbytes // p.parts
        elif p.kind == "expert":  # EP group 0 holds the first n / ep experts of every layer
            m = _EXPERT.match(t.logical.name)
            assert m is not None
            experts += t.nbytes // p.parts if p.expert < counts[m.group(1)] // ep else 0
        elif p.kind == "host":
            host += t.nbytes
        else:
            replicated += t.nbytes
    return GpuBytes(tp, ep, split, experts, replicated, host)
