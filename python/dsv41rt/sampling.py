"""Per-request sampling parameters (the C++ sampler's fields; semantics in cpp/kernels/sampling.h)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (the Runtime default); the server uses the OpenAI default 1.0
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int = 0
    top_logprobs: int = 0

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


GREEDY = SamplingParams()


@dataclass(frozen=True)
class Grammar:
    """Holds a request's output to a grammar (cpp/include/dsv41rt/runtime.hpp GrammarParams;
    cpp/runtime/engine/grammar.h)."""

    kind: str  # "json_object", "json_schema", "structural_tag" (xgrammar's JSON), "ebnf", "regex"
    text: str = ""  # the schema / structural tag / grammar (root rule "root") / pattern
    start_token: int = -1  # free output until this token is drawn (e.g. "</think>"); -1: held from the start
    start_within: int = -1  # with start_token: forced once this many tokens came without it; -1: never

    def to_dict(self) -> dict[str, str | int]:
        return asdict(self)
