"""Model configs: parsing, validation, the per-layer plan, presets and cache accounting."""

from .cache_bytes import CacheBytes, cache_bytes
from .parse import config_from_dict, load_config
from .plan import Candidates, LayerPlan, ModelPlan, Role, Stage, build_plan
from .presets import preset_config_json, preset_names
from .schema import Arch, DSparkConfig, EngramConfig, ModelConfig, QuantConfig, RopeScaling

__all__ = [
    "Arch",
    "CacheBytes",
    "Candidates",
    "DSparkConfig",
    "EngramConfig",
    "LayerPlan",
    "ModelConfig",
    "ModelPlan",
    "QuantConfig",
    "Role",
    "RopeScaling",
    "Stage",
    "build_plan",
    "cache_bytes",
    "config_from_dict",
    "load_config",
    "preset_config_json",
    "preset_names",
]
