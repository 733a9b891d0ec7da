"""transformers 5.23's DeepSeek-V4 model as an independent reference (CPU, eager, FP32).

The checkpoint is read back from its safetensors files with safetensors + torch alone (FP8 E4M3
weights in 128 x 128 blocks and packed E2M1 experts in 1 x 32 blocks, UE8M0 scales), mapped onto
`DeepseekV4ForCausalLM`'s parameter names, and loaded strictly (every parameter of the backbone
set; the MTP layer `mtp.0` is not part of that model). Nothing of dsv41rt is used to decode it.
"""

from __future__ import annotations

import glob
import json
import os
import re
from typing import Any

# E2M1 code (bit 3: sign) -> value.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_FP8_BLOCK = 128  # quantization_config.weight_block_size of the V4 presets
_FP4_BLOCK = 32

# Checkpoint name fragments -> transformers' (applied in order on the part after "layers.N.").
_RENAMES = (
    (r"^attn\.indexer\.compressor\.", "self_attn.compressor.indexer."),
    (r"^attn\.indexer\.wq_b\.", "self_attn.compressor.indexer.q_b_proj."),
    (r"^attn\.indexer\.weights_proj\.", "self_attn.compressor.indexer.scorer.weights_proj."),
    (r"^attn\.attn_sink$", "self_attn.sinks"),
    (r"^attn\.", "self_attn."),
    (r"\.wq_a\.", ".q_a_proj."),
    (r"\.q_norm\.", ".q_a_norm."),
    (r"\.wq_b\.", ".q_b_proj."),
    (r"\.wkv\.", ".kv_proj."),
    (r"\.wgate\.", ".gate_proj."),
    (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."),
    (r"(compressor|indexer)\.norm\.", r"\1.kv_norm."),
    (r"(compressor|indexer)\.ape$", r"\1.position_bias"),
    (r"^attn_norm\.", "input_layernorm."),
    (r"^ffn_norm\.", "post_attention_layernorm."),
    (r"^hc_attn_(fn|base|scale)$", r"attn_hc.\1"),
    (r"^hc_ffn_(fn|base|scale)$", r"ffn_hc.\1"),
    (r"^ffn\.gate\.bias$", "mlp.gate.e_score_correction_bias"),
    (r"^ffn\.shared_experts\.w1\.", "mlp.shared_experts.gate_proj."),
    (r"^ffn\.shared_experts\.w2\.", "mlp.shared_experts.down_proj."),
    (r"^ffn\.shared_experts\.w3\.", "mlp.shared_experts.up_proj."),
    (r"^ffn\.", "mlp."),
)
_TOP = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}


def _decode(raw: dict[str, Any], name: str) -> Any:
    """FP32 values of tensor `name` (weight + scale where quantised)."""
    import torch

    w = raw[name]
    scale_name = name[: -len("weight")] + "scale" if name.endswith(".weight") else None
    if scale_name is None or scale_name not in raw:
        return w.float() if w.dtype != torch.int64 else w
    scale = torch.exp2(raw[scale_name].view(torch.uint8).float() - 127.0)
    if w.dtype == torch.float8_e4m3fn:
        full = scale.repeat_interleave(_FP8_BLOCK, 0).repeat_interleave(_FP8_BLOCK, 1)
        return w.float() * full[: w.shape[0], : w.shape[1]]
    if w.dtype == torch.int8:  # two E2M1 codes per byte, the low nibble first
        b = w.view(torch.uint8).int()
        codes = torch.stack([b & 0xF, b >> 4], dim=-1).reshape(w.shape[0], -1)
        table = torch.tensor(_E2M1, dtype=torch.float32)
        values = table[codes & 7] * torch.where(codes & 8 > 0, -1.0, 1.0)
        return values * scale.repeat_interleave(_FP4_BLOCK, 1)
    raise ValueError(f"{name}: unexpected stored dtype {w.dtype}")


