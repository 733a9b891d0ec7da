"""The tensors a checkpoint must hold, derived from the layer plan (architecture spec §5.1, §6).

`expected_tensors(plan)` lists *logical* weights (name, shape, storage class). `physical_tensors`
expands them into what the safetensors files hold: with a `quantization_config`, an FP8 matrix
becomes `<name>` F8_E4M3 + `<stem>.scale` F8_E8M0 (block grid), an FP4 expert matrix becomes `<name>`
I8 [out, in/2] (two E2M1 codes per byte, even column in the low nibble) + `<stem>.scale` F8_E8M0
[out, in/32]; without one they are stored BF16 at their logical shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from ..config.plan import LayerPlan, ModelPlan, Role, Stage


class Storage(str, Enum):
    BF16 = "BF16"
    F32 = "F32"
    I64 = "I64"
    FP8 = "fp8"  # F8_E4M3 + UE8M0 block scales (when quantised)
    FP4 = "fp4"  # packed E2M1 + UE8M0 1x32 scales (when quantised)


@dataclass(frozen=True)
class LogicalTensor:
    name: str
    shape: tuple[int, ...]
    storage: Storage
    block: tuple[int, int] = (0, 0)  # FP8 scale block (rows, cols)


@dataclass(frozen=True)
class PhysicalTensor:
    name: str
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]
    logical: LogicalTensor  # the weight this tensor stores (a scale points at its weight)
    is_scale: bool = False

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BYTES[self.dtype]


DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "I32": 4, "I64": 8}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Builder:
    def __init__(self, plan: ModelPlan) -> None:
        self.plan, self.cfg = plan, plan.config
        q = self.cfg.quant
        # Without a quantization_config the weights are the BF16 values of the release's grid (the
        # dequantised codes), so the release's block shape and FP4 experts still define them.
        release_block = (32, 32) if self.cfg.is_v41 else (128, 128)
        self.block = q.weight_block_size if q is not None else release_block
        self.expert_fp4 = q is None or q.expert_dtype == "fp4"
        self.out: list[LogicalTensor] = []

    def add(self, name: str, shape: tuple[int, ...], storage: Storage, block: tuple[int, int] | None = None) -> None:
        default = self.block if storage is Storage.FP8 else (0, 0)
        self.out.append(LogicalTensor(name, shape, storage, block or default))

    def dense(self, name: str, out_dim: int, in_dim: int) -> None:
        self.add(name, (out_dim, in_dim), Storage.FP8)

    def attention(self, p: str, layer: LayerPlan) -> None:
        c = self.cfg
        h, d, n_h = c.hidden_size, c.head_dim, c.num_attention_heads
        self.dense(f"{p}attn.wq_a.weight", c.q_lora_rank, h)
        self.add(f"{p}attn.q_norm.weight", (c.q_lora_rank,), Storage.BF16)
        self.dense(f"{p}attn.wq_b.weight", n_h * d, c.q_lora_rank)
        self.dense(f"{p}attn.wkv.weight", d, h)
        self.add(f"{p}attn.kv_norm.weight", (d,), Storage.BF16)
        self.dense(f"{p}attn.wo_a.weight", c.o_groups * c.o_lora_rank, n_h * d // c.o_groups)
        self.dense(f"{p}attn.wo_b.weight", h, c.o_groups * c.o_lora_rank)
        self.add(f"{p}attn.attn_sink", (n_h,), Storage.F32)
        if c.is_v41:
            self._v41_compress(p, layer)
        else:
            self._v4_compress(p, layer)

    def _v41_compress(self, p: str, layer: LayerPlan) -> None:
        c = self.cfg
        h, d, di = c.hidden_size, c.head_dim, c.index_head_dim
        if layer.role is Role.FULL:
            self.add(f"{p}attn.compressor.wkv.weight", (d, h), Storage.BF16)
            if layer.ratio > 1:  # ratio-1 compression is a plain projection, no pooling gate
                self.add(f"{p}attn.compressor.wgate.weight", (d, h), Storage.BF16)
            self.add(f"{p}attn.compressor.norm.weight", (d,), Storage.BF16)
            self.add(f"{p}attn.indexer.wk.weight", (di, d), Storage.BF16)
            self.add(f"{p}attn.indexer.k_norm.weight", (di,), Storage.BF16)
        if layer.role in (Role.FULL, Role.REINDEX):
            self.dense(f"{p}attn.indexer.wq_b.weight", c.index_n_heads * di, c.q_lora_rank)
            self.add(f"{p}attn.indexer.weights_proj.weight", (c.index_n_heads, h), Storage.BF16)

    def _v4_compress(self, p: str, layer: LayerPlan) -> None:
        c = self.cfg
        h, d, di = c.hidden_size, c.head_dim, c.index_head_dim
        if layer.role is Role.CSA:  # overlapped compression: value and score rows are 2*D wide
            self._v4_compressor(f"{p}attn.compressor.", 2 * d, d, h, 4)
            self.dense(f"{p}attn.indexer.wq_b.weight", c.index_n_heads * di, c.q_lora_rank)
            self.add(f"{p}attn.indexer.weights_proj.weight", (c.index_n_heads, h), Storage.BF16)
            self._v4_compressor(f"{p}attn.indexer.compressor.", 2 * di, di, h, 4)
        elif layer.role is Role.HCA:
            self._v4_compressor(f"{p}attn.compressor.", d, d, h, layer.ratio)

    def _v4_compressor(self, p: str, width: int, norm: int, h: int, ape_rows: int) -> None:
        self.add(f"{p}wkv.weight", (width, h), Storage.BF16)
        self.add(f"{p}wgate.weight", (width, h), Storage.BF16)
        self.add(f"{p}ape", (ape_rows, width), Storage.F32)
        self.add(f"{p}norm.weight", (norm,), Storage.BF16)

    def moe(self, p: str, layer: LayerPlan) -> None:
        c = self.cfg
        h, inter, e = c.hidden_size, c.moe_intermediate_size, layer.n_experts
        self.add(f"{p}ffn.gate.weight", (e, h), Storage.BF16)
        if layer.hash_routed:
            self.add(f"{p}ffn.gate.tid2eid", (c.vocab_size, layer.experts_per_tok), Storage.I64)
        else:
            self.add(f"{p}ffn.gate.bias", (e,), Storage.F32)
            if c.is_v41:
                self.add(f"{p}ffn.gate.bias_vl", (e,), Storage.F32)
        for w, (o, i) in (("w1", (inter, h)), ("w2", (h, inter)), ("w3", (inter, h))):
            self.dense(f"{p}ffn.shared_experts.{w}.weight", o, i)
        expert = Storage.FP4 if self.expert_fp4 else Storage.FP8
        for x in range(e):
            for w, (o, i) in (("w1", (inter, h)), ("w2", (h, inter)), ("w3", (inter, h))):
                self.add(f"{p}ffn.experts.{x}.{w}.weight", (o, i), expert)

    def block_common(self, layer: LayerPlan) -> None:
        c, p = self.cfg, layer.name_prefix
        h = c.hidden_size
        self.add(f"{p}attn_norm.weight", (h,), Storage.BF16)
        self.add(f"{p}ffn_norm.weight", (h,), Storage.BF16)
        for kind in ("attn", "ffn"):
            self.add(f"{p}hc_{kind}_fn", (c.hc_mix_width, c.hc_mult * h), Storage.F32)
            self.add(f"{p}hc_{kind}_base", (c.hc_mix_width,), Storage.F32)
            self.add(f"{p}hc_{kind}_scale", (3,), Storage.F32)
        self.attention(p, layer)
        self.moe(p, layer)

    def engram(self, layer: LayerPlan, rows: int) -> None:
        c = self.cfg
        assert c.engram is not None
        e, p = c.engram, layer.name_prefix
        self.add(f"{p}engram.embed.weight", (rows, e.head_dim), Storage.FP8, (1, 32))
        self.dense(f"{p}engram.wkv.weight", (c.hc_mult + 1) * c.hidden_size, e.hash_columns * e.head_dim)
        self.add(f"{p}engram.q_weight", (c.hc_mult, c.hidden_size), Storage.BF16)
        self.add(f"{p}engram.k_weight", (c.hc_mult, c.hidden_size), Storage.BF16)

    def drafts(self) -> None:
        c, h = self.cfg, self.cfg.hidden_size
        last = len(self.plan.draft_layers) - 1
        for layer in self.plan.draft_layers:
            self.block_common(layer)
            p = layer.name_prefix
            if layer.stage is Stage.DSPARK:
                assert c.dspark is not None
                if layer.index == 0:
                    self.dense(f"{p}main_proj.weight", h, h * len(c.dspark.target_layer_ids))
                    self.add(f"{p}main_norm.weight", (h,), Storage.BF16)
                if layer.index == last:
                    r = c.dspark.markov_rank
                    self.add(f"{p}norm.weight", (h,), Storage.BF16)
                    self.add(f"{p}markov_head.embed.weight", (c.vocab_size, r), Storage.BF16)
                    self.add(f"{p}markov_head.head.weight", (c.vocab_size, r), Storage.BF16)
                    self.add(f"{p}confidence_head.proj.weight", (1, h + r), Storage.BF16)
            else:  # V4 MTP
                self.dense(f"{p}e_proj.weight", h, h)
                self.dense(f"{p}h_proj.weight", h, h)
                for n in ("enorm", "hnorm", "norm"):
                    self.add(f"{p}{n}.weight", (h,), Storage.BF16)
                self.hc_head(p)

    def hc_head(self, p: str) -> None:
        c = self.cfg
        self.add(f"{p}hc_head_fn", (c.hc_mult, c.hc_mult * c.hidden_size), Storage.F32)
        self.add(f"{p}hc_head_base", (c.hc_mult,), Storage.F32)
        self.add(f"{p}hc_head_scale", (1,), Storage.F32)


def expected_tensors(plan: ModelPlan) -> list[LogicalTensor]:
    """Every logical weight of the checkpoint, sorted by name."""
    b = _Builder(plan)
    c = plan.config
    b.add("embed.weight", (c.vocab_size, c.hidden_size), Storage.BF16)
    b.add("head.weight", (c.vocab_size, c.hidden_size), Storage.BF16)
    b.add("norm.weight", (c.hidden_size,), Storage.BF16)
    if not c.is_v41:
        b.hc_head("")
    engram_rows = dict(zip(c.engram.layer_ids, c.engram.num_embeddings, strict=True)) if c.engram else {}
    for layer in plan.layers:
        b.block_common(layer)
        if layer.engram:
            b.engram(layer, engram_rows[layer.index])
    b.drafts()
    return sorted(b.out, key=lambda t: t.name)


def scale_name(weight_name: str) -> str:
    return weight_name.removesuffix(".weight") + ".scale"


def physical_tensors(plan: ModelPlan) -> list[PhysicalTensor]:
    """What the safetensors files hold, sorted by name."""
    quantized = plan.config.quant is not None
    out: list[PhysicalTensor] = []
    for t in expected_tensors(plan):
        if t.storage in (Storage.FP8, Storage.FP4) and quantized:
            rows, cols = t.shape
            if t.storage is Storage.FP8:
                br, bc = t.block
                out.append(PhysicalTensor(t.name, "F8_E4M3", t.shape, t))
                out.append(
                    PhysicalTensor(scale_name(t.name), "F8_E8M0", (_ceil_div(rows, br), _ceil_div(cols, bc)), t, True)
                )
            else:
                out.append(PhysicalTensor(t.name, "I8", (rows, cols // 2), t))
                out.append(PhysicalTensor(scale_name(t.name), "F8_E8M0", (rows, cols // 32), t, True))
        elif t.storage in (Storage.FP8, Storage.FP4):
            out.append(PhysicalTensor(t.name, "BF16", t.shape, t))
        else:
            out.append(PhysicalTensor(t.name, t.storage.value, t.shape, t))
    return sorted(out, key=lambda t: t.name)
