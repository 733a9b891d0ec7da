"""`dsv41rt.Runtime`: load a checkpoint, run requests step by step (greedy), score prompts.

Minimal by design (the engine issue adds the scheduler, paged pool and sampling): every step
prefills newly added requests in one forward (or in chunks) and decodes one token for the others.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import _core
from .checkpoint.reader import open_checkpoint
from .config.engram_layout import engram_layouts
from .errors import Dsv41rtError
from .tokenizer import engram_multipliers
from .tokenizer.cache import cached_token_map


class StepOutput(NamedTuple):
    request_id: int
    new_tokens: list[int]
    finished: bool
    finish_reason: str | None  # "length" | "stop" | None


@dataclass
class _Request:
    handle: int
    prompt: list[int]
    max_new_tokens: int
    stop_token_ids: frozenset[int]
    generated: list[int] = field(default_factory=list)
    next_token: int | None = None
    finished: bool = False


def _engram_inputs(path: str, opened) -> tuple[np.ndarray | None, list[dict]]:
    cfg = opened.config
    if cfg.engram is None:
        return None, []
    tok = os.path.join(path, "tokenizer.json")
    if not os.path.exists(tok):
        raise Dsv41rtError(f"{path}: Engram layers need the checkpoint's tokenizer.json (not found)")
    token_map, n_classes = cached_token_map(tok)
    e = cfg.engram
    if n_classes != e.compressed_vocab_size:
        raise Dsv41rtError(
            f"{tok}: the tokenizer normalises to {n_classes} classes but engram_compressed_vocab_size is "
            f"{e.compressed_vocab_size}; the Engram hash depends on it"
        )
    if len(token_map) != cfg.vocab_size:
        raise Dsv41rtError(f"{tok}: tokenizer has {len(token_map)} ids, config vocab_size is {cfg.vocab_size}")
    layers = [
        {
            "multipliers": engram_multipliers(layout.layer_id, n_classes, e.max_ngram_size),
            "primes": list(layout.primes),
            "offsets": list(layout.offsets),
        }
        for layout in engram_layouts(e)
    ]
    return np.ascontiguousarray(token_map, dtype=np.int32), layers


class Runtime:
    """A loaded model plus its live requests."""

    def __init__(
        self, checkpoint: str, device: str = "cpu", *, cache_quant: bool = True, record_decisions: bool = False
    ) -> None:
        """Load `checkpoint` (validated against its config).

        cache_quant=False keeps every cache in FP32 (a debugging deviation from the released numerics,
        matching the reference's "cache quantisation off" mode); record_decisions keeps each forward's
        indexer top-k and routed experts for `decisions()`.
        """
        if device != "cpu":
            raise Dsv41rtError(f"device {device!r} is not supported yet (only 'cpu')")
        opened = open_checkpoint(checkpoint)  # validates config and every tensor, errors by name
        self.config = opened.config
        token_map, layers = _engram_inputs(checkpoint, opened)
        del opened
        try:
            self._ex = _core.Executor(checkpoint, token_map, layers, cache_quant, record_decisions)
        except _core.Error as err:
            raise Dsv41rtError(str(err)) from None
        self._requests: dict[int, _Request] = {}
        self._next_id = 1

    # ---- requests -----------------------------------------------------------------------------
    def _check_ids(self, ids: Sequence[int], what: str) -> list[int]:
        out = []
        for i, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise Dsv41rtError(f"{what}[{i}] is {t!r}, not a token id")
            if not 0 <= int(t) < self.config.vocab_size:
                raise Dsv41rtError(f"{what}[{i}] = {int(t)} is outside the vocabulary [0, {self.config.vocab_size})")
            out.append(int(t))
        return out

    def add_request(
        self, prompt_ids: Sequence[int], max_new_tokens: int = 16, stop_token_ids: Sequence[int] | None = None
    ) -> int:
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise Dsv41rtError("prompt_ids must contain at least one token")
        if max_new_tokens < 0:
            raise Dsv41rtError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        stops = frozenset(self._check_ids(stop_token_ids or [], "stop_token_ids"))
        rid = self._next_id
        self._next_id += 1
        self._requests[rid] = _Request(self._ex.new_request(), prompt, max_new_tokens, stops)
        return rid

    def abort(self, request_id: int) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            raise Dsv41rtError(f"unknown request {request_id}")
        self._ex.release(req.handle)

    def step(self) -> list[StepOutput]:
        """Advance every live request by one token (prefilling new ones first)."""
        outs = []
        for rid, req in list(self._requests.items()):
            if req.finished:
                continue
            if req.max_new_tokens == 0:
                req.finished = True
                outs.append(StepOutput(rid, [], True, "length"))
                continue
            feed = req.prompt if req.next_token is None else [req.next_token]
            logits = self._ex.forward(req.handle, np.asarray(feed, np.int32), all_logits=False)
            tok = int(np.argmax(logits[-1]))
            req.generated.append(tok)
            req.next_token = tok
            reason = (
                "stop" if tok in req.stop_token_ids else "length" if len(req.generated) >= req.max_new_tokens else None
            )
            req.finished = reason is not None
            outs.append(StepOutput(rid, [tok], req.finished, reason))
        for rid in [r for r, q in self._requests.items() if q.finished]:
            self._ex.release(self._requests.pop(rid).handle)
        return outs

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 16) -> list[list[int]]:
        """Greedy continuation of each prompt (run together, step by step)."""
        ids = [self.add_request(p, max_new_tokens) for p in prompts]
        out: dict[int, list[int]] = {i: [] for i in ids}
        while any(i in self._requests for i in ids):
            for o in self.step():
                out[o.request_id].extend(o.new_tokens)
        return [out[i] for i in ids]

    # ---- scoring ------------------------------------------------------------------------------
    def score(self, prompt_ids: Sequence[int], chunk_size: int | None = None) -> np.ndarray:
        """Logits float32 [len, vocab] of every position, prefilled in chunks of `chunk_size`."""
        prompt = self._check_ids(prompt_ids, "prompt_ids")
        if not prompt:
            raise Dsv41rtError("cannot score an empty prompt")
        if chunk_size is not None and chunk_size < 1:
            raise Dsv41rtError(f"chunk_size must be >= 1, got {chunk_size}")
        handle = self._ex.new_request()
        try:
            step = chunk_size or len(prompt)
            parts = [
                self._ex.forward(handle, np.asarray(prompt[i : i + step], np.int32), all_logits=True)
                for i in range(0, len(prompt), step)
            ]
        finally:
            self._ex.release(handle)
        return np.concatenate(parts, axis=0)

    # ---- diagnostics --------------------------------------------------------------------------
    def dequant_counters(self) -> dict[str, int]:
        return dict(self._ex.counters())

    def reset_dequant_counters(self) -> None:
        self._ex.reset_counters()

    def decisions(self) -> dict[str, np.ndarray]:
        """The last forward's "topk_L<l>" / "experts_L<l>" arrays (sorted rows), if recording."""
        return dict(self._ex.decisions())

    def set_dequant_reuse(self, on: bool) -> None:
        self._ex.set_dequant_reuse(on)

    def forward_tokens(self, handle: int, tokens: Sequence[int]) -> np.ndarray:
        """Low-level: run tokens on an executor request handle (see new_handle)."""
        return self._ex.forward(handle, np.asarray(self._check_ids(tokens, "tokens"), np.int32), all_logits=True)

    def new_handle(self) -> int:
        return self._ex.new_request()

    def release_handle(self, handle: int) -> None:
        self._ex.release(handle)
