"""Engram token normalisation map and hash multipliers (spec §4.1.1, §4.1.3), in pure Python.

Reproduces NeMo Automodel's ``_compressed_token_map`` (models/deepseek_v41/engram.py) without the
``tokenizers`` package: every token id is decoded alone the way the HF byte-level decoder does it,
then keyed either on the raw token string (decoded text contains U+FFFD) or on the normalised text
(NFKC -> NFD -> strip combining marks -> per-character lowercase -> collapse ``[ \\t\\r\\n]+`` to one
space -> a lone space is kept -> strip Unicode White_Space); ids with equal keys share a
compressed id, numbered in first-seen order.

Details that follow the Rust implementation rather than Python's string methods:
  * ByteLevel decode: a token whose characters are all in the GPT-2 byte<->unicode table becomes
    those bytes, otherwise its own UTF-8 bytes; the concatenated bytes are decoded leniently.
  * Added tokens decode to their content.
  * StripAccents removes General_Category Mark (Mn, Mc, Me) characters.
  * Lowercase maps each character on its own (no Greek final-sigma context rule of ``str.lower``).
  * Strip uses Rust's ``char::is_whitespace`` (Unicode White_Space), which is not ``str.isspace``.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

import numpy as np

_REPLACEMENT = "\ufffd"
_WS_RUN = re.compile(r"[ \t\r\n]+")
# Unicode White_Space (Rust char::is_whitespace).
_WHITE_SPACE = frozenset(
    [chr(c) for c in range(0x09, 0x0E)]
    + [" ", "\u0085", "\u00a0", "\u1680"]
    + [chr(c) for c in range(0x2000, 0x200B)]
    + ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
)


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte -> printable character table used by byte-level BPE."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_CHAR_TO_BYTE = {c: b for b, c in _bytes_to_unicode().items()}


def byte_level_bytes(token: str) -> bytes:
    """The bytes a byte-level BPE vocabulary entry stands for (its own UTF-8 when it is not one)."""
    try:
        return bytes(_CHAR_TO_BYTE[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def _byte_level_decode(token: str) -> str:
    return byte_level_bytes(token).decode("utf-8", errors="replace")


def _strip_white_space(text: str) -> str:
    start, end = 0, len(text)
    while start < end and text[start] in _WHITE_SPACE:
        start += 1
    while end > start and text[end - 1] in _WHITE_SPACE:
        end -= 1
    return text[start:end]


def normalize_text(text: str) -> str:
    """NeMo's normaliser sequence on one decoded token."""
    text = unicodedata.normalize("NFKC", text)
    text = unicodedata.normalize("NFD", text)
    text = "".join(c for c in text if not unicodedata.category(c).startswith("M"))
    text = "".join(c.lower() for c in text)
    text = _WS_RUN.sub(" ", text)
    if text == " ":
        return " "  # NeMo protects a lone space from Strip with a sentinel
    return _strip_white_space(text)


def _id_to_token(tokenizer_json: dict) -> list[str | None]:
    vocab: dict[str, int] = tokenizer_json["model"]["vocab"]
    added = tokenizer_json.get("added_tokens", [])
    size = max([*vocab.values(), *(a["id"] for a in added)]) + 1
    tokens: list[str | None] = [None] * size
    for tok, i in vocab.items():
        tokens[i] = tok
    for a in added:
        tokens[a["id"]] = a["content"]
    return tokens


def compressed_token_map(tokenizer_json_path: str | Path) -> tuple[np.ndarray, int]:
    """Return (map int32 [vocab], number of compressed ids) for a byte-level BPE tokenizer.json."""
    with open(tokenizer_json_path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model", {})
    decoder = tj.get("decoder") or {}
    if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel":
        raise ValueError(
            f"{tokenizer_json_path}: expected a byte-level BPE tokenizer "
            f"(model {model.get('type')!r}, decoder {decoder.get('type')!r})"
        )
    added_ids = {a["id"] for a in tj.get("added_tokens", [])}
    tokens = _id_to_token(tj)
    key_to_id: dict[str, int] = {}
    out = np.empty(len(tokens), dtype=np.int32)
    for i, tok in enumerate(tokens):
        if tok is None:
            text, raw = "", ""
        elif i in added_ids:
            text, raw = tok, tok
        else:
            text, raw = _byte_level_decode(tok), tok
        if _REPLACEMENT in text:
            key = raw
        else:
            key = normalize_text(text) or text
        out[i] = key_to_id.setdefault(key, len(key_to_id))
    return out, len(key_to_id)


def engram_multipliers(layer_id: int, n_classes: int, max_ngram: int) -> list[int]:
    """Hash multipliers of one Engram layer: odd int64 values from numpy's PCG64 (as NeMo)."""
    bound = max(1, (np.iinfo(np.int64).max // n_classes) // 2)
    rng = np.random.default_rng(10007 * layer_id)
    values = rng.integers(0, bound, size=(max_ngram,), dtype=np.int64)
    return [int(v) for v in values * 2 + 1]
