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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

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


def generate_greedy_speculative(
    rt: Runtime,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    num_speculative_tokens: int | None = None,
    draft: DraftFn | None = None,
) -> SpeculativeGeneration:
    """`max_new_tokens` greedy tokens after `prompt_ids` (no stop tokens), drafting up to
    `num_speculative_tokens` per step (default: the drafter's block; at most sliding_window - 1,
    the verify forward's limit) with DSpark or `draft`."""
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
        while len(tokens) < max_new_tokens:
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
        return SpeculativeGeneration(tuple(tokens), steps, drafted, accepted)
    finally:
        rt.release_handle(handle)
