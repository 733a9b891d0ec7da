#!/usr/bin/env python3
"""GPU half of the mutation check, build side (runs here, no GPU needed): builds libdsv41rt.so with
CUDA once unmutated and once per "gpu" mutation of mutations.py, into
.devcarry/mut/<name>/libdsv41rt.so.0.gz of the main checkout (git-ignored; it travels to the GPU
machine, where tests/mutations/run_gpu.sh unpacks each variant and runs the carried GoogleTest
backend suites against it through LD_LIBRARY_PATH). Stripped, a variant is still 3.2 MiB (the
code and the device fatbin); gzip brings it to 1.2 MiB, so nine fit the 20 MiB carry budget.

    /work/main/.venv/bin/python tests/mutations/build_gpu.py [--only NAME ...] [--out DIR]

Incremental: one persistent CMake/Ninja tree; a mutation recompiles only its .cu file (and relinks).
The variants must match the carried test binaries' headers: build them from the commit those
binaries were built from (the script compares the exported symbols with .devcarry/gtest/lib's
library and checks every binary's undefined symbols are defined; it refuses on a mismatch).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import Mutation, StaleMutation, apply_to, by_kind, check_all, restore  # noqa: E402
from tree import REPO_ROOT, describe, sync_tree  # noqa: E402

VENV = Path(os.environ.get("DSV41RT_MUT_VENV", "/work/main/.venv"))
LIBRARY = "cpp/libdsv41rt.so.0.1.0"  # the build's real file; the test binaries load it by SONAME
SONAME = "libdsv41rt.so.0"
SIZE_LIMIT = 20 << 20  # everything under --out travels to the GPU machine with the carried binaries


def run(cmd: list[str], log: Path) -> None:
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {log}")


def configure(src: Path, build_dir: Path, log: Path) -> None:
    run(
        [
            str(VENV / "bin" / "cmake"), "-S", str(src), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={VENV / 'bin' / 'ninja'}", "-DDSV41RT_BUILD_TESTS=OFF",
            "-DCMAKE_BUILD_TYPE=Release", "-DDSV41RT_WITH_CUDA=ON",
            # The Python whose nvidia-nccl package provides nccl.h, as in the test binaries' build
            # (scripts/test.sh runs in the venv): same NCCL setting, same exported symbols.
            f"-DDSV41RT_NCCL_PYTHON={VENV / 'bin' / 'python3'}",
        ],
        log,
    )  # fmt: skip


def build_library(build_dir: Path, log: Path) -> float:
    start = time.monotonic()
    run([str(VENV / "bin" / "cmake"), "--build", str(build_dir), "--target", "dsv41rt", "-j2"], log)
    return time.monotonic() - start


def install_variant(build_dir: Path, dest: Path) -> tuple[str, Path]:
    """Writes the built library, stripped and gzipped, to dest/libdsv41rt.so.0.gz; returns the
    sha256 of the stripped library and the stripped copy (for check_abi; delete it after)."""
    dest.mkdir(parents=True, exist_ok=True)
    stripped = dest / SONAME
    shutil.copyfile(build_dir / LIBRARY, stripped)
    # Symbol tables and debug info only: the dynamic symbols and the device code stay.
    subprocess.run(["strip", "--strip-unneeded", str(stripped)], check=True)
    data = stripped.read_bytes()
    # mtime=0: the same library gives the same .gz.
    (dest / f"{SONAME}.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return hashlib.sha256(data).hexdigest(), stripped


def symbols(path: Path, defined: bool) -> set[str]:
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, str(path)], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def check_abi(variant: Path, gtest_dir: Path) -> list[str]:
    """Problems that would make the carried test binaries misbehave with this library."""
    problems: list[str] = []
    ours = symbols(variant, defined=True)
    carried = gtest_dir / "lib" / "libdsv41rt.so.0.1.0"
    if carried.is_file():
        theirs = symbols(carried, defined=True)
        if ours != theirs:
            problems.append(
                f"exported symbols differ from {carried}: {len(theirs - ours)} missing here, "
                f"{len(ours - theirs)} extra (different commit or configuration?)"
            )
    for binary in sorted(gtest_dir.glob("test_backend_*")):
        missing = {s for s in symbols(binary, defined=False) if "dsv41rt" in s} - ours
        if missing:
            problems.append(f"{binary.name} needs {len(missing)} symbols this library lacks, e.g. {sorted(missing)[0]}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAME", help="build only this mutation (repeatable)")
    ap.add_argument("--src", type=Path, default=REPO_ROOT, help="tree to mutate (default: this repository)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/mut-gpu-src"))
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/mut-gpu-build"))
    ap.add_argument("--out", type=Path, default=Path("/work/main/.devcarry/mut"))
    ap.add_argument("--gtest", type=Path, default=Path("/work/main/.devcarry/gtest"), help="carried test binaries")
    ap.add_argument("--log", type=Path, default=Path("/tmp/mut-gpu-build.log"))
    args = ap.parse_args()
    src = args.src.resolve()

    selected: list[Mutation] = by_kind("gpu")
    try:
        check_all(src, selected)
    except StaleMutation as e:
        print(f"STALE MUTATION LIST: {e}", file=sys.stderr)
        return 2
    if args.only:
        unknown = set(args.only) - {m.name for m in selected}
        if unknown:
            print(f"unknown GPU mutations: {sorted(unknown)}", file=sys.stderr)
            return 2
        selected = [m for m in selected if m.name in args.only]

    commit = describe(src)
    args.log.write_text("")
    print(f"syncing {src} -> {args.scratch}: {sync_tree(src, args.scratch)} files written", flush=True)
    configure(args.scratch, args.build_dir, args.log)

    manifest: list[tuple[str, str, str]] = []  # (name, sha256, description)
    seconds = build_library(args.build_dir, args.log)
    digest, stripped = install_variant(args.build_dir, args.out / "baseline")
    manifest.append(("baseline", digest, "no mutation"))
    print(f"baseline: built in {seconds:.0f} s", flush=True)
    problems = check_abi(stripped, args.gtest)
    stripped.unlink()
    if problems:
        print("the carried test binaries do not match this build:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2

    for m in selected:
        original = apply_to(m, args.scratch)
        try:
            seconds = build_library(args.build_dir, args.log)
        finally:
            restore(m, args.scratch, original)  # new mtime: the next build recompiles the file
        digest, stripped = install_variant(args.build_dir, args.out / m.name)
        stripped.unlink()
        manifest.append((m.name, digest, m.description))
        print(f"{m.name}: built in {seconds:.0f} s", flush=True)
    build_library(args.build_dir, args.log)  # leave the build tree unmutated

    digests = [d for _, d, _ in manifest]
    if len(set(digests)) != len(digests):
        print("two variants are byte-identical: a mutation changed no code", file=sys.stderr)
        return 2
    # The manifest names what each folder holds and the commit it was built from (run_gpu.sh
    # prints both); entries of variants not rebuilt this time (--only) are kept. Folders of
    # mutations no longer in the list would be run too: say so rather than delete them silently.
    path = args.out / "manifest.tsv"
    rows: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line and not line.startswith("#"):
                rows[line.split("\t")[0]] = line
    rows.update({n: f"{n}\t{commit}\t{d[:16]}\t{desc}" for n, d, desc in manifest})
    path.write_text("# name\tcommit\tsha256[:16]\tdescription\n" + "".join(f"{r}\n" for r in rows.values()))
    known = {"baseline", *(m.name for m in by_kind("gpu"))}
    stray = [p.name for p in args.out.iterdir() if p.is_dir() and p.name not in known]
    if stray:
        print(f"warning: {args.out} holds folders of no current mutation: {stray}", file=sys.stderr)
    total = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{len(manifest)} variants in {args.out}: {total / (1 << 20):.1f} MiB (commit {commit})")
    if total > SIZE_LIMIT:
        print(f"over the {SIZE_LIMIT >> 20} MiB carry budget", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
