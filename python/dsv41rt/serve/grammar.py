"""The grammar a request's output is held to (issue 23, grammar-constrained decoding).

deepseek-recipe resolves what a request constrains into `inference_options.output_constraint`:
`response_format` json_object / json_schema (kind "json", schema "" or the schema) and a forced tool
call (chat `tool_choice` "required" or a named function, Responses the same, Messages "any" or a
named tool: kind "tool_call_required", schema the JSON list of the tools that may be called). This
module turns it into the engine's Grammar (cpp/runtime/engine/grammar.h, xgrammar underneath):

- JSON: the schema, strict (xgrammar's JSON-schema grammar, compact: no free whitespace), or any
  JSON object;
- a forced call: V4.1's DSML tool-call block exactly as deepseek-recipe renders and parses it,
  `\\n\\n<｜DSML｜ calls>\\n` + one or more `<｜DSML｜ invoke name="NAME">\\n ... </｜DSML｜ invoke>\\n`
  (one when parallel calls are off) + `</｜DSML｜ calls>`, each invoke's parameters in its schema's
  order (required ones always, the others optional), every value compact JSON of its property
  schema (`string="false"`, strings too), as xgrammar structural tags; the `｜DSML｜` marker is its
  own token, as the encoding has it. Parameters outside `properties` cannot be produced. A V4
  checkpoint's block is V4's spelling (`<｜DSML｜tool_calls>`, `<｜DSML｜invoke ...>`: no space after
  the marker; protocol.ChatFormat), the rest the same.

In thinking mode (the prompt ends with `<think>`) the constraint applies to the answer, after
`</think>`: the reasoning is free, and `</think>` is forced once half the output budget went to it,
so the constrained answer always has the other half.
"""

from __future__ import annotations

import json
from typing import Any

from ..sampling import Grammar
from .protocol import V41_FORMAT, ApiError, ChatFormat

DSML = "｜DSML｜"


def _const(text: str) -> dict[str, Any]:
    return {"type": "const_string", "value": text}


# The marker is one token in the V4.1 encoding, and the recipe's stream parser finds the markup by
# it: the grammar takes the token, never the same text spelled with other tokens.
MARKER: dict[str, Any] = {"type": "token", "token": DSML}


def _markup(before: str, after: str) -> list[dict[str, Any]]:
    """`before` + the marker token + `after`, e.g. `<｜DSML｜ calls>`."""
    return [_const(before), MARKER, _const(after)]


# The recipe ends a parameter's value at the first `</｜DSML｜` in its text, JSON string or not: a
# value spelling it would be cut there (arguments that are not JSON; Messages then showed `input`
# {}). JSON strings are therefore held away from it: xgrammar's `excludes` covers strings without
# pattern, format or length bounds (keys and values of any nesting); it would drop length bounds,
# so a bounded string instead gets a pattern of the same bounds over characters other than ｜
# (U+FF5C). xgrammar keeps quotes, backslashes and control characters out of an ASCII pattern's
# characters, so such a string holds no escapes, as xgrammar's own bounded strings never did.
# Strings with the schema's own pattern or format keep their constraint alone (xgrammar cannot
# intersect it).
_CLOSE = "</" + DSML
_BAR = DSML[0]


def _held_off_close(schema: Any) -> Any:
    """`schema` with each length-bounded string (no pattern, format, enum or const) as the pattern
    of its bounds over characters other than ｜, at any nesting."""
    if isinstance(schema, list):
        return [_held_off_close(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in ("enum", "const", "default", "examples") else _held_off_close(v)) for k, v in schema.items()}
    types = out.get("type")
    is_string = types == "string" or (isinstance(types, list) and "string" in types)
    bounded = "minLength" in out or "maxLength" in out
    if is_string and bounded and not any(k in out for k in ("pattern", "format", "enum", "const")):
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", "")
        out["pattern"] = f"^[^\\u{ord(_BAR):04X}]{{{lo},{hi}}}$"
    return out


def _parameter(name: str, schema: Any, sp: str) -> dict[str, Any]:
    """One `<｜DSML｜ parameter name="NAME" string="false">VALUE</｜DSML｜ parameter>\\n`: the value
    as compact JSON of its property schema, strings too. The recipe parses it as it parses the raw
    form (`string="true"`) the model also writes for strings, but only JSON lets the grammar hold a
    string exactly (UTF-8, maxLength, pattern, any text including "</"), and JSON strings never
    spell the closing markup (above)."""
    key = json.dumps(name, ensure_ascii=False)[1:-1]
    content = {
        "type": "json_schema",
        "json_schema": _held_off_close(schema if isinstance(schema, dict) else {}),
        "max_whitespace_cnt": 1,
        "excludes": [_CLOSE],
    }
    elements = _markup("<", f'{sp}parameter name="{key}" string="false">')
    return {"type": "sequence", "elements": [*elements, content, *_markup("</", f"{sp}parameter>\n")]}


