"""The committed type stubs of `dsv41rt._core` (python/dsv41rt/_core/*.pyi, read by mypy in CI) are
what nanobind's stubgen writes for the built module: a binding change without its stub fails here."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
STUBS = os.path.join(ROOT, "python", "dsv41rt", "_core")


def test_committed_stubs_match_the_module(tmp_path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-m", "dsv41rt._core", "-r", "-O", str(tmp_path), "-q"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    fresh = sorted(os.listdir(tmp_path / "_core"))
    assert fresh == sorted(f for f in os.listdir(STUBS) if f.endswith(".pyi"))
    for name in fresh:
        with open(os.path.join(STUBS, name), encoding="utf-8") as f:
            committed = f.read()
        assert (tmp_path / "_core" / name).read_text(encoding="utf-8") == committed, (
            f"python/dsv41rt/_core/{name} is stale: regenerate with "
            "python -m nanobind.stubgen -m dsv41rt._core -r -O python/dsv41rt"
        )
