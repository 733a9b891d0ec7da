#!/usr/bin/env python3
"""CPU half of the mutation check: applies each "cpu" mutation of mutations.py to a scratch copy of
the tree, builds the Python package CPU-only (incrementally, one persistent build directory), runs
the CI's Python suite against it until the first failure, and reports which test caught it.

    /work/main/.venv/bin/python tests/mutations/run_cpu.py            # baseline + every mutation
    /work/main/.venv/bin/python tests/mutations/run_cpu.py --only rope_shift
    /work/main/.venv/bin/python tests/mutations/run_cpu.py --list     # check the list applies

The unmutated baseline runs first and must pass (else nothing a mutation "catches" means anything).
Exit status: 0 when every mutation run was caught, 1 when one was not (or failed to build), 2 when
the baseline fails or the list is stale. The report (markdown) goes to REPORT-cpu.md beside this
file unless --report says otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutations import MUTATIONS, Mutation, StaleMutation, apply_to, by_kind, check_all, restore  # noqa: E402
from tree import REPO_ROOT, describe, sync_tree  # noqa: E402

VENV = Path(os.environ.get("DSV41RT_MUT_VENV", "/work/main/.venv"))
PYTHON = VENV / "bin" / "python"


@dataclass
class Outcome:
    name: str
    description: str
    status: str  # "caught", "NOT CAUGHT", "BUILD FAILED", "timeout", "passed" (baseline), "FAILED" (baseline)
    test: str = ""  # first failing test's node id
    error: str = ""  # its one-line error
    build_s: float = 0.0
    test_s: float = 0.0


def build_command(site: Path, build_dir: Path) -> list[str]:
    # --no-build-isolation: the venv's scikit-build-core and nanobind (no network, and no fresh
    # build environment whose paths would defeat the incremental build). -C build-dir keeps one
    # CMake/Ninja tree across mutations, so only the mutated file recompiles (and relinks).
    return [
        str(PYTHON), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--target", str(site),
        "-C", f"build-dir={build_dir}", "-C", "cmake.define.DSV41RT_WITH_CUDA=OFF", "--upgrade", ".",
    ]  # fmt: skip


def build(scratch: Path, site: Path, build_dir: Path, log: Path) -> tuple[bool, float]:
    start = time.monotonic()
    with log.open("w") as f:
        rc = subprocess.run(build_command(site, build_dir), cwd=scratch, stdout=f, stderr=subprocess.STDOUT).returncode
    return rc == 0, time.monotonic() - start


def test_env(scratch: Path, site: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=f"{site}{os.pathsep}{scratch / 'tests' / 'python'}",
        # As .ci/run: the oracle tests must run, never skip. Not DSV41RT_FORBID_SKIPS: CI's package
        # is built with CUDA (nvcc is there) and so with NCCL, this CPU-only one is not, and the
        # NCCL-build test skips (the report lists the baseline's unexpected skips).
        DSV41RT_REQUIRE_ORACLE="1",
        PYTHONWARNINGS="ignore::DeprecationWarning",
        # As scripts/test.sh's activated venv: tools the tests call (cmake, ninja, dsv41rt) on PATH.
        PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(VENV),
    )
    return env


# Run first: the end-to-end and invariance suites that most bugs trip, so a caught mutation stops
# after a minute or two instead of after the whole alphabet. The set of tests is exactly the CI
# suite's (every tests/python/test_*.py, each once); only their order differs.
CATCH_FIRST = ("test_oracle_v41.py", "test_engine.py", "test_runtime_cpu.py", "test_sampling.py", "test_ops_moe.py")


def test_files(scratch: Path) -> list[str]:
    tests = scratch / "tests" / "python"
    rest = sorted(p.name for p in tests.glob("test_*.py") if p.name not in CATCH_FIRST)
    return [str(tests / name) for name in (*CATCH_FIRST, *rest)]


def pytest_command(scratch: Path) -> list[str]:
    # -rfE: the short summary names the first failure ("FAILED node - error"); -x: stop there.
    return [
        str(PYTHON), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--maxfail=1", "-x",
        *test_files(scratch),
    ]  # fmt: skip


def check_import(scratch: Path, site: Path) -> str:
    """The path dsv41rt is imported from under the test environment; fails unless it is `site`."""
    code = "import dsv41rt, dsv41rt._core as c; print(dsv41rt.__file__); print(c.__file__)"
    out = subprocess.run(
        [str(PYTHON), "-c", code], cwd=scratch, env=test_env(scratch, site), capture_output=True, text=True, check=True
    ).stdout.split()
    for path in out:
        if not Path(path).resolve().is_relative_to(site.resolve()):
            raise SystemExit(f"the tests would import {path}, not the mutated build in {site}")
    return out[0]


FAILED_LINE = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")
# faulthandler's dump after a crash: the innermost frame in a test file names the test.
CRASH_FRAME = re.compile(r'File "[^"]*/tests/python/(test_\w+\.py)", line \d+ in (\w+)')


def first_failure(output: str) -> tuple[str, str]:
    """(node id, one-line error) of the first failure in pytest's output, or ("", "")."""
    for line in output.splitlines():
        m = FAILED_LINE.match(line.strip())
        if m:
            return m.group(2), (m.group(3) or "").strip()
    frames = CRASH_FRAME.findall(output)
    if frames:
        crash = next((line.strip() for line in output.splitlines() if "Fatal Python error" in line), "crash")
        return f"tests/python/{frames[0][0]}::{frames[0][1]}", crash
    return "", ""


