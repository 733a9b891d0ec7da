"""`dsv41rt serve` on a tiny DeepSeek-V4 checkpoint (issue 25, acceptance 3), CPU: one live server
driven by the official `openai` client (chat streamed and not, completions), its prompts in V4's
chat encoding (deepseek-recipe's `DeepseekV4Encoding`, not V4.1's), its greedy tokens those of the
`Runtime` on the same prompt, the runtime options V4 cannot run with yet resolved from their
defaults (one log line) or refused at start when asked for, and a forced tool call's grammar in
V4's DSML spelling.

The checkpoint: $DSV41RT_TEST_V4_CHECKPOINT (scripts/test.sh makes tiny-v4 seed 0 there), else a
tiny-v4 generated for this module."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import deepseek_recipe as dr
import httpx
import openai
import pytest
from dsv41rt.errors import Dsv41rtError
from dsv41rt.options import RuntimeOptions
from dsv41rt.serve.config import build_config
from dsv41rt.serve.tool_calls import parse_output
from serve_harness import LiveServer, free_port

MODEL = "dsv41rt-tiny-v4"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
CHAT_TOKENS = 8
COMPLETION_PROMPT = "Hello world"
COMPLETION_TOKENS = 5
V4_RESOLVED = "running with kv-cache-dtype float32 (default auto)"


@pytest.fixture(scope="module")
def v4_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    given = os.environ.get("DSV41RT_TEST_V4_CHECKPOINT")
    if given and os.path.isfile(os.path.join(given, "config.json")):
        return given
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    out = str(tmp_path_factory.mktemp("tiny-v4-seed0"))
    make_checkpoint(preset_config_json("tiny-v4"), out, 0)
    return out


@pytest.fixture(scope="module")
def server(v4_dir: str):
    # Every runtime option at its default: the server must pick what V4 runs with by itself.
    s = LiveServer("--model", v4_dir, "--served-model-name", MODEL, "--log-level", "info")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused")


def _conversation(body: dict) -> dr.ConversationRequest:
    """deepseek-recipe's own conversion of a chat body for a V4 model, as DeepSeek renders it."""
    options = dr.ConversionOptions().with_model_alias(MODEL, dr.ModelVersion.DeepseekV4Pro)
    return dr.ChatCompletionRequest({"model": MODEL, **body}).convert(options)


def _v4_prompt(v4_dir: str, body: dict) -> list[int]:
    tok = dr.Tokenizer.from_file(os.path.join(v4_dir, "tokenizer.json"))
    return dr.DeepseekV4Encoding().with_tokenizer(tok).encode(_conversation(body).conversation)


