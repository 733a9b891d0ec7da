"""Speculative decoding in the engine from Python (issue 24): `speculative-config` as a runtime
option (YAML key, `--speculative-config` flag, `Runtime(..., speculative_config=...)`), the
engine's greedy outputs with DSpark drafts equal those without, its counters reach `stats()` and
the server's /metrics under vLLM's names, the benchmarks' hooks (draft_source, forced_acceptance)
work, and bad configs are errors naming what is wrong. The bitwise engine checks (logprobs, oracle
drafts, forced acceptance, preemption) are tests/cpp/test_engine_speculation.cc."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from dsv41rt.errors import Dsv41rtError
from dsv41rt.options import RuntimeOptions, options_from, to_argv
from dsv41rt.speculative import SpeculativeConfig


def test_speculative_config_as_a_runtime_option() -> None:
    o = options_from({"speculative_config": '{"method": "dspark", "num_speculative_tokens": 3}'})
    assert o.speculative_config == SpeculativeConfig("dspark", 3)
    assert options_from({"speculative_config": {"method": "dspark"}}).speculative_config == SpeculativeConfig()
    assert RuntimeOptions().speculative_config is None
    assert options_from({"speculative_config": None}).speculative_config is None
    # vLLM's disable_by_batch_size; without a count the length is self-tuned (draft_length.h).
    tuned = options_from({"speculative_config": '{"method": "dspark", "disable_by_batch_size": 8}'})
    assert tuned.speculative_config == SpeculativeConfig("dspark", None, 8)
    assert tuned.speculative_config.engine_tokens == -1
    assert json.loads(tuned.speculative_config.to_json()) == {"method": "dspark", "disable_by_batch_size": 8}
    # The flags that rebuild the options (worker processes) carry it as JSON.
    argv = to_argv(o)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "dspark", "num_speculative_tokens": 3}
    for bad, message in (
        ('{"method": "eagle"}', '"method" must be "dspark"'),
        ('{"method": "dspark", "num_speculative_tokens": -2}', "integer >= 0"),
        ("{not json", "not valid JSON"),
        ('{"method": "dspark", "k": 2}', "unknown key"),
        ('{"method": "dspark", "disable_by_batch_size": 0}', "integer >= 1"),
        ('{"method": "dspark", "disable_by_batch_size": true}', "integer >= 1"),
    ):
        with pytest.raises(Dsv41rtError, match="speculative-config") as e:
            options_from({"speculative_config": bad})
        assert message in str(e.value)


def test_serve_yaml_and_flag() -> None:
    from dsv41rt.serve.config import build_config, dump

    cfg = build_config({"speculative-config": {"method": "dspark", "num_speculative_tokens": 2}}, {})
    assert cfg.runtime.speculative_config == SpeculativeConfig("dspark", 2)
    assert build_config(yaml.safe_load(dump(cfg)), {}) == cfg  # `dsv41rt config dump` round trip
    flag = build_config({}, {"speculative_config": '{"method": "dspark"}'})
    assert flag.runtime.speculative_config == SpeculativeConfig("dspark", None)
    with pytest.raises(Dsv41rtError, match="speculative-config"):
        build_config({"speculative-config": {"method": "ngram"}}, {})


def test_metrics_use_vllm_names() -> None:
    from dsv41rt.serve.metrics import Metrics

    stats = {
        "spec_decode_drafts": 4,
        "spec_decode_draft_tokens": 20,
        "spec_decode_accepted_tokens": 7,
        "spec_decode_accepted_pos_0": 4,
        "spec_decode_accepted_pos_1": 3,
    }
    text = Metrics("m", lambda: stats).render().decode()
    assert 'dsv41rt:spec_decode_num_drafts_total{model_name="m"} 4.0' in text
    assert 'dsv41rt:spec_decode_num_draft_tokens_total{model_name="m"} 20.0' in text
    assert 'dsv41rt:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0' in text
    assert 'dsv41rt:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 3.0' in text


@pytest.fixture(scope="module")
def runtimes(tiny_v41_dir: str):
    from dsv41rt.runtime import Runtime

    plain = Runtime(tiny_v41_dir, kv_memory="64M", page_size=4)
    spec = Runtime(
        tiny_v41_dir,
        kv_memory="64M",
        page_size=4,
        speculative_config='{"method": "dspark", "num_speculative_tokens": 5}',
    )
    yield plain, spec
    plain.close()
    spec.close()


def test_engine_greedy_outputs_equal_plain(runtimes) -> None:
    plain, spec = runtimes
    rng = np.random.default_rng(3)
    prompts = [[int(t) for t in rng.integers(3, 129000, n)] for n in (1, 9, 40, 130)]
    want = plain.generate(prompts, max_new_tokens=12, ignore_eos=True)
    got = spec.generate(prompts, max_new_tokens=12, ignore_eos=True)
    assert got == want
    s = spec.stats()
    assert s["spec_decode_drafts"] > 0 and s["spec_decode_draft_tokens"] >= s["spec_decode_drafts"]
    assert 0 <= s["spec_decode_accepted_tokens"] <= s["spec_decode_draft_tokens"]
    assert "spec_decode_accepted_pos_4" in s
    assert plain.stats()["spec_decode_drafts"] == 0


def test_self_tuned_engine_equals_plain_and_skips_a_drafter_that_misses(runtimes, tiny_v41_dir: str) -> None:
    """speculative-config without a count: lengths chosen per request and step (draft_length.h).
    Random weights accept almost nothing, so the drafter runs for probes only after the first
    verifies; the greedy outputs stay plain decoding's. With disable_by_batch_size 1, a batch of 4
    never drafts."""
    from dsv41rt.runtime import Runtime

    plain, _ = runtimes
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(3, 129000, n)] for n in (1, 9, 40, 130)]
    want = plain.generate(prompts, max_new_tokens=24, ignore_eos=True)
    cases = (({"method": "dspark"}, 4 * 23 // 3), ({"method": "dspark", "disable_by_batch_size": 1}, 0))
    for spec, most_drafts in cases:
        tuned = Runtime(tiny_v41_dir, kv_memory="64M", page_size=4, speculative_config=spec)
        try:
            # All four are submitted before the first step and end together: every step runs 4.
            got = tuned.generate(prompts, max_new_tokens=24, ignore_eos=True)
            s = tuned.stats()
        finally:
            tuned.close()
        assert got == want, spec
        assert s["spec_decode_drafts"] <= most_drafts, spec
        assert (s["spec_decode_drafts"] > 0) == (most_drafts > 0), spec


def _continuation(prompts: list[list[int]], want: list[list[int]], calls: list[int]):
    """A draft_source: the known continuation of each request (told apart by its prompt)."""
    by_prompt = {tuple(p): w for p, w in zip(prompts, want, strict=True)}

    def known(request_id: int, tokens: list[int], k: int) -> list[int]:
        calls.append(request_id)
        for p, w in by_prompt.items():
            if tuple(tokens[: len(p)]) == p:
                at = len(tokens) - len(p)
                return w[at : at + k]
        raise AssertionError("a request of unknown prompt")

    return known


def test_draft_source_hook_replaces_the_drafter(runtimes, tiny_v41_dir: str) -> None:
    """Runtime(draft_source=...) (benchmarks: fixed acceptance lengths): the known continuation
    as drafts is all accepted and the outputs are plain decoding's; the hook needs a count."""
    from dsv41rt.runtime import Runtime

    plain, _ = runtimes
    rng = np.random.default_rng(8)
    prompts = [[int(t) for t in rng.integers(3, 129000, n)] for n in (3, 20)]
    want = plain.generate(prompts, max_new_tokens=10, ignore_eos=True)
    calls: list[int] = []
    known = _continuation(prompts, want, calls)

    spec = {"method": "dspark", "num_speculative_tokens": 3}
    rt = Runtime(tiny_v41_dir, kv_memory="64M", page_size=4, speculative_config=spec, draft_source=known)
    try:
        assert rt.generate(prompts, max_new_tokens=10, ignore_eos=True) == want
        s = rt.stats()
    finally:
        rt.close()
    assert calls and s["spec_decode_accepted_tokens"] == s["spec_decode_draft_tokens"] > 0
    with pytest.raises(Dsv41rtError, match="draft_source: give num_speculative_tokens > 0"):
        Runtime(tiny_v41_dir, speculative_config={"method": "dspark"}, draft_source=known)


