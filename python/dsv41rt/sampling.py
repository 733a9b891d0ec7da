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
