#!/usr/bin/env bash
# Builds drover-agent and drover for arm64, armhf and amd64 (release profile,
# stripped) with the toolchain of cross/setup.sh, and packages each as .debs.
#
#   bash cross/build.sh [--control-plane ARCHS] [arm64|armhf|amd64 ...]
#
# Default: both binaries for all three architectures. --control-plane
# names the architectures (comma-separated, or "none") whose control plane
# is built too; the agent is built for every one named. The cross suite
# builds the control plane for amd64 only (see scripts/test-cross.sh).
# Output: target/debs/*.deb (this run's architectures' old packages removed
# first, so a package there is always this build's).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
control_plane=
archs=()
while [ $# -gt 0 ]; do
    case "$1" in
      --control-plane) control_plane=${2:?--control-plane needs architectures, comma-separated, or none}; shift 2 ;;
      arm64 | armhf | amd64) archs+=("$1"); shift ;;
      *) echo "usage: cross/build.sh [--control-plane ARCHS|none] [arm64|armhf|amd64 ...]" >&2; exit 2 ;;
    esac
done
[ ${#archs[@]} -gt 0 ] || archs=(arm64 armhf amd64)
[ -n "$control_plane" ] || control_plane=$(IFS=,; echo "${archs[*]}")
export RUSTC=$here/toolchain/bin/rustc
[ -x "$RUSTC" ] || { echo "run cross/setup.sh first" >&2; exit 1; }
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_LINKER=arm-linux-gnueabihf-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export CARGO_TARGET_ARMV7_UNKNOWN_LINUX_GNUEABIHF_RUNNER="qemu-arm-static -L /usr/arm-linux-gnueabihf"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CC_armv7_unknown_linux_gnueabihf=arm-linux-gnueabihf-gcc
# Separate from the host's target directory: another compiler builds here.
export CARGO_TARGET_DIR=$root/target/cross
cd "$root"
triple_of() {
    case "$1" in
      arm64) echo aarch64-unknown-linux-gnu ;;
      armhf) echo armv7-unknown-linux-gnueabihf ;;
      amd64) echo x86_64-unknown-linux-gnu ;;
    esac
}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)-1
with_plane() { [[ ",$control_plane," == *",$1,"* ]]; }
agent_targets=()
plane_targets=()
built=()
for arch in "${archs[@]}"; do
    triple=$(triple_of "$arch")
    if [ ! -d "$here/toolchain/usr/lib/rustlib/$triple" ]; then
        echo "no standard library for $triple in cross/toolchain: run cross/setup.sh" >&2
        exit 1
    fi
    built+=("$arch")
    rm -f "target/debs/drover-agent_${version}_${arch}.deb" "target/debs/drover_${version}_${arch}.deb"
    agent_targets+=(--target "$triple")
    with_plane "$arch" && plane_targets+=(--target "$triple")
done
[ ${#built[@]} -gt 0 ] || { echo "nothing to build" >&2; exit 1; }
# The agent for every architecture in one cargo run: cargo overlaps one
# target's single-threaded link-time optimisation with the next one's
# compiling (678 s for all three cold in CI on 2026-12-03, where arm64's
# alone took 293 s cold: about a fifth less than three runs). The agent
# and the control plane are never built in one run: there the agent would
# take the control plane's features of shared crates (clap's colours, more
# of tokio) and grow by what it never calls.
started=$SECONDS
# Cargo's JSON messages are counted (scripts/cargo-tally.py: what the
# target cache held); cargo renders the diagnostics itself.
cargo build --release --locked "${agent_targets[@]}" -p drover-agent --message-format=json-render-diagnostics |
    python3 "$root/scripts/cargo-tally.py" "agents (${built[*]})"
echo "cross/build.sh: the agent for ${built[*]} took $((SECONDS - started)) s"
if [ ${#plane_targets[@]} -gt 0 ]; then
    # The workspace profile (fat LTO, one codegen unit): thin LTO over 16
    # units (tried in 1292b98) built no faster here (8 m 28 s cold for
    # arm64, against 7 m 20 s fat after the agent) and made the binary
    # 35 % larger.
    started=$SECONDS
    cargo build --release --locked "${plane_targets[@]}" -p drover --message-format=json-render-diagnostics |
        python3 "$root/scripts/cargo-tally.py" "control plane ($control_plane)"
    echo "cross/build.sh: the control plane for $control_plane took $((SECONDS - started)) s"
fi
for arch in "${built[@]}"; do
    dir=$CARGO_TARGET_DIR/$(triple_of "$arch")/release
    packages=(drover-agent)
    with_plane "$arch" && packages+=(drover)
    for p in "${packages[@]}"; do ls -l "$dir/$p"; done
    bash "$here/package-deb.sh" "$arch" "$dir" "$root/target/debs" "${packages[@]}"
done
