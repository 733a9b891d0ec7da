"""Schedule and shape rules of DeepSeek-V4.1 / V4 configs (architecture spec §1.1, §1.2).

Each violated rule raises ConfigError naming the field and the layer. These are the rules the
reference implementation enforces plus the ones our kernels and cache formats rely on (widths that
are multiples of the quantiser blocks, supported compression ratios).
"""

from __future__ import annotations

from ..errors import ConfigError
from .engram_layout import engram_layouts
from .schema import ModelConfig

V41_RATIOS = (0, 1, 2)
V4_RATIOS = (0, 4, 128)


def _fail(cfg: ModelConfig, msg: str) -> ConfigError:
    return ConfigError(f"{cfg.source}: {msg}")


def _check_layer_list(cfg: ModelConfig, name: str, ids: tuple[int, ...], limit: int) -> None:
    if list(ids) != sorted(set(ids)):
        raise _fail(cfg, f"{name} must be strictly increasing, got {list(ids)}")
    bad = [i for i in ids if not 0 <= i < limit]
    if bad:
        raise _fail(cfg, f"{name} refers to layers {bad} outside 0..{limit - 1}")


def _validate_common(cfg: ModelConfig) -> None:
    if cfg.num_key_value_heads != 1:
        raise _fail(cfg, f"num_key_value_heads must be 1 (one shared KV latent), got {cfg.num_key_value_heads}")
    if cfg.n_shared_experts != 1:
        raise _fail(cfg, f"n_shared_experts must be 1, got {cfg.n_shared_experts}")
    if cfg.num_attention_heads % cfg.o_groups:
        raise _fail(
            cfg, f"num_attention_heads ({cfg.num_attention_heads}) must be divisible by o_groups ({cfg.o_groups})"
        )
    r = cfg.qk_rope_head_dim
    if r % 2 or r > min(cfg.head_dim, cfg.index_head_dim):
        raise _fail(
            cfg,
            f"qk_rope_head_dim ({r}) must be even and <= head_dim ({cfg.head_dim}) and "
            f"index_head_dim ({cfg.index_head_dim})",
        )
    if cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise _fail(
            cfg, f"num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds n_routed_experts ({cfg.n_routed_experts})"
        )
    if cfg.scoring_func != "sqrtsoftplus":
        raise _fail(cfg, f"scoring_func must be 'sqrtsoftplus', got {cfg.scoring_func!r}")
    if cfg.topk_method != "noaux_tc":
        raise _fail(cfg, f"topk_method must be 'noaux_tc', got {cfg.topk_method!r}")
    # Cache formats quantise head/index vectors in blocks of 32 (FP8 window, MXFP4) and 16 (NVFP4).
    for name in ("head_dim", "index_head_dim", "hidden_size"):
        if getattr(cfg, name) % 32:
            raise _fail(cfg, f"{name} ({getattr(cfg, name)}) must be a multiple of 32 (quantiser block)")
    if cfg.quant is not None and cfg.quant.expert_dtype == "fp4":
        for name in ("hidden_size", "moe_intermediate_size"):
            if getattr(cfg, name) % 32:
                raise _fail(cfg, f"{name} ({getattr(cfg, name)}) must be a multiple of 32 for FP4 experts")
    needed = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    if len(cfg.compress_ratios) < needed:
        raise _fail(
            cfg,
            f"compress_ratios has {len(cfg.compress_ratios)} entries but num_hidden_layers + "
            f"num_nextn_predict_layers = {needed}",
        )
    for i in range(cfg.num_hidden_layers, needed):
        if cfg.compress_ratios[i] != 0:
            raise _fail(cfg, f"compress_ratios[{i}] (draft/MTP stage) must be 0, got {cfg.compress_ratios[i]}")
    allowed = V41_RATIOS if cfg.is_v41 else V4_RATIOS
    for i, m in enumerate(cfg.compress_ratios):
        if m not in allowed:
            raise _fail(
                cfg, f"compress_ratios[{i}] = {m} is not supported for {cfg.arch.value} (allowed: {list(allowed)})"
            )
    if any(m > 0 for m in cfg.backbone_ratios) and cfg.rope_scaling is None:
        raise _fail(cfg, "rope_scaling (YaRN) is required when any layer has compress ratio > 0")


