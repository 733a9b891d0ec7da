"""`dsv41rt inspect`: the layer plan table, tensor inventory and cache bytes."""

from __future__ import annotations

import re

from dsv41rt.cli import main


def run(capsys, *args: str) -> str:
    assert main(["inspect", *args]) == 0
    return capsys.readouterr().out


def test_inspect_released_v41_flash(capsys) -> None:
    out = run(capsys, "deepseek-v4.1-flash")
    assert "layer roles: 2 SWA-only, 4 Full, 4 Reindex, 30 Reuse" in out
    assert "global KV (compressed KV + index keys): 890 B/token" in out
    assert "window rows: 528 B per row" in out
    rows = {m[0]: m for m in re.findall(r"^(\d+)\s+(\d)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(.+)$", out, re.M)}
    assert rows["25"][1:5] == ("1", "Reuse", "20", "24")
    assert rows["24"][1:6] == ("1", "Reindex", "20", "own", "uses")
    assert rows["20"][5] == "source"
    assert rows["14"][6] == "yes" and rows["0"][7].strip() == "10000" and rows["2"][7].strip() == "160000 + YaRN"
    assert "95,819 tensors" in out  # spec §6.1's computed text tensor count


def test_inspect_v4_presets(capsys) -> None:
    out = run(capsys, "deepseek-v4-flash")
    assert "2 SWA-only, 21 CSA, 20 HCA" in out and "3514.25 B/token" in out
    assert "69,187 tensors" in out  # spec §6.2 cross-check with the released index
    assert "145,116 tensors" in run(capsys, "deepseek-v4-pro")
    assert "note: V4's quantised rows" not in out  # the released widths hold them


def test_inspect_says_when_v4_rows_cannot_be_quantised(capsys) -> None:
    """tiny-v4 (head_dim 64) cannot hold V4's 584-byte rows: the runtime runs it with FP32 caches."""
    out = run(capsys, "tiny-v4")
    assert "note: V4's quantised rows need head_dim 512 with a 64-channel rope tail" in out
    assert "(head_dim 64, rope 16) runs with kv_cache_dtype float32 only" in out
    assert "note:" not in run(capsys, "tiny-v4-d512")


def test_inspect_generated_checkpoint(capsys, tiny_v41_dir: str) -> None:
    out = run(capsys, tiny_v41_dir)
    assert "(validated against config.json)" in out
    assert re.search(r"F8_E4M3\s+\d+ tensors", out) and re.search(r"I8\s+\d+ tensors", out)
    assert "dspark.1" in out
