"""`engram_tables.st`: the Engram hashing inputs of a checkpoint, the one route by which they reach
the C++ core (cpp/runtime/model/engram_tables.cc), for Python and C hosts alike.

The normalised-token map comes from the tokenizer (Python, `tokenizers`). Tensors: `token_map` I32
[vocab], and per Engram layer i in config order `layer{i}.multipliers` I64 [max_ngram],
`layer{i}.primes` and `layer{i}.offsets` I64 [(max_ngram - 1) * n_heads]. Written next to
generated checkpoints and by `dsv41rt prepare CHECKPOINT` for released ones; a `Runtime` on a
checkpoint without the file writes one into the cache directory (engram_tables_for).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator

import numpy as np

from ..checkpoint.safetensors_writer import TensorEntry, write_file
from ..config.engram_layout import engram_layouts
from ..errors import Dsv41rtError
from .cache import cache_dir, cached_token_map
from .engram_token_map import engram_multipliers

# Safetensors format, but not named *.safetensors: loaders that glob a directory for weight shards
# (NeMo's does) must not take it for one.
FILE_NAME = "engram_tables.st"


def engram_inputs(checkpoint: str, config) -> tuple[np.ndarray | None, list[dict]]:
    """The Engram token map and per-layer hash inputs of a checkpoint (None, [] without Engram)."""
    if config.engram is None:
        return None, []
    tok = os.path.join(checkpoint, "tokenizer.json")
    if not os.path.exists(tok):
        raise Dsv41rtError(f"{checkpoint}: Engram layers need the checkpoint's tokenizer.json (not found)")
    token_map, n_classes = cached_token_map(tok)
    e = config.engram
    if n_classes != e.compressed_vocab_size:
        raise Dsv41rtError(
            f"{tok}: the tokenizer normalises to {n_classes} classes but engram_compressed_vocab_size is "
            f"{e.compressed_vocab_size}; the Engram hash depends on it"
        )
    if len(token_map) != config.vocab_size:
        raise Dsv41rtError(f"{tok}: tokenizer has {len(token_map)} ids, config vocab_size is {config.vocab_size}")
    layers = [
        {
            "multipliers": engram_multipliers(layout.layer_id, n_classes, e.max_ngram_size),
            "primes": list(layout.primes),
            "offsets": list(layout.offsets),
        }
        for layout in engram_layouts(e)
    ]
    return np.ascontiguousarray(token_map, dtype=np.int32), layers


def write_engram_tables_file(path: str, token_map: np.ndarray, layers: list[dict]) -> str:
    arrays: list[tuple[str, str, np.ndarray]] = [("token_map", "I32", np.asarray(token_map, np.int32))]
    for i, layer in enumerate(layers):
        for key in ("multipliers", "primes", "offsets"):
            arrays.append((f"layer{i}.{key}", "I64", np.asarray(layer[key], np.int64)))
    arrays.sort(key=lambda a: a[0])

    def produce(a: np.ndarray) -> Iterator[bytes]:
        yield a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()

    groups = [([TensorEntry(name, dt, tuple(a.shape))], lambda a=a: produce(a)) for name, dt, a in arrays]
    write_file(path, groups)
    return path


def write_engram_tables(checkpoint: str, token_map: np.ndarray, layers: list[dict]) -> str:
    return write_engram_tables_file(os.path.join(checkpoint, FILE_NAME), token_map, layers)


def engram_tables_for(checkpoint: str, config) -> str:
    """The Engram inputs file a Runtime should read: "" when the checkpoint has its own (or needs
    none), else one computed from its tokenizer and cached (keyed by tokenizer and config)."""
    if config.engram is None or os.path.exists(os.path.join(checkpoint, FILE_NAME)):
        return ""
    with open(os.path.join(checkpoint, "config.json"), "rb") as f:
        key = hashlib.sha256(f.read())
    tok = os.path.join(checkpoint, "tokenizer.json")
    if os.path.exists(tok):
        with open(tok, "rb") as f:
            key.update(f.read())
    path = os.path.join(cache_dir(), f"engram-tables-{key.hexdigest()[:32]}.st")
    if os.path.exists(path):
        return path
    token_map, layers = engram_inputs(checkpoint, config)
    assert token_map is not None  # the config has Engram layers
    os.makedirs(cache_dir(), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".st")
    os.close(fd)
    write_engram_tables_file(tmp, token_map, layers)
    os.replace(tmp, path)  # atomic: concurrent writers never expose a partial file
    return path
