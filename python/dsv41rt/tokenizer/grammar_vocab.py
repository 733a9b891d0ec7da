"""The vocabulary grammars compile against (cpp/runtime/engine/grammar.h): the bytes each token
decodes to, read from the checkpoint's byte-level BPE tokenizer.json.

Added tokens are control tokens (b"": no grammar ever produces them, so a JSON string cannot end a
turn with `<｜end▁of▁sentence｜>` or open a reasoning block with `<think>`), except the markup
that V4.1's output formats spell with an added token, which keeps its text: `｜DSML｜`, the
tool-call marker (`<｜DSML｜ invoke name="...">`)."""

from __future__ import annotations

import json
from pathlib import Path

from .engram_token_map import byte_level_bytes

GRAMMAR_TEXT_TOKENS = frozenset({"｜DSML｜"})


def grammar_vocab(tokenizer_json_path: str | Path) -> list[bytes]:
    """tokens[i] = the bytes of token i (b"" for control tokens), for Runtime.set_grammar_vocab."""
    with open(tokenizer_json_path, encoding="utf-8") as f:
        tj = json.load(f)
    model, decoder = tj.get("model", {}), tj.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        raise ValueError(
            f"{tokenizer_json_path}: grammars need a byte-level BPE tokenizer "
            f"(model {model.get('type')!r}, decoder {decoder.get('type')!r})"
        )
    vocab: dict[str, int] = model["vocab"]
    added = tj.get("added_tokens", [])
    size = max([*vocab.values(), *(a["id"] for a in added)]) + 1
    tokens = [b""] * size
    for tok, i in vocab.items():
        tokens[i] = byte_level_bytes(tok)
    for a in added:
        tokens[a["id"]] = a["content"].encode("utf-8") if a["content"] in GRAMMAR_TEXT_TOKENS else b""
    return tokens
