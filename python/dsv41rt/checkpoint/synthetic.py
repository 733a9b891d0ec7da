"""Synthetic weights: a preset's checkpoint whose large quantised matrices are generated at load.

`write_synthetic_checkpoint` writes what `make-checkpoint` writes except the tensors whose codes
are sampled directly (at least `direct_codes_min_numel` elements: nearly all of a full-width
preset's bytes), and lists those in `dsv41rt_synthetic.json`; the core generates them when it opens
the directory (cpp/runtime/model/synthetic_weights.h) with the same bytes make-checkpoint would
have written (cpp/kernels/synthetic_codes.h follows checkpoint/direct_stream.py, which follows
numpy). So `Runtime(dir)` on the result computes exactly what it computes on the written checkpoint.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..config import build_plan, config_from_dict
from ..config.plan import ModelPlan
from ..config.presets import preset_config_json
from ..errors import CheckpointError
from .generator import DIRECT_CODES_MIN_NUMEL, SYNTHETIC_MANIFEST, _TensorSource, make_checkpoint
from .tensor_spec import Storage, tensor_spec


def _check_seed(seed: int) -> None:
    if not 0 <= seed < 1 << 63:  # the core reads the manifest's seed as an int64
        raise CheckpointError(f"synthetic weights: the seed must be a non-negative integer below 2^63, got {seed}")


def manifest_entries(plan: ModelPlan, seed: int, direct_codes_min_numel: int) -> list[dict[str, Any]]:
    """The directly sampled tensors of a plan, as the core's manifest lists them."""
    spec = tensor_spec(plan)
    scale_of = {p.logical.name: p.name for p in spec.physical if p.is_scale}
    out = []
    for t in spec.logical:
        src = _TensorSource(t, plan, seed, direct_codes_min_numel)
        if not src.direct:
            continue
        if len(t.shape) != 2:
            raise CheckpointError(f"{t.name}: synthetic weights need a matrix, got shape {t.shape}")
        block = t.block if t.storage is Storage.FP8 else (1, 32)
        out.append(
            {
                "name": t.name,
                "scale": scale_of[t.name],
                "storage": t.storage.value,
                "rows": t.shape[0],
                "cols": t.shape[1],
                "block_rows": block[0],
                "block_cols": block[1],
                "scale_exponent": src.direct_scale_exponent(),
            }
        )
    return out


def write_manifest(out_dir: str, plan: ModelPlan, seed: int, direct_codes_min_numel: int) -> int:
    """Write dsv41rt_synthetic.json into out_dir; returns the number of tensors it lists."""
    _check_seed(seed)
    entries = manifest_entries(plan, seed, direct_codes_min_numel)
    with open(os.path.join(out_dir, SYNTHETIC_MANIFEST), "w") as f:
        json.dump({"seed": seed, "tensors": entries}, f, indent=1)
        f.write("\n")
    return len(entries)


def write_synthetic_checkpoint(
    preset: str,
    seed: int,
    out_dir: str,
    *,
    direct_codes_min_numel: int = DIRECT_CODES_MIN_NUMEL,
    tokenizer: bool = True,
) -> str:
    """Write preset `preset`'s synthetic checkpoint for `seed` into out_dir; returns out_dir.

    Unknown presets raise ConfigError naming the known ones; a negative seed CheckpointError.
    """
    _check_seed(seed)
    cfg = preset_config_json(preset)
    build_plan(config_from_dict(cfg, source=preset))  # config errors before any file is written
    make_checkpoint(
        cfg,
        out_dir,
        seed,
        name=preset,
        tokenizer=tokenizer,
        direct_codes_min_numel=direct_codes_min_numel,
        synthetic=True,
    )
    return out_dir
