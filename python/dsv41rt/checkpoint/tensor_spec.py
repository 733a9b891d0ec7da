"""The tensors a checkpoint must hold: the C++ tensor spec (cpp/runtime/model/tensor_spec.h) as data.

`logical` lists every weight (name, shape, storage class); `physical` is what the safetensors files
hold: with a `quantization_config` an FP8 matrix is `<name>` F8_E4M3 + `<stem>.scale` F8_E8M0 over
the block grid, an FP4 expert matrix `<name>` I8 [out, in/2] + `<stem>.scale` F8_E8M0 [out, in/32];
without one both are BF16 at their logical shape. The weight loader and checkpoint validation read
the same spec in C++.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .. import _core
from ..config.plan import ModelPlan


class Storage(str, Enum):
    BF16 = "BF16"
    F32 = "F32"
    I64 = "I64"
    FP8 = "fp8"  # F8_E4M3 + UE8M0 block scales (when quantised)
    FP4 = "fp4"  # packed E2M1 + UE8M0 1x32 scales (when quantised)


@dataclass(frozen=True)
class LogicalTensor:
    name: str
    shape: tuple[int, ...]
    storage: Storage
    block: tuple[int, int] = (0, 0)  # FP8 scale block (rows, cols)


@dataclass(frozen=True)
class PhysicalTensor:
    name: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    logical: LogicalTensor  # the weight this tensor stores (a scale points at its weight)
    is_scale: bool
    nbytes: int


@dataclass(frozen=True)
class TensorSpec:
    quantized: bool
    logical: tuple[LogicalTensor, ...]  # sorted by name
    physical: tuple[PhysicalTensor, ...]  # sorted by name


def tensor_spec(plan: ModelPlan) -> TensorSpec:
    quantized, logical_rows, physical_rows = _core.tensor_spec(plan.native)
    logical = tuple(LogicalTensor(name, shape, Storage(s), block) for name, shape, s, block in logical_rows)
    physical = tuple(
        PhysicalTensor(name, dtype, shape, logical[i], is_scale, nbytes)
        for name, dtype, shape, i, is_scale, nbytes in physical_rows
    )
    return TensorSpec(quantized, logical, physical)


def expected_tensors(plan: ModelPlan) -> list[LogicalTensor]:
    """Every logical weight of the checkpoint, sorted by name."""
    return list(tensor_spec(plan).logical)


def physical_tensors(plan: ModelPlan) -> list[PhysicalTensor]:
    """What the safetensors files hold, sorted by name."""
    return list(tensor_spec(plan).physical)
