"""Named model configs as `config.json` dicts.

Released configs (no weights): `deepseek-v4.1-flash`, `deepseek-v4-flash`, `deepseek-v4-pro`
(architecture spec §1.1, §1.2). Generator presets (`dsv41rt make-checkpoint --preset`):

* `tiny-v41` — every V4.1 structural feature at tiny width (the widths of the shared oracle's tiny
  preset, which NeMo loads: real 129280-token vocabulary so Engram hashing matches): ratios 0/1/2,
  Full/Reindex/Reuse, a candidate source and users, Engram on an SWA and a compressed layer, mHC,
  and two DSpark stages.
* `tiny-v41-released-schedule` — tiny widths with the released 40-layer V4.1-Flash schedule and role
  lists (and 3 DSpark stages).
* `tiny-v4` — V4 at tiny width: SWA, CSA (ratio 4), HCA (ratio 128), hash-routed MoE, one MTP layer.
* `tiny-v4-d512` — tiny-v4 with the release's head_dim 512 / qk_rope_head_dim 64 (index_head_dim 64),
  the one width V4's quantised cache rows (584 B, `kv_cache_dtype auto`) hold.
* `bench-40` — released V4.1-Flash widths and 40-layer schedule with 32 routed experts and small
  Engram tables, for benchmarks on one GPU.
* `flash-full` — the released V4.1-Flash text config (384 routed experts, full Engram tables): about
  300 GB of weights, meant for synthetic weights generated at load (checkpoint/synthetic.py) rather
  than for `make-checkpoint`.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from ..errors import ConfigError

V41_YARN = {
    "rope_type": "yarn",
    "factor": 16,
    "beta_fast": 32,
    "beta_slow": 1,
    "original_max_position_embeddings": 65536,
}
V4_YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}
V41_QUANT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "activation_scheme": "dynamic",
    "weight_block_size": [32, 32],
    "expert_dtype": "fp4",
}
V4_QUANT = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}

# Released V4.1-Flash text_config (spec §1.1).
V41_FLASH_TEXT: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 5120,
    "moe_intermediate_size": 2304,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "hidden_act": "silu",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "tie_word_embeddings": False,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000.0,
    "rope_scaling": V41_YARN,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * 3,
    "compress_rope_theta": 160000.0,
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 3,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_num_experts_per_tok": 3,
    "dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "model_type": "deepseek_v41_text",
}
V41_FLASH_VISION: dict[str, Any] = {
    "num_hidden_layers": 32,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "intermediate_size": 2816,
    "patch_size": 14,
    "rope_theta": 10000.0,
    "downsample_ratio": 3,
    "max_image_tokens": 1024,
    "min_pixels": 295936,
    "max_wh_ratio": None,
    "model_type": "deepseek_v41_vision",
}
TEXT_ONLY_VISION = dict(V41_FLASH_VISION, num_hidden_layers=0)


def v41_config_json(
    text: dict[str, Any], *, quantized: bool = True, vision: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Top-level V4.1 config.json around a text_config (nested, as released)."""
    out: dict[str, Any] = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
        "image_token_id": 129264,
        "text_config": copy.deepcopy(text),
        "vision_config": copy.deepcopy(vision if vision is not None else TEXT_ONLY_VISION),
    }
    if quantized:
        out["quantization_config"] = dict(V41_QUANT)
    return out


def _v4(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": 129280,
        "num_key_value_heads": 1,
        "head_dim": 512,
        "qk_rope_head_dim": 64,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "swiglu_limit": 10.0,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "sliding_window": 128,
        "compress_rope_theta": 160000.0,
        "rope_theta": 10000.0,
        "rope_scaling": dict(V4_YARN),
        "num_hash_layers": 3,
        "index_head_dim": 128,
        "hc_mult": 4,
        "hc_sinkhorn_iters": 20,
        "hc_eps": 1e-6,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 1048576,
        "initializer_range": 0.02,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "expert_dtype": "fp4",
        "quantization_config": dict(V4_QUANT),
    }
    out.update(kw)
    return out


def _deepseek_v4_flash() -> dict[str, Any]:
    return _v4(
        hidden_size=4096,
        num_hidden_layers=43,
        num_attention_heads=64,
        q_lora_rank=1024,
        o_lora_rank=1024,
        o_groups=8,
        moe_intermediate_size=2048,
        n_routed_experts=256,
        routed_scaling_factor=1.5,
        compress_ratios=[0, 0] + [4, 128] * 20 + [4, 0],
        index_n_heads=64,
        index_topk=512,
    )


def _deepseek_v4_pro() -> dict[str, Any]:
    return _v4(
        hidden_size=7168,
        num_hidden_layers=61,
        num_attention_heads=128,
        q_lora_rank=1536,
        o_lora_rank=1024,
        o_groups=16,
        moe_intermediate_size=3072,
        n_routed_experts=384,
        routed_scaling_factor=2.5,
        compress_ratios=[128, 128] + [4, 128] * 29 + [4, 0],
        index_n_heads=64,
        index_topk=1024,
    )


