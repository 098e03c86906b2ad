#!/usr/bin/env bash
# Runs what cross/build.sh built under qemu-user: --version of both binaries,
# and the agent answering on its status socket; checks each .deb's
# architecture and contents; prints the binary sizes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)-1
checked=0
for arch in arm64 armhf amd64; do
    case "$arch" in
      arm64) triple=aarch64-unknown-linux-gnu; run="qemu-aarch64-static -L /usr/aarch64-linux-gnu" ;;
      armhf) triple=armv7-unknown-linux-gnueabihf; run="qemu-arm-static -L /usr/arm-linux-gnueabihf" ;;
      amd64) triple=x86_64-unknown-linux-gnu; run="" ;;
    esac
    bin=$root/target/cross/$triple/release
    [ -x "$bin/drover-agent" ] || { echo "$arch: not built"; continue; }
    echo "== $arch"
    # The control plane only where this build packaged it (cross/build.sh
    # --control-plane); the agent everywhere.
    plane=no
    [ -f "$root/target/debs/drover_${version}_${arch}.deb" ] && plane=yes
    $run "$bin/drover-agent" --version
    [ "$plane" = no ] || $run "$bin/drover" --version
    work=$(mktemp -d)
    cat > "$work/agent.toml" <<CONFIG
device_id = "cross-$arch"
intent_public_keys = ["4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065"]
state_dir = "$work/state"
status_socket = "$work/status.sock"
[transport]
kind = "websocket"
server_url = "ws://127.0.0.1:9"
token = "t"
[updater]
mode = "simulate"
CONFIG
    $run "$bin/drover-agent" --config "$work/agent.toml" run 2>"$work/agent.log" &
    agent=$!
    for _ in $(seq 100); do [ -S "$work/status.sock" ] && break; sleep 0.1; done
    status=$($run "$bin/drover-agent" status --json --socket "$work/status.sock" || true)
    grep -q "\"deviceId\": \"cross-$arch\"" <<<"$status" \
        || { echo "$arch: the agent did not answer on its status socket"; cat "$work/agent.log"; kill "$agent"; exit 1; }
    echo "$arch: status socket answers"
    bash "$root/scripts/check-no-test-hooks.sh" "$bin/drover-agent" $run
    kill -TERM "$agent"; wait "$agent" || true
    rm -rf "$work"
    packages=(drover-agent)
    [ "$plane" = no ] || packages+=(drover)
    for pkg in "${packages[@]}"; do
        deb=$root/target/debs/${pkg}_${version}_${arch}.deb
        [ "$(dpkg-deb -f "$deb" Architecture)" = "$arch" ] || { echo "$deb: wrong architecture"; exit 1; }
        listing=$(dpkg-deb -c "$deb")
        grep -q "./usr/bin/$pkg\$" <<<"$listing" || { echo "$deb: no /usr/bin/$pkg"; exit 1; }
        echo "$(basename "$deb"): $(stat -c %s "$deb") bytes"
    done
    sizes="drover-agent $(stat -c %s "$bin/drover-agent") bytes"
    [ "$plane" = no ] || sizes="$sizes, drover $(stat -c %s "$bin/drover") bytes"
    echo "binary sizes: $sizes (release profile, stripped)"
    checked=$((checked + 1))
done
[ "$checked" -gt 0 ] || { echo "nothing built; run cross/build.sh"; exit 1; }
