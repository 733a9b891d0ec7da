"""DeepSeek-V4 under context, tensor and expert parallelism (virtual ranks over LocalComm) against
one rank, bitwise, as V4.1 (test_context_parallel.py, test_tensor_expert_parallel.py say why):
every rank writes the whole batch's state, V4's compressor state included, so nothing of it is
copied between ranks, and hash-routed layers route by token id on every rank alike.

On CUDA expert parallelism sums the ranks' partial MoE outputs (test_tensor_expert_parallel_cuda.py
says why), so EP cases there are the one-rank logits up to FP32 summation order: within
1e-4 * max|logit| (fp32, the precision here), greedy tokens identical.

Tensor shares must fall on V4's 128-row FP8 scale blocks: tiny-v4's 64-row `wo_a` cannot be split
in two, so the TP cases use tiny-v4 with `o_lora_rank` 128 (256 rows; `wq_b` has 4 heads × 64),
and the plain tiny-v4 shows the loader's refusal naming the tensor."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from dsv41rt.errors import Dsv41rtError
from test_context_parallel import DECODE, prefill_and_decode, prompt_of

PROMPTS = (1, 37, 201)
EP_BOUND = 1e-4  # CUDA expert parallelism: FP32 summation order of the ranks' partial sums
V4 = dict(kv_memory=64 << 20, max_num_seqs=4, kv_cache_dtype="float32", enable_prefix_caching=False)


@pytest.fixture(scope="module")
def tiny_v4_tp_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from dsv41rt.checkpoint.generator import make_checkpoint
    from dsv41rt.config.presets import preset_config_json

    cfg = copy.deepcopy(preset_config_json("tiny-v4"))
    cfg.get("text_config", cfg)["o_lora_rank"] = 128
    out = str(tmp_path_factory.mktemp("ck") / "tiny-v4-wide-o-seed1")
    make_checkpoint(cfg, out, 1)
    return out


def check_parallel_equals_one_rank(path: str, device: str, groups: list[dict]) -> None:
    from dsv41rt.runtime import Runtime

    base = Runtime(path, device, **V4)
    want = {n: prefill_and_decode(base, prompt_of(n)) for n in PROMPTS}
    want_tokens = base.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=16, ignore_eos=True)
    base.close()
    for group in groups:
        rt = Runtime(path, device, **group, **V4)
        bitwise = device == "cpu" or group.get("expert_parallel_size", 1) == 1
        for n in PROMPTS:
            logits, tokens, steps = prefill_and_decode(rt, prompt_of(n))
            for got, ref in ((logits, want[n][0]), (steps, want[n][2])):
                err = float(np.abs(got - ref).max())
                if bitwise:
                    assert np.array_equal(got, ref), (group, n, err)
                else:
                    assert err <= EP_BOUND * float(np.abs(ref).max()), (group, n, err)
            assert tokens == want[n][1], (group, n)
        # Through the engine: the three prompts batched (prefill chunks next to decodes).
        assert rt.generate([prompt_of(n) for n in PROMPTS], max_new_tokens=16, ignore_eos=True) == want_tokens, group
        rt.close()
        how = "bitwise" if bitwise else f"within {EP_BOUND} * max|logit|, tokens equal"
        print(f"{device} {group}: prompts {PROMPTS} + {DECODE} decode steps and batched generation {how}")


def test_v4_context_and_expert_parallel_equal_one_rank(tiny_v4_dir: str) -> None:
    groups = [
        dict(context_parallel_size=2),
        dict(context_parallel_size=3),
        dict(expert_parallel_size=2),
        dict(context_parallel_size=2, expert_parallel_size=2),
    ]
    check_parallel_equals_one_rank(tiny_v4_dir, "cpu", groups)


def test_v4_tensor_parallel_equals_one_rank(tiny_v4_tp_dir: str) -> None:
    groups = [
        dict(tensor_parallel_size=2),
        dict(tensor_parallel_size=2, expert_parallel_size=2),
        dict(tensor_parallel_size=2, context_parallel_size=2),
    ]
    check_parallel_equals_one_rank(tiny_v4_tp_dir, "cpu", groups)


def test_v4_tensor_shares_off_the_scale_blocks_are_refused_by_tensor(tiny_v4_dir: str) -> None:
    from dsv41rt.runtime import Runtime

    with pytest.raises(Dsv41rtError, match=r"attn\.wo_a rows \[0, 32\) do not fall on its 128-row scale blocks"):
        Runtime(tiny_v4_dir, tensor_parallel_size=2, **V4)


@pytest.mark.cuda
def test_v4_parallel_equals_one_rank_cuda(tiny_v4_tp_dir: str) -> None:
    groups = [dict(context_parallel_size=2), dict(expert_parallel_size=2), dict(tensor_parallel_size=2)]
    check_parallel_equals_one_rank(tiny_v4_tp_dir, "cuda", groups)