# The Runtime side runs in its own process with one OpenMP thread, like the server (see
# test_serve_shutdown.py's _REFERENCE), with the options the server resolves for the checkpoint.
_REFERENCE = """
import json, sys
from dsv41rt import Runtime
from dsv41rt.sampling import SamplingParams
from dsv41rt.serve.config import build_config

job = json.load(sys.stdin)
rt = Runtime(job["model"], options=build_config({}, {"model": job["model"]}).runtime)
out = [rt.generate([prompt], n, SamplingParams(temperature=0.0), sequential=True)[0] for prompt, n in job["runs"]]
rt.close()
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def reference(v4_dir: str) -> dict[str, Any]:
    """Runtime.generate's greedy tokens for the chat prompt (V4 encoding) and the completion prompt."""
    import tokenizers

    hf = tokenizers.Tokenizer.from_file(os.path.join(v4_dir, "tokenizer.json"))
    chat_prompt = _v4_prompt(v4_dir, {"messages": MESSAGES})
    completion_prompt = hf.encode(COMPLETION_PROMPT, add_special_tokens=False).ids
    job = {"model": v4_dir, "runs": [[chat_prompt, CHAT_TOKENS], [completion_prompt, COMPLETION_TOKENS]]}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    p = subprocess.run(
        [sys.executable, "-c", _REFERENCE], input=json.dumps(job), capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    chat_ids, completion_ids = json.loads(p.stdout)
    return {"chat": (chat_prompt, chat_ids), "completion": (completion_prompt, completion_ids), "hf": hf}


def test_the_defaults_resolve_to_what_v4_runs_with_and_explicit_ones_are_kept_or_refused(v4_dir, tmp_path) -> None:
    """serve/config.py: options left at their defaults become V4's values; explicit values V4 runs
    with are kept; explicit values it cannot run with yet are errors naming the key; a V4.1
    checkpoint keeps every default."""
    rt = build_config({}, {"model": v4_dir}).runtime
    assert rt == RuntimeOptions(kv_cache_dtype="float32", page_size=128)  # the prefix cache stays on
    kept = build_config({"page-size": 256, "enable_prefix_caching": False}, {"model": v4_dir}).runtime
    assert (kept.page_size, kept.enable_prefix_caching, kept.kv_cache_dtype) == (256, False, "float32")
    parallel = build_config({"context-parallel-size": 2, "expert-parallel-size": 2}, {"model": v4_dir}).runtime
    assert (parallel.context_parallel_size, parallel.expert_parallel_size) == (2, 2)  # V4 runs them
    refused = {
        "precision": ("fp8", "precision: fp8 is not supported"),
        "page-size": (64, "page-size: 64 is not supported"),
        "speculative-config": ('{"method": "dspark"}', "speculative-config: "),
        "load-drafter": (True, "load-drafter: true is not supported"),
    }
    for key, (value, message) in refused.items():
        with pytest.raises(Dsv41rtError, match=message):
            build_config({key: value}, {"model": v4_dir})  # from a file
        with pytest.raises(Dsv41rtError, match=message):
            build_config({}, {"model": v4_dir, key.replace("-", "_"): value})  # from a flag
    # V4's quantised cache rows run on the cpu and cuda backends: an explicit auto is kept on both.
    assert build_config({"kv-cache-dtype": "auto"}, {"model": v4_dir}).runtime.kv_cache_dtype == "auto"
    on_cuda = build_config({"kv-cache-dtype": "auto", "device": "cuda"}, {"model": v4_dir}).runtime
    assert on_cuda.kv_cache_dtype == "auto" and on_cuda.device == "cuda"
    v41 = tmp_path / "v41"
    v41.mkdir()
    (v41 / "config.json").write_text(json.dumps({"model_type": "deepseek_v41"}))
    assert build_config({}, {"model": str(v41)}).runtime == RuntimeOptions()
    assert build_config({"precision": "fp8"}, {"model": str(v41)}).runtime.precision == "fp8"
    # The CUDA backend has the V4 ops (fp32): device cuda is kept.
    assert build_config({"device": "cuda"}, {"model": v4_dir}).runtime.device == "cuda"


def test_an_explicit_option_v4_cannot_run_with_is_refused_at_start(v4_dir) -> None:
    """`precision: bf16` asked for on a V4 checkpoint: exit 2 with one line naming the key, before
    the port or the model (no traceback)."""
    cmd = [sys.executable, "-m", "dsv41rt", "serve", "--model", v4_dir, "--port", str(free_port())]
    r = subprocess.run([*cmd, "--device", "cuda", "--precision", "bf16"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.strip() == (
        "dsv41rt serve: error: precision: bf16 is not supported with a DeepSeek-V4 checkpoint: DeepSeek-V4 runs in "
        "fp32 only so far; remove it or set fp32"
    ), r.stderr
    assert "Traceback" not in r.stdout + r.stderr


def test_the_server_says_what_it_resolved_for_v4(server) -> None:
    out = server.output()
    assert f"DeepSeek-V4 checkpoint: {V4_RESOLVED}, page-size 128 (default 64)" in out, out
    assert "Traceback" not in out


def test_chat_prompt_is_deepseek_recipes_v4_encoding(server, v4_dir) -> None:
    """The server's chat prompt is DeepseekV4Encoding's ids for the conversation (the V4.1 encoding
    renders the same conversation differently, so a server on V4.1's encoding fails this)."""
    body = {"messages": MESSAGES}
    served = httpx.post(server.url + "/tokenize", json={"model": MODEL, **body}).json()["tokens"]
    assert served == _v4_prompt(v4_dir, body)
    conv = _conversation(body).conversation
    assert (
        dr.DeepseekV41Encoding().render_conversation(conv).prompt
        != dr.DeepseekV4Encoding().render_conversation(conv).prompt
    )
    tok = dr.Tokenizer.from_file(os.path.join(v4_dir, "tokenizer.json"))
    with pytest.raises(RuntimeError):  # V4's tokenizer cannot even spell V4.1's <｜System｜>
        dr.DeepseekV41Encoding().with_tokenizer(tok).encode(conv)


def _expected_chat(reference: dict, tok_path: str) -> tuple[str, str, str, int, int]:
    """(reasoning, content, finish_reason, prompt tokens, completion tokens) of the Runtime's greedy
    tokens as the chat route parses them (deepseek-recipe's stream processor, one token a step)."""
    prompt, ids = reference["chat"]
    body = {"messages": MESSAGES, "max_tokens": CHAT_TOKENS, "temperature": 0}
    finish = dr.InferenceFinishReason.Length if len(ids) == CHAT_TOKENS else dr.InferenceFinishReason.Stop
    parsed, _ = parse_output(_conversation(body), dr.Tokenizer.from_file(tok_path), [[t] for t in ids], finish)
    return parsed.reasoning_content, parsed.content, parsed.finish_reason or "", len(prompt), len(ids)


def test_chat_not_streamed_and_streamed_are_the_runtimes_greedy_tokens(client, reference, v4_dir) -> None:
    """Greedy chat (thinking on, the default: the prompt ends in <think>) equals the Runtime's greedy
    tokens on the V4-encoded prompt, parsed as the route parses them; streamed the same, with usage."""
    reasoning, content, finish, n_prompt, n_out = _expected_chat(reference, os.path.join(v4_dir, "tokenizer.json"))
    assert n_out >= 1 and reasoning + content
    assert [m.id for m in client.models.list().data] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=CHAT_TOKENS, temperature=0)  # type: ignore[arg-type]
    msg = r.choices[0].message.model_dump()
    assert r.object == "chat.completion" and msg["role"] == "assistant"
    assert (msg["reasoning_content"], msg["content"] or "", r.choices[0].finish_reason) == (reasoning, content, finish)
    assert r.usage is not None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (
        n_prompt,
        n_out,
        n_prompt + n_out,
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=CHAT_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.model_dump() for c in chunks if c.choices]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == reasoning
    assert "".join(d.get("content") or "" for d in deltas) == content
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [finish]
    usage = chunks[-1].usage
    assert not chunks[-1].choices and usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (n_prompt, n_out)


def test_completions_are_the_runtimes_greedy_tokens(client, reference) -> None:
    prompt, ids = reference["completion"]
    r = client.completions.create(model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=COMPLETION_TOKENS, temperature=0)
    assert r.choices[0].text == reference["hf"].decode(ids, skip_special_tokens=False)
    assert r.choices[0].finish_reason == ("length" if len(ids) == COMPLETION_TOKENS else "stop")
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt), len(ids))
    parts = client.completions.create(
        model=MODEL, prompt=COMPLETION_PROMPT, max_tokens=COMPLETION_TOKENS, temperature=0, stream=True
    )
    assert "".join(p.choices[0].text for p in parts if p.choices) == r.choices[0].text


