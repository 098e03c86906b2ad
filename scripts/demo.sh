#!/usr/bin/env bash
# The demo: a control plane, three agents and a task run, end to end, on the
# embedded store. Nothing to install beyond a Rust toolchain on Debian.
set -euo pipefail
cd "$(dirname "$0")/.."
# The first run builds the binaries (cargo shows its progress); drover with
# its demo, which the packaged drover leaves out.
cargo build --bins --features drover/demo
exec target/debug/drover demo "$@"
