#!/usr/bin/env bash
# Sets up the cross-compilation toolchain from Debian's packages alone:
# Debian's rustc-web, its standard library for amd64, arm64 and armhf, and
# the LLVM it links, exactly as cross/toolchain.lock pins them (version,
# pool path, SHA-256); the cross gcc toolchains (linkers) and
# qemu-user-static to run what was built. The pinned packages are fetched
# from the archive's pool by their path, checked against the pin, and kept
# in a cache under /var/tmp; no index is read for them, so a mirror whose
# index is stale or mid-sync cannot fail the build (cross/pin.sh reads the
# signed indexes when the pin moves). Nothing is installed with dpkg for
# foreign architectures: the packages are unpacked into a directory of the
# cache, which cross/toolchain links to, so the host's dpkg and its
# architectures are left alone.
#
#   bash cross/setup.sh        # then: bash cross/build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lock=$here/toolchain.lock
floor=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$here/../Cargo.toml" | head -n1)
cache=${DROVER_CROSS_CACHE:-/var/tmp/drover-cross}

export DEBIAN_FRONTEND=noninteractive
# A mirror mid-sync can fail one index; the rest is still usable.
apt-get update || true
apt-get install -y --no-install-recommends \
    gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf libc6-dev-arm64-cross libc6-dev-armhf-cross \
    qemu-user-static dpkg-dev binutils xz-utils curl gpgv debian-archive-keyring debootstrap

pins=$(grep -v '^#' "$lock" | awk 'NF')
version=$(awk '$1 == "amd64" && $2 == "rustc-web" {print $3}' <<<"$pins")
[ -n "$version" ] || { echo "$lock pins no amd64 rustc-web" >&2; exit 1; }
dpkg --compare-versions "${version%%+*}" ge "$floor" ||
    { echo "$lock pins rustc-web $version, below the workspace's rust-version $floor: run cross/pin.sh" >&2; exit 1; }
echo "rustc-web $version (pinned in cross/toolchain.lock)"
# What the archive offers now: said, never required. A security update
# moves rustc-web on and, some days later, takes the old version out of the
# pool; the pin is moved by cross/pin.sh.
offered=$(apt-cache madison rustc-web 2>/dev/null | awk '{print $3}' | sort -V | tail -n1)
moved=
if [ -n "$offered" ] && [ "$offered" != "$version" ] && dpkg --compare-versions "$offered" gt "$version"; then
    moved="The archive now offers rustc-web $offered, which cross/toolchain.lock does not know (it pins $version). To move the pin: bash cross/pin.sh, check the diff of cross/toolchain.lock, and commit it."
    echo "NOTE: $moved" >&2
fi

toolchain=$cache/toolchain-$(sha256sum "$lock" | cut -c1-16)
link() {
    rm -rf "$here/toolchain"
    ln -s "$toolchain" "$here/toolchain"
}
mkdir -p "$cache/debs"
exec 8>"$cache/lock"
flock 8
if [ -e "$toolchain/.ready" ]; then
    link
    echo "toolchain $version already in $toolchain (cross/toolchain links to it)"
    exit 0
fi

list=$(bash "$here/fetch-pinned.sh" "$lock" "$cache/debs") || {
    [ -z "$moved" ] || echo "$moved (A superseded version leaves the pool some days after its successor arrives.)" >&2
    exit 1
}
mapfile -t fetched <<<"$list"
rm -rf "$toolchain" "$toolchain.part"
mkdir -p "$toolchain.part"
for deb in "${fetched[@]}"; do dpkg-deb -x "$deb" "$toolchain.part"; done
mkdir -p "$toolchain.part/bin"
cat > "$toolchain.part/bin/rustc" <<WRAPPER
#!/bin/sh
# Debian's rustc-web $version, unpacked: its sysroot ($toolchain/usr) holds the
# x86_64, aarch64 and armv7 standard libraries.
LD_LIBRARY_PATH=$toolchain/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $toolchain/usr/bin/rustc "\$@"
WRAPPER
chmod +x "$toolchain.part/bin/rustc"
mv "$toolchain.part" "$toolchain"
"$toolchain/bin/rustc" --version
for triple in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu armv7-unknown-linux-gnueabihf; do
    [ -d "$toolchain/usr/lib/rustlib/$triple" ] || { echo "the pinned packages hold no standard library for $triple" >&2; exit 1; }
done
ls "$toolchain/usr/lib/rustlib"
touch "$toolchain/.ready"
link
