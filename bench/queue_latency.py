"""Time from a request's arrival at an idle server to the start of its first forward.

Drives the server's engine loop (python/dsv41rt/serve/engine_loop.py) in process on the built-in
tiny model: N requests one after another (each waits for the previous to finish, so the server is
idle at every arrival); per request, first_forward - arrival from the loop's timestamps (both
time.monotonic). Prints the median and quartiles; --out writes them as JSON with commit and date.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import time

from dsv41rt.runtime import Runtime
from dsv41rt.sampling import GREEDY
from dsv41rt.serve.engine_loop import EngineLoop, Tracked
from dsv41rt.serve.tiny_model import ensure_tiny_model


async def measure(loop: EngineLoop, n: int) -> list[float]:
    out = []
    for i in range(n):
        req = Tracked([0, 5 + i, 9], 1, GREEDY, [], True, asyncio.Queue(), asyncio.get_running_loop())
        loop.submit(req)
        while (await req.out.get()) is not None:
            pass
        assert req.first_forward is not None
        out.append(req.first_forward - req.arrival)
        await asyncio.sleep(0.01)  # idle again before the next arrival
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--out")
    a = ap.parse_args()
    rt = Runtime(ensure_tiny_model(), engine_thread=True)  # as `dsv41rt serve` creates it
    loop = EngineLoop(rt)
    try:
        lat = asyncio.run(measure(loop, a.requests))
    finally:
        loop.shutdown()
    q = statistics.quantiles(lat, n=4)
    ms = [x * 1e3 for x in (q[0], statistics.median(lat), q[2], max(lat))]
    print(
        f"arrival -> first forward over {len(lat)} requests: median {ms[1]:.3f} ms "
        f"(quartiles {ms[0]:.3f} / {ms[2]:.3f}, max {ms[3]:.3f})"
    )
    if a.out:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        with open(a.out, "w") as f:
            json.dump(
                {
                    "commit": commit,
                    "date": time.strftime("%Y-%m-%d"),
                    "host_cpus": os.cpu_count(),
                    "median_ms": ms[1],
                    "q1_ms": ms[0],
                    "q3_ms": ms[2],
                    "max_ms": ms[3],
                    "samples_ms": [x * 1e3 for x in lat],
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
