"""Config parsing, validation and the per-layer plan (architecture spec §1, §2.9, §7.1).

One implementation (cpp/runtime/model/, bound as dsv41rt._core) parses and plans for both Python and
C++ hosts; these tests run it on every preset and every broken config, through a dict and a file.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from dsv41rt.checkpoint.tensor_spec import Storage, expected_tensors, physical_tensors
from dsv41rt.config import Candidates, Role, build_plan, cache_bytes, config_from_dict, load_config
from dsv41rt.config.engram_layout import engram_layouts
from dsv41rt.config.presets import preset_config_json, preset_names
from dsv41rt.errors import ConfigError


def plan_of(name: str):
    return build_plan(config_from_dict(preset_config_json(name), name))


def test_every_preset_parses_and_plans() -> None:
    assert {
        "deepseek-v4.1-flash",
        "deepseek-v4-flash",
        "deepseek-v4-pro",
        "tiny-v41",
        "tiny-v41-released-schedule",
        "tiny-v4",
        "bench-40",
        "flash-full",
    } <= set(preset_names())
    for name in preset_names():
        plan = plan_of(name)
        assert len(plan.layers) == plan.config.num_hidden_layers


# One letter per backbone layer (S SWA-only, F Full, R Reindex, U Reuse, C CSA, H HCA), the draft
# stages (stage, count, experts, top-k) and the weights' storage (FP8 block, expert dtype).
_V41_RELEASED = "SSFUUUUUFUUUUUFUUUUUFUUURUUURUUURUUURUUU"
SCHEDULES = {
    "deepseek-v4.1-flash": (_V41_RELEASED, ("dspark", 3, 128, 3), (32, 32), "fp4"),
    "bench-40": (_V41_RELEASED, ("dspark", 3, 32, 3), (32, 32), "fp4"),
    "flash-full": (_V41_RELEASED, ("dspark", 3, 128, 3), (32, 32), "fp4"),
    "tiny-v41-released-schedule": (_V41_RELEASED, ("dspark", 3, 4, 2), (32, 32), "fp4"),
    "tiny-v41": ("SSFURFUFRFRUS", ("dspark", 2, 4, 2), (32, 32), "fp4"),
    "deepseek-v4-flash": ("SS" + "CH" * 20 + "C", ("mtp", 1, 256, 6), (128, 128), "fp4"),
    "deepseek-v4-pro": ("HH" + "CH" * 29 + "C", ("mtp", 1, 384, 6), (128, 128), "fp4"),
    "tiny-v4": ("SSCHCH", ("mtp", 1, 8, 2), (128, 128), "fp4"),
}
_LETTER = {Role.SWA: "S", Role.FULL: "F", Role.REINDEX: "R", Role.REUSE: "U", Role.CSA: "C", Role.HCA: "H"}


def _unquantized(name: str) -> dict:
    d = preset_config_json(name)
    del d["quantization_config"]
    return d


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_preset_schedules(name: str) -> None:
    roles, (stage, n_stages, n_experts, top_k), block, experts = SCHEDULES[name]
    plan = plan_of(name)
    assert "".join(_LETTER[x.role] for x in plan.layers) == roles
    assert len(plan.draft_layers) == n_stages
    for i, x in enumerate(plan.draft_layers):
        assert (x.index, x.stage.value, x.ratio, x.role) == (i, stage, 0, Role.SWA)
        assert (x.kv_source, x.topk_source) == (None, None)
        assert (x.n_experts, x.experts_per_tok, x.rope_base, x.yarn) == (n_experts, top_k, 10000.0, False)
        assert x.name_prefix == f"mtp.{i}."
    assert all(x.stage.value == "backbone" and x.name_prefix == f"layers.{i}." for i, x in enumerate(plan.layers))
    assert plan.config.quant is not None
    assert (plan.config.quant.weight_block_size, plan.config.quant.expert_dtype) == (block, experts)


def test_unquantized_configs_keep_release_storage() -> None:
    for name, block in (("tiny-v41", (32, 32)), ("tiny-v4", (128, 128))):
        cfg = config_from_dict(_unquantized(name), name)
        assert cfg.quant is None
        plan = build_plan(cfg)
        assert [x.role for x in plan.layers] == [x.role for x in plan_of(name).layers]
        spec = {t.name: t for t in expected_tensors(plan)}
        assert spec["layers.2.attn.wq_b.weight"].block == block  # the release's grid, stored BF16
        assert spec["layers.2.ffn.experts.0.w1.weight"].storage is Storage.FP4
        assert {t.dtype for t in physical_tensors(plan)} <= {"BF16", "F32", "I64"}


def test_released_v41_flash_schedule_matches_spec_table() -> None:
    plan = plan_of("deepseek-v4.1-flash")
    counts = plan.role_counts()
    assert (counts[Role.SWA], counts[Role.FULL], counts[Role.REINDEX], counts[Role.REUSE]) == (2, 4, 4, 30)
    # Spec §2.9: (layers, role, kv source, top-k source)
    table = [
        ((0, 1), Role.SWA, None, None),
        ((2,), Role.FULL, 2, 2),
        ((3, 4, 5, 6, 7), Role.REUSE, 2, 2),
        ((8,), Role.FULL, 8, 8),
        ((9, 13), Role.REUSE, 8, 8),
        ((14,), Role.FULL, 14, 14),
        ((15, 19), Role.REUSE, 14, 14),
        ((20,), Role.FULL, 20, 20),
        ((21, 23), Role.REUSE, 20, 20),
        ((24,), Role.REINDEX, 20, 24),
        ((25, 27), Role.REUSE, 20, 24),
        ((28,), Role.REINDEX, 20, 28),
        ((29, 31), Role.REUSE, 20, 28),
        ((32,), Role.REINDEX, 20, 32),
        ((33, 35), Role.REUSE, 20, 32),
        ((36,), Role.REINDEX, 20, 36),
        ((37, 39), Role.REUSE, 20, 36),
    ]
    for layers, role, kv, topk in table:
        for i in layers:
            layer = plan.layers[i]
            assert (layer.role, layer.kv_source, layer.topk_source) == (role, kv, topk), i
    assert plan.layers[20].candidates is Candidates.SOURCE
    assert [i for i, x in enumerate(plan.layers) if x.candidates is Candidates.USES] == [24, 28, 32, 36]
    assert [i for i, x in enumerate(plan.layers) if x.engram] == [1, 14]
    assert [x.rope_base for x in plan.layers[:3]] == [10000.0, 10000.0, 160000.0]
    assert not plan.layers[0].yarn and plan.layers[2].yarn
    assert len(plan.draft_layers) == 3 and all(x.n_experts == 128 and x.experts_per_tok == 3 for x in plan.draft_layers)


def test_cache_bytes_match_spec() -> None:
    v41 = cache_bytes(plan_of("deepseek-v4.1-flash"))
    assert v41.global_per_token == 890.0
    assert v41.window_row == 528
    assert 40 * 128 * 528 == 2_703_360  # spec §7.1 backbone windows; DSpark rings add 3 x 67,584
    assert v41.window_per_request == 2_703_360 + 202_752
    assert (v41.compressor_state_per_request, v41.engram_history_per_request) == (3 * (2 * 512 * 4), 3 * 4)
    assert cache_bytes(plan_of("deepseek-v4-flash")).global_per_token == 3514.25
    assert cache_bytes(plan_of("deepseek-v4-flash")).window_row == 584
    assert abs(cache_bytes(plan_of("deepseek-v4-pro")).global_per_token - 5031.4375) < 1e-9


def test_v4_layer_types_follow_released_ratios() -> None:
    flash = plan_of("deepseek-v4-flash")
    assert [x.role for x in flash.layers[:4]] == [Role.SWA, Role.SWA, Role.CSA, Role.HCA]
    assert flash.layers[42].role is Role.CSA and [x.hash_routed for x in flash.layers[:4]] == [True] * 3 + [False]
    pro = plan_of("deepseek-v4-pro")
    assert [x.role for x in pro.layers[:3]] == [Role.HCA, Role.HCA, Role.CSA]
    assert sum(x.role is Role.CSA for x in pro.layers) == 30 and sum(x.role is Role.HCA for x in pro.layers) == 31


def test_engram_primes_of_the_release() -> None:
    cfg = config_from_dict(preset_config_json("deepseek-v4.1-flash"))
    l1, l14 = engram_layouts(cfg.engram)
    assert (l1.primes[0], l1.primes[-1], l14.primes[0], l14.primes[-1]) == (16000057, 16000463, 16000477, 16000889)
    assert (l1.required_rows, l14.required_rows) == (384006168, 384016682)
    assert len(set(l1.primes) | set(l14.primes)) == 48
    assert l1.offsets[:2] == (0, l1.primes[0]) and l1.offsets[-1] == l1.required_rows - l1.primes[-1]


def _v41(**text_overrides):
    d = preset_config_json("tiny-v41")
    d["text_config"].update(text_overrides)
    return d


# (overrides of text_config, substring the error must contain)
BAD_V41 = [
    ({"hidden_size": "64"}, "text_config.hidden_size must be an integer"),
    ({"hidden_size": True}, "text_config.hidden_size must be an integer"),
    ({"num_hidden_layers": 0}, "text_config.num_hidden_layers must be an integer >= 1"),
    ({"rms_norm_eps": float("nan")}, "text_config.rms_norm_eps"),
    ({"compress_ratios": [0, 0, 2]}, "compress_ratios has 3 entries"),
    ({"compress_ratios": [0, 0, 3, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 0, 0]}, "compress_ratios[2] = 3 is not supported"),
    ({"compress_ratios": [0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0, 2, 0]}, "compress_ratios[13] (draft/MTP stage)"),
    ({"kv_source_layer_ids": [2, 5, 7, 9, 3]}, "kv_source_layer_ids must be strictly increasing"),
    ({"kv_source_layer_ids": [2, 5, 7, 9, 11]}, "kv_source_layer_ids [11] must also be in index_source_layer_ids"),
    (
        {"kv_source_layer_ids": [0, 2, 5, 7, 9], "index_source_layer_ids": [0, 2, 4, 5, 7, 8, 9, 10]},
        "layer 0 has compress ratio 0",
    ),
    (
        {"kv_source_layer_ids": [5, 7, 9], "index_source_layer_ids": [4, 5, 7, 8, 9, 10]},
        "layer 2 (compress ratio 2) needs a preceding KV source",
    ),
    (
        {"kv_source_layer_ids": [2, 5, 9], "index_source_layer_ids": [2, 4, 5, 8, 9, 10]},
        "layer 7 (compress ratio 1) needs a preceding KV source with the same ratio",
    ),
    ({"kv_source_layer_ids": [2, 5, 7, 9, 40]}, "kv_source_layer_ids refers to layers [40]"),
    ({"candidate_source_layer_id": 10}, "candidate_source_layer_id 10 must be -1 or one of kv_source_layer_ids"),
    ({"engram_num_embeddings": [3252, 100]}, "engram_num_embeddings for layer 8 is 100"),
    ({"engram_num_embeddings": [3252]}, "engram_num_embeddings has 1 entries"),
    ({"o_groups": 3}, "divisible by o_groups"),
    ({"qk_rope_head_dim": 15}, "qk_rope_head_dim (15) must be even"),
    ({"num_experts_per_tok": 9}, "num_experts_per_tok (9) exceeds n_routed_experts"),
    ({"num_key_value_heads": 2}, "num_key_value_heads must be 1"),
    ({"head_dim": 48}, "head_dim (48) must be a multiple of 32"),
    ({"dspark_target_layer_ids": [10, 11, 13]}, "dspark_target_layer_ids refers to layers [13]"),
    ({"dspark_num_experts_per_tok": 5}, "dspark_num_experts_per_tok (5) exceeds"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2}}, "rope_scaling.rope_type must be 'yarn'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 16}}, "rope_scaling.original_max_position_embeddings is missing"),
    ({"scoring_func": "softmax"}, "scoring_func must be 'sqrtsoftplus'"),
]


@pytest.mark.parametrize("overrides,needle", BAD_V41, ids=[n[:40] for _, n in BAD_V41])
def test_bad_v41_config_names_the_field(overrides, needle) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(_v41(**overrides), "cfg.json")
    assert needle in str(e.value)
    assert str(e.value).startswith("cfg.json:")


def test_missing_required_field_is_named() -> None:
    d = preset_config_json("tiny-v41")
    del d["text_config"]["q_lora_rank"]
    with pytest.raises(ConfigError, match=r"required field text_config\.q_lora_rank is missing"):
        config_from_dict(d)


def test_top_level_errors() -> None:
    with pytest.raises(ConfigError, match="model_type must be 'deepseek_v41' or 'deepseek_v4'"):
        config_from_dict({"model_type": "llama"})
    with pytest.raises(ConfigError, match="text_config must be a JSON object"):
        config_from_dict({"model_type": "deepseek_v41", "text_config": [1]})
    with pytest.raises(ConfigError, match="config must be a JSON object"):
        config_from_dict([1, 2])
    d = preset_config_json("tiny-v41")
    d["quantization_config"]["weight_block_size"] = [32]
    with pytest.raises(ConfigError, match="quantization_config.weight_block_size"):
        config_from_dict(d)


def test_bad_v4_configs() -> None:
    d = preset_config_json("tiny-v4")
    d["compress_ratios"] = [0, 0, 2, 128, 4, 128, 0]
    with pytest.raises(ConfigError, match=r"compress_ratios\[2\] = 2 is not supported for deepseek_v4"):
        config_from_dict(d)
    d = preset_config_json("tiny-v4")
    d["num_hash_layers"] = 7
    with pytest.raises(ConfigError, match="num_hash_layers"):
        config_from_dict(d)


def test_load_config_file_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no config.json found"):
        load_config(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json: not valid JSON"):
        load_config(str(tmp_path))
    good = preset_config_json("tiny-v4")
    (tmp_path / "config.json").write_text(json.dumps(good))
    cfg = load_config(str(tmp_path))
    assert cfg.num_hidden_layers == 6 and cfg.source == str(tmp_path / "config.json")
    assert load_config(str(tmp_path / "config.json")) == cfg


def test_tiny_v41_covers_every_structural_feature() -> None:
    plan = plan_of("tiny-v41")
    roles = {x.role for x in plan.layers}
    assert roles == {Role.SWA, Role.FULL, Role.REINDEX, Role.REUSE}
    assert {x.ratio for x in plan.layers} == {0, 1, 2}
    assert {x.candidates for x in plan.layers} == {Candidates.NONE, Candidates.SOURCE, Candidates.USES}
    assert {plan.layers[i].role for i in plan.config.engram.layer_ids} == {Role.SWA, Role.REINDEX}
    assert len(plan.draft_layers) == 2 and plan.config.hc_mult > 1


def test_config_is_frozen() -> None:
    cfg = config_from_dict(preset_config_json("tiny-v41"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 5  # type: ignore[misc]
    assert copy.deepcopy(cfg) == cfg
    assert build_plan(copy.deepcopy(cfg)) == build_plan(cfg)
