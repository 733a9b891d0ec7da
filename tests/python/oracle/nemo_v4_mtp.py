"""NeMo Automodel 0.7.0's DeepSeek-V4 MTP block (`DeepseekV4MTPBlock`, v4:mtp.py:45-192) as an
independent reference for `mtp.0` (CPU, eager, FP32).

The whole checkpoint is read back from its safetensors files and decoded by NeMo's own V4
state-dict adapter (FP8 / FP4 + UE8M0; it re-prefixes `mtp.0.*` onto the block), so our generator,
our loader and NeMo's loader are checked against each other. The block is fed streams given by the
caller (ours, before the hyper-head) and the embeddings of the next tokens; its prediction hidden
state goes through NeMo's FP32 head.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np


def build_model(ckpt: str) -> Any:
    """NeMo's DeepseekV4ForCausalLM (FP32) with the checkpoint's backbone, head and MTP block."""
    import nemo_automodel.components.moe.experts as experts
    import torch
    from nemo_automodel.components.models.deepseek_v4.config import DeepseekV4Config
    from nemo_automodel.components.models.deepseek_v4.model import DeepseekV4ForCausalLM
    from safetensors import safe_open

    from oracle.nemo_v41 import _backend

    fn = experts.swiglu_clamped_deepep  # NeMo compiles it; the eager original computes the same
    experts.swiglu_clamped_deepep = getattr(fn, "_torchdynamo_orig_callable", fn)
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    cfg["dtype"] = cfg["torch_dtype"] = "float32"
    cfg.pop("quantization_config", None)
    torch.manual_seed(0)  # construction-time init is overwritten by the checkpoint
    model = DeepseekV4ForCausalLM(DeepseekV4Config.from_dict(cfg), backend=_backend()).eval()
    state = {}
    for path in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            state.update({k: f.get_tensor(k) for k in f.keys()})
    missing, unexpected = model.load_state_dict(model.state_dict_adapter.from_hf(state), strict=False)
    if missing or unexpected:
        raise RuntimeError(f"NeMo could not load {ckpt}: missing={missing[:8]} unexpected={unexpected[:8]}")
    if model.mtp is None or len(model.mtp.layers) != 1:
        raise RuntimeError(f"{ckpt}: NeMo built no single MTP layer")
    return model


def mtp_logits(model: Any, streams: np.ndarray, next_ids: list[int], *, use_e: bool = True) -> np.ndarray:
    """Logits [rows, V] of NeMo's MTP block on `streams` [rows, hc * H] (positions 0..rows-1) with
    the embeddings of `next_ids` [rows]; `use_e=False` drops the E term (a negative control)."""
    import torch
    from nemo_automodel.components.models.deepseek_v4.layers import build_causal_padding_mask

    block = model.mtp.layers[0]
    cfg = model.config
    n = len(next_ids)
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(streams, np.float32)).view(1, n, cfg.hc_mult, cfg.hidden_size)
        ids = torch.tensor([next_ids], dtype=torch.long)
        emb = model.model.embed_tokens(ids).float()
        if not use_e:
            # e_proj(enorm(0)) = 0: the streams alone enter the block
            emb = torch.zeros_like(emb)
        mask = build_causal_padding_mask(
            None, seq_len=n, dtype=torch.float32, device=x.device, batch_size=1, sliding_window=cfg.sliding_window
        )
        _, hidden = block(
            x,
            embed_input=emb,
            input_ids=ids,
            position_ids=torch.arange(n).unsqueeze(0),
            attention_mask=mask,
            padding_mask=None,
        )
        return model.lm_head(hidden.float())[0].numpy()


def reference(model: Any, streams: np.ndarray, next_ids: list[int], **kw: Any) -> dict[str, np.ndarray]:
    """NeMo's MTP logits and their noise floor: the largest change of its own logits under two
    relative-1e-6 jitters of the input streams (the rule of test_oracle_v41)."""
    full = mtp_logits(model, streams, next_ids, **kw)
    noise = np.zeros(len(next_ids), np.float32)
    for seed in (1, 2):
        jitter = np.random.default_rng(seed).standard_normal(streams.shape).astype(np.float32)
        moved = mtp_logits(model, streams * (1 + 1e-6 * jitter), next_ids, **kw)
        noise = np.maximum(noise, np.abs(moved - full).max(-1))
    return {"logits": full, "noise": noise}
