"""DSpark's target features against the independent V4.1 reference (NeMo Automodel 0.7.0, FP32, CPU).

The drafter (spec 4.2) reads, at each layer of `dspark_target_layer_ids`, the mean over the hc
streams of that layer's input after its Engram update. NeMo names the capture point itself
(`DeepseekV41ForCausalLM.get_dspark_target_feature_modules`: the first input of the layer's
attention hyper-connection); the runtime records its own (`record_decisions`,
`Runtime.dspark_target_features`).

Mode: cache quantisation off on both sides (as the decision test of test_oracle_v41.py), where the
network is smooth at FP32 level, so the features must agree to FP32 reduction-order noise: per layer
max |ours - ref| <= 1e-4 * max |ref| (the logits agree to ~2e-5 there). Rows: a 200-token prefill
(one forward) and 8 decode steps through our caches (one forward each), against one reference
forward over all 208 tokens. A negative control compares each layer with the next target layer's
reference features and must fail the bound. (tiny-v41, like the release, has no Engram at its
target layers: that the capture follows an Engram update rests on where the runner records it.)
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_oracle_packages

pytestmark = pytest.mark.oracle

BOUND = 1e-4


def reference_features(model, ids: list[int], layer_ids: list[int]) -> dict[int, np.ndarray]:
    import torch

    captured: dict[int, np.ndarray] = {}
    hooks = []
    for layer, module in zip(layer_ids, model.get_dspark_target_feature_modules(layer_ids), strict=True):

        def hook(_module, args, layer=layer):
            captured[layer] = args[0][0].float().mean(dim=1).numpy()  # [S, streams, H] -> [S, H]

        hooks.append(module.register_forward_pre_hook(hook))
    try:
        with torch.no_grad():
            model(torch.tensor([ids], dtype=torch.long))
    finally:
        for h in hooks:
            h.remove()
    return captured


def test_target_features_match_reference_without_cache_quantisation(tmp_path) -> None:
    require_oracle_packages()
    import nemo_automodel.components.models.deepseek_v41.attention as nemo_attention
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json
    from dsv41rt.runtime import Runtime
    from oracle.nemo_v41 import build_model

    make_checkpoint(preset_config_json("tiny-v41"), str(tmp_path), 5)
    model = build_model(str(tmp_path))
    layer_ids = list(model.config.text_config.dspark_target_layer_ids)
    rt = Runtime(str(tmp_path), kv_cache_dtype="float32", record_decisions=True)
    prompt = [0] + [int(t) for t in np.random.default_rng(2000).integers(3, 129000, 199)]
    h = rt.new_handle()
    logits = rt.forward_tokens(h, prompt)
    ours = [rt.dspark_target_features()]
    tokens = list(prompt)
    for _ in range(8):  # greedy decode through the caches
        tokens.append(int(np.argmax(logits[-1])))
        logits = rt.forward_tokens(h, [tokens[-1]])
        ours.append(rt.dspark_target_features())
    rt.release_handle(h)
    got = {layer: np.concatenate([o[layer] for o in ours]) for layer in layer_ids}

    original = nemo_attention.quantize_cache
    nemo_attention.quantize_cache = lambda values, **_: values
    try:
        ref = reference_features(model, tokens, layer_ids)
    finally:
        nemo_attention.quantize_cache = original

    assert sorted(got) == sorted(ref) == layer_ids
    for layer in layer_ids:
        assert got[layer].shape == ref[layer].shape == (len(tokens), model.config.text_config.hidden_size)
        err, peak = float(np.abs(got[layer] - ref[layer]).max()), float(np.abs(ref[layer]).max())
        print(f"layer {layer}: max |ours - ref| {err:.3g}, max |ref| {peak:.3g}")
        assert err <= BOUND * peak, f"layer {layer}: {err:.3g} > {BOUND} x {peak:.3g}"
    # Negative control: a neighbouring layer's features are far outside the bound.
    for a, b in zip(layer_ids, layer_ids[1:], strict=False):
        assert np.abs(got[a] - ref[b]).max() > BOUND * np.abs(ref[b]).max() * 100
