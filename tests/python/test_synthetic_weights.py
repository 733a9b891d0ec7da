"""Synthetic weights (checkpoint/synthetic.py + cpp/runtime/model/synthetic_weights.h) on tiny presets.

A synthetic checkpoint leaves the directly sampled tensors out of its files and the core generates
them when it opens the directory. Tiny presets have no tensor at the default threshold
(DIRECT_CODES_MIN_NUMEL), so both sides here use a small one, putting most quantised matrices
(experts, attention projections, Engram tables) on the direct path. Tolerance: bitwise, for the
tensor bytes (every tensor the core sees equals the written checkpoint's) and for the logits, on one
rank and under tensor x expert parallelism (LocalComm virtual ranks).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from dsv41rt.checkpoint.generator import make_checkpoint
from dsv41rt.checkpoint.reader import open_checkpoint
from dsv41rt.checkpoint.synthetic import write_synthetic_checkpoint
from dsv41rt.config.presets import preset_config_json
from dsv41rt.errors import CheckpointError, ConfigError

MIN_NUMEL = 1024
SEED = 3
PRESETS = ("tiny-v41", "tiny-v41-released-schedule", "tiny-v4")
RUNNABLE = ("tiny-v41", "tiny-v41-released-schedule")  # the runtime runs V4.1 only


@pytest.fixture(scope="module", params=PRESETS)
def pair(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(written checkpoint, synthetic checkpoint) of one preset, same seed and threshold."""
    preset = request.param
    root = tmp_path_factory.mktemp(preset)
    written, synthetic = str(root / "written"), str(root / "synthetic")
    make_checkpoint(preset_config_json(preset), written, SEED, name=preset, direct_codes_min_numel=MIN_NUMEL)
    write_synthetic_checkpoint(preset, SEED, synthetic, direct_codes_min_numel=MIN_NUMEL)
    return written, synthetic


def _manifest(path: str) -> dict:
    with open(os.path.join(path, "dsv41rt_synthetic.json")) as f:
        return json.load(f)


def test_synthetic_files_leave_out_the_listed_tensors(pair: tuple[str, str]) -> None:
    written, synthetic = pair
    listed = _manifest(synthetic)["tensors"]
    storages = {e["storage"] for e in listed}
    assert storages == {"fp8", "fp4"}, storages  # both code samplers are exercised
    from dsv41rt import _core

    in_files = set(_core.Checkpoint(synthetic).names())
    for e in listed:
        assert e["name"] not in in_files and e["scale"] not in in_files
    assert len(in_files) + 2 * len(listed) == len(_core.Checkpoint(written).names())
    assert not os.path.exists(os.path.join(written, "dsv41rt_synthetic.json"))


def test_every_tensor_equals_make_checkpoint_bytes(pair: tuple[str, str]) -> None:
    written, synthetic = pair
    want, got = open_checkpoint(written).tensors, open_checkpoint(synthetic).tensors
    assert got.names() == want.names()
    generated = 0
    for name in want.names():
        a, b = want.array(name), got.array(name)
        assert (b.dtype, b.shape) == (a.dtype, a.shape), name
        assert a.tobytes() == b.tobytes(), name
        generated += got.info(name)["file"] == "<memory>"
    assert generated == 2 * len(_manifest(synthetic)["tensors"])


def _prompt(n: int) -> list[int]:
    return [0] + [int(t) for t in np.random.default_rng(7000 + n).integers(3, 129000, n - 1)]


@pytest.mark.parametrize("pair", RUNNABLE, indirect=True)
@pytest.mark.parametrize("sizes", [(1, 1), (2, 2)])
def test_logits_equal_the_written_checkpoints(pair: tuple[str, str], sizes: tuple[int, int]) -> None:
    from dsv41rt.runtime import Runtime

    written, synthetic = pair
    tp, ep = sizes
    kw = dict(kv_memory=64 << 20, max_num_seqs=2, tensor_parallel_size=tp, expert_parallel_size=ep)
    want = Runtime(written, **kw)
    got = Runtime(synthetic, **kw)
    for n in (1, 29):
        a, b = want.score(_prompt(n)), got.score(_prompt(n))
        assert np.array_equal(a, b), f"tp {tp} ep {ep} prompt {n}: max |Δ| {np.abs(a - b).max()}"
    want.close()
    got.close()


def test_bad_input_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="unknown preset 'no-such'"):
        write_synthetic_checkpoint("no-such", 0, str(tmp_path / "a"))
    with pytest.raises(CheckpointError, match="non-negative"):
        write_synthetic_checkpoint("tiny-v4", -1, str(tmp_path / "b"))
    with pytest.raises(CheckpointError, match="below 2\\^63"):
        write_synthetic_checkpoint("tiny-v4", 1 << 63, str(tmp_path / "b"))
    with pytest.raises(CheckpointError, match="direct-codes-min-numel must be >= 1"):
        write_synthetic_checkpoint("tiny-v4", 0, str(tmp_path / "c"), direct_codes_min_numel=0)


def test_malformed_manifest_names_the_entry(pair: tuple[str, str], tmp_path) -> None:
    import shutil

    _, synthetic = pair
    broken = str(tmp_path / "broken")
    shutil.copytree(synthetic, broken)
    m = _manifest(broken)
    m["tensors"][0]["storage"] = "fp16"
    with open(os.path.join(broken, "dsv41rt_synthetic.json"), "w") as f:
        json.dump(m, f)
    with pytest.raises(CheckpointError, match="storage must be"):
        open_checkpoint(broken)


def test_cli_writes_a_synthetic_checkpoint(tmp_path, pair: tuple[str, str], capsys) -> None:
    from dsv41rt.cli import main

    written, _ = pair
    with open(os.path.join(written, "dsv41rt_generated.json")) as f:
        preset = json.load(f)["preset"]
    out = str(tmp_path / "cli")
    argv = ["make-checkpoint", "--preset", preset, "--seed", str(SEED), "--out", out, "--synthetic"]
    assert main([*argv, "--direct-codes-min-numel", str(MIN_NUMEL), "--workers", "1"]) == 0
    want, got = open_checkpoint(written).tensors, open_checkpoint(out).tensors
    assert all(want.array(n).tobytes() == got.array(n).tobytes() for n in want.names())
    assert main([*argv, "--bf16"]) != 0
    assert "synthetic weights need a quantised config" in capsys.readouterr().err
