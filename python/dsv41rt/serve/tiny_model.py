"""The built-in model: tiny-v41 (seed 0) generated deterministically into a cache directory on
first use, so `dsv41rt serve` with no model works on a fresh machine without a GPU or a download."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

PRESET, SEED = "tiny-v41", 0
NAME = "dsv41rt-tiny-v41"


def default_dir() -> str:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "dsv41rt", "models", f"{PRESET}-seed{SEED}")


def _complete(path: str) -> bool:
    try:
        with open(os.path.join(path, "dsv41rt_generated.json")) as f:
            meta = json.load(f)
        with open(os.path.join(path, "tokenizer.json"), encoding="utf-8") as f:
            has_system = "<｜System｜>" in f.read()
    except (OSError, ValueError):
        return False
    return meta.get("preset") == PRESET and meta.get("seed") == SEED and has_system


def ensure_tiny_model(path: str = "") -> str:
    """The built-in checkpoint's directory, generated (atomically) when missing or stale."""
    from ..checkpoint.generator import make_checkpoint
    from ..config.presets import preset_config_json

    path = path or default_dir()
    if _complete(path):
        return path
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny-", dir=parent)
    try:
        make_checkpoint(preset_config_json(PRESET), tmp, SEED, name=PRESET)
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path
