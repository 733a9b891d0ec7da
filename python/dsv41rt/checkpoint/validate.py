"""Check a checkpoint's tensors against the tensors its config implies.

Every mismatch is collected — missing, unexpected, wrong dtype, wrong shape — and reported together
by name in one CheckpointError. Unquantised tensors may be stored in any float dtype (the release's
exact per-tensor dtypes are not all known; the loader upcasts), quantised ones must have exactly the
release formats. Vision tensors are skipped: this is a text runtime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..config.plan import ModelPlan
from ..errors import CheckpointError
from .tensor_spec import PhysicalTensor, physical_tensors

FLOAT_DTYPES = ("BF16", "F32", "F16")
INT_DTYPES = ("I64", "I32")
# Text-only runtime: the vision tower and its glue are ignored, as are image-token routing biases.
_IGNORED = re.compile(r"^(vision\.|aligner\.|image_(start|end|newline)$)")
_OPTIONAL = re.compile(r"\.ffn\.gate\.bias_vl$")
MAX_LISTED = 40


def allowed_dtypes(t: PhysicalTensor) -> tuple[str, ...]:
    if t.dtype in ("F8_E4M3", "F8_E8M0", "I8"):
        return (t.dtype,)
    if t.dtype == "I64":
        return INT_DTYPES
    return FLOAT_DTYPES


def check_tensors(plan: ModelPlan, found: Mapping[str, tuple[str, Sequence[int]]], where: str) -> list[str]:
    """Problems (one line each, naming the tensor) of `found` = {name: (safetensors dtype, shape)}."""
    expected = {t.name: t for t in physical_tensors(plan)}
    problems = []
    for name in sorted(set(expected) - set(found)):
        if not _OPTIONAL.search(name):
            e = expected[name]
            problems.append(f"missing tensor {name} (expected {e.dtype} {list(e.shape)})")
    for name in sorted(set(found) - set(expected)):
        if not _IGNORED.match(name):
            dtype, shape = found[name]
            problems.append(f"unexpected tensor {name} ({dtype} {list(shape)})")
    for name in sorted(set(expected) & set(found)):
        e, (dtype, shape) = expected[name], found[name]
        if dtype not in allowed_dtypes(e):
            problems.append(f"tensor {name} has dtype {dtype}, expected {' or '.join(allowed_dtypes(e))}")
        if tuple(shape) != tuple(e.shape):
            problems.append(f"tensor {name} has shape {list(shape)}, expected {list(e.shape)}")
    return problems


def raise_problems(problems: list[str], where: str) -> None:
    if not problems:
        return
    shown = problems[:MAX_LISTED]
    more = f"\n  ... and {len(problems) - MAX_LISTED} more" if len(problems) > MAX_LISTED else ""
    raise CheckpointError(
        f"{where}: checkpoint does not match its config ({len(problems)} problems):\n  " + "\n  ".join(shown) + more,
        problems,
    )


def validate_checkpoint_tensors(plan: ModelPlan, found: Mapping[str, tuple[str, Sequence[int]]], where: str) -> None:
    raise_problems(check_tensors(plan, found, where), where)
