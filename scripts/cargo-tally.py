#!/usr/bin/env python3
"""Counts what a cargo build took from the target directory.

    cargo build --message-format=json-render-diagnostics ... | python3 scripts/cargo-tally.py LABEL

Reads cargo's JSON messages on stdin (diagnostics are rendered by cargo
itself on stderr), counts the compilation units cargo found fresh and the
ones it compiled, prints one line for LABEL, and appends
"LABEL FRESH TOTAL" to the file DROVER_CACHE_TALLY names, if any, for
.ci/run's hit rate. Lines that are not JSON pass through.
"""
import json
import os
import sys

label = sys.argv[1] if len(sys.argv) > 1 else "cargo"
fresh = total = 0
for line in sys.stdin:
    try:
        message = json.loads(line)
    except ValueError:
        sys.stdout.write(line)
        continue
    if message.get("reason") == "compiler-artifact":
        total += 1
        fresh += bool(message.get("fresh"))
share = f"{100 * fresh / total:.0f} %" if total else "none built"
print(f"compile cache ({label}): {fresh} of {total} compilation units fresh ({share})")
tally = os.environ.get("DROVER_CACHE_TALLY")
if tally:
    with open(tally, "a") as out:
        out.write(f"{label} {fresh} {total}\n")
