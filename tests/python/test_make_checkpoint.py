"""`dsv41rt make-checkpoint`: determinism, release formats, sharding, every generator preset."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from dsv41rt import _core
from dsv41rt.checkpoint import quantize as q
from dsv41rt.checkpoint.generator import DIRECT_CODES_MIN_NUMEL, _TensorSource, make_checkpoint
from dsv41rt.checkpoint.reader import open_checkpoint
from dsv41rt.checkpoint.tensor_spec import LogicalTensor, Storage, expected_tensors, physical_tensors
from dsv41rt.cli import main
from dsv41rt.config import build_plan, config_from_dict
from dsv41rt.config.presets import preset_config_json


def digests(d: str) -> dict[str, str]:
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_same_seed_gives_byte_identical_files(tmp_path, tiny_v41_dir: str) -> None:
    again = tmp_path / "again"
    assert main(["make-checkpoint", "--preset", "tiny-v41", "--seed", "1", "--out", str(again)]) == 0
    assert digests(tiny_v41_dir) == digests(str(again))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(digests(str(again)))


def test_different_seed_differs(tmp_path, tiny_v41_dir: str) -> None:
    other = tmp_path / "seed2"
    make_checkpoint(preset_config_json("tiny-v41"), str(other), 2, tokenizer=False)
    assert digests(str(other))["model.safetensors"] != digests(tiny_v41_dir)["model.safetensors"]


def test_generated_checkpoint_validates_and_uses_release_formats(tiny_v41_dir: str) -> None:
    ck = open_checkpoint(tiny_v41_dir)
    info = ck.tensors.all_info()
    assert info["layers.2.attn.wq_a.weight"] == ("F8_E4M3", [32, 64])
    assert info["layers.2.attn.wq_a.scale"] == ("F8_E8M0", [1, 2])
    assert info["layers.2.ffn.experts.0.w1.weight"] == ("I8", [32, 32])
    assert info["layers.2.ffn.experts.0.w1.scale"] == ("F8_E8M0", [32, 2])
    assert info["layers.1.engram.embed.weight"][0] == "F8_E4M3"
    assert info["layers.1.engram.embed.scale"][1] == [3252, 1]
    assert info["layers.2.hc_attn_fn"] == ("F32", [8, 128])
    assert info["mtp.0.main_proj.weight"] == ("F8_E4M3", [64, 192])
    assert "mtp.1.markov_head.head.weight" in info and "mtp.0.markov_head.head.weight" not in info
    # Scales are powers of two chosen as 2^ceil(log2(amax/448)): the block max lands in (224, 448].
    w = ck.tensors.array("layers.3.attn.wq_b.weight")
    s = ck.tensors.array("layers.3.attn.wq_b.scale")
    deq = q.dequantize_fp8_blocks(w, s, 32, 32)
    block_max = np.abs(deq).reshape(deq.shape[0] // 32, 32, deq.shape[1] // 32, 32).max(axis=(1, 3))
    ratio = block_max / _core.decode(s, "e8m0")
    assert np.all((ratio > 224) & (ratio <= 448))


def test_fp8_block_quantiser_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((70, 100)) * 0.05).astype(np.float32)
    w[3, 5] = 1e-30  # subnormal-range input
    codes, scales = q.quantize_fp8_blocks(w, 32, 32)
    t = torch.from_numpy(w)
    for bi in range(scales.shape[0]):
        for bj in range(scales.shape[1]):
            tile = t[bi * 32 : (bi + 1) * 32, bj * 32 : (bj + 1) * 32]
            amax = float(tile.abs().max())
            scale = 2.0 ** np.ceil(np.log2(max(amax / 448, 2.0**-126)))
            assert scales[bi, bj] == int(np.log2(scale)) + 127
            ref = (tile / scale).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
            np.testing.assert_array_equal(codes[bi * 32 : (bi + 1) * 32, bj * 32 : (bj + 1) * 32], ref)


def test_fp4_row_quantiser_rounds_ties_to_even() -> None:
    # One row, one 32-block with amax 6 -> scale 1: values sit exactly on FP4 midpoints.
    row = np.array([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -2.5, -5.0, -6.0] + [0.0] * 20], np.float32)
    packed, scales = q.quantize_fp4_rows(row)
    assert scales[0, 0] == 127
    deq = q.dequantize_fp4_rows(packed, scales)[0, :12]
    np.testing.assert_array_equal(deq, [6, 0, 1, 1, 2, 2, 4, 4, -0.0, -2, -4, -6])
    lo = packed.view(np.uint8)[0, 0] & 0xF
    assert lo == 7  # element 0 (6.0) sits in the low nibble of byte 0


def test_bf16_variant_holds_the_dequantised_values(tmp_path, tiny_v41_dir: str) -> None:
    cfg = preset_config_json("tiny-v41")
    cfg.pop("quantization_config")
    make_checkpoint(cfg, str(tmp_path), 1, tokenizer=False)
    bf16 = open_checkpoint(str(tmp_path)).tensors
    released = open_checkpoint(tiny_v41_dir).tensors
    assert bf16.info("layers.3.attn.wq_b.weight")["dtype"] == "BF16"
    deq = q.dequantize_fp8_blocks(
        released.array("layers.3.attn.wq_b.weight"), released.array("layers.3.attn.wq_b.scale"), 32, 32
    )
    np.testing.assert_array_equal(_core.decode(bf16.array("layers.3.attn.wq_b.weight"), "bf16"), deq)
    deq4 = q.dequantize_fp4_rows(
        released.array("layers.5.ffn.experts.3.w3.weight"), released.array("layers.5.ffn.experts.3.w3.scale")
    )
    np.testing.assert_array_equal(_core.decode(bf16.array("layers.5.ffn.experts.3.w3.weight"), "bf16"), deq4)


def test_sharded_output_round_trips(tmp_path, tiny_v41_dir: str) -> None:
    out = tmp_path / "sharded"
    assert (
        main(
            [
                "make-checkpoint",
                "--preset",
                "tiny-v41",
                "--seed",
                "1",
                "--out",
                str(out),
                "--max-shard-bytes",
                "8M",
                "--no-tokenizer",
            ]
        )
        == 0
    )
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and all((out / s).exists() for s in shards)
    serial = tmp_path / "serial"  # the same shards written by one process instead of several
    assert (
        main(
            [
                "make-checkpoint",
                "--preset",
                "tiny-v41",
                "--seed",
                "1",
                "--out",
                str(serial),
                "--max-shard-bytes",
                "8M",
                "--no-tokenizer",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    assert digests(str(serial)) == digests(str(out))
    parallel = tmp_path / "parallel"
    assert (
        main(
            [
                "make-checkpoint",
                "--preset",
                "tiny-v41",
                "--seed",
                "1",
                "--out",
                str(parallel),
                "--max-shard-bytes",
                "8M",
                "--no-tokenizer",
                "--workers",
                "3",
            ]
        )
        == 0
    )
    assert digests(str(parallel)) == digests(str(out))
    sharded = open_checkpoint(str(out)).tensors
    single = open_checkpoint(tiny_v41_dir).tensors
    assert sharded.names() == single.names()
    for name in ("embed.weight", "layers.12.ffn.experts.7.w2.weight", "mtp.1.markov_head.head.weight"):
        np.testing.assert_array_equal(sharded.array(name), single.array(name))


@pytest.mark.parametrize("preset", ["tiny-v4", "tiny-v41-released-schedule"])
def test_other_tiny_presets_generate_and_validate(tmp_path, preset: str) -> None:
    make_checkpoint(preset_config_json(preset), str(tmp_path), 0, tokenizer=False)
    ck = open_checkpoint(str(tmp_path))
    assert len(ck.tensors.names()) == len(physical_tensors(ck.plan))


def test_bench_40_spec_and_direct_code_sampler() -> None:
    plan = build_plan(config_from_dict(preset_config_json("bench-40")))
    tensors = physical_tensors(plan)
    total = sum(t.nbytes for t in tensors)
    assert 30e9 < total < 40e9, total  # released widths, 32 experts: streams, never held in memory
    # The direct sampler (used for tensors this large) keeps the float rule's standard deviation.
    expert = next(t for t in expected_tensors(plan) if t.name == "layers.2.ffn.experts.0.w1.weight")
    assert expert.shape[0] * expert.shape[1] >= DIRECT_CODES_MIN_NUMEL
    packed, scales = _TensorSource(expert, plan, 0)._quantized_chunks((0, 64), 0)
    vals = q.dequantize_fp4_rows(packed, scales)
    target = 1 / np.sqrt(expert.shape[1])
    assert 0.6 * target < vals.std() < 1.6 * target
    dense = LogicalTensor("layers.2.attn.wq_b.weight", (32768, 1280), Storage.FP8, (32, 32))
    codes, sc = _TensorSource(dense, plan, 0)._quantized_chunks((0, 64), 0)
    vals = q.dequantize_fp8_blocks(codes, sc, 32, 32)
    target = 0.5 / np.sqrt(1280)
    assert 0.6 * target < vals.std() < 1.6 * target and np.isfinite(vals).all()
