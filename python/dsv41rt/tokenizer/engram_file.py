"""`engram_tables.st`: the Engram hashing inputs of a checkpoint, for hosts without Python.

The normalised-token map comes from the tokenizer (Python, `tokenizers`); the C API and C++ hosts
read this file instead (cpp/runtime/model/engram_tables.cc). Tensors: `token_map` I32 [vocab], and
per Engram layer i in config order `layer{i}.multipliers` I64 [max_ngram], `layer{i}.primes` and
`layer{i}.offsets` I64 [(max_ngram - 1) * n_heads]. Written next to generated checkpoints and by
`dsv41rt prepare CHECKPOINT` for released ones.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

import numpy as np

from ..checkpoint.safetensors_writer import TensorEntry, write_file

# Safetensors format, but not named *.safetensors: loaders that glob a directory for weight shards
# (NeMo's does) must not take it for one.
FILE_NAME = "engram_tables.st"


def write_engram_tables(checkpoint: str, token_map: np.ndarray, layers: list[dict]) -> str:
    arrays: list[tuple[str, str, np.ndarray]] = [("token_map", "I32", np.asarray(token_map, np.int32))]
    for i, layer in enumerate(layers):
        for key in ("multipliers", "primes", "offsets"):
            arrays.append((f"layer{i}.{key}", "I64", np.asarray(layer[key], np.int64)))
    arrays.sort(key=lambda a: a[0])

    def produce(a: np.ndarray) -> Iterator[bytes]:
        yield a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()

    groups = [([TensorEntry(name, dt, tuple(a.shape))], lambda a=a: produce(a)) for name, dt, a in arrays]
    path = os.path.join(checkpoint, FILE_NAME)
    write_file(path, groups)
    assert struct.calcsize("<q") == 8
    return path
