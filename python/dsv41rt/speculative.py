"""Greedy speculative decoding on a direct handle (issue 24, spec 4.2 and 7.3-7.4): draft a block,
verify it with one target forward, keep the agreeing prefix plus the target's own next token,
roll the rest back exactly. The tokens are plain greedy decoding's, bitwise, whatever the drafts
are; only the number of target forwards changes.

    rt = Runtime(checkpoint, load_drafter=True)
    result = generate_greedy_speculative(rt, prompt_ids, max_new_tokens=64)
    result.tokens, result.accepted / max(result.drafted, 1)

The drafter is DSpark's (Runtime.draft_greedy) unless `draft` is given: a callable from the
tokens generated so far (the last one not fed yet) and the most tokens wanted, to a proposal
(tests use the true continuation to force acceptance).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import Dsv41rtError

if TYPE_CHECKING:
    from .runtime import Runtime


@dataclass(frozen=True)
class DraftBlock:
    """A block the DSpark drafter proposes: its tokens in order and each one's confidence logit."""

    tokens: tuple[int, ...]
    confidence: tuple[float, ...]


@dataclass(frozen=True)
class SpeculativeGeneration:
    """The generated tokens and what the speculation did: target forwards after the prompt
    (steps), draft tokens proposed, and how many of them the target accepted."""

    tokens: tuple[int, ...]
    steps: int
    drafted: int
    accepted: int


DraftFn = Callable[[list[int], int], Sequence[int]]


@dataclass(frozen=True)
class SpeculativeConfig:
    """vLLM's `--speculative-config` for this model: the method (DSpark, V4.1's only drafter), the
    draft tokens per step (None: self-tuned per request and step, up to the drafter's block) and
    `disable_by_batch_size` (no drafts in steps of more requests; None: never)."""

    method: str = "dspark"
    num_speculative_tokens: int | None = None
    disable_by_batch_size: int | None = None

    def to_json(self) -> str:
        """The `--speculative-config` text that parses back to this config."""
        d: dict[str, Any] = {"method": self.method}
        if self.num_speculative_tokens is not None:
            d["num_speculative_tokens"] = self.num_speculative_tokens
        if self.disable_by_batch_size is not None:
            d["disable_by_batch_size"] = self.disable_by_batch_size
        return json.dumps(d)

    @property
    def engine_tokens(self) -> int:
        """The C++ RuntimeOptions.num_speculative_tokens: -1 for the self-tuned length."""
        return -1 if self.num_speculative_tokens is None else self.num_speculative_tokens


def parse_speculative_config(value: str | dict[str, Any]) -> SpeculativeConfig:
    """A SpeculativeConfig from the JSON text of `--speculative-config` (or its decoded object),
    with an error naming what is wrong: not an object, an unknown key, a method other than
    "dspark", a count that is not a non-negative integer."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise Dsv41rtError(f"speculative-config: not valid JSON ({e}): {value!r}") from None
    if not isinstance(value, dict):
        raise Dsv41rtError(f"speculative-config: must be a JSON object, got {value!r}")
    known = {"method", "num_speculative_tokens", "disable_by_batch_size"}
    unknown = sorted(set(value) - known)
    if unknown:
        raise Dsv41rtError(f"speculative-config: unknown key(s) {unknown}; known: {sorted(known)}")
    method = value.get("method")
    if method != "dspark":
        raise Dsv41rtError(f'speculative-config: "method" must be "dspark" (V4.1\'s drafter), got {method!r}')
    k = value.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
        raise Dsv41rtError(f'speculative-config: "num_speculative_tokens" must be an integer >= 0, got {k!r}')
    b = value.get("disable_by_batch_size")
    if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 1):
        raise Dsv41rtError(f'speculative-config: "disable_by_batch_size" must be an integer >= 1, got {b!r}')
    return SpeculativeConfig(method, k, b)


def generate_greedy_speculative(
    rt: Runtime,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    num_speculative_tokens: int | None = None,
    draft: DraftFn | None = None,
    stop_token_ids: Sequence[int] = (),
) -> SpeculativeGeneration:
    """`max_new_tokens` greedy tokens after `prompt_ids`, drafting up to `num_speculative_tokens`
    per step (default: the drafter's block; at most sliding_window - 1, the verify forward's
    limit) with DSpark or `draft`. Generation ends at the first of `stop_token_ids`, which is kept
    (the engine's rule: `Runtime.generate` returns the same tokens)."""
    if max_new_tokens < 1:
        raise Dsv41rtError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not prompt_ids:
        raise Dsv41rtError("generate_greedy_speculative: empty prompt")
    cfg = rt.config
    block = cfg.dspark.block_size if cfg.dspark else 0
    k_max = block if num_speculative_tokens is None else num_speculative_tokens
    if not 0 <= k_max < cfg.sliding_window:
        raise Dsv41rtError(f"num_speculative_tokens must be in [0, {cfg.sliding_window - 1}], got {k_max}")
    handle = rt.new_handle()
    try:
        logits = rt.forward_tokens(handle, prompt_ids, all_logits=False)
        tokens = [int(np.argmax(logits[0]))]  # first maximum: ties to the lowest id, as the sampler
        steps = drafted = accepted = 0
        stops = set(stop_token_ids)

        def stopped() -> bool:
            return any(t in stops for t in tokens)

        while len(tokens) < max_new_tokens and not stopped():
            k = min(k_max, max_new_tokens - len(tokens) - 1)  # never past max_new_tokens
            if k == 0:
                proposal: list[int] = []
            elif draft is not None:
                proposal = [int(t) for t in draft(list(tokens), k)][:k]
            else:
                proposal = list(rt.draft_greedy(handle, tokens[-1]).tokens[:k])
            new = rt.verify_greedy(handle, tokens[-1], proposal)
            steps += 1
            drafted += len(proposal)
            accepted += len(new) - 1
            tokens += new
        if stopped():  # the accepted block may run past a stop token: cut after the first
            tokens = tokens[: next(i for i, t in enumerate(tokens) if t in stops) + 1]
        return SpeculativeGeneration(tuple(tokens), steps, drafted, accepted)
    finally:
        rt.release_handle(handle)
