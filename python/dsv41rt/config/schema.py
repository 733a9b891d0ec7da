"""Frozen dataclasses holding a DeepSeek-V4.1 / V4 model config.

The C++ parser (cpp/runtime/model/model_config.h, bound as `dsv41rt._core`) reads and validates
`config.json`; `parse.py` fills these from what it returns. V4.1 (`model_type: deepseek_v41`) nests
the text model under `text_config`; V4 (`deepseek_v4`) is flat and uses the released legacy keys
(`compress_ratios`, `num_hash_layers`, `rope_scaling.type`). Both give one `ModelConfig`; fields that
only one architecture has are empty for the other. Spec: docs of the model (architecture §1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Arch(str, Enum):
    V41 = "deepseek_v41"
    V4 = "deepseek_v4"


@dataclass(frozen=True)
class RopeScaling:
    """YaRN frequency blend used by every layer with compress ratio > 0."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float


@dataclass(frozen=True)
class QuantConfig:
    """Release quantisation: FP8 E4M3 dense weights with UE8M0 block scales, FP4 routed experts."""

    weight_block_size: tuple[int, int]
    expert_dtype: str | None  # "fp4" or None (experts stored like dense weights)
    scale_fmt: str = "ue8m0"
    activation_scheme: str = "dynamic"


@dataclass(frozen=True)
class EngramConfig:
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]
    max_ngram_size: int
    vocab_size: int
    n_heads: int
    head_dim: int
    pad_token_id: int
    compressed_vocab_size: int


@dataclass(frozen=True)
class DSparkConfig:
    num_stages: int
    block_size: int
    noise_token_id: int
    target_layer_ids: tuple[int, ...]
    markov_rank: int
    n_routed_experts: int
    num_experts_per_tok: int


@dataclass(frozen=True)
class ModelConfig:
    arch: Arch
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    scoring_func: str
    topk_method: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    swiglu_limit: float
    rms_norm_eps: float
    sliding_window: int
    compress_ratios: tuple[int, ...]
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    num_nextn_predict_layers: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int | None
    quant: QuantConfig | None
    # V4.1 only
    kv_source_layer_ids: tuple[int, ...] = ()
    index_source_layer_ids: tuple[int, ...] = ()
    candidate_source_layer_id: int = -1
    candidate_topk_blocks: int = 0
    candidate_block_size: int = 0
    engram: EngramConfig | None = None
    dspark: DSparkConfig | None = None
    # V4 only
    num_hash_layers: int = 0
    # Where the config came from, for error messages.
    source: str = field(default="<dict>", compare=False)
    # The parsed C++ config these fields were filled from (`_core.ModelConfig`): build_plan and the
    # tensor spec are computed from it, never from a second reading of the fields above.
    native: Any = field(default=None, compare=False, repr=False)

    @property
    def is_v41(self) -> bool:
        return self.arch is Arch.V41