# Tiny widths shared by the tiny V4.1 presets (the shared oracle's "tiny": NeMo loads these).
_TINY_WIDTHS: dict[str, Any] = {
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 32,
    "o_lora_rank": 32,
    "o_groups": 2,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "sliding_window": 8,
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 8,
    "engram_vocab_size": 512,
    "engram_n_heads": 2,
    "engram_head_dim": 32,
    "dspark_markov_rank": 16,
    "dspark_n_routed_experts": 4,
    "dspark_num_experts_per_tok": 2,
}


def _with_engram_rows(text: dict[str, Any]) -> dict[str, Any]:
    """Fill engram_num_embeddings with the exact prime sums, as the release does."""
    from .engram_layout import engram_layouts
    from .schema import EngramConfig

    e = EngramConfig(
        tuple(text["engram_layer_ids"]),
        (),
        text["engram_max_ngram_size"],
        text["engram_vocab_size"],
        text["engram_n_heads"],
        text["engram_head_dim"],
        text["engram_pad_token_id"],
        text["engram_compressed_vocab_size"],
    )
    text["engram_num_embeddings"] = [layout.required_rows for layout in engram_layouts(e)]
    return text


def _tiny_v41() -> dict[str, Any]:
    # 13 backbone layers: SWA x2 | ratio 2: Full, Reuse, Reindex, Full, Reuse | ratio 1: Full, Reindex,
    # Full (candidate source), Reindex (uses candidates), Reuse | SWA; Engram on 1 (SWA) and 8 (Reindex);
    # 2 DSpark stages fed by layers 10-12.
    text = dict(V41_FLASH_TEXT, **_TINY_WIDTHS)
    text.update(
        num_hidden_layers=13,
        compress_ratios=[0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0],
        kv_source_layer_ids=[2, 5, 7, 9],
        index_source_layer_ids=[2, 4, 5, 7, 8, 9, 10],
        candidate_source_layer_id=9,
        candidate_topk_blocks=3,
        candidate_block_size=4,
        hc_mult=2,
        engram_layer_ids=[1, 8],
        num_nextn_predict_layers=2,
        dspark_target_layer_ids=[10, 11, 12],
    )
    return v41_config_json(_with_engram_rows(text))


def _tiny_v41_released_schedule() -> dict[str, Any]:
    text = dict(V41_FLASH_TEXT, **_TINY_WIDTHS)
    text.update(candidate_topk_blocks=3, candidate_block_size=4)
    return v41_config_json(_with_engram_rows(text))


def _tiny_v4() -> dict[str, Any]:
    # SWA, SWA, CSA(4), HCA(128), CSA, HCA; layers 0-2 hash-routed; one MTP layer.
    return _v4(
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=6,
        num_attention_heads=4,
        head_dim=64,
        qk_rope_head_dim=16,
        q_lora_rank=32,
        o_lora_rank=32,
        o_groups=2,
        n_routed_experts=8,
        num_experts_per_tok=2,
        routed_scaling_factor=1.5,
        sliding_window=8,
        compress_ratios=[0, 0, 4, 128, 4, 128, 0],
        num_hash_layers=3,
        index_n_heads=16,
        index_head_dim=32,
        index_topk=8,
        hc_mult=2,
    )


def _tiny_v4_d512() -> dict[str, Any]:
    # V4's 584-byte cache rows hold head_dim 512 with a 64-channel rope part only (spec 5.4).
    # The indexer ropes the same 64 channels of its keys, so index_head_dim grows to 64 too.
    return {**_tiny_v4(), "head_dim": 512, "qk_rope_head_dim": 64, "index_head_dim": 64}


def _bench_40() -> dict[str, Any]:
    text = dict(V41_FLASH_TEXT, n_routed_experts=32, engram_vocab_size=20000, dspark_n_routed_experts=32)
    return v41_config_json(_with_engram_rows(text))


RELEASED = {
    "deepseek-v4.1-flash": lambda: v41_config_json(V41_FLASH_TEXT, vision=V41_FLASH_VISION),
    "deepseek-v4-flash": _deepseek_v4_flash,
    "deepseek-v4-pro": _deepseek_v4_pro,
}
GENERATOR = {
    "tiny-v41": _tiny_v41,
    "tiny-v41-released-schedule": _tiny_v41_released_schedule,
    "tiny-v4": _tiny_v4,
    "tiny-v4-d512": _tiny_v4_d512,
    "bench-40": _bench_40,
    "flash-full": lambda: v41_config_json(V41_FLASH_TEXT),
}


def preset_names() -> list[str]:
    return sorted(RELEASED) + sorted(GENERATOR)


@cache
def _cached(name: str) -> dict[str, Any]:
    table = {**RELEASED, **GENERATOR}
    if name not in table:
        raise ConfigError(f"unknown preset {name!r}; known presets: {', '.join(preset_names())}")
    return table[name]()


def preset_config_json(name: str) -> dict[str, Any]:
    """A fresh copy of the config.json dict of a named preset."""
    return copy.deepcopy(_cached(name))
