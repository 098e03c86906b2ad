#!/usr/bin/env python3
"""Gives a fresh clone's unchanged sources the times they had in the run
before, so cargo reuses what that run built from them.

Usage: source-mtimes.py MANIFEST   (run at the checkout's root, under the
target cache's lock: scripts/target-cache.sh)

Cargo decides that a workspace crate is up to date by comparing its source
files' modification times with the time it last compiled them. A fresh
clone's files are all new, so without this every workspace crate is
compiled again in every profile and for every target, the release builds'
link-time optimisation included, although most of them did not change.

MANIFEST records, for each file git tracks, its SHA-256 and the time it was
given in the run before. A file whose content is the one recorded gets that
time back; every other file is given the time of now, after every build the
cache holds (the lock keeps runs one at a time), so cargo compiles it again
even where the clone is older than the last build. Freshness is decided by
content, never by a time alone: a changed source always rebuilds.

Cargo does not rebuild a crate when a value it set for the compiler changes
(CARGO_MANIFEST_DIR, CARGO_BIN_EXE_*, CARGO_TARGET_TMPDIR, OUT_DIR: paths
that name this clone), so a file that reads one is always given the time of
now: the crate holding it is compiled again with this clone's paths.

The new manifest is written before any build starts, so a run that stops
half way leaves one that describes the sources its builds used.
"""

import hashlib
import os
import subprocess
import sys
import time

CLONE_PATHS = (b"CARGO_MANIFEST_DIR", b"CARGO_BIN_EXE", b"CARGO_TARGET_TMPDIR", b"OUT_DIR")


def read_manifest(path):
    kept = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 3 and parts[1].isdigit():
                    kept[parts[2]] = (parts[0], int(parts[1]))
    except FileNotFoundError:
        pass
    return kept


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: source-mtimes.py MANIFEST")
    manifest = sys.argv[1]
    listed = subprocess.run(["git", "ls-files", "-z"], check=True, capture_output=True).stdout
    kept = read_manifest(manifest)
    now = time.time_ns()
    rows, reused, touched = [], 0, 0
    for raw in listed.split(b"\0"):
        if not raw:
            continue
        name = raw.decode("utf-8", "surrogateescape")
        if "\t" in name or "\n" in name or os.path.islink(name) or not os.path.isfile(name):
            continue
        with open(name, "rb") as f:
            content = f.read()
        digest = hashlib.sha256(content).hexdigest()
        before = kept.get(name)
        if before and before[0] == digest and not any(p in content for p in CLONE_PATHS):
            mtime = before[1]
            reused += 1
        else:
            mtime = now
            touched += 1
        os.utime(name, ns=(mtime, mtime))
        rows.append(f"{digest}\t{mtime}\t{name}\n")
    tmp = manifest + ".new"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(rows)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest)
    print(f"target cache: {reused} sources unchanged since the run before keep its times, {touched} are new to it")


if __name__ == "__main__":
    main()
