"""Malformed checkpoints get a clear error naming the file / tensor / field, never a crash."""

from __future__ import annotations

import json
import os
import shutil
import struct

import numpy as np
import pytest
from dsv41rt.checkpoint.reader import open_checkpoint
from dsv41rt.checkpoint.safetensors_writer import TensorEntry, write_file
from dsv41rt.cli import main
from dsv41rt.config.presets import preset_config_json
from dsv41rt.errors import CheckpointError

NP_TO_ST = {"float32": "F32", "uint16": "BF16", "uint8": None, "int8": "I8", "int64": "I64"}


def copy_config(src: str, dst: str) -> None:
    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src, "config.json"), dst)


def rewrite(src: str, dst: str, edit) -> None:
    """Copy a checkpoint, passing {name: (dtype, array)} through `edit` before writing it back."""
    ck = open_checkpoint(src, validate=False).tensors
    tensors = {n: (ck.info(n)["dtype"], np.array(ck.array(n))) for n in ck.names()}
    edit(tensors)
    copy_config(src, dst)
    groups = [([TensorEntry(n, d, tuple(a.shape))], lambda a=a: iter([a.tobytes()])) for n, (d, a) in tensors.items()]
    write_file(os.path.join(dst, "model.safetensors"), groups)


def test_mismatches_are_reported_together_by_name(tmp_path, tiny_v41_dir: str) -> None:
    def edit(t):
        del t["layers.4.attn.indexer.wq_b.weight"]  # missing
        t["layers.3.attn.compressor.wkv.weight"] = ("BF16", np.zeros((64, 64), np.uint16))  # unexpected (Reuse)
        t["layers.0.attn.attn_sink"] = ("F32", np.zeros(5, np.float32))  # wrong shape
        t["layers.0.attn.wq_a.weight"] = ("I8", t["layers.0.attn.wq_a.weight"][1].view(np.int8))  # wrong dtype

    rewrite(tiny_v41_dir, str(tmp_path), edit)
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(str(tmp_path))
    msg = str(e.value)
    assert "4 problems" in msg
    assert "missing tensor layers.4.attn.indexer.wq_b.weight" in msg
    assert "unexpected tensor layers.3.attn.compressor.wkv.weight" in msg
    assert "tensor layers.0.attn.attn_sink has shape [5], expected [4]" in msg
    assert "tensor layers.0.attn.wq_a.weight has dtype I8, expected F8_E4M3" in msg
    assert len(e.value.problems) == 4
    # The CLI reports the same, with exit code 2 and no traceback.
    assert main(["inspect", str(tmp_path)]) == 2


def test_vision_tensors_are_ignored_and_float_dtypes_accepted(tmp_path, tiny_v41_dir: str) -> None:
    def edit(t):
        t["vision.blocks.0.weight"] = ("BF16", np.zeros((2, 2), np.uint16))
        t["image_newline"] = ("BF16", np.zeros(64, np.uint16))
        del t["layers.2.ffn.gate.bias_vl"]  # image-token routing bias: optional for text
        t["head.weight"] = ("F32", np.zeros((129280, 64), np.float32))  # NeMo stores head in FP32

    rewrite(tiny_v41_dir, str(tmp_path), edit)
    open_checkpoint(str(tmp_path))


def test_truncated_file_names_file_and_tensor(tmp_path, tiny_v41_dir: str) -> None:
    copy_config(tiny_v41_dir, str(tmp_path))
    data = open(os.path.join(tiny_v41_dir, "model.safetensors"), "rb").read()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(str(tmp_path))
    msg = str(e.value)
    assert "model.safetensors" in msg and "truncated" in msg.lower()
    header = json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])
    last = max((v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__")[1]
    assert last in msg


def test_lying_header_length(tmp_path, tiny_v41_dir: str) -> None:
    copy_config(tiny_v41_dir, str(tmp_path))
    data = bytearray(open(os.path.join(tiny_v41_dir, "model.safetensors"), "rb").read(4096))
    data[:8] = struct.pack("<Q", 1 << 40)
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        open_checkpoint(str(tmp_path))


def _raw_file(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def test_unknown_dtype_names_dtype_and_tensor(tmp_path) -> None:
    header = {"layers.0.attn_sink": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}}
    _raw_file(tmp_path / "model.safetensors", header, b"\0\0")
    (tmp_path / "config.json").write_text(json.dumps(preset_config_json("tiny-v4")))
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(str(tmp_path))
    assert "F8_E5M2" in str(e.value) and "layers.0.attn_sink" in str(e.value)


def test_size_mismatch_and_overlap(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(preset_config_json("tiny-v4")))
    _raw_file(tmp_path / "model.safetensors", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(CheckpointError, match=r"\ba\b"):
        open_checkpoint(str(tmp_path))
    _raw_file(
        tmp_path / "model.safetensors",
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        b"\0" * 12,
    )
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(str(tmp_path))
    # Both tensors named, quoted (a bare "a" / "b" would match any message).
    assert "overlap" in str(e.value).lower() and "'a'" in str(e.value) and "'b'" in str(e.value)


def test_missing_shard_names_shard_and_tensor(tmp_path) -> None:
    out = tmp_path / "sharded"
    assert (
        main(
            [
                "make-checkpoint",
                "--preset",
                "tiny-v4",
                "--seed",
                "0",
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
    shard = sorted(set(index["weight_map"].values()))[1]
    os.remove(out / shard)
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(str(out))
    tensor = next(k for k, v in index["weight_map"].items() if v == shard)
    assert shard in str(e.value)
    assert any(k in str(e.value) for k, v in index["weight_map"].items() if v == shard), tensor


def test_config_breaking_schedule_rules_in_checkpoint_dir(tmp_path, capsys) -> None:
    cfg = preset_config_json("tiny-v41")
    cfg["text_config"]["candidate_source_layer_id"] = 4  # a Reindex layer, not a KV source
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["inspect", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "candidate_source_layer_id 4" in err and "config.json" in err


def test_inspect_unknown_path(capsys) -> None:
    assert main(["inspect", "no-such-model"]) == 2
    assert "neither a checkpoint directory nor a preset" in capsys.readouterr().err
