"""Time to the first token of a short request sent while a long prompt prefills (issue 23 D2).

Starts `dsv41rt serve` on the built-in tiny model (CPU unless a GPU is there), sends a long
completions prompt (`--long` tokens, max_tokens 1) and, `--delay` seconds later (its prefill under
way), a short one (a few tokens, max_tokens 1); reports the short request's latency and the long
one's, per repeat, and their medians. --out writes JSON with commit and date.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

MODEL = "dsv41rt-tiny-v41"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--long", type=int, default=8000, help="tokens of the long prompt")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds between the long and the short request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="")
    ap.add_argument("serve_args", nargs="*", help="extra `dsv41rt serve` flags (after --)")
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "dsv41rt", "serve", "--port", str(port), "--log-level", "warning", *args.serve_args]
    cmd += ["--tiny-model-dir", os.path.join(tempfile.mkdtemp(), "tiny")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        for _ in range(900):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        rows = []
        for rep in range(args.repeats):
            # token ids as a prompt: exactly --long tokens, different per repeat (no prefix-cache hit)
            long_body = {
                "model": MODEL,
                "prompt": [3 + (i * 7919 + rep) % 100000 for i in range(args.long)],
                "max_tokens": 1,
            }
            took: dict[str, float] = {}

            def send_long(body: dict = long_body, took: dict[str, float] = took) -> None:
                t = time.monotonic()
                httpx.post(url + "/v1/completions", json=body, timeout=600).raise_for_status()
                took["long"] = time.monotonic() - t

            th = threading.Thread(target=send_long)
            th.start()
            time.sleep(args.delay)
            t = time.monotonic()
            short = {"model": MODEL, "prompt": [11, 12 + rep, 13], "max_tokens": 1}
            httpx.post(url + "/v1/completions", json=short, timeout=600).raise_for_status()
            took["short"] = time.monotonic() - t
            th.join()
            rows.append(took)
            print(
                f"repeat {rep}: short request {took['short']:.2f} s, "
                f"long prompt ({args.long} tokens) {took['long']:.2f} s"
            )
        med = {k: statistics.median(r[k] for r in rows) for k in ("short", "long")}
        print(f"median: short {med['short']:.2f} s, long {med['long']:.2f} s")
        if args.out:
            commit = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            with open(args.out, "w") as f:
                json.dump(
                    {
                        "commit": commit,
                        "date": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()),
                        "long_tokens": args.long,
                        "delay_s": args.delay,
                        "rows": rows,
                        "median": med,
                    },
                    f,
                    indent=1,
                )
        return 0
    finally:
        proc.terminate()
        proc.wait(timeout=60)


if __name__ == "__main__":
    raise SystemExit(main())