WEATHER = {
    "type": "object",
    "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def _spelled(node: dict, value: str) -> str:
    """The text a structural tag's one path spells: each JSON value `value`, optional parts out,
    the first branch of a choice, one repetition."""
    kind = node["type"]
    if kind == "structural_tag":
        return _spelled(node["format"], value)
    if kind == "sequence":
        return "".join(_spelled(e, value) for e in node["elements"])
    if kind == "const_string":
        return node["value"]
    if kind == "token":
        return node["token"]
    if kind == "json_schema":
        return value
    if kind == "optional":
        return ""
    if kind == "or":
        return _spelled(node["elements"][0], value)
    if kind == "plus":
        return _spelled(node["content"], value)
    raise AssertionError(kind)


def test_forced_tool_call_grammar_is_v4s_dsml_and_the_server_parses_it(client, v4_dir) -> None:
    """A forced call's grammar spells the block as deepseek-recipe's V4 encoding renders a call
    (`<｜DSML｜tool_calls>`, not V4.1's `<｜DSML｜ calls>`), and on the live server the call comes back
    as an OpenAI tool call with arguments valid for the schema."""
    from dsv41rt.serve.grammar import dsml_calls_tag
    from dsv41rt.serve.protocol import Tokenizers

    fmt = Tokenizers(v4_dir).format
    assert fmt.model_type == "deepseek_v4" and fmt.version == dr.ModelVersion.DeepseekV4Pro
    spelled = _spelled(dsml_calls_tag([{"name": "get_weather", "parameters": WEATHER}], False, fmt), "3")
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"days": 3}'}}
    history = [
        {"role": "user", "content": "?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    conv = _conversation({"messages": history, "tools": TOOLS}).conversation
    rendered = dr.DeepseekV4Encoding().render_conversation(conv)
    assert spelled in rendered.prompt and spelled.startswith("\n\n<｜DSML｜tool_calls>\n"), (spelled, rendered.prompt)
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in 3 days?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=100,  # the block alone is ~50 tokens
        temperature=0,
        extra_body={"thinking": {"type": "disabled"}},
    )
    calls = r.choices[0].message.tool_calls or []
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, r
    assert calls[0].function.name == "get_weather" and not r.choices[0].message.content  # type: ignore[union-attr]
    days = json.loads(calls[0].function.arguments)["days"]  # type: ignore[union-attr]
    assert isinstance(days, int) and 1 <= days <= 14
