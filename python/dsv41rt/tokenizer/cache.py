"""Cache of the Engram normalised-token map, keyed by the tokenizer file's SHA-256.

Computing the map decodes and normalises every token (~5 s for the 129280-token tokenizer), so it is
computed once per tokenizer and stored under $DSV41RT_CACHE_DIR (default ~/.cache/dsv41rt).
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np

from .engram_token_map import compressed_token_map


def cache_dir() -> str:
    return os.environ.get("DSV41RT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "dsv41rt")


def cached_token_map(tokenizer_json: str) -> tuple[np.ndarray, int]:
    with open(tokenizer_json, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:32]
    path = os.path.join(cache_dir(), f"engram-token-map-{digest}.npy")
    try:
        token_map = np.load(path)
        if token_map.dtype == np.int32 and token_map.ndim == 1:
            return token_map, int(token_map.max()) + 1
    except (OSError, ValueError):
        pass  # absent or unreadable: recompute
    token_map, n = compressed_token_map(tokenizer_json)
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".npy")
        with os.fdopen(fd, "wb") as f:
            np.save(f, token_map.astype(np.int32))
        os.replace(tmp, path)  # atomic: concurrent writers never expose a partial file
    except OSError:
        pass  # a read-only home is fine: the map is just recomputed next time
    return token_map, n
