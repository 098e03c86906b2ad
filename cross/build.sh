#!/usr/bin/env bash
# Builds drover-agent and drover for arm64, armhf and amd64 (release profile,
# stripped) with the toolchain of cross/setup.sh, and packages each as .debs.
#
#   bash cross/build.sh [arm64|armhf|amd64 ...]     # default: all three
# Output: target/debs/*.deb
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
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
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(arm64 armhf amd64)
cd "$root"
for arch in "${archs[@]}"; do
    case "$arch" in
      arm64) triple=aarch64-unknown-linux-gnu ;;
      armhf) triple=armv7-unknown-linux-gnueabihf ;;
      amd64) triple=x86_64-unknown-linux-gnu ;;
      *) echo "unknown architecture $arch" >&2; exit 2 ;;
    esac
    if [ ! -d "$here/toolchain/usr/lib/rustlib/$triple" ]; then
        echo "no standard library for $triple in cross/toolchain (see cross/setup.sh's warnings); skipping $arch" >&2
        continue
    fi
    # One invocation each: built together, the agent would take the control
    # plane's features of shared crates (clap's colours, more of tokio) and
    # grow by what it never calls.
    cargo build --release --locked --target "$triple" -p drover-agent
    # The control plane with thin LTO over 16 codegen units: its fat-LTO
    # build took 8-9 minutes per architecture on 2 cores (most of the
    # cross suite's 46 minutes on 2026-12-03). A server binary's size
    # matters less than the agent's, which keeps the profile above.
    CARGO_PROFILE_RELEASE_LTO=thin CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo build --release --locked --target "$triple" -p drover
    ls -l "$CARGO_TARGET_DIR/$triple/release/drover-agent" "$CARGO_TARGET_DIR/$triple/release/drover"
    bash "$here/package-deb.sh" "$arch" "$CARGO_TARGET_DIR/$triple/release" "$root/target/debs"
done
