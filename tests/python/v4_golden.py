"""Golden values for the V4 CPU reference ops, computed by transformers 5.23's own DeepSeek-V4 modules.

Run by ctest before tests/cpp/test_v4_ops.cc (a FIXTURES_SETUP test, tests/cpp/CMakeLists.txt):

    python tests/python/v4_golden.py --out <dir>

writes raw little-endian tensors <dir>/<name>.bin and <dir>/manifest.txt with one line per item:
`tensor <name> <f32|i32|i64> <dims...>` or `scalar <name> <value>`. Nothing is committed: the files
are regenerated on every run from a fixed seed, in FP32 on the CPU.

Cases (small dims, same code paths as the released widths):
- csa / idx: `DeepseekV4CSACompressor` (ratio 4, overlap, APE) and its nested `DeepseekV4Indexer`
  compressor on one 37-token prompt, captured at the output of each `kv_norm` (before RoPE) with a
  forward hook; `past_key_values=None` is transformers' one-shot prefill form. *_step_out: the same
  modules fed one token per forward through transformers' own cache layers (`DeepseekV4CSACache`,
  `DeepseekV4HCACache`: its decode path, with the overlap state carried between calls).
- hca: `DeepseekV4HCACompressor` (ratio 128) on 300 tokens (2 entries, 44 trailing), same capture.
- hash / hash1: `DeepseekV4HashRouter` (tid2eid lookup, sqrtsoftplus weights) on 20 tokens, k = 4 and k = 1.
- hchead: `DeepseekV4HyperHead` (the final collapse of the hc_mult streams) on 6 tokens.
- hcconn: `DeepseekV4HyperConnection` (one sublayer's mHC: post, comb and the streams collapsed
  by the pre of the same streams) on 6 tokens: V4.1's hc_mix / hc_collapse are checked against it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

SEED = 20261204
EPS = 1e-6
SCALE = 2.5  # routed_scaling_factor of the hash router case


def _config(**overrides: object):  # -> DeepseekV4Config
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    base: dict[str, object] = dict(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=32,
        q_lora_rank=16,
        index_n_heads=2,
        index_head_dim=16,
        index_topk=4,
        n_routed_experts=16,
        num_experts_per_tok=4,
        routed_scaling_factor=SCALE,
        rms_norm_eps=EPS,
    )
    base.update(overrides)
    return DeepseekV4Config(**base)


class _Writer:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []

    def tensor(self, name: str, value: torch.Tensor | np.ndarray) -> None:
        a = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        code = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}[a.dtype]
        np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tofile(self.out / f"{name}.bin")
        self.lines.append(" ".join(["tensor", name, code, *(str(d) for d in a.shape)]))

    def scalar(self, name: str, value: float) -> None:
        self.lines.append(f"scalar {name} {value!r}")

    def close(self) -> None:
        (self.out / "manifest.txt").write_text("\n".join(self.lines) + "\n")


def _randomize(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Every parameter N(0, 0.2²), norm weights 1 + N(0, 0.1²) (transformers leaves them torch.empty)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("kv_norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))


def _capture(norm: torch.nn.Module, into: list[torch.Tensor]) -> None:
    norm.register_forward_hook(lambda _m, _i, out: into.append(out.detach().clone()))


def _compressor_weights(w: _Writer, prefix: str, comp: torch.nn.Module) -> None:
    w.tensor(f"{prefix}_wkv", comp.kv_proj.weight)
    w.tensor(f"{prefix}_wgate", comp.gate_proj.weight)
    w.tensor(f"{prefix}_ape", comp.position_bias)
    w.tensor(f"{prefix}_norm", comp.kv_norm.weight)


def write_csa(w: _Writer, gen: torch.Generator) -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4CSACompressor

    cfg = _config()
    comp = DeepseekV4CSACompressor(cfg).eval()
    _randomize(comp, gen)
    T = 37
    x = torch.randn(1, T, cfg.hidden_size, generator=gen)
    q_res = torch.randn(1, T, cfg.q_lora_rank, generator=gen)
    main: list[torch.Tensor] = []
    index: list[torch.Tensor] = []
    _capture(comp.kv_norm, main)
    _capture(comp.indexer.kv_norm, index)
    with torch.no_grad():
        comp(x, q_res, torch.arange(T)[None], None, 0)
    assert len(main) == 1 and len(index) == 1
    w.tensor("csa_x", x[0])
    _compressor_weights(w, "csa", comp)
    w.tensor("csa_out", main[0][0])
    _compressor_weights(w, "idx", comp.indexer)
    w.tensor("idx_out", index[0][0])
    # transformers' decode path: its CSA cache layer fed one token per forward.
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4CSACache

    main.clear()
    index.clear()
    _step(comp, DeepseekV4CSACache(cfg), x, q_res)
    w.tensor("csa_step_out", torch.cat(main, dim=1)[0])
    w.tensor("idx_step_out", torch.cat(index, dim=1)[0])


def _step(comp: torch.nn.Module, layer: object, x: torch.Tensor, q_res: torch.Tensor | None) -> None:
    """Feeds x one position per forward through `layer` (a transformers V4 cache layer at index 0)."""
    cache = SimpleNamespace(layers=[layer])
    with torch.no_grad():
        for t in range(x.shape[1]):
            q = None if q_res is None else q_res[:, t : t + 1]
            comp(x[:, t : t + 1], q, torch.tensor([[t]]), cache, 0)


def write_hca(w: _Writer, gen: torch.Generator) -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HCACompressor

    cfg = _config()
    comp = DeepseekV4HCACompressor(cfg).eval()
    _randomize(comp, gen)
    T = 300
    x = torch.randn(1, T, cfg.hidden_size, generator=gen)
    out: list[torch.Tensor] = []
    _capture(comp.kv_norm, out)
    with torch.no_grad():
        comp(x, None, torch.arange(T)[None], None, 0)
    assert len(out) == 1
    w.tensor("hca_x", x[0])
    _compressor_weights(w, "hca", comp)
    w.tensor("hca_out", out[0][0])
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HCACache

    out.clear()
    _step(comp, DeepseekV4HCACache(cfg), x, None)
    w.tensor("hca_step_out", torch.cat(out, dim=1)[0])


def write_hash(w: _Writer, gen: torch.Generator, prefix: str, k: int) -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter

    cfg = _config(num_experts_per_tok=k)
    router = DeepseekV4HashRouter(cfg).eval()
    S, E = 20, cfg.n_routed_experts
    with torch.no_grad():
        router.weight.copy_(0.3 * torch.randn(E, cfg.hidden_size, generator=gen))
        table = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(cfg.vocab_size)])
        router.tid2eid.copy_(table)
        ids = torch.randint(0, cfg.vocab_size, (1, S), generator=gen)
        x = torch.randn(1, S, cfg.hidden_size, generator=gen)
        _, weights, indices = router(x, ids)
    w.tensor(f"{prefix}_x", x[0])
    w.tensor(f"{prefix}_gate", router.weight)
    w.tensor(f"{prefix}_tid2eid", table.to(torch.int32))
    w.tensor(f"{prefix}_ids", ids[0].to(torch.int64))
    w.tensor(f"{prefix}_idx", indices.to(torch.int32))
    w.tensor(f"{prefix}_weight", weights)


def _streams(cfg: object, gen: torch.Generator, S: int) -> torch.Tensor:
    return torch.randn(1, S, cfg.hc_mult, cfg.hidden_size, generator=gen)


def write_hc(w: _Writer, gen: torch.Generator) -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
        DeepseekV4HyperConnection,
        DeepseekV4HyperHead,
    )

    cfg = _config()
    w.scalar("hc_eps", cfg.hc_eps)
    w.scalar("hc_iters", cfg.hc_sinkhorn_iters)
    head = DeepseekV4HyperHead(cfg).eval()
    _randomize(head, gen)
    x = _streams(cfg, gen, 6)
    with torch.no_grad():
        out = head(x)
    w.tensor("hchead_x", x[0])
    w.tensor("hchead_fn", head.hc_fn)
    w.tensor("hchead_base", head.hc_base)
    w.tensor("hchead_scale", head.hc_scale)
    w.tensor("hchead_out", out[0])
    conn = DeepseekV4HyperConnection(cfg).eval()
    _randomize(conn, gen)
    x = _streams(cfg, gen, 6)
    with torch.no_grad():
        post, comb, collapsed = conn(x)
    w.tensor("hcconn_x", x[0])
    w.tensor("hcconn_fn", conn.fn)
    w.tensor("hcconn_base", conn.base)
    w.tensor("hcconn_scale", conn.scale)
    w.tensor("hcconn_post", post[0])
    w.tensor("hcconn_comb", comb[0])
    w.tensor("hcconn_collapsed", collapsed[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_default_dtype(torch.float32)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(SEED)
    w = _Writer(args.out)
    w.scalar("eps", EPS)
    write_csa(w, gen)
    write_hca(w, gen)
    w.scalar("hash_scale", SCALE)
    write_hash(w, gen, "hash", 4)
    write_hash(w, gen, "hash1", 1)  # k = 1: transformers still normalises (weight = scale)
    write_hc(w, gen)
    w.close()


if __name__ == "__main__":
    main()
