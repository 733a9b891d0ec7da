"""Prefill/decode disaggregation on one GPU against one server (issue 26 acceptance 3).

Runs `dsv41rt bench` (streamed completions of random prompts, concurrency 1) first against a
single `dsv41rt serve`, then against `dsv41rt router` over a prefill and a decode server on the
same GPU (`handoff-memory` device by default: NIXL moves the state in device memory, UCX's CUDA
IPC), and reports TTFT and TPOT of both next to the decode server's transfer time and bytes per
request (`dsv41rt:handoff_transfer_seconds`, `dsv41rt:handoff_received_bytes_total`).

  python bench/disagg_bench.py --checkpoint /tmp/bench-40 --precision fp8 --prompt 8192 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack


def _wait_healthy(url: str, proc: subprocess.Popen, log: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the process exited with {proc.returncode}:\n{open(log).read()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"{url}: not healthy within {timeout:.0f} s:\n{open(log).read()[-3000:]}")


class _Proc:
    """One `dsv41rt` process (serve or router) on a port, logging to a file, stopped on exit."""

    def __init__(self, stack: ExitStack, port: int, *args: str, env: dict[str, str] | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False).name
        cmd = [sys.executable, "-m", "dsv41rt", *args, "--port", str(port), "--log-level", "warning"]
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        stack.callback(self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def metrics(self) -> dict[str, float]:
        """Sums of the dsv41rt: samples by name (labels dropped)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("dsv41rt:"):
                name, value = line.split("{", 1)[0], float(line.rsplit(" ", 1)[1])
                out[name] = out.get(name, 0.0) + value
        return out


def _client(url: str, a: argparse.Namespace, out: str, seed: int = 1) -> dict:
    cmd = [sys.executable, "-m", "dsv41rt", "bench", "--base-url", url, "--input-len", str(a.prompt)]
    cmd += ["--output-len", str(a.new_tokens), "--num-prompts", str(a.requests), "--max-concurrency", "1"]
    cmd += ["--seed", str(seed), "--out", out, "--no-plot"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--device", default="cuda", help="cpu for a smoke test of the script")
    p.add_argument("--precision", default="fp8")
    p.add_argument("--prompt", type=int, default=8192, help="prompt tokens per request")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=3, help="requests per setup (after one warm-up request)")
    p.add_argument("--kv-memory", default="8G", help="each server's KV pool")
    p.add_argument("--memory", default="device", choices=("device", "host"), help="handoff-memory of the pair")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--timeout", type=float, default=300, help="seconds a server may take to start")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    common = [a.checkpoint, "--device", a.device, "--precision", a.precision, "--kv-memory", a.kv_memory]
    common += ["--max-num-batched-tokens", "8192"]
    tmp = tempfile.mkdtemp()
    result: dict = {"config": vars(a), "commit": os.environ.get("DSV41RT_COMMIT", "?"), "date": time.strftime("%F")}

    with ExitStack() as stack:
        single = _Proc(stack, a.port, "serve", *common)
        _wait_healthy(single.url, single.proc, single.log, a.timeout)
        warm = argparse.Namespace(**{**vars(a), "requests": 1})
        _client(single.url, warm, f"{tmp}/warm.json", seed=2)  # other prompts: no prefix-cache hit
        result["single"] = _client(single.url, a, f"{tmp}/single.json")
    print(
        f"single server: median TTFT {result['single']['median_ttft_ms']:.1f} ms, "
        f"median TPOT {result['single']['median_tpot_ms']:.2f} ms"
    )

    with ExitStack() as stack:
        mem = ["--handoff-memory", a.memory]
        prefill = _Proc(stack, a.port + 1, "serve", *common, "--disaggregation-mode", "prefill", *mem)
        decode = _Proc(
            stack, a.port + 2, "serve", *common, "--disaggregation-mode", "decode", *mem, env={"UCX_PROTO_INFO": "y"}
        )
        for s in (prefill, decode):
            _wait_healthy(s.url, s.proc, s.log, a.timeout)
        router = _Proc(stack, a.port + 3, "router", "--prefill", prefill.url, "--decode", decode.url)
        _wait_healthy(router.url, router.proc, router.log, 60)
        _client(router.url, warm, f"{tmp}/warm_pd.json", seed=2)
        before = decode.metrics()
        result["disaggregated"] = _client(router.url, a, f"{tmp}/pd.json")
        after = decode.metrics()
        n = after["dsv41rt:handoff_transfer_seconds_count"] - before["dsv41rt:handoff_transfer_seconds_count"]
        secs = after["dsv41rt:handoff_transfer_seconds_sum"] - before["dsv41rt:handoff_transfer_seconds_sum"]
        moved = after["dsv41rt:handoff_received_bytes_total"] - before["dsv41rt:handoff_received_bytes_total"]
        result["handoff"] = {
            "requests": n,
            "ms_per_request": 1e3 * secs / max(n, 1),
            "bytes_per_request": moved / max(n, 1),
        }
        decode.stop()
        with open(decode.log) as f:
            log = [ln.rstrip() for ln in f]
        # UCX's protocol tables for reads (ucp_get): the header and the rows naming the transport.
        at = [i for i, ln in enumerate(log) if "ucp_get" in ln]
        result["ucx_protocol_lines"] = [ln for i in at for ln in log[i : i + 8]][:40]
    pd, h = result["disaggregated"], result["handoff"]
    print(
        f"disaggregated ({a.memory} memory): median TTFT {pd['median_ttft_ms']:.1f} ms, "
        f"median TPOT {pd['median_tpot_ms']:.2f} ms; handoff {h['ms_per_request']:.2f} ms and "
        f"{h['bytes_per_request'] / 1e6:.2f} MB per request ({h['requests']:.0f} requests)"
    )
    print("UCX protocol tables of the decode server's reads (ucp_get):")
    print("\n".join(result["ucx_protocol_lines"][:12]) or "  (none printed)")
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
