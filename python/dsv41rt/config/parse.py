"""Read a Hugging Face `config.json` into a validated `ModelConfig`, with the C++ parser.

The parser and validator live in cpp/runtime/model/model_config.{h,cc} (one copy, shared with C++
hosts); they raise `ConfigError` naming the source and the offending field or layer. This module only
fills the frozen dataclasses of `schema.py` from the parsed result.
"""

from __future__ import annotations

from typing import Any

from .. import _core
from .schema import Arch, DSparkConfig, EngramConfig, ModelConfig, QuantConfig, RopeScaling


def config_of(native: _core.ModelConfig) -> ModelConfig:
    """The dataclass view of a parsed C++ config."""
    f = native.fields()
    rope, quant, engram, dspark = (f.pop(k) for k in ("rope_scaling", "quant", "engram", "dspark"))
    return ModelConfig(
        **f
        | {
            "arch": Arch(f["arch"]),
            "rope_scaling": RopeScaling(**rope) if rope is not None else None,
            "quant": QuantConfig(**quant) if quant is not None else None,
            "engram": EngramConfig(**engram) if engram is not None else None,
            "dspark": DSparkConfig(**dspark) if dspark is not None else None,
            "native": native,
        }
    )


def config_from_dict(data: Any, source: str = "<dict>") -> ModelConfig:
    """Parse and validate a config.json dict; raises ConfigError naming the offending field."""
    return config_of(_core.model_config_from_object(data, source))


def load_config(path: str) -> ModelConfig:
    """Load `config.json` from a checkpoint directory (or the file itself)."""
    return config_of(_core.load_model_config(path))
