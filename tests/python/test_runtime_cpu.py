"""The CPU executor: decode == prefill == chunked prefill, dequant-workspace reuse, CLI, bad input.

Tolerance for decode == prefill: bitwise. Every op of the CPU path computes each row (token) with a
fixed reduction order that does not depend on which other rows share the forward (linear, norms,
mHC, MoE, indexer scores, attention per query), and cache values go through the same quantisers, so
a position's logits cannot depend on how the prompt was chunked.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from dsv41rt.checkpoint.generator import make_checkpoint
from dsv41rt.cli import main
from dsv41rt.config.presets import preset_config_json
from dsv41rt.errors import Dsv41rtError
from dsv41rt.runtime import Runtime


@pytest.fixture(scope="module")
def rt(tiny_v41_dir: str) -> Runtime:
    return Runtime(tiny_v41_dir)


def prompt(n: int, seed: int = 3) -> list[int]:
    return [0] + [int(x) for x in np.random.default_rng(seed).integers(3, 129000, n - 1)]


def test_logits_are_finite_and_shaped(rt: Runtime) -> None:
    logits = rt.score(prompt(20))
    assert logits.shape == (20, 129280) and np.isfinite(logits).all()
    assert 0.5 < logits.std() < 30


@pytest.mark.parametrize("chunk", [1, 3, 17])
def test_chunked_prefill_equals_one_shot(rt: Runtime, chunk: int) -> None:
    p = prompt(45)  # crosses the window (8), many ratio-2 groups and candidate blocks
    before = rt.backend_stats()["eager_forwards"]
    chunked = rt.score(p, chunk_size=chunk)
    # score() really ran ceil(45 / chunk) forwards, so the equality below compares chunked with
    # one-shot prefill, not one-shot with itself.
    assert rt.backend_stats()["eager_forwards"] - before == -(-45 // chunk)
    np.testing.assert_array_equal(chunked, rt.score(p))


def test_prefill_then_decode_equals_one_shot(rt: Runtime) -> None:
    p = prompt(40, seed=5)
    full = rt.score(p)
    h = rt.new_handle()
    parts = [rt.forward_tokens(h, p[:13])] + [rt.forward_tokens(h, [t]) for t in p[13:]]
    rt.release_handle(h)
    np.testing.assert_array_equal(np.concatenate(parts), full)


def test_generate_is_greedy_over_score(rt: Runtime) -> None:
    p = prompt(11, seed=9)
    gen = rt.generate([p], max_new_tokens=6)[0]
    seq = list(p)
    for tok in gen:
        assert tok == int(np.argmax(rt.score(seq)[-1]))
        seq.append(tok)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_dequant_reuse_counts_on_released_schedule(tmp_path, device: str) -> None:
    make_checkpoint(preset_config_json("tiny-v41-released-schedule"), str(tmp_path), 0)
    rt = Runtime(str(tmp_path), device)
    p = prompt(30, seed=2)

    def trace(reuse: bool, in_place: bool = False) -> tuple[list[np.ndarray], dict[str, int]]:
        # These forwards are decode-sized: with the attention reading the caches in place (the
        # default) no workspace is filled, so the workspace counts need the switch off.
        rt.set_switch("attention_in_place", in_place)
        rt.set_dequant_reuse(reuse)
        rt.reset_dequant_counters()
        h = rt.new_handle()
        # A prefill forward, then five forwards that each process new tokens (6 forwards in all).
        outs = [rt.forward_tokens(h, p[:10])] + [rt.forward_tokens(h, p[10 + 4 * i : 14 + 4 * i]) for i in range(5)]
        rt.release_handle(h)
        return outs, rt.dequant_counters()

    on, c_on = trace(True)
    off, c_off = trace(False)
    in_place, c_in_place = trace(True, in_place=True)
    print(f"{device} dequant calls: reuse on {c_on['dequant_calls']}, reuse off {c_off['dequant_calls']}")
    assert c_on["dequant_calls"] == 24 and c_on["reuse_hits"] == 6 * 34
    assert c_off["dequant_calls"] == 228 and c_off["reuse_hits"] == 0
    assert c_in_place["dequant_calls"] == 0 and c_in_place["reuse_hits"] == 0
    for a, b, c in zip(on, off, in_place, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)


def test_dequant_workspace_is_never_reused_by_the_next_forward(tmp_path) -> None:
    """A ratio's dequantised workspace serves the layers of one forward only: the next forward
    (here another request's prefill with as many compressed rows) dequantises again. Reference:
    the same forwards with reuse off (every layer dequantises)."""
    make_checkpoint(preset_config_json("tiny-v41-released-schedule"), str(tmp_path), 0)
    rt = Runtime(str(tmp_path))
    prompts = [prompt(24, seed=5), prompt(24, seed=6)]  # the same compressed row counts
    rt.set_switch("attention_in_place", False)  # decode-sized forwards would not fill a workspace

    def forwards(reuse: bool) -> list[np.ndarray]:
        rt.set_dequant_reuse(reuse)
        handles = [rt.new_handle() for _ in prompts]
        outs = [rt.forward_tokens(h, p) for h, p in zip(handles, prompts, strict=True)]
        for h in handles:
            rt.release_handle(h)
        return outs

    want = forwards(False)
    got = forwards(True)
    assert not np.array_equal(want[0], want[1])  # the two requests' logits differ
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_bad_input_errors(rt: Runtime) -> None:
    with pytest.raises(Dsv41rtError, match=r"prompt_ids\[1\] = 129280 is outside the vocabulary"):
        rt.score([0, 129280])
    with pytest.raises(Dsv41rtError, match="empty prompt"):
        rt.score([])
    with pytest.raises(Dsv41rtError, match="chunk_size must be >= 1"):
        rt.score([0, 1], chunk_size=0)
    with pytest.raises(Dsv41rtError, match=r"prompt_ids\[0\] is 'a', not a token id"):
        rt.add_request(["a"])
    with pytest.raises(Dsv41rtError, match="unknown request id 999"):
        rt.abort(999)


def test_score_and_generate_cli(tmp_path, tiny_v41_dir: str, capsys) -> None:
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps([prompt(5), prompt(9, seed=4)]))
    out = tmp_path / "s.npz"
    assert main(["score", "--checkpoint", tiny_v41_dir, "--prompts", str(prompts), "--out", str(out)]) == 0
    z = np.load(out)
    assert z["logits_0"].shape == (5, 129280) and z["logits_1"].shape == (9, 129280)
    gen = tmp_path / "g.json"
    args = ["generate", "--checkpoint", tiny_v41_dir, "--prompts", str(prompts), "--max-new-tokens", "3"]
    assert main([*args, "--out", str(gen)]) == 0
    g = json.loads(gen.read_text())
    assert len(g) == 2 and all(len(x) == 3 for x in g)
    assert g[0][0] == int(np.argmax(z["logits_0"][-1]))
    bad = tmp_path / "bad.json"
    bad.write_text('[[0, "x"]]')
    assert main(["score", "--checkpoint", tiny_v41_dir, "--prompts", str(bad), "--out", str(out)]) == 2
    assert "prompt 0 position 1 is 'x'" in capsys.readouterr().err


def test_unknown_or_missing_device_is_a_clear_error(tiny_v41_dir: str) -> None:
    with pytest.raises(Dsv41rtError, match="unknown device 'tpu'"):
        Runtime(tiny_v41_dir, "tpu")
    # No GPU 99 anywhere: the CUDA build says no such device, a CPU-only build says it lacks CUDA.
    with pytest.raises(Dsv41rtError, match="cuda:99"):
        Runtime(tiny_v41_dir, "cuda:99")


def test_load_progress_bar_counts_every_block(tiny_v41_dir: str, capsys) -> None:
    Runtime(tiny_v41_dir, progress=True)
    assert "13/13" in capsys.readouterr().err  # tiny-v41 has 13 blocks


def test_memory_plan_is_the_pool_the_runtime_builds(tiny_v41_dir) -> None:
    # _core.memory_plan (benchmarks size pools with it before loading weights) splits a budget as
    # the executor does.
    from dsv41rt import _core

    plan = _core.build_model_plan(_core.load_model_config(tiny_v41_dir))
    m = _core.memory_plan(plan, 3 << 20, 3, 24, 128, 8)
    rt = Runtime(
        tiny_v41_dir, kv_memory=3 << 20, max_num_seqs=3, max_num_batched_tokens=24, max_model_len=128, page_size=8
    )
    s = rt.stats()
    assert (s["pages_total"], s["slots_total"]) == (m["num_pages"], m["num_slots"]) and m["num_pages"] > 1
    assert (s["page_bytes"], s["slot_bytes"], s["scratch_bytes"]) == (
        m["page_bytes"],
        m["slot_bytes"],
        m["scratch_bytes"],
    )
    assert s["workspace_bytes_per_page"] == m["workspace_bytes_per_page"] and m["page_tokens"] == 8
    with pytest.raises(Exception, match="KV memory budget of 1024 bytes is too small"):
        _core.memory_plan(plan, 1024, 3, 24, 128, 8)


def test_gpu_only_switches_are_refused_on_the_cpu_by_name(tiny_v41_dir) -> None:
    """The CUDA executor's switches (streams, graphs, programmatic launch) name themselves and the
    device when set on the CPU executor; an unknown switch lists the known ones."""
    from dsv41rt import _core

    rt = Runtime(tiny_v41_dir)
    for name in ("multistream", "cuda_graphs", "programmatic_launch"):
        with pytest.raises(_core.Error, match=f"the {name} switch does not apply to the cpu executor"):
            rt.set_switch(name, False)
    with pytest.raises(Dsv41rtError, match="unknown switch 'pdl'.*programmatic_launch"):
        rt.set_switch("pdl", True)
