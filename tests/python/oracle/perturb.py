"""Perturbed copies of a checkpoint, for negative controls: a test's bound must reject a model
that differs from the reference by a plausible bug (e.g. one routed expert dropped)."""

from __future__ import annotations

import json
import shutil
import struct


def copy_with_zeroed(src: str, dst: str, names: list[str]) -> None:
    """Copies checkpoint `src` to `dst` with the stored bytes of `names` set to zero (a zero FP8 /
    FP4 code is 0.0, so a zeroed down-projection drops its expert's contribution). Single-file
    checkpoints only (the tiny presets)."""
    shutil.copytree(src, dst)
    path = f"{dst}/model.safetensors"
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        for name in names:
            begin, end = header[name]["data_offsets"]
            f.seek(8 + n + begin)
            f.write(bytes(end - begin))
