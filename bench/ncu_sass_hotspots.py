"""Where a kernel's warps stall, per SASS instruction, from an Nsight Compute report.

Reads the CSV of `ncu -i REPORT --page source --csv --print-source sass` (one table per profiled
kernel, or all kernels concatenated) and prints, for the kernel instance chosen with --instance:
the stall samples per opcode and the hottest instructions with their neighbours' addresses, so a
report of tens of MB can be read where it was taken (device machine) and only the summary kept.

    ncu -i att.ncu-rep --page source --csv --print-source sass > att_sass.csv
    python3 bench/ncu_sass_hotspots.py att_sass.csv --instance 2 --top 40
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections import Counter


def _tables(text: str) -> list[list[dict[str, str]]]:
    """Splits the concatenated CSV into tables, one per kernel instance (each has a header)."""
    tables: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines + ['"Kernel Name"']):
        # A table is a "Kernel Name" line, then a header row starting "Address", then the rows.
        is_header = line.startswith('"Address"') or line.startswith('"Kernel Name"')
        if is_header and start is not None:
            tables.append(list(csv.DictReader(io.StringIO("\n".join(lines[start:i])))))
            start = None
        if line.startswith('"Address"'):
            start = i
    return [t for t in tables if t]


def _column(row: dict[str, str], *needles: str) -> str | None:
    for key in row:
        if all(n.lower() in key.lower() for n in needles):
            return key
    return None


def _number(text: str | None) -> float:
    if text is None:
        return 0.0
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--instance", type=int, default=0, help="which kernel table (0-based)")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    with open(args.csv, encoding="utf-8", errors="replace") as f:
        tables = _tables(f.read())
    print(f"{len(tables)} kernel table(s)")
    if not tables:
        return 1
    rows = tables[min(args.instance, len(tables) - 1)]
    first = rows[0]
    print("columns:", ", ".join(first.keys()))
    src = _column(first, "source") or "Source"
    samples = _column(first, "warp stall sampling", "all") or _column(first, "sampling")
    executed = _column(first, "instructions executed") or _column(first, "executed")
    if samples is None:
        print("no stall-sampling column")
        return 1
    total = sum(_number(r[samples]) for r in rows)
    insts = sum(_number(r[executed]) for r in rows) if executed else 0.0
    print(f"{len(rows)} SASS instructions, {total:.0f} stall samples, {insts:.0f} warp instructions executed")
    by_op: Counter[str] = Counter()
    exec_by_op: Counter[str] = Counter()
    for r in rows:
        words = (r.get(src) or "").strip().split()
        if words and words[0].startswith("@"):
            words = words[1:]
        op = words[0].split(".")[0] if words else "?"
        by_op[op] += _number(r[samples])
        if executed:
            exec_by_op[op] += _number(r[executed])
    print("\nstall samples by opcode (share) | warp instructions executed")
    for op, n in by_op.most_common(25):
        print(f"  {op:10s} {n / max(total, 1):6.1%} | {exec_by_op[op]:10.0f}")
    print(f"\ntop {args.top} instructions by stall samples")
    ranked = sorted(range(len(rows)), key=lambda i: -_number(rows[i][samples]))[: args.top]
    for i in sorted(ranked):
        r = rows[i]
        print(f"  [{i:5d}] {_number(r[samples]) / max(total, 1):6.2%}  {(r.get(src) or '')[:90]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
