"""Open a Hugging Face-format checkpoint directory: config + safetensors, validated once in C++.

`open_checkpoint` is cpp/runtime/model/checkpoint_validation.h's open_checkpoint: it parses
config.json (ConfigError naming the field), maps the safetensors files (CheckpointError naming the
file and tensor) and checks every tensor against the tensor spec, reporting all mismatches together
(CheckpointError with `.problems`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import _core
from ..config import ModelConfig, ModelPlan
from ..config.parse import config_of
from ..config.plan import plan_of


@dataclass(frozen=True)
class OpenedCheckpoint:
    path: str
    config: ModelConfig
    plan: ModelPlan
    tensors: _core.Checkpoint


def open_checkpoint(path: str, *, validate: bool = True) -> OpenedCheckpoint:
    native_plan, tensors = _core.open_checkpoint(path, validate)
    config = config_of(native_plan.config)
    return OpenedCheckpoint(path, config, plan_of(config, native_plan), tensors)
