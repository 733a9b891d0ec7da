"""Shared fixtures: generated tiny checkpoints (once per session) and device markers."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        from dsv41rt import _core

        return bool(getattr(_core, "cuda_device_count", lambda: 0)())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def require_oracle_packages() -> None:
    """Skip when the reference packages are absent, unless CI demands them (then fail loudly)."""
    missing = []
    for mod in ("torch", "transformers", "nemo_automodel"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        msg = f"oracle packages missing: {', '.join(missing)} (run scripts/setup.sh)"
        if os.environ.get("DSV41RT_REQUIRE_ORACLE") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


@pytest.fixture
def rng():
    """A fresh seed per test (printed, so a failure can be replayed): (generator, seed)."""
    seed = int(np.random.SeedSequence().entropy % (1 << 32))
    print(f"seed {seed}")
    return np.random.default_rng(seed), seed


@pytest.fixture(scope="session")
def tiny_v41_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    out = str(tmp_path_factory.mktemp("ck") / "tiny-v41-seed1")
    make_checkpoint(preset_config_json("tiny-v41"), out, 1, name="tiny-v41")
    return out
