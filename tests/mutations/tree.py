"""Scratch copies of the source tree for the mutation runners.

A scratch copy is kept in sync with the repository's working tree (tracked files plus untracked
ones git does not ignore, so a test being written is checked before it is committed) by content:
a file is rewritten only when its bytes differ, so it gets a new mtime and the persistent
incremental build recompiles exactly what changed. Copies never preserve the source's mtimes: a
file restored with an older mtime than an object built from a mutated version of it would not be
recompiled, and a mutated object would silently survive into the next build.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def source_files(src: Path) -> list[str]:
    """Paths (relative to src) of the files a build of src sees: tracked and untracked-not-ignored,
    minus tracked files deleted in the working tree."""
    out = subprocess.run(
        ["git", "-C", str(src), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    return sorted({p for p in out.decode().split("\0") if p and (src / p).is_file()})


def sync_tree(src: Path, dst: Path) -> int:
    """Makes dst hold exactly src's source files (see module doc); returns how many were written."""
    files = source_files(src)
    wanted = set(files)
    dst.mkdir(parents=True, exist_ok=True)
    written = 0
    for rel in files:
        data = (src / rel).read_bytes()
        target = dst / rel
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod((src / rel).stat().st_mode & 0o777)
        written += 1
    # Files that left the source tree leave the copy (a stale .cc would still be globbed into the
    # build). Only files are removed; empty directories are harmless.
    for path in sorted(dst.rglob("*")):
        if path.is_file() and str(path.relative_to(dst)) not in wanted:
            path.unlink()
    return written


def describe(src: Path) -> str:
    """The commit of src, marked -dirty when the working tree differs from it."""
    return subprocess.run(
        ["git", "-C", str(src), "describe", "--always", "--dirty", "--abbrev=10"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
