"""A streaming, deterministic safetensors writer (single file or shards + index).

The header lists tensors sorted by name; the data section is written in the order the caller
produces tensors (safetensors readers only require non-overlapping, contiguous offsets), so a
weight and its scale can be produced together and streamed without holding the model in memory.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from .. import _core


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = _core.safetensors_dtype_size(self.dtype)
        for d in self.shape:
            n *= d
        return n


# A group is tensors written back to back (a weight and its scale); `produce` yields their bytes in order.
Group = tuple[list[TensorEntry], Callable[[], Iterator[bytes]]]


def _header(entries_in_data_order: list[TensorEntry]) -> bytes:
    offsets, pos = {}, 0
    for e in entries_in_data_order:
        offsets[e.name] = (pos, pos + e.nbytes)
        pos += e.nbytes
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    by_name = {e.name: e for e in entries_in_data_order}
    for name in sorted(by_name):
        e = by_name[name]
        header[name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": list(offsets[name])}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # 8-byte aligned data section, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw


def write_file(path: str, groups: Iterable[Group]) -> int:
    """Write one safetensors file; returns the data bytes written. Checks every group's byte count."""
    groups = list(groups)
    entries = [e for g in groups for e in g[0]]
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(_header(entries))
        total = 0
        for tensors, produce in groups:
            want = sum(e.nbytes for e in tensors)
            got = 0
            for chunk in produce():
                f.write(chunk)
                got += len(chunk)
            if got != want:
                raise RuntimeError(f"{path}: tensors {[e.name for e in tensors]} produced {got} bytes, expected {want}")
            total += got
    os.replace(tmp, path)  # never leave a half-written file under the final name
    return total


def shard_groups(groups: list[Group], max_shard_bytes: int) -> list[list[Group]]:
    """Greedy split in order; a group is never split across shards."""
    shards: list[list[Group]] = [[]]
    size = 0
    for g in groups:
        n = sum(e.nbytes for e in g[0])
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(g)
        size += n
    return shards


# Shards being written by forked workers (set before the fork; producers are closures, which cannot
# be pickled, so the workers inherit them instead of receiving them).
_SHARDS: list[list[Group]] = []


def _write_shard(out_dir: str, index: int) -> int:
    name = shard_name(index, len(_SHARDS))
    return write_file(os.path.join(out_dir, name), _SHARDS[index])


def shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


def write_checkpoint(
    out_dir: str,
    groups: list[Group],
    max_shard_bytes: int,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
) -> list[str]:
    """Write model.safetensors, or model-0000i-of-0000n.safetensors + model.safetensors.index.json.

    With workers > 1, shards are written by that many forked processes; every shard's bytes depend
    only on its tensors, so the files are identical to a single-process run.
    """
    global _SHARDS
    shards = shard_groups(groups, max_shard_bytes)
    if len(shards) == 1:
        write_file(os.path.join(out_dir, "model.safetensors"), shards[0])
        return ["model.safetensors"]
    names = [shard_name(i, len(shards)) for i in range(len(shards))]
    workers = max(1, min(workers, len(shards)))
    _SHARDS = shards
    try:
        if workers == 1:
            sizes = []
            for i in range(len(shards)):
                sizes.append(_write_shard(out_dir, i))
                if progress:
                    progress(f"wrote {names[i]} ({i + 1}/{len(shards)})")
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                sizes = list(pool.map(_write_shard, [out_dir] * len(shards), range(len(shards))))
            if progress:
                progress(f"wrote {len(shards)} shards with {workers} processes")
    finally:
        _SHARDS = []
    weight_map = {e.name: names[i] for i, shard in enumerate(shards) for tensors, _ in shard for e in tensors}
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return names
