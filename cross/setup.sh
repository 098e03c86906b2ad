#!/usr/bin/env bash
# Sets up the cross-compilation toolchain from Debian's packages alone:
# Debian's rustc-web (the newest the configured archive offers, at or above
# the workspace's floor), its standard library for arm64 and armhf, the cross
# gcc toolchains (linkers), and qemu-user-static to run what was built.
# Nothing is installed with dpkg for foreign architectures: the rustc-web
# packages are unpacked into cross/toolchain/, so the host's dpkg and its
# architectures are left alone. Checksums are verified: amd64 packages by
# apt, foreign ones against Packages indexes whose checksums are checked
# against the gpgv-verified InRelease.
#
#   bash cross/setup.sh        # then: bash cross/build.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
toolchain=$here/toolchain
floor=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$here/../Cargo.toml" | head -n1)

export DEBIAN_FRONTEND=noninteractive
# A mirror mid-sync can fail one index; the rest is still usable.
apt-get update || true
apt-get install -y --no-install-recommends \
    gcc-aarch64-linux-gnu gcc-arm-linux-gnueabihf libc6-dev-arm64-cross libc6-dev-armhf-cross \
    qemu-user-static dpkg-dev binutils xz-utils curl gpgv debian-archive-keyring debootstrap

# The newest rustc-web at or above the floor.
version=$(apt-cache madison rustc-web | awk '{print $3}' | while read -r v; do
    upstream=${v%%+*}
    if dpkg --compare-versions "$upstream" ge "$floor"; then echo "$v"; fi
done | sort -V | tail -n1)
if [ -z "$version" ]; then
    echo "no rustc-web >= $floor in the configured archive (is bookworm-security in the apt sources?)" >&2
    exit 1
fi
minor=$(echo "$version" | sed 's/^\([0-9]*\.[0-9]*\).*/\1/')
echo "rustc-web $version"

debs=$toolchain/debs
stamp=$toolchain/.ready-$version
if [ -e "$stamp" ]; then
    echo "toolchain $version already in $toolchain"
    exit 0
fi
rm -rf "$toolchain"
mkdir -p "$debs"
cd "$debs"

# Which archive (main or security) and mirror serve this version; asked
# before anything is downloaded (apt prints no URI for a file already here).
pool=$(apt-cache show "libstd-rust-web-dev=$version" | sed -n 's/^Filename: //p' | head -n1)
uri=$(apt-get download --print-uris "libstd-rust-web-dev=$version" 2>/dev/null | sed -n "s/^'\(.*\)\/pool\/.*/\1/p" | head -n1)

# amd64 (the host): apt downloads and verifies them.
llvm=$(apt-cache show "libstd-rust-web-$minor=$version" | sed -n 's/^Depends:.*\(libllvm[0-9]*\).*/\1/p' | head -n1)
apt-get download "rustc-web=$version" "libstd-rust-web-$minor=$version" "libstd-rust-web-dev=$version" "$llvm"