def _validate_v41_schedule(cfg: ModelConfig) -> None:
    n = cfg.num_hidden_layers
    kv, idx = cfg.kv_source_layer_ids, cfg.index_source_layer_ids
    _check_layer_list(cfg, "kv_source_layer_ids", kv, n)
    _check_layer_list(cfg, "index_source_layer_ids", idx, n)
    missing = sorted(set(kv) - set(idx))
    if missing:
        raise _fail(cfg, f"kv_source_layer_ids {missing} must also be in index_source_layer_ids")
    owner_ratio = None
    for layer, m in enumerate(cfg.backbone_ratios):
        if m == 0:
            if layer in kv or layer in idx:
                raise _fail(cfg, f"layer {layer} has compress ratio 0 (SWA-only) and cannot be a KV or index source")
            continue
        if layer in kv:
            owner_ratio = m
        if owner_ratio != m:
            raise _fail(
                cfg,
                f"layer {layer} (compress ratio {m}) needs a preceding KV source with the same ratio "
                f"(the most recent KV source has ratio {owner_ratio})",
            )
    c = cfg.candidate_source_layer_id
    if c >= 0:
        if c not in kv:
            raise _fail(cfg, f"candidate_source_layer_id {c} must be -1 or one of kv_source_layer_ids {list(kv)}")
        if cfg.candidate_block_size <= 0 or cfg.candidate_topk_blocks <= 0:
            raise _fail(
                cfg,
                "candidate_block_size and candidate_topk_blocks must be positive when candidate_source_layer_id is set",
            )


def _validate_engram(cfg: ModelConfig) -> None:
    e = cfg.engram
    if e is None:
        return
    _check_layer_list(cfg, "engram_layer_ids", e.layer_ids, cfg.num_hidden_layers)
    if len(e.num_embeddings) != len(e.layer_ids):
        raise _fail(
            cfg, f"engram_num_embeddings has {len(e.num_embeddings)} entries for {len(e.layer_ids)} engram_layer_ids"
        )
    if not 0 <= e.pad_token_id < cfg.vocab_size:
        raise _fail(cfg, f"engram_pad_token_id {e.pad_token_id} is outside the vocabulary (0..{cfg.vocab_size - 1})")
    if e.head_dim % 32:
        raise _fail(cfg, f"engram_head_dim ({e.head_dim}) must be a multiple of 32 (FP8 row block)")
    for layout, rows in zip(engram_layouts(e), e.num_embeddings, strict=True):
        if rows < layout.required_rows:
            raise _fail(
                cfg,
                f"engram_num_embeddings for layer {layout.layer_id} is {rows}, but its hash buckets "
                f"need {layout.required_rows} rows (sum of primes {list(layout.primes)})",
            )


def _validate_dspark(cfg: ModelConfig) -> None:
    d = cfg.dspark
    if d is None:
        return
    _check_layer_list(cfg, "dspark_target_layer_ids", d.target_layer_ids, cfg.num_hidden_layers)
    if not d.target_layer_ids:
        raise _fail(cfg, "dspark_target_layer_ids must not be empty when num_nextn_predict_layers > 0")
    if d.num_experts_per_tok > d.n_routed_experts:
        raise _fail(
            cfg,
            f"dspark_num_experts_per_tok ({d.num_experts_per_tok}) exceeds dspark_n_routed_experts "
            f"({d.n_routed_experts})",
        )
    if d.block_size < 2:
        raise _fail(cfg, f"dspark_block_size must be >= 2 (anchor + at least one draft slot), got {d.block_size}")
    if not 0 <= d.noise_token_id < cfg.vocab_size:
        raise _fail(cfg, f"dspark_noise_token_id {d.noise_token_id} is outside the vocabulary")


def _validate_v4(cfg: ModelConfig) -> None:
    if cfg.num_hash_layers > cfg.num_hidden_layers:
        raise _fail(cfg, f"num_hash_layers ({cfg.num_hash_layers}) exceeds num_hidden_layers ({cfg.num_hidden_layers})")
    if cfg.num_hash_layers and cfg.num_experts_per_tok > cfg.n_routed_experts:
        raise _fail(cfg, "hash layers need num_experts_per_tok <= n_routed_experts")


def validate_config(cfg: ModelConfig) -> None:
    """Raise ConfigError on the first violated rule."""
    _validate_common(cfg)
    if cfg.is_v41:
        _validate_v41_schedule(cfg)
        _validate_engram(cfg)
        _validate_dspark(cfg)
    else:
        _validate_v4(cfg)
