"""The mutation list: plausible bugs the test suites must catch, one at a time.

Each mutation replaces exact text in one source file. Every `old` must occur exactly once in that
file (checked before anything is built, see `apply_to`), so an edit of the code that moves or
rewrites a mutated line makes the runners fail loudly instead of testing nothing.

kind "cpu": code the CPU build runs (shared runtime code or the CPU kernels); the default CI Python
suite (tests/python, run by tests/mutations/run_cpu.py) must catch it.
kind "gpu": CUDA kernels only; the CUDA instances of the GoogleTest backend suites
(tests/cpp/test_backend_*.cc, run on the GPU machine by tests/mutations/run_gpu.sh) must catch it.

To add a mutation: append a Mutation below (copy `old` from the file, keep it as short as is still
unique), then run `python tests/mutations/run_cpu.py --list` to check it applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["cpu", "gpu"]


@dataclass(frozen=True)
class Edit:
    """Replace `old` (which must occur exactly once in the file) with `new`."""

    old: str
    new: str


@dataclass(frozen=True)
class Mutation:
    name: str
    kind: Kind
    path: str  # relative to the repository root
    edits: tuple[Edit, ...]  # usually one; several when the bug touches more than one line
    description: str  # the bug, in one line


class StaleMutation(RuntimeError):
    """A mutation's `old` text is missing or ambiguous: the list no longer matches the code."""


def mutated_text(m: Mutation, original: str) -> str:
    """The file's text with every edit of `m` applied; raises StaleMutation unless each `old`
    occurs exactly once (in the original file, and still once when its turn comes)."""
    text = original
    for i, e in enumerate(m.edits):
        for label, haystack in (("the original file", original), ("the partly mutated file", text)):
            n = haystack.count(e.old)
            if n != 1:
                raise StaleMutation(
                    f"mutation {m.name}: edit {i} `old` occurs {n} times in {label} {m.path} "
                    f"(must be exactly 1):\n{e.old}"
                )
        if e.new == e.old:
            raise StaleMutation(f"mutation {m.name}: edit {i} changes nothing")
        text = text.replace(e.old, e.new)
    return text


def apply_to(m: Mutation, root: Path) -> str:
    """Applies `m` to the tree at `root`; returns the file's original text (for `restore`)."""
    target = root / m.path
    original = target.read_text()
    target.write_text(mutated_text(m, original))
    return original


def restore(m: Mutation, root: Path, original: str) -> None:
    # Writing (rather than e.g. a copy that keeps an old mtime) gives the file a new mtime, so the
    # next incremental build recompiles it and never links a stale mutated object.
    (root / m.path).write_text(original)


def check_all(root: Path, mutations: list[Mutation] | None = None) -> None:
    """Raises StaleMutation for the first mutation that does not apply cleanly to `root`."""
    names = [m.name for m in MUTATIONS]
    if len(names) != len(set(names)):
        raise StaleMutation(f"duplicate mutation names: {sorted(n for n in names if names.count(n) > 1)}")
    for m in mutations or MUTATIONS:
        mutated_text(m, (root / m.path).read_text())


def by_kind(kind: Kind) -> list[Mutation]:
    return [m for m in MUTATIONS if m.kind == kind]


def one(old: str, new: str) -> tuple[Edit, ...]:
    return (Edit(old, new),)


