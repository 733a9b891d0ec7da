"""The C++ config parser and layer plan (cpp/runtime/model/) agree with the Python ones.

Python (dsv41rt.config) is the source of truth; C++ hosts load checkpoints without Python, so both
must produce the same plan for every preset and reject the same broken configs, naming the same
field.
"""

from __future__ import annotations

import json
import math

import pytest
from dsv41rt import _core  # a build without it is broken, not a reason to skip
from dsv41rt.config import Stage, build_plan, load_config
from dsv41rt.config.presets import preset_config_json, preset_names
from dsv41rt.errors import ConfigError
from test_config import BAD_V41


def _cases() -> list[tuple[str, dict]]:
    cases = [(name, preset_config_json(name)) for name in preset_names()]
    unquantized = preset_config_json("tiny-v41")
    del unquantized["quantization_config"]
    cases.append(("tiny-v41-unquantized", unquantized))
    v4_unquantized = preset_config_json("tiny-v4")
    del v4_unquantized["quantization_config"]
    cases.append(("tiny-v4-unquantized", v4_unquantized))
    return cases


def _write(tmp_path, data: dict) -> str:
    (tmp_path / "config.json").write_text(json.dumps(data))
    return str(tmp_path)


def _python_view(path: str) -> dict:
    plan = build_plan(load_config(path))
    cfg = plan.config
    q = cfg.quant
    release_block = (32, 32) if cfg.is_v41 else (128, 128)  # checkpoint/tensor_spec.py

    def layers(xs) -> list[dict]:
        return [
            dict(
                index=x.index,
                draft=x.stage is not Stage.BACKBONE,
                name_prefix=x.name_prefix,
                ratio=x.ratio,
                role=x.role.value,
                kv_source=x.kv_source,
                topk_source=x.topk_source,
                candidates=x.candidates.value,
                engram=x.engram,
                rope_base=x.rope_base,
                yarn=x.yarn,
                hash_routed=x.hash_routed,
                n_experts=x.n_experts,
                experts_per_tok=x.experts_per_tok,
            )
            for x in xs
        ]

    return dict(
        arch=cfg.arch.value,
        hidden_size=cfg.hidden_size,
        vocab_size=cfg.vocab_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_nextn_predict_layers=cfg.num_nextn_predict_layers,
        sliding_window=cfg.sliding_window,
        quantized=q is not None,
        weight_block_size=tuple(q.weight_block_size) if q is not None else release_block,
        expert_fp4=q is None or q.expert_dtype == "fp4",
        layers=layers(plan.layers),
        draft_layers=layers(plan.draft_layers),
    )


@pytest.mark.parametrize("name,data", _cases(), ids=[name for name, _ in _cases()])
def test_cpp_plan_matches_python(tmp_path, name: str, data: dict) -> None:
    path = _write(tmp_path, data)
    py = _python_view(path)
    cpp = _core.model_plan(path)
    assert cpp["source"] == str(tmp_path / "config.json")
    for key in py:
        if key in ("layers", "draft_layers"):
            continue
        assert cpp[key] == py[key], key
    for key in ("layers", "draft_layers"):
        assert len(cpp[key]) == len(py[key]), key
        for c, p in zip(cpp[key], py[key], strict=True):
            assert set(c) == set(p)
            for field, value in p.items():
                assert c[field] == value, f"{key}[{p['index']}].{field}: C++ {c[field]!r}, Python {value!r}"


def _v41(**text_overrides) -> dict:
    d = preset_config_json("tiny-v41")
    d["text_config"].update(text_overrides)
    return d


def _v4(**overrides) -> dict:
    d = preset_config_json("tiny-v4")
    d.update(overrides)
    return d


def _top(**overrides) -> dict:
    d = preset_config_json("tiny-v41")
    d.update(overrides)
    return d


def _quant(**overrides) -> dict:
    d = preset_config_json("tiny-v41")
    d["quantization_config"].update(overrides)
    return d


# (config, substring both messages must contain). BAD_V41 is test_config.py's list of text_config
# overrides; these add top-level, quantisation and V4 cases.
BAD = [(_v41(**overrides), needle) for overrides, needle in BAD_V41] + [
    (_v41(engram_head_dim=48), "engram_head_dim (48) must be a multiple of 32"),
    (_v41(dspark_block_size=1), "dspark_block_size must be >= 2"),
    (_v41(candidate_block_size=0), "candidate_block_size and candidate_topk_blocks must be positive"),
    (_v41(rope_scaling=None), "rope_scaling (YaRN) is required"),
    (_v41(hc_mult=1.5), "text_config.hc_mult must be an integer"),
    (_v41(engram_layer_ids=None), "text_config.engram_layer_ids must be a list of integers"),
    (_v41(rope_scaling=[1]), "text_config.rope_scaling must be a JSON object"),
    (_top(text_config=[1]), "text_config must be a JSON object"),
    (_top(model_type="llama"), "model_type must be 'deepseek_v41' or 'deepseek_v4'"),
    (_top(bos_token_id=None), "bos_token_id and eos_token_id must be integers"),
    (_quant(weight_block_size=[32]), "quantization_config.weight_block_size must be two positive integers"),
    (_quant(quant_method="int8"), "quantization_config.quant_method must be 'fp8'"),
    (_quant(expert_dtype="int4"), "expert_dtype must be 'fp4' or 'fp8'"),
    (_v4(compress_ratios=[0, 0, 2, 128, 4, 128, 0]), "compress_ratios[2] = 2 is not supported for deepseek_v4"),
    (_v4(num_hash_layers=7), "num_hash_layers (7) exceeds num_hidden_layers (6)"),
    (_v4(rope_scaling={"type": "yarn", "factor": 16}), "rope_scaling.original_max_position_embeddings is missing"),
    (_v4(n_shared_experts=2), "n_shared_experts must be 1"),
]


@pytest.mark.parametrize("data,needle", BAD, ids=[n[:50] for _, n in BAD])
def test_both_parsers_reject_broken_configs(tmp_path, data: dict, needle: str) -> None:
    path = _write(tmp_path, data)
    file = str(tmp_path / "config.json")
    with pytest.raises(ConfigError) as py_err:
        load_config(path)
    with pytest.raises(_core.Error) as cpp_err:
        _core.model_plan(path)
    assert needle in str(py_err.value)
    cpp_msg = str(cpp_err.value)
    assert f"{file}: " in cpp_msg
    text = data.get("text_config")
    if isinstance(text, dict) and any(isinstance(v, float) and math.isnan(v) for v in text.values()):
        # json.dumps writes NaN, which Python's json accepts but strict RFC 8259 (C++) does not.
        assert "not valid JSON" in cpp_msg
        return
    assert needle in cpp_msg, cpp_msg


def test_missing_file_and_bad_json(tmp_path) -> None:
    with pytest.raises(_core.Error, match="no config.json found"):
        _core.model_plan(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(_core.Error, match="config.json: not valid JSON"):
        _core.model_plan(str(tmp_path))