def test_forced_acceptance_hook(runtimes, tiny_v41_dir: str) -> None:
    """Runtime(forced_acceptance=...) (benchmarks only, not lossless): every verify accepts the
    count the hook gives, clamped to its drafts (here a schedule with 0 and past k), whatever the
    target says. With the known continuation as drafts the tokens stay plain decoding's, and the
    stats count exactly the forced drafts; the hook needs a count."""
    from dsv41rt.runtime import Runtime

    plain, _ = runtimes
    rng = np.random.default_rng(9)
    prompts = [[int(t) for t in rng.integers(3, 129000, n)] for n in (3, 20, 7)]
    want = plain.generate(prompts, max_new_tokens=12, ignore_eos=True)
    schedule, forced = [2, 0, 5, 1], []

    def accepted(request_id: int, drafted: int) -> int:
        a = schedule[len(forced) % len(schedule)]
        forced.append(min(a, drafted))
        return a

    spec = {"method": "dspark", "num_speculative_tokens": 3}
    known = _continuation(prompts, want, [])
    rt = Runtime(
        tiny_v41_dir,
        kv_memory="64M",
        page_size=4,
        speculative_config=spec,
        draft_source=known,
        forced_acceptance=accepted,
    )
    try:
        assert rt.generate(prompts, max_new_tokens=12, ignore_eos=True) == want
        s = rt.stats()
    finally:
        rt.close()
    assert 0 in forced and 3 in forced  # clamped from 5
    assert s["spec_decode_drafts"] == len(forced)
    assert s["spec_decode_accepted_tokens"] == sum(forced) > 0
    assert s["spec_decode_accepted_tokens"] < s["spec_decode_draft_tokens"]
    with pytest.raises(Dsv41rtError, match="forced_acceptance: give num_speculative_tokens > 0"):
        Runtime(tiny_v41_dir, forced_acceptance=accepted)