MUTATIONS: list[Mutation] = [
    # ---- CPU: code both backends share, and the CPU kernels ----------------------------------
    Mutation(
        "drop_expert",
        "cpu",
        "cpp/kernels/cpu/moe.cc",
        one(
            "for (int64_t c = 0; c < H; ++c) yr[c] += o[c];",
            "for (int64_t c = 0; c < H; ++c) yr[c] += e == 1 ? 0.0f : o[c];",
        ),
        "moe_forward: routed expert id 1 contributes nothing to the tokens routed to it",
    ),
    Mutation(
        "skip_cache_quant",
        "cpu",
        "cpp/runtime/model/model_runner_attention.cc",
        one("  be_.cache_qdq(fmt.window, kv, N, D, s);\n", ""),
        "window KV not quantise-dequantised: this forward's rows attend unquantised values, older "
        "rows come back from the cache quantised",
    ),
    Mutation(
        "rope_shift",
        "cpu",
        "cpp/kernels/cpu/rope.cc",
        one("static_cast<float>(positions[r])", "static_cast<float>(positions[r] + 1)"),
        "apply_rope rotates every row by its position + 1",
    ),
    Mutation(
        "window_off_by_one",
        "cpu",
        "cpp/kernels/cpu/paged.cc",
        one("lo = std::max<int64_t>(0, t - W + 1)", "lo = std::max<int64_t>(0, t - W + 2)"),
        "attention_indices: the sliding window holds W - 1 rows instead of W",
    ),
    Mutation(
        "compression_boundary",
        "cpu",
        "cpp/runtime/model/forward_plan.cc",
        one("rp.n_visible.push_back((P + t + 1) / m);", "rp.n_visible.push_back((P + t + 2) / m);"),
        "a query sees a compressed entry one position before its last source token",
    ),
    Mutation(
        "stale_dequant",
        "cpu",
        "cpp/runtime/dequant_workspace.cc",
        (
            Edit("ws.forward_id == forward_id_ &&", ""),
            Edit("ws.source_epoch == epoch &&", ""),
        ),
        "dequant workspace reused across forwards and after its source cache was written",
    ),
    Mutation(
        "ignore_chunking",
        "cpu",
        "cpp/runtime/model/forward_plan.cc",
        one(
            "for (int64_t s = std::max<int64_t>(0, hist - P); s < hist; ++s) {",
            "for (int64_t s = hist; s < hist; ++s) {",
        ),
        "Engram: a later prefill chunk ignores the request's history (n-grams across a chunk boundary are lost)",
    ),
    Mutation(
        "swap_heads",
        "cpu",
        "cpp/kernels/cpu/attention.cc",
        # Bounded so that an odd head count reads no memory outside sink: the last head keeps its own.
        (
            Edit("float m = sink[h];", "float m = sink[(h ^ 1) < n_heads ? h ^ 1 : h];"),
            Edit("std::exp(sink[h] - m)", "std::exp(sink[(h ^ 1) < n_heads ? h ^ 1 : h] - m)"),
        ),
        "sparse attention: each head uses its neighbour's attention sink",
    ),
    Mutation(
        "sampling_topk_off_by_one",
        "cpu",
        "cpp/kernels/cpu/sampling.cc",
        # use_k means top_k < V, so top_k + 1 <= V: no guard needed.
        one("const int64_t n = use_k ? p.top_k : V;", "const int64_t n = use_k ? p.top_k + 1 : V;"),
        "top-k keeps k + 1 tokens",
    ),
    # ---- GPU: CUDA kernels only --------------------------------------------------------------
    Mutation(
        "cuda_window_off_by_one",
        "gpu",
        "cpp/kernels/cuda/paged.cu",
        one("lo = t - W + 1 > 0 ? t - W + 1 : 0", "lo = t - W + 2 > 0 ? t - W + 2 : 0"),
        "attention_indices_kernel: the sliding window holds W - 1 rows instead of W",
    ),
    Mutation(
        "cuda_sampling_topk_off_by_one",
        "gpu",
        "cpp/kernels/cuda/sampling.cu",
        one("const int64_t n = use_k ? p.top_k : V;", "const int64_t n = use_k ? p.top_k + 1 : V;"),
        "top-k keeps k + 1 tokens",
    ),
    Mutation(
        "cuda_rope_shift",
        "gpu",
        "cpp/kernels/cuda/rope.cu",
        one("static_cast<float>(positions[r])", "static_cast<float>(positions[r] + 1)"),
        "rope kernel rotates every row by its position + 1",
    ),
    Mutation(
        "cuda_swap_heads",
        "gpu",
        "cpp/kernels/cuda/attention.cu",
        # The kernel reads the sink once (the running max starts at it; denom's sink term is 1).
        one("float m_run = sink[h];", "float m_run = sink[(h ^ 1) < H ? h ^ 1 : h];"),
        "sparse_attention_kernel: each head uses its neighbour's attention sink",
    ),
    Mutation(
        "cuda_skip_cache_quant",
        "gpu",
        "cpp/kernels/cuda/quant.cu",
        one(
            "if (active) y[i] = __fmul_rn(decode_element<F>(q.code), q.s);",
            "if (active) y[i] = x[i] + 0.0f * q.s;",  # (q stays used: no unused-variable warning)
        ),
        "qdq_kernel writes its input unchanged instead of the quantised value",
    ),
    Mutation(
        "cuda_drop_expert",
        "gpu",
        "cpp/kernels/cuda/moe.cu",
        one(
            "const float v = warp_dot(hidden + (t * (k + 1) + bj) * ld, w2 + (be * H + c) * I, I, lane);\n"
            "      yc = yc + v;",
            "const float v = warp_dot(hidden + (t * (k + 1) + bj) * ld, w2 + (be * H + c) * I, I, lane);\n"
            "      yc = be == 1 ? yc : yc + v;",
        ),
        "moe_down_kernel (BF16-weight split path): the combine drops routed expert id 1",
    ),
    Mutation(
        "cuda_drop_expert_fp32",
        "gpu",
        "cpp/kernels/cuda/moe.cu",
        one(
            "if (be < 0 || be >= E) continue;  // invalid id",
            "if (be < 0 || be >= E || be == 1) continue;  // invalid id",
        ),
        "moe_forward_kernel (FP32-weight per-token path): routed expert id 1 is skipped",
    ),
    Mutation(
        "cuda_drop_expert_grouped",
        "gpu",
        "cpp/kernels/cuda/moe_grouped.cu",
        one(
            "if (pos >= 0) acc = acc + out[int64_t(pos) * H + c];",
            "if (pos >= 0 && be != 1) acc = acc + out[int64_t(pos) * H + c];",
        ),
        "combine_kernel (BF16 tensor-core grouped path): routed expert id 1 is dropped",
    ),
]
