"""Parse a Hugging Face `config.json` dict into a validated `ModelConfig`.

Structural fields (widths, layer counts, schedules) are required: a partial config must not silently
become a different model. Numerics that every release shares (eps, Sinkhorn iterations, token ids)
take the released defaults when absent, as the reference config classes do. Unknown keys are
ignored (HF configs carry many non-architectural keys), but every key that is read is type-checked
and errors name the key path.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from ..errors import ConfigError
from .schema import Arch, DSparkConfig, EngramConfig, ModelConfig, QuantConfig, RopeScaling
from .validate import validate_config

_MISSING = object()


class _Fields:
    """Typed accessor over one JSON object that names `prefix.key` in every error."""

    def __init__(self, data: Any, prefix: str, source: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: {prefix or 'config'} must be a JSON object, got {type(data).__name__}")
        self.data, self.prefix, self.source = data, prefix, source

    def _name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def _fail(self, key: str, what: str, value: Any) -> ConfigError:
        return ConfigError(f"{self.source}: {self._name(key)} must be {what}, got {value!r}")

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise ConfigError(f"{self.source}: required field {self._name(key)} is missing")
        return default

    def int(self, key: str, default: Any = _MISSING, *, minimum: int | None = None) -> int:
        v = self.raw(key, default)
        if type(v) is not int:
            raise self._fail(key, "an integer", v)
        if minimum is not None and v < minimum:
            raise self._fail(key, f"an integer >= {minimum}", v)
        return v

    def opt_int(self, key: str) -> int | None:
        v = self.raw(key, None)
        return None if v is None else self.int(key)

    def float(self, key: str, default: Any = _MISSING, *, positive: bool = False) -> float:
        v = self.raw(key, default)
        if type(v) not in (int, float) or not math.isfinite(v):
            raise self._fail(key, "a finite number", v)
        if positive and v <= 0:
            raise self._fail(key, "a positive number", v)
        return float(v)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        v = self.raw(key, default)
        if type(v) is not bool:
            raise self._fail(key, "true or false", v)
        return v

    def str(self, key: str, default: Any = _MISSING) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise self._fail(key, "a string", v)
        return v

    def ints(self, key: str, default: Any = _MISSING) -> tuple[int, ...]:
        v = self.raw(key, default)
        if not isinstance(v, (list, tuple)) or any(type(x) is not int for x in v):
            raise self._fail(key, "a list of integers", v)
        return tuple(v)

    def sub(self, key: str, default: Any = _MISSING) -> _Fields | None:
        v = self.raw(key, default)
        return None if v is None else _Fields(v, self._name(key), self.source)


def _rope_scaling(f: _Fields) -> RopeScaling | None:
    rs = f.sub("rope_scaling", None)
    if rs is None:
        return None
    kind = rs.data.get("rope_type", rs.data.get("type"))  # V4.1 writes rope_type, the V4 release `type`
    if kind != "yarn":
        raise ConfigError(f"{f.source}: {rs.prefix}.rope_type must be 'yarn', got {kind!r}")
    return RopeScaling(
        factor=rs.float("factor", positive=True),
        original_max_position_embeddings=rs.int("original_max_position_embeddings", minimum=1),
        beta_fast=rs.float("beta_fast", positive=True),
        beta_slow=rs.float("beta_slow", positive=True),
    )


def _quant(top: _Fields, text: _Fields, arch: Arch) -> QuantConfig | None:
    q = top.sub("quantization_config", None)
    if q is None:
        return None
    method = q.str("quant_method")
    if method != "fp8":
        raise ConfigError(f"{top.source}: quantization_config.quant_method must be 'fp8', got {method!r}")
    scale_fmt = q.str("scale_fmt", "ue8m0")
    if scale_fmt != "ue8m0":
        raise ConfigError(f"{top.source}: quantization_config.scale_fmt must be 'ue8m0', got {scale_fmt!r}")
    block = q.ints("weight_block_size")
    if len(block) != 2 or min(block) <= 0:
        raise ConfigError(
            f"{top.source}: quantization_config.weight_block_size must be two positive integers, got {list(block)!r}"
        )
    # V4.1 keeps expert_dtype inside quantization_config, the V4 release at top level.
    expert = q.data.get("expert_dtype", top.data.get("expert_dtype", text.data.get("expert_dtype")))
    if expert not in (None, "fp4", "fp8"):
        raise ConfigError(f"{top.source}: expert_dtype must be 'fp4' or 'fp8', got {expert!r}")
    return QuantConfig(
        weight_block_size=(block[0], block[1]),
        expert_dtype=None if expert == "fp8" else expert,
        scale_fmt=scale_fmt,
        activation_scheme=q.str("activation_scheme", "dynamic"),
    )


def _common(t: _Fields) -> dict[str, Any]:
    return dict(
        vocab_size=t.int("vocab_size", minimum=1),
        hidden_size=t.int("hidden_size", minimum=1),
        moe_intermediate_size=t.int("moe_intermediate_size", minimum=1),
        num_hidden_layers=t.int("num_hidden_layers", minimum=1),
        num_attention_heads=t.int("num_attention_heads", minimum=1),
        num_key_value_heads=t.int("num_key_value_heads", 1),
        head_dim=t.int("head_dim", minimum=1),
        qk_rope_head_dim=t.int("qk_rope_head_dim", minimum=1),
        q_lora_rank=t.int("q_lora_rank", minimum=1),
        o_lora_rank=t.int("o_lora_rank", minimum=1),
        o_groups=t.int("o_groups", minimum=1),
        n_routed_experts=t.int("n_routed_experts", minimum=1),
        n_shared_experts=t.int("n_shared_experts", 1),
        num_experts_per_tok=t.int("num_experts_per_tok", minimum=1),
        scoring_func=t.str("scoring_func", "sqrtsoftplus"),
        topk_method=t.str("topk_method", "noaux_tc"),
        norm_topk_prob=t.bool("norm_topk_prob", True),
        routed_scaling_factor=t.float("routed_scaling_factor", positive=True),
        swiglu_limit=t.float("swiglu_limit", 10.0, positive=True),
        sliding_window=t.int("sliding_window", minimum=1),
        compress_ratios=t.ints("compress_ratios"),
        rope_theta=t.float("rope_theta", 10000.0, positive=True),
        compress_rope_theta=t.float("compress_rope_theta", 160000.0, positive=True),
        rope_scaling=_rope_scaling(t),
        max_position_embeddings=t.int("max_position_embeddings", 1048576, minimum=1),
        index_n_heads=t.int("index_n_heads", minimum=1),
        index_head_dim=t.int("index_head_dim", minimum=1),
        index_topk=t.int("index_topk", minimum=1),
        hc_mult=t.int("hc_mult", 4, minimum=1),
        hc_sinkhorn_iters=t.int("hc_sinkhorn_iters", 20, minimum=1),
        hc_eps=t.float("hc_eps", 1e-6, positive=True),
        num_nextn_predict_layers=t.int("num_nextn_predict_layers", 0, minimum=0),
    )


def _token_ids(top: _Fields, t: _Fields) -> dict[str, Any]:
    def pick(key: str, default: int | None) -> int | None:
        src = top if key in top.data else t
        return src.opt_int(key) if key in src.data else default

    bos, eos = pick("bos_token_id", 0), pick("eos_token_id", 1)
    if bos is None or eos is None:
        raise ConfigError(f"{top.source}: bos_token_id and eos_token_id must be integers")
    return dict(bos_token_id=bos, eos_token_id=eos, pad_token_id=pick("pad_token_id", None))


def _parse_v41(top: _Fields) -> ModelConfig:
    t = top.sub("text_config")
    assert t is not None
    fields = _common(t)
    fields["rms_norm_eps"] = t.float("rms_norm_eps", 1e-20, positive=True)
    engram_ids = t.ints("engram_layer_ids", ())
    engram = None
    if engram_ids:
        engram = EngramConfig(
            layer_ids=engram_ids,
            num_embeddings=t.ints("engram_num_embeddings"),
            max_ngram_size=t.int("engram_max_ngram_size", 4, minimum=2),
            vocab_size=t.int("engram_vocab_size", minimum=2),
            n_heads=t.int("engram_n_heads", minimum=1),
            head_dim=t.int("engram_head_dim", minimum=1),
            pad_token_id=t.int("engram_pad_token_id", 2, minimum=0),
            compressed_vocab_size=t.int("engram_compressed_vocab_size", minimum=1),
        )
    n_stages = fields["num_nextn_predict_layers"]
    dspark = None
    if n_stages:
        dspark = DSparkConfig(
            num_stages=n_stages,
            block_size=t.int("dspark_block_size", minimum=1),
            noise_token_id=t.int("dspark_noise_token_id", minimum=0),
            target_layer_ids=t.ints("dspark_target_layer_ids"),
            markov_rank=t.int("dspark_markov_rank", minimum=1),
            n_routed_experts=t.int("dspark_n_routed_experts", minimum=1),
            num_experts_per_tok=t.int("dspark_num_experts_per_tok", minimum=1),
        )
    return ModelConfig(
        arch=Arch.V41,
        **fields,
        **_token_ids(top, t),
        quant=_quant(top, t, Arch.V41),
        kv_source_layer_ids=t.ints("kv_source_layer_ids"),
        index_source_layer_ids=t.ints("index_source_layer_ids"),
        candidate_source_layer_id=t.int("candidate_source_layer_id", -1, minimum=-1),
        candidate_topk_blocks=t.int("candidate_topk_blocks", 0, minimum=0),
        candidate_block_size=t.int("candidate_block_size", 0, minimum=0),
        engram=engram,
        dspark=dspark,
        source=top.source,
    )


def _parse_v4(top: _Fields) -> ModelConfig:
    fields = _common(top)
    fields["rms_norm_eps"] = top.float("rms_norm_eps", 1e-6, positive=True)
    return ModelConfig(
        arch=Arch.V4,
        **fields,
        **_token_ids(top, top),
        quant=_quant(top, top, Arch.V4),
        num_hash_layers=top.int("num_hash_layers", 0, minimum=0),
        source=top.source,
    )


def config_from_dict(data: Any, source: str = "<dict>") -> ModelConfig:
    """Parse and validate a config.json dict; raises ConfigError naming the offending field."""
    top = _Fields(data, "", source)
    model_type = top.str("model_type")
    if model_type == Arch.V41.value:
        cfg = _parse_v41(top)
    elif model_type == Arch.V4.value:
        cfg = _parse_v4(top)
    else:
        raise ConfigError(f"{source}: model_type must be 'deepseek_v41' or 'deepseek_v4', got {model_type!r}")
    validate_config(cfg)
    return cfg


def load_config(path: str) -> ModelConfig:
    """Load `config.json` from a checkpoint directory (or the file itself)."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{file}: no config.json found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: not valid JSON: {e}") from None
    return config_from_dict(data, source=file)
