"""Broken configs through both ways in (a dict, a config.json file): one error naming the source,
the field and the layer, from the one parser (cpp/runtime/model/model_config*.cc)."""

from __future__ import annotations

import json
import math

import pytest
from dsv41rt.config import config_from_dict, load_config
from dsv41rt.config.presets import preset_config_json
from dsv41rt.errors import ConfigError
from test_config import BAD_V41, _v41


def _top(**overrides) -> dict:
    d = preset_config_json("tiny-v41")
    d.update(overrides)
    return d


def _quant(**overrides) -> dict:
    d = preset_config_json("tiny-v41")
    d["quantization_config"].update(overrides)
    return d


def _v4(**overrides) -> dict:
    d = preset_config_json("tiny-v4")
    d.update(overrides)
    return d


# Whole configs (top-level, quantisation, V4 and more text_config cases) and the substring the error
# must contain.
BAD = [(_v41(**overrides), needle) for overrides, needle in BAD_V41] + [
    (_v41(engram_head_dim=48), "engram_head_dim (48) must be a multiple of 32"),
    (_v41(engram_pad_token_id=200000), "engram_pad_token_id 200000 is outside the vocabulary"),
    (_v41(dspark_block_size=1), "dspark_block_size must be >= 2"),
    (_v41(dspark_noise_token_id=200000), "dspark_noise_token_id 200000 is outside the vocabulary"),
    (_v41(dspark_target_layer_ids=[]), "dspark_target_layer_ids must not be empty"),
    (_v41(candidate_block_size=0), "candidate_block_size and candidate_topk_blocks must be positive"),
    (_v41(rope_scaling=None), "rope_scaling (YaRN) is required"),
    (_v41(hc_mult=1.5), "text_config.hc_mult must be an integer, got 1.5"),
    (_v41(hc_mult=2.0), "text_config.hc_mult must be an integer, got 2.0"),
    (_v41(num_attention_heads=2**31), "text_config.num_attention_heads must be an integer <= 2147483647"),
    (_v41(engram_layer_ids=None), "text_config.engram_layer_ids must be a list of integers, got null"),
    (_v41(rope_scaling=[1]), "text_config.rope_scaling must be a JSON object"),
    (_v41(topk_method="greedy"), "topk_method must be 'noaux_tc'"),
    (_v41(moe_intermediate_size=48), "moe_intermediate_size (48) must be a multiple of 32 for FP4 experts"),
    (_top(text_config=[1]), "text_config must be a JSON object"),
    (_top(text_config=None), "text_config must be a JSON object, got null"),
    (_top(model_type="llama"), "model_type must be 'deepseek_v41' or 'deepseek_v4'"),
    (_top(bos_token_id=None), "bos_token_id and eos_token_id must be integers"),
    (_quant(weight_block_size=[32]), "quantization_config.weight_block_size must be two positive integers"),
    (_quant(quant_method="int8"), "quantization_config.quant_method must be 'fp8'"),
    (_quant(scale_fmt="e4m3"), "quantization_config.scale_fmt must be 'ue8m0'"),
    (_quant(expert_dtype="int4"), "expert_dtype must be 'fp4' or 'fp8'"),
    (_v4(compress_ratios=[0, 0, 2, 128, 4, 128, 0]), "compress_ratios[2] = 2 is not supported for deepseek_v4"),
    (_v4(num_hash_layers=7), "num_hash_layers (7) exceeds num_hidden_layers (6)"),
    (_v4(rope_scaling={"type": "yarn", "factor": 16}), "rope_scaling.original_max_position_embeddings is missing"),
    (_v4(n_shared_experts=2), "n_shared_experts must be 1"),
]


@pytest.mark.parametrize("data,needle", BAD, ids=[n[:50] for _, n in BAD])
def test_broken_config_file_names_file_and_field(tmp_path, data: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as from_dict:
        config_from_dict(data, "cfg.json")
    assert needle in str(from_dict.value) and str(from_dict.value).startswith("cfg.json: ")
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError) as from_file:
        load_config(str(tmp_path))
    text = data.get("text_config")
    if isinstance(text, dict) and any(isinstance(v, float) and math.isnan(v) for v in text.values()):
        # json.dumps writes NaN, which strict JSON (RFC 8259) does not have.
        assert "not valid JSON" in str(from_file.value)
    else:
        assert str(from_file.value) == str(from_dict.value).replace("cfg.json", str(tmp_path / "config.json"), 1)


def test_python_values_json_cannot_hold_are_named() -> None:
    with pytest.raises(ConfigError, match=r"cfg.json: text_config.hc_mult holds a set"):
        config_from_dict(_v41(hc_mult={2}), "cfg.json")
    d = _v41()
    d["text_config"][3] = 1
    with pytest.raises(ConfigError, match=r"text_config has a key that is not a string: 3"):
        config_from_dict(d, "cfg.json")
    d = _v41(compress_ratios=tuple(preset_config_json("tiny-v41")["text_config"]["compress_ratios"]))
    assert config_from_dict(d).compress_ratios[:3] == (0, 0, 2)  # tuples read as lists
