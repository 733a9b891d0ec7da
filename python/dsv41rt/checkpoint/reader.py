"""Open a Hugging Face-format checkpoint directory: config + safetensors (via the C++ reader)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .. import _core
from ..config import ModelConfig, ModelPlan, build_plan, load_config
from ..errors import CheckpointError
from .validate import validate_checkpoint_tensors


@dataclass(frozen=True)
class OpenedCheckpoint:
    path: str
    config: ModelConfig
    plan: ModelPlan
    tensors: _core.Checkpoint


def open_tensors(path: str) -> _core.Checkpoint:
    """The zero-copy safetensors view of a checkpoint; header errors name the file and tensor."""
    try:
        return _core.Checkpoint(path)
    except _core.Error as e:
        raise CheckpointError(str(e)) from None


def open_checkpoint(path: str, *, validate: bool = True) -> OpenedCheckpoint:
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a checkpoint directory")
    config = load_config(path)
    plan = build_plan(config)
    tensors = open_tensors(path)
    if validate:
        found = {name: (dtype, shape) for name, (dtype, shape) in tensors.all_info().items()}
        validate_checkpoint_tensors(plan, found, path)
    return OpenedCheckpoint(path, config, plan, tensors)
