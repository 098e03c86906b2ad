#!/usr/bin/env bash
# Fetches the nats-server the cluster tests run (tests/tests/nats_cluster.rs)
# and prints its path. A JetStream cluster needs nats-server 2.10 or later:
# on bookworm's 2.9.10 a SIGKILLed node, restarted, took writes before it had
# rejoined its streams' Raft groups and its copy of a bucket diverged for good
# (docs/operations.md). Bookworm has no newer package, so this
# takes Debian trixie's build from the Debian archive, checks its SHA-256,
# and unpacks it under target/ (dpkg-deb -x: nothing is installed on the
# host). amd64 only; elsewhere it prints the nats-server on PATH.
# Usage: bash scripts/fetch-nats-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.10.27-1+b2
sha256=6d913ac987b78734c08537c2adeb1526cf735f216173a9170d94b185fcfe6f8a
dir=target/tools/nats-server-$version
if [ "$(dpkg --print-architecture)" != amd64 ]; then
  command -v nats-server
  exit 0
fi
if [ ! -x "$dir/usr/sbin/nats-server" ]; then
  mkdir -p target/tools
  deb=target/tools/nats-server_${version}_amd64.deb
  url=${DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/n/nats-server/nats-server_${version}_amd64.deb
  curl -fsSL --retry 3 -o "$deb.part" "$url" >&2
  echo "$sha256  $deb.part" | sha256sum -c --quiet - >&2
  mv "$deb.part" "$deb"
  rm -rf "$dir"
  dpkg-deb -x "$deb" "$dir"
fi
echo "$PWD/$dir/usr/sbin/nats-server"
