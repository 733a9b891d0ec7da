"""Runtime.rollback_handle on DeepSeek-V4 checkpoints through the bindings (tests/cpp/test_v4_rollback.cc
covers the lengths and the slot bytes in depth): positions fed undoably and taken back leave a handle
that continues bitwise as a fresh one fed only the kept tokens, with its pages given back, for FP32
caches (tiny-v4) and V4's quantised caches (`kv_cache_dtype auto`, tiny-v4-d512). Each V4
compressor's state (CSA ratio 4 with overlap, its indexer's, HCA ratio 128) is rebuilt from the
record (docs/design/v4.md step 10). With the MTP layer loaded, undoable forwards are refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import rollback_util
from dsv41rt.errors import Dsv41rtError
from rollback_util import check_rollback_continues

HIGH = 120000  # token ids below tiny-v4's vocabulary


def ids(n: int, seed: int) -> list[int]:
    return rollback_util.ids(n, seed, HIGH)


@pytest.fixture(
    scope="module",
    params=[
        ("float32", "cpu"),
        ("auto", "cpu"),
        pytest.param(("float32", "cuda"), marks=pytest.mark.cuda, id="float32-cuda"),
        pytest.param(("auto", "cuda"), marks=pytest.mark.cuda, id="auto-cuda"),
    ],
    ids=lambda p: "-".join(p) if isinstance(p, tuple) else str(p),
)
def rt(request: pytest.FixtureRequest, tiny_v4_dir: str, tiny_v4_d512_dir: str) -> Any:
    """FP32 caches on tiny-v4, quantised caches (auto) on tiny-v4-d512; the CPU backend, and the
    CUDA backend (the same undo code over Backend copies) where a GPU is present."""
    from dsv41rt.runtime import Runtime

    kv, device = request.param
    ck = tiny_v4_dir if kv == "float32" else tiny_v4_d512_dir
    runtime = Runtime(ck, device, kv_cache_dtype=kv, enable_prefix_caching=False)
    yield runtime
    runtime.close()


# (prefix, kept, rolled back, second rollback): CSA groups of 4 (before / after the first complete
# group, on a boundary), HCA's group of 128 (across it, exactly on it), the window of 8.
CASES = [(1, 2, 3, 0), (3, 1, 4, 0), (10, 4, 4, 0), (124, 6, 2, 0), (125, 3, 5, 0), (126, 6, 2, 3)]


@pytest.mark.parametrize(("a", "k", "r", "r2"), CASES)
def test_rollback_continues_as_a_fresh_handle(rt: Any, a: int, k: int, r: int, r2: int) -> None:
    check_rollback_continues(rt, a, k, r, r2, HIGH)


def test_a_forward_longer_than_the_window_goes_back_whole(rt: Any) -> None:
    h = rt.new_handle()
    text = ids(20, seed=5)
    rt.forward_tokens(h, text[:12], all_logits=False)
    rt.forward_tokens(h, ids(9, seed=6), all_logits=False, undoable=True)
    with pytest.raises(Dsv41rtError, match="only all of them") as e:
        rt.rollback_handle(h, 4)
    assert e.value.code == "out_of_range"
    rt.rollback_handle(h, 9)
    after = rt.forward_tokens(h, text[12:])
    fresh = rt.new_handle()
    rt.forward_tokens(fresh, text[:12], all_logits=False)
    assert np.array_equal(after, rt.forward_tokens(fresh, text[12:]))
    rt.release_handle(h)
    rt.release_handle(fresh)


def test_undoable_forwards_are_refused_with_the_mtp_layer(tiny_v4_dir: str) -> None:
    from dsv41rt.runtime import Runtime

    runtime = Runtime(tiny_v4_dir, kv_cache_dtype="float32", enable_prefix_caching=False, load_drafter=True)
    h = runtime.new_handle()
    with pytest.raises(Dsv41rtError, match="not built for DeepSeek-V4's MTP layer") as e:
        runtime.forward_tokens(h, ids(5, 1), undoable=True)
    assert e.value.code == "unsupported"
    runtime.release_handle(h)
    runtime.close()
