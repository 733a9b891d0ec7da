"""NeMo Automodel 0.7.0's DeepSeek-V4.1 model as an independent reference (CPU, eager, FP32).

The checkpoint is read back from its safetensors files and decoded by NeMo's own state-dict adapter
(FP8/FP4 + UE8M0), so our generator and NeMo's loader are checked against each other.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any


def _backend() -> Any:
    from nemo_automodel.components.models.common.utils import BackendConfig

    return BackendConfig(
        attn="eager",
        linear="torch",
        rms_norm="torch_fp32",
        experts="torch_mm",
        dispatcher="torch",
        rope_fusion=False,
        gate_precision="float32",
    )


def build_model(ckpt: str, dtype: str = "float32") -> Any:
    import nemo_automodel.components.moe.experts as experts
    import torch
    from nemo_automodel.components.models.deepseek_v41.config import DeepseekV41Config
    from nemo_automodel.components.models.deepseek_v41.model import DeepseekV41ForCausalLM
    from safetensors import safe_open
    from transformers import PreTrainedTokenizerFast

    # NeMo torch.compile's its clamped SwiGLU; the eager original computes the same values.
    fn = experts.swiglu_clamped_deepep
    experts.swiglu_clamped_deepep = getattr(fn, "_torchdynamo_orig_callable", fn)
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg_dict = json.load(f)
    cfg_dict["text_config"]["dtype"] = dtype
    cfg_dict.pop("quantization_config", None)
    cfg = DeepseekV41Config.from_dict(cfg_dict)
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ckpt, "tokenizer.json"))
    torch.manual_seed(0)  # construction-time init is overwritten by the checkpoint
    model = DeepseekV41ForCausalLM(cfg, backend=_backend(), tokenizer=tok).eval()
    state = {}
    for path in sorted(glob.glob(os.path.join(ckpt, "*.safetensors"))):
        with safe_open(path, framework="pt") as f:
            state.update({k: f.get_tensor(k) for k in f.keys()})
    native = model.state_dict_adapter.from_hf(state)
    missing, unexpected = model.load_state_dict(native, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"NeMo could not load {ckpt}: missing={missing[:8]} unexpected={unexpected[:8]}")
    return model


def logits(model: Any, ids: list[int]) -> Any:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids], dtype=torch.long)).logits[0].float()
