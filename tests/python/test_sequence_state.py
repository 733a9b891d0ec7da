"""A sequence's cache state handed from one runtime to another (Runtime.export_handle /
import_handle; cpp/runtime/sequence_state.h): the prefill/decode handoff's payload."""

from __future__ import annotations

import numpy as np
import pytest
from dsv41rt.runtime import Runtime

DECODE = [7, 9, 11, 13, 200, 3, 4, 5, 6, 8]


def runtime(path: str, **kw) -> Runtime:
    return Runtime(path, kv_memory=64 << 20, max_num_seqs=4, **kw)


@pytest.mark.parametrize("n", [1, 7, 37, 200])
def test_an_imported_sequence_continues_bitwise(tiny_v41_dir: str, n: int) -> None:
    """Prompts that end inside the first page, past the window ring's wrap, past the first
    compressed entries and across several pages: the importer's decoded logits equal the
    exporter's bit for bit, and both pools stay consistent."""
    a, b = runtime(tiny_v41_dir), runtime(tiny_v41_dir)
    prompt = [0] + [int(t) for t in np.random.default_rng(n).integers(3, 1000, n - 1)]
    h = a.new_handle()
    a.forward_tokens(h, prompt, all_logits=False)
    blob = a.export_handle(h)
    h2 = b.import_handle(blob)
    for t in DECODE:
        assert np.array_equal(a.decode_handles([h], [t]), b.decode_handles([h2], [t])), f"token {t}"
    # Exporting does not change the exported sequence; a second import into the same runtime works.
    h3 = a.import_handle(a.export_handle(h))
    assert np.array_equal(a.decode_handles([h], [1]), a.decode_handles([h3], [1]))
    # Released handles give every slot and page back (the pool's invariants hold with none held).
    for rt, handles in ((a, [h, h3]), (b, [h2])):
        for x in handles:
            rt.release_handle(x)
        rt.check_invariants()


def test_bad_blobs_are_refused_before_taking_pool_memory(tiny_v41_dir: str) -> None:
    a, b = runtime(tiny_v41_dir), runtime(tiny_v41_dir)
    h = a.new_handle()
    a.forward_tokens(h, [0, 5, 6, 7, 8, 9, 10, 11, 12, 13], all_logits=False)
    blob = a.export_handle(h)
    before = b.describe_pool()
    with pytest.raises(Exception, match="shorter than its header"):
        b.import_handle(blob[:10])
    with pytest.raises(Exception, match="truncated or padded"):
        b.import_handle(blob[:-1])
    flipped = bytearray(blob)
    flipped[-3] ^= 0x10
    with pytest.raises(Exception, match="checksum mismatch"):
        b.import_handle(bytes(flipped))
    with pytest.raises(Exception, match="bad magic"):
        b.import_handle(b"XXXXXXXX" + blob[8:])
    with pytest.raises(Exception, match="expected bytes"):
        b.import_handle(bytearray(blob))  # type: ignore[arg-type]
    assert b.describe_pool() == before
    b.check_invariants()  # nothing taken: no handle holds pages in b
    with pytest.raises(Exception, match="unknown sequence handle"):
        a.export_handle(12345)


def test_another_pool_layout_is_named(tiny_v41_dir: str) -> None:
    a, b = runtime(tiny_v41_dir), runtime(tiny_v41_dir, page_size=128)
    h = a.new_handle()
    a.forward_tokens(h, [0, 5, 6, 7], all_logits=False)
    with pytest.raises(Exception, match="pool layout differs"):
        b.import_handle(a.export_handle(h))


def test_another_model_is_named(tiny_v41_dir: str, tmp_path) -> None:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    other = str(tmp_path / "released-schedule")
    make_checkpoint(preset_config_json("tiny-v41-released-schedule"), other, 1, name="tiny-v41-released-schedule")
    a, b = runtime(tiny_v41_dir), runtime(other)
    h = a.new_handle()
    a.forward_tokens(h, [0, 5, 6, 7], all_logits=False)
    with pytest.raises(Exception, match="from another model"):
        b.import_handle(a.export_handle(h))


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_cuda_an_imported_sequence_continues_bitwise(tiny_v41_dir: str, precision: str) -> None:
    """The same handoff between two runtimes on one GPU (device pool and Engram history copied
    through the host; run on the H200 by bench/device_session.sh, step suite)."""
    a, b = (runtime(tiny_v41_dir, device="cuda", precision=precision) for _ in range(2))
    prompt = [0] + [int(t) for t in np.random.default_rng(5).integers(3, 1000, 199)]
    h = a.new_handle()
    a.forward_tokens(h, prompt, all_logits=False)
    h2 = b.import_handle(a.export_handle(h))
    for t in DECODE:
        assert np.array_equal(a.decode_handles([h], [t]), b.decode_handles([h2], [t])), f"token {t}"
