#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with a Rust toolchain:
# installs what the tests need, builds every binary the end-to-end tests start
# as processes, then runs formatting, lints and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v apt-get >/dev/null || { echo "the tests need a Debian-based system (apt-get)"; exit 1; }
for tool in dpkg-query; do
  command -v "$tool" >/dev/null || need_apt+=(dpkg)
done
if [ "${#need_apt[@]}" -gt 0 ]; then
  # Mirrors sometimes serve a stale index; a failing update must not stop the install.
  apt-get update || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_apt[@]}"
fi

export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --all-features -- -D warnings
# The end-to-end tests run drover and drover-agent as processes.
cargo build --workspace --bins
cargo test --workspace --all-features