def _state_dict(ckpt: str, n_experts: int) -> dict[str, Any]:
    import torch
    from safetensors import safe_open

    raw: dict[str, Any] = {}
    for path in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            raw.update({k: f.get_tensor(k) for k in f.keys() if not k.startswith("mtp.")})
    state: dict[str, Any] = {}
    experts: dict[tuple[int, str], list[Any]] = {}
    for name in raw:
        if name.endswith(".scale") and name[: -len("scale")] + "weight" in raw:
            continue
        if name in _TOP:
            state[_TOP[name]] = _decode(raw, name)
            continue
        m = re.match(r"layers\.(\d+)\.(.*)$", name)
        if m is None:
            raise ValueError(f"unmapped tensor {name}")
        layer, rest = int(m.group(1)), m.group(2)
        e = re.match(r"ffn\.experts\.(\d+)\.(w[123])\.weight$", rest)
        if e:
            experts.setdefault((layer, e.group(2)), [None] * n_experts)[int(e.group(1))] = _decode(raw, name)
            continue
        for pattern, repl in _RENAMES:
            rest = re.sub(pattern, repl, rest)
        state[f"model.layers.{layer}.{rest}"] = _decode(raw, name)
    for layer in sorted({lay for lay, _ in experts}):
        w1, w2, w3 = (torch.stack(experts[(layer, k)]) for k in ("w1", "w2", "w3"))
        state[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat([w1, w3], dim=1)
        state[f"model.layers.{layer}.mlp.experts.down_proj"] = w2
    return state


def build_model(ckpt: str) -> Any:
    import torch
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4ForCausalLM

    with open(os.path.join(ckpt, "config.json")) as f:
        cfg_dict = json.load(f)
    cfg_dict.pop("quantization_config", None)  # the weights are decoded to FP32 here
    cfg_dict["torch_dtype"] = "float32"
    cfg = DeepseekV4Config.from_dict(cfg_dict)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)  # construction-time init is overwritten below
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    state = _state_dict(ckpt, cfg.num_local_experts)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"transformers could not load {ckpt}: missing={missing[:8]} unexpected={unexpected[:8]}")
    return model


def logits(model: Any, ids: list[int]) -> Any:
    """[len(ids), V] FP32 logits of one forward over `ids` (no cache)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


def reference(model: Any, ids: list[int]) -> dict[str, Any]:
    """Logits of every position of `ids` and their noise floor: the largest change of the reference's
    own logits under two relative-1e-6 jitters of the token embeddings (as oracle/reference.py does
    for V4.1 with cache quantisation off)."""
    import numpy as np
    import torch

    full = logits(model, ids).numpy()
    emb = model.get_input_embeddings()
    w0 = emb.weight.data
    noise = np.zeros(len(ids), np.float32)
    for seed in (1, 2):
        jitter = torch.randn(w0.shape, generator=torch.Generator().manual_seed(seed))
        emb.weight.data = w0 * (1 + 1e-6 * jitter)
        try:
            noise = np.maximum(noise, np.abs(logits(model, ids).numpy() - full).max(-1))
        finally:
            emb.weight.data = w0
    return {"logits": full, "noise": noise}


def decisions(model: Any, ids: list[int]) -> dict[str, Any]:
    """transformers' discrete decisions for `ids`: sorted indexer top-k ("topk_L<l>", -1 = none) of
    every CSA layer and sorted routed experts ("experts_L<l>") of every layer, as numpy arrays."""
    import torch

    got: dict[str, Any] = {}

    def keep(key: str, idx: Any) -> None:
        got[key] = torch.sort(idx.reshape(len(ids), -1).to(torch.int32), dim=-1).values.numpy()

    hooks = []
    for i, layer in enumerate(model.model.layers):
        compressor = layer.self_attn.compressor
        if compressor is not None and hasattr(compressor, "indexer"):
            topk_hook = lambda m, a, o, i=i: keep(f"topk_L{i}", o[0])  # noqa: E731
            hooks.append(compressor.indexer.register_forward_hook(topk_hook))
        expert_hook = lambda m, a, o, i=i: keep(f"experts_L{i}", o[2])  # noqa: E731
        hooks.append(layer.mlp.gate.register_forward_hook(expert_hook))
    try:
        logits(model, ids)
    finally:
        for h in hooks:
            h.remove()
    return got