def _invoke(fn: dict[str, Any], sp: str) -> dict[str, Any]:
    """`<｜DSML｜ invoke name="NAME">\\n` + its parameters in the schema's order (the required ones
    always, the others optional) + `</｜DSML｜ invoke>\\n`."""
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    elements = _markup("<", f'{sp}invoke name="{fn["name"]}">\n')
    for name, schema in props.items():
        p = _parameter(name, schema, sp)
        elements.append(p if name in required else {"type": "optional", "content": p})
    return {"type": "sequence", "elements": elements + _markup("</", f"{sp}invoke>\n")}


def dsml_calls_tag(tools: list[dict[str, Any]], parallel: bool, fmt: ChatFormat = V41_FORMAT) -> dict[str, Any]:
    """xgrammar's structural tag for a DSML calls block calling one (or, parallel, more) of `tools`
    ({"name", "parameters"} each), spelled as the model of `fmt` writes it."""
    sp, block = fmt.dsml_space, fmt.dsml_block
    invokes = [_invoke(tool, sp) for tool in tools]
    one: dict[str, Any] = invokes[0] if len(invokes) == 1 else {"type": "or", "elements": invokes}
    calls = {"type": "plus", "content": one} if parallel else one
    elements = [*_markup("\n\n<", f"{sp}{block}>\n"), calls, *_markup("</", f"{sp}{block}>")]
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}


def split_forced_choice(body: dict) -> tuple[dict, list[dict[str, Any]] | None]:
    """A request body whose `tool_choice` forces a call (chat / Responses "required" or a named
    function, Messages "any" or a named tool), as (the body with `tool_choice` auto, for the
    recipe's conversion, the tools that may be called as {"name", "parameters"}); other bodies as
    (body, None). The recipe refuses a forced choice in thinking mode; the grammar applies it after
    the reasoning instead. The route's checks ran first (the named tool is among `tools`)."""
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind not in ("required", "function", "any", "tool"):
        return body, None
    tools = []
    for t in body.get("tools") or []:
        fn = t.get("function", t)
        tools.append({"name": fn["name"], "parameters": fn.get("parameters", t.get("input_schema"))})
    named: dict[str, Any] = choice if isinstance(choice, dict) else {}
    if kind in ("function", "tool"):
        name = named.get("name") or (named.get("function") or {}).get("name")
        tools = [t for t in tools if t["name"] == name]
    auto: Any = "auto"
    if kind in ("any", "tool"):  # Anthropic's shape keeps its other settings
        auto = {k: v for k, v in named.items() if k == "disable_parallel_tool_use"} | {"type": "auto"}
    return {**body, "tool_choice": auto}, tools


def output_grammar(
    body: dict,
    constraint: Any,
    forced: list[dict[str, Any]] | None,
    parallel: bool,
    thinking_end: int | None,
    max_tokens: int,
    fmt: ChatFormat = V41_FORMAT,
) -> Grammar | None:
    """The Grammar of the request `body` (None: unconstrained): a forced call among `forced` (from
    split_forced_choice), else the recipe's output constraint (JSON; the schema as the client sent
    it: the recipe's copy drops keywords such as maxLength and maxItems). `thinking_end`: the
    `</think>` token when the prompt opens a reasoning block, else None. `fmt`: the model's chat
    format (how its DSML block is spelled)."""
    start_token, start_within = (thinking_end, max_tokens // 2) if thinking_end is not None else (-1, -1)

    def held(kind: str, text: str = "") -> Grammar:
        return Grammar(kind, text, start_token=start_token, start_within=start_within)

    if forced is not None:
        if not forced:
            raise ApiError(400, "'tool_choice' forces a call but no tool can be called", "tool_choice")
        return held("structural_tag", json.dumps(dsml_calls_tag(forced, parallel, fmt)))
    if constraint is None:
        return None
    if constraint.kind == "json":
        rf = body.get("response_format") or {}
        asked = (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
        if isinstance(asked, dict):
            return held("json_schema", json.dumps(asked))
        if constraint.schema:
            return held("json_schema", constraint.schema)
        return held("json_object")
    if constraint.kind in ("tool_call", "tool_call_required"):
        return None  # tools offered, none forced (forced choices never reach the recipe: above)
    raise ApiError(400, f"the output constraint {constraint.kind!r} is not supported by this server")