def test_load_errors_name_the_problem(tiny_v41_dir: str, tmp_path) -> None:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json
    from dsv41rt.runtime import Runtime

    with pytest.raises(Dsv41rtError, match="block of 5"):
        Runtime(tiny_v41_dir, speculative_config={"method": "dspark", "num_speculative_tokens": 6})
    with pytest.raises(Dsv41rtError, match="sliding window"):
        Runtime(tiny_v41_dir, speculative_config={"method": "dspark", "num_speculative_tokens": 9})
    config = preset_config_json("tiny-v41")
    text = {k: v for k, v in config["text_config"].items() if not k.startswith("dspark_")}
    config["text_config"] = {**text, "num_nextn_predict_layers": 0}  # no DSpark stages
    make_checkpoint(config, str(tmp_path / "plain"), 1, name="tiny-v41-no-dspark")
    with pytest.raises(Dsv41rtError, match="has no DSpark drafter"):
        Runtime(str(tmp_path / "plain"), speculative_config={"method": "dspark"})


def test_served_greedy_completion_and_metrics(tiny_dir: str, tok) -> None:
    """`dsv41rt serve --speculative-config`: a greedy completion equals the engine's without
    speculation (the same built-in model through Runtime), and /metrics shows the drafts."""
    import httpx
    from dsv41rt.runtime import Runtime
    from prometheus_client.parser import text_string_to_metric_families
    from serve_harness import LiveServer

    model_dir = tiny_dir  # the built-in model (conftest: generated once per module)
    spec = '{"method": "dspark", "num_speculative_tokens": 4}'
    server = LiveServer("--speculative-config", spec, "--kv-memory", "64M", model_dir=model_dir)
    try:
        prompt = [5, 900, 77, 1234, 8]
        r = httpx.post(
            server.url + "/v1/completions",
            json={
                "model": "dsv41rt-tiny-v41",
                "prompt": prompt,
                "max_tokens": 10,
                "temperature": 0,
                "ignore_eos": True,
                "logprobs": 0,
            },
            timeout=120,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 10
        samples = {
            (s.name, s.labels.get("position")): s.value
            for fam in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
            for s in fam.samples
        }
        assert samples[("dsv41rt:spec_decode_num_drafts_total", None)] > 0
        assert samples[("dsv41rt:spec_decode_num_draft_tokens_total", None)] >= 4
        assert ("dsv41rt:spec_decode_num_accepted_tokens_per_pos_total", "3") in samples
    finally:
        assert server.stop() == 0, server.output()
    rt = Runtime(model_dir, kv_memory="64M")
    try:
        want = rt.generate([prompt], max_new_tokens=10, ignore_eos=True)[0]
    finally:
        rt.close()
    assert r.json()["choices"][0]["text"] == tok.hf.decode(want, skip_special_tokens=False)
