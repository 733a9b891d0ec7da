"""The forced-call grammar (python/dsv41rt/serve/grammar.py) never lets a JSON value spell the
closing markup `</｜DSML｜`: the recipe ends a parameter's value there, so such a value came back
as arguments that are not JSON (a flake of the Messages test: `input` {}). A random model writes
it too rarely to test by sampling; here the grammar itself is asked, token by token, what it
accepts of outputs the recipe would misparse (dsv41rt._core.grammar_accepted_prefix), and the
schema's bounds still hold."""

from __future__ import annotations

import json
import os

import pytest
from dsv41rt import _core
from dsv41rt.config.parse import load_config
from dsv41rt.sampling import Grammar
from dsv41rt.serve.grammar import dsml_calls_tag
from dsv41rt.serve.protocol import V4_FORMAT, V41_FORMAT, ChatFormat
from dsv41rt.tokenizer.grammar_vocab import grammar_vocab

D = "｜DSML｜"
TOOL = {
    "name": "note",
    "parameters": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 12},
            "body": {"type": "string"},
            "meta": {"type": "object"},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1}},
        },
        "required": ["title"],
    },
}

pytestmark = pytest.mark.skipif(not _core.Runtime.grammar_available(), reason="built without xgrammar")


@pytest.fixture(scope="module")
def vocab(tiny_dir: str) -> tuple[list[bytes], int, list[int]]:
    cfg = load_config(os.path.join(tiny_dir, "config.json"))
    return grammar_vocab(os.path.join(tiny_dir, "tokenizer.json")), cfg.vocab_size, [cfg.eos_token_id]


def _call(params: dict[str, str], fmt: ChatFormat) -> str:
    sp, block = fmt.dsml_space, fmt.dsml_block
    body = "".join(f'<{D}{sp}parameter name="{k}" string="false">{v}</{D}{sp}parameter>\n' for k, v in params.items())
    return f'\n\n<{D}{sp}{block}>\n<{D}{sp}invoke name="note">\n{body}</{D}{sp}invoke>\n</{D}{sp}{block}>'


def _accepted(tok, vocab, params: dict[str, str], fmt: ChatFormat = V41_FORMAT) -> bool:
    """Whether the forced-call grammar takes the whole call and then the end-of-sequence token."""
    tokens, size, stops = vocab
    g = Grammar("structural_tag", json.dumps(dsml_calls_tag([TOOL], False, fmt)))
    ids = tok.encode(_call(params, fmt)) + stops
    n, ended = _core.grammar_accepted_prefix(tokens, size, stops, g.to_dict(), ids)
    return n == len(ids) and ended


@pytest.mark.parametrize("fmt", [V41_FORMAT, V4_FORMAT], ids=["v41", "v4"])
def test_values_never_spell_the_closing_markup(tok, vocab, fmt) -> None:
    close = f"</{D}{fmt.dsml_space}parameter>"
    assert _accepted(tok, vocab, {"title": '"Paris"'}, fmt)  # the plain call goes through
    assert _accepted(tok, vocab, {"title": '"Paris"', "body": '"a<b </c> <D>"'}, fmt)
    # The opening markup in a string does not end the value: the recipe reads it as text.
    assert _accepted(tok, vocab, {"title": '"x"', "body": f'"a<{D} invoke"'}, fmt)
    for name, value in [
        ("body", f'"cut {close} here"'),  # an unbounded string
        ("body", f'"</{D}"'),
        ("meta", f'{{"k": "v</{D}"}}'),  # a nested value of an object of any keys
        ("meta", f'{{"</{D}": 1}}'),  # and its key
        ("tags", f'["a", "</{D}x"]'),  # a bounded string inside an array
        ("title", f'"a</{D}b"'),  # a bounded string
    ]:
        params = {"title": '"x"', name: value} if name != "title" else {"title": value}
        assert not _accepted(tok, vocab, params, fmt), (name, value)


def test_the_schemas_bounds_still_hold(tok, vocab) -> None:
    assert _accepted(tok, vocab, {"title": '"' + "a" * 12 + '"'})
    assert not _accepted(tok, vocab, {"title": '"' + "a" * 13 + '"'})  # maxLength 12
    assert not _accepted(tok, vocab, {"title": '"x"', "tags": '[""]'})  # minLength 1
    assert _accepted(tok, vocab, {"title": '"x"', "tags": '["a", "bc"]'})
    # A bounded string holds no ｜ (its pattern: the cost of keeping its bounds), and, as xgrammar's
    # own bounded strings, no escapes; only JSON comes out.
    assert not _accepted(tok, vocab, {"title": f'"a{D[0]}b"'})
    assert _accepted(tok, vocab, {"title": '"héllo wörld"'})
    for value in [r'"a\uff5cb"', r'"a\"b"', r'"a\-b"', '"a\nb"']:
        assert not _accepted(tok, vocab, {"title": value}), value
    # An unbounded string holds the escapes JSON has, and only them.
    assert _accepted(tok, vocab, {"title": '"x"', "body": r'"a\uff5c\"b\\c\n\/"'})
    assert not _accepted(tok, vocab, {"title": '"x"', "body": r'"a\-b"'})
    assert not _accepted(tok, vocab, {"title": '"x"', "body": '"a\nb"'})  # a raw line feed
