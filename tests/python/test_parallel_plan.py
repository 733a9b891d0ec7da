"""The tensor / expert parallel placement (config/parallel_plan.py) and `dsv41rt inspect`'s per-GPU bytes."""

from __future__ import annotations

import pytest
from dsv41rt.checkpoint.tensor_spec import physical_tensors
from dsv41rt.cli import main
from dsv41rt.config import build_plan, config_from_dict
from dsv41rt.config.parallel_plan import gpu_bytes, placement
from dsv41rt.config.presets import preset_config_json
from dsv41rt.errors import ConfigError


def plan_of(preset: str):
    return build_plan(config_from_dict(preset_config_json(preset), source=f"preset {preset}"))


@pytest.mark.parametrize("preset", ["deepseek-v4.1-flash", "tiny-v41", "bench-40"])
def test_one_gpu_holds_everything_but_the_engram_tables(preset: str) -> None:
    plan = plan_of(preset)
    tensors = list(physical_tensors(plan))
    b = gpu_bytes(tensors, plan, 1, 1)
    assert b.device + b.host == sum(t.nbytes for t in tensors)
    assert b.host == sum(t.nbytes for t in tensors if ".engram.embed." in t.name)


@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 8)])
def test_split_weights_are_partitioned_exactly(tp: int, ep: int) -> None:
    plan = plan_of("deepseek-v4.1-flash")
    tensors = list(physical_tensors(plan))
    one, many = gpu_bytes(tensors, plan, 1, 1), gpu_bytes(tensors, plan, tp, ep)
    assert many.split * tp == one.split and many.experts * tp == one.experts
    assert many.replicated == one.replicated and many.host == one.host


def test_placement_of_named_weights() -> None:
    plan = plan_of("deepseek-v4.1-flash")
    by_name = {t.name: placement(t, plan, 8, 4) for t in physical_tensors(plan)}
    assert (by_name["layers.3.attn.wq_b.weight"].kind, by_name["layers.3.attn.wq_b.weight"].dim) == ("split", 0)
    assert by_name["layers.3.attn.wq_b.scale"] == by_name["layers.3.attn.wq_b.weight"]  # a scale follows its weight
    assert (by_name["layers.3.attn.wo_b.weight"].kind, by_name["layers.3.attn.wo_b.weight"].dim) == ("split", 1)
    assert by_name["layers.2.attn.indexer.wq_b.weight"].kind == "replicated"  # not the attention's wq_b
    assert by_name["layers.3.attn.wkv.weight"].kind == "replicated"  # the latent all heads share
    e = by_name["layers.3.ffn.experts.201.w2.weight"]
    assert (e.kind, e.dim, e.parts, e.expert) == ("expert", 1, 2, 201)
    assert by_name["embed.weight"].kind == "split" and by_name["head.weight"].kind == "split"
    assert by_name["layers.14.engram.embed.weight"].kind == "host"
    assert by_name["layers.14.engram.embed.scale"].kind == "host"


@pytest.mark.parametrize(
    ("tp", "ep", "message"),
    [
        (4, 3, "must divide tensor-parallel-size"),
        (3, 1, "num_attention_heads (64) is not divisible by 3"),
        (16, 1, "o_groups (8) is not divisible by 16"),
        (0, 1, "must be >= 1"),
    ],
)
def test_sizes_that_do_not_divide_are_named(tp: int, ep: int, message: str) -> None:
    plan = plan_of("deepseek-v4.1-flash")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        gpu_bytes(list(physical_tensors(plan)), plan, tp, ep)


def test_inspect_prints_per_gpu_bytes_and_the_fit(capsys) -> None:
    assert main(["inspect", "deepseek-v4.1-flash"]) == 0
    out = capsys.readouterr().out
    assert "weights on each GPU: 285.50 GiB (306,557,453,640 B" in out  # the released ~306 GB
    assert "H200 (141 GB): does not fit" in out
    args = ["--tensor-parallel-size", "4", "--expert-parallel-size", "4", "--kv-memory", "16G"]
    assert main(["inspect", "deepseek-v4.1-flash", *args]) == 0
    out = capsys.readouterr().out
    assert "weights on each GPU: 72.31 GiB" in out and "Engram tables in host memory, once per host: 188.83 GiB" in out
    assert "H200 (141 GB): fits with kv-memory 16.00 GiB" in out


def test_inspect_rejects_a_size_that_does_not_divide(capsys) -> None:
    assert main(["inspect", "deepseek-v4.1-flash", "--tensor-parallel-size", "3"]) == 2
    assert "num_attention_heads (64) is not divisible by 3" in capsys.readouterr().err
