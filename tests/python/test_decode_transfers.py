"""What a decode step copies from the device to the host: the drawn tokens and their logprobs,
not the logits (issue: sampling is a backend op). Counted by the backend (backend_stats()
"d2h_bytes": every device-to-host copy the executor makes goes through Backend::to_host)."""

from __future__ import annotations

import pytest

BATCH = 64


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_batch_64_decode_step_moves_a_few_bytes_per_request(tiny_v41_dir, device: str) -> None:
    from dsv41rt.runtime import Runtime

    rt = Runtime(tiny_v41_dir, device, max_num_seqs=BATCH, max_num_batched_tokens=4 * BATCH)
    for r in range(BATCH):
        rt.add_request([0, 5 + r, 9, 17], max_new_tokens=4, ignore_eos=True)
    rt.step()  # every prompt prefilled in one step (and its first token drawn)
    assert rt.stats()["running"] == BATCH
    per_step = []
    while rt.has_unfinished():
        before = rt.backend_stats()["d2h_bytes"]
        outs = rt.step()
        per_step.append(rt.backend_stats()["d2h_bytes"] - before)
        assert len(outs) == BATCH  # a decode-only step: every request advanced
    vocab = rt.config.vocab_size
    print(
        f"{device}: device-to-host bytes per batch-{BATCH} decode step: {per_step} "
        f"(logits would be {BATCH * vocab * 4})"
    )
    # 4-byte token + 4-byte logprob per request (the GPU's padded graph rows included): 512 B.
    assert all(b <= 4096 for b in per_step), per_step
    # The bound discriminates: one row of logits alone is more than it.
    assert vocab * 4 > 4096