# arm64 and armhf standard libraries: from the archive's signed indexes.
[ -n "$uri" ] || { echo "cannot tell which mirror serves rustc-web $version" >&2; exit 1; }
case "$pool" in
  pool/updates/*) suite=bookworm-security ;;
  *) suite=$(. /etc/os-release && echo "$VERSION_CODENAME") ;;
esac
# A verified index entry for libstd-rust-web-dev $version of ARCH: each
# suite that may list it (the one apt named first, then the others of the
# same release), each compressed form of its index, each checked against
# that suite's InRelease verified with gpgv, fetched by its hash where the
# archive keeps indexes by hash (Debian's does). Seen here: a mirror
# mid-sync serving an armhf index that does not match its InRelease; the
# by-hash copy, another suite, another form of the index, or the same one a
# minute later does.
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
suites="$suite"
for other in "$codename-security" "$codename" "$codename-updates" "$codename-proposed-updates"; do
    [ "$other" = "$suite" ] || suites="$suites $other"
done
# The archives' base URIs: the one serving this version, and the main and
# security archives the apt sources name.
bases=$( (echo "$uri"
    sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
    awk '/^deb / && $2 ~ /^http/ {print $2}' /etc/apt/sources.list 2>/dev/null || true) | sed 's#/*$##' | awk 'NF && !seen[$0]++')
verified_entry() { # arch: writes the package's index entry to entry-ARCH and its archive to base-ARCH
    local arch=$1 try candidate base s compressed expected
    for try in 1 2 3; do
        for s in $suites; do
            for base in $bases; do
                case "$s" in
                *-security) [[ "$base" == *security* ]] || continue ;;
                *) [[ "$base" == *security* ]] && continue ;;
                esac
                curl -fsSL "$base/dists/$s/InRelease" -o "InRelease-$s" 2>/dev/null || continue
                gpgv --keyring /usr/share/keyrings/debian-archive-keyring.gpg "InRelease-$s" 2>/dev/null || {
                    echo "WARNING: InRelease of $s from $base does not verify" >&2
                    continue
                }
                for compressed in xz gz; do
                    candidate=main/binary-$arch/Packages.$compressed
                    expected=$(awk -v f="$candidate" '/^SHA256:/{x=1;next} /^[A-Za-z]/{x=0} x && $3==f {print $1}' "InRelease-$s")
                    [ -n "$expected" ] || continue
                    # By hash first (what apt does where the archive offers
                    # it: a file named by its checksum cannot be the stale
                    # one a mirror mid-sync serves), then by name.
                    local got=no url
                    for url in "$base/dists/$s/main/binary-$arch/by-hash/SHA256/$expected" "$base/dists/$s/$candidate"; do
                        curl -fsSL "$url" -o "Packages-$arch.$compressed" 2>/dev/null || continue
                        if echo "$expected  Packages-$arch.$compressed" | sha256sum -c --quiet >/dev/null 2>&1; then
                            got=yes
                            break
                        fi
                        echo "WARNING: $url does not match $s's signed InRelease (mirror mid-sync?)" >&2
                    done
                    [ "$got" = yes ] || continue
                    local entry
                    entry=$( (if [ "$compressed" = xz ]; then xz -dc; else gzip -dc; fi) <"Packages-$arch.$compressed" |
                        awk -v v="$version" 'BEGIN{RS=""} index($0, "Package: libstd-rust-web-dev\n") == 1 && index($0, "\nVersion: " v "\n")')
                    if [ -n "$entry" ]; then
                        echo "$arch: libstd-rust-web-dev $version listed in $url, verified against $s's InRelease"
                        echo "$entry" >"entry-$arch"
                        echo "$base" >"base-$arch"
                        return 0
                    fi
                done
            done
        done
        [ "$try" = 3 ] || { echo "WARNING: no verified $arch index lists libstd-rust-web-dev $version; trying again in 60 s" >&2; sleep 60; }
    done
    return 1
}
for arch in arm64 armhf; do
    if verified_entry "$arch"; then
        entry=$(cat "entry-$arch")
        base=$(cat "base-$arch")
    else
        # Without a verified index there is no trusted checksum for the
        # package: skip the architecture (build.sh then says it is missing)
        # unless told otherwise.
        if [ "${DROVER_CROSS_UNVERIFIED_INDEX:-}" != 1 ]; then
            echo "WARNING: no index of $arch that matches a signed InRelease lists libstd-rust-web-dev $version;" \
                 "skipping $arch (set DROVER_CROSS_UNVERIFIED_INDEX=1 to trust the index's own checksum)" >&2
            continue
        fi
        echo "WARNING: using the unverified $arch index" >&2
        base=$uri
        curl -fsSL "$uri/dists/$suite/main/binary-$arch/Packages.xz" -o "Packages-$arch.xz"
        entry=$(xz -dc "Packages-$arch.xz" | awk -v v="$version" 'BEGIN{RS=""} index($0, "Package: libstd-rust-web-dev\n") == 1 && index($0, "\nVersion: " v "\n")')
    fi
    file=$(echo "$entry" | sed -n 's/^Filename: //p')
    sha=$(echo "$entry" | sed -n 's/^SHA256: //p')
    [ -n "$file" ] || { echo "libstd-rust-web-dev $version missing for $arch" >&2; exit 1; }
    curl -fsSL "$base/$file" -o "libstd-rust-web-dev_$arch.deb"
    echo "$sha  libstd-rust-web-dev_$arch.deb" | sha256sum -c --quiet
done

for deb in *.deb; do dpkg-deb -x "$deb" "$toolchain"; done
mkdir -p "$toolchain/bin"
cat > "$toolchain/bin/rustc" <<WRAPPER
#!/bin/sh
# Debian's rustc-web, unpacked: its sysroot ($toolchain/usr) holds the
# x86_64, aarch64 and armv7 standard libraries.
LD_LIBRARY_PATH=$toolchain/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $toolchain/usr/bin/rustc "\$@"
WRAPPER
chmod +x "$toolchain/bin/rustc"
"$toolchain/bin/rustc" --version
ls "$toolchain/usr/lib/rustlib"
touch "$stamp"