def unexpected_skips(output: str) -> list[str]:
    """Skips of tests not marked cuda, as tests/python/conftest.py's summary lists them."""
    return [line.split(":", 1)[1].strip() for line in output.splitlines() if line.startswith("  unexpected skip:")]


def run_tests(scratch: Path, site: Path, log: Path, timeout_s: float) -> tuple[int | None, str, str, float]:
    """(pytest exit status or None on timeout, first failing node, its error, seconds)."""
    start = time.monotonic()
    with log.open("w") as f:
        try:
            rc: int | None = subprocess.run(
                pytest_command(scratch), cwd=scratch, env=test_env(scratch, site), stdout=f,
                stderr=subprocess.STDOUT, timeout=timeout_s,
            ).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = None
    seconds = time.monotonic() - start
    node, error = first_failure(log.read_text(errors="replace"))
    return rc, node, error, seconds


def md_cell(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def report(outcomes: list[Outcome], commit: str, command: str, baseline_ran: bool, skips: list[str]) -> str:
    caught = sum(o.status == "caught" for o in outcomes if o.name != "(baseline)")
    total = sum(o.name != "(baseline)" for o in outcomes)
    lines = [
        "# CPU mutation report",
        "",
        f"- command: `{command}`",
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- commit: {commit}",
        f"- tests: `{shlex.join(pytest_command(Path('<tree>'))[: -len(CATCH_FIRST)])} <files>` with "
        f"DSV41RT_REQUIRE_ORACLE=1; <files>: every tests/python/test_*.py once, {', '.join(CATCH_FIRST)} first",
        f"- baseline: {'run first (must pass)' if baseline_ran else 'NOT run (--no-baseline)'}",
        f"- baseline's skips of tests not marked cuda (CPU-only build): {', '.join(skips) or 'none'}",
        f"- result: {caught} of {total} mutations caught",
        "",
        "| mutation | bug | result | first failing test | error | build s | test s |",
        "|---|---|---|---|---|---:|---:|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.name} | {md_cell(o.description, 100)} | {o.status} | {md_cell(o.test, 120)} | "
            f"{md_cell(o.error)} | {o.build_s:.0f} | {o.test_s:.0f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this mutation (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the mutations, check they apply, and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (debugging only)")
    ap.add_argument("--src", type=Path, default=REPO_ROOT, help="tree to mutate (default: this repository)")
    ap.add_argument("--scratch", type=Path, default=Path("/tmp/mut-src"))
    ap.add_argument("--site", type=Path, default=Path("/tmp/mut-site"))
    ap.add_argument("--build-dir", type=Path, default=Path("/tmp/mut-build"))
    ap.add_argument("--logs", type=Path, default=Path("/tmp/mut-logs"))
    ap.add_argument("--report", type=Path, default=Path(__file__).resolve().parent / "REPORT-cpu.md")
    ap.add_argument("--timeout", type=float, default=0, help="pytest seconds per run (default: 3x baseline, >= 900)")
    args = ap.parse_args()
    src = args.src.resolve()

    try:
        check_all(src)  # every mutation, CPU and GPU: a stale entry fails here, before any build
    except StaleMutation as e:
        print(f"STALE MUTATION LIST: {e}", file=sys.stderr)
        return 2
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:32} {m.kind:4} {m.path:46} {m.description}")
        print(f"{len(MUTATIONS)} mutations; all apply to {src}")
        return 0

    selected: list[Mutation] = by_kind("cpu")
    if args.only:
        unknown = set(args.only) - {m.name for m in selected}
        if unknown:
            print(f"unknown CPU mutations: {sorted(unknown)} (see --list)", file=sys.stderr)
            return 2
        selected = [m for m in selected if m.name in args.only]

    commit = describe(src)
    command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    args.logs.mkdir(parents=True, exist_ok=True)
    print(f"syncing {src} -> {args.scratch}: {sync_tree(src, args.scratch)} files written", flush=True)
    outcomes: list[Outcome] = []
    skips: list[str] = []

    def finish(code: int) -> int:
        text = report(outcomes, commit, command, not args.no_baseline, skips)
        args.report.write_text(text)
        print(text, flush=True)
        print(f"report: {args.report}; logs: {args.logs}")
        return code

    timeout_s = args.timeout or 3600.0
    if not args.no_baseline:
        ok, build_s = build(args.scratch, args.site, args.build_dir, args.logs / "baseline.build.log")
        if not ok:
            print(f"baseline build failed: see {args.logs / 'baseline.build.log'}", file=sys.stderr)
            return 2
        print(f"tests import dsv41rt from {check_import(args.scratch, args.site)}", flush=True)
        rc, node, error, test_s = run_tests(args.scratch, args.site, args.logs / "baseline.test.log", timeout_s)
        skips = unexpected_skips((args.logs / "baseline.test.log").read_text(errors="replace"))
        status = "passed" if rc == 0 else "FAILED"
        if rc != 0 and not node:
            node, error = "", f"pytest exit {rc}, no failing test named (see baseline.test.log)"
        outcomes.append(Outcome("(baseline)", "no mutation", status, node, error, build_s, test_s))
        print(f"baseline: {status} (build {build_s:.0f} s, tests {test_s:.0f} s)", flush=True)
        if rc != 0:
            print(f"the unmutated suite fails ({node or '-'}: {error}); stopping", file=sys.stderr)
            return finish(2)
        timeout_s = args.timeout or max(900.0, 3 * test_s)

    all_caught = True
    for m in selected:
        original = apply_to(m, args.scratch)
        try:
            ok, build_s = build(args.scratch, args.site, args.build_dir, args.logs / f"{m.name}.build.log")
        finally:
            # The built package holds the mutation; the source goes back at once (new mtime: the
            # next build recompiles it), so an interrupted run never leaves a mutated scratch tree.
            restore(m, args.scratch, original)
        if not ok:
            outcomes.append(Outcome(m.name, m.description, "BUILD FAILED", "", f"see {m.name}.build.log", build_s))
            all_caught = False
            print(f"{m.name}: BUILD FAILED", flush=True)
            continue
        if not outcomes:  # --no-baseline: still prove the tests import this build
            print(f"tests import dsv41rt from {check_import(args.scratch, args.site)}", flush=True)
        rc, node, error, test_s = run_tests(args.scratch, args.site, args.logs / f"{m.name}.test.log", timeout_s)
        if rc is None:
            status, error = "timeout", f"pytest ran past {timeout_s:.0f} s (last: {node or '?'})"
        elif rc == 0:
            status = "NOT CAUGHT"
        elif node:
            status = "caught"
        else:
            # Failed without naming a test (e.g. a crash faulthandler did not trace): still caught,
            # but the log must be read.
            status, error = "caught", f"pytest exit {rc}, no failing test named (see {m.name}.test.log)"
        all_caught = all_caught and status == "caught"
        outcomes.append(Outcome(m.name, m.description, status, node, error, build_s, test_s))
        print(f"{m.name}: {status} {node} (build {build_s:.0f} s, tests {test_s:.0f} s)", flush=True)
    return finish(0 if all_caught else 1)


if __name__ == "__main__":
    sys.exit(main())
