#!/usr/bin/env bash
# Writes cross/toolchain.lock: the Debian packages of the cross toolchain
# (rustc-web, its standard library for amd64, arm64 and armhf, and the LLVM
# it links), each by version, pool path and SHA-256, as Cargo.lock pins
# crates. cross/setup.sh then fetches exactly these from the pool and checks
# each against its pin; it reads no index, so a mirror whose index is stale
# or mid-sync cannot fail a build. This script is the one place the signed
# indexes are read: run it when the archive moves rustc-web on (setup.sh
# says so), check the diff, and commit the lock.
#
#   bash cross/pin.sh                    # the newest rustc-web at or above the floor
#   bash cross/pin.sh --version V        # that version
#   bash cross/pin.sh --trust-index armhf   # take armhf's entry from an index
#                                           # that does not match its InRelease
#
# amd64's entries come from apt's own indexes (apt verifies them against
# the signed Release files). arm64's and armhf's come from the archive's
# Packages index of that architecture, whose SHA-256 is checked against the
# suite's InRelease verified with gpgv and Debian's keyring; by hash first
# (as apt fetches it), then by name, .xz then .gz, each suite of the
# release, three rounds a minute apart. Only --trust-index ARCH takes an
# entry from an index that does not verify, and the lock says so on its line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
lock=$here/toolchain.lock
floor=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' "$here/../Cargo.toml" | head -n1)
version=
trusted=
while [ $# -gt 0 ]; do
    case "$1" in
    --version) version=${2:?--version needs a Debian version}; shift 2 ;;
    --trust-index) trusted="$trusted ${2:?--trust-index needs arm64 or armhf}"; shift 2 ;;
    *) echo "usage: cross/pin.sh [--version V] [--trust-index arm64|armhf]" >&2; exit 2 ;;
    esac
done

apt-get update || true
if [ -z "$version" ]; then
    version=$(apt-cache madison rustc-web | awk '{print $3}' | while read -r v; do
        if dpkg --compare-versions "${v%%+*}" ge "$floor"; then echo "$v"; fi
    done | sort -V | tail -n1)
    [ -n "$version" ] || { echo "no rustc-web >= $floor in the configured archive (is bookworm-security in the apt sources?)" >&2; exit 1; }
fi
minor=$(echo "$version" | sed 's/^\([0-9]*\.[0-9]*\).*/\1/')
echo "pinning rustc-web $version"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
lines=()
# One lock line from an index entry (a Packages stanza) on stdin.
line_of() { # arch how
    awk -v arch="$1" -v how="$2" '
        /^Package: / {p=$2} /^Version: / {v=$2} /^Filename: / {f=$2} /^SHA256: / {s=$2}
        END { if (p && v && f && s) print arch, p, v, f, s, how }'
}
show() { # package=version: apt's verified entry for amd64
    apt-cache show "$1" | awk 'BEGIN{RS=""} NR==1'
}
llvm=$(apt-cache show "libstd-rust-web-$minor=$version" | sed -n 's/^Depends:.*\(libllvm[0-9]*\).*/\1/p' | head -n1)
[ -n "$llvm" ] || { echo "libstd-rust-web-$minor $version names no libllvm" >&2; exit 1; }
llvm_version=$(apt-cache show "$llvm" | sed -n 's/^Version: //p' | sort -V | tail -n1)
for spec in "rustc-web=$version" "libstd-rust-web-$minor=$version" "libstd-rust-web-dev=$version" "$llvm=$llvm_version"; do
    l=$(show "$spec" | line_of amd64 apt-verified)
    [ -n "$l" ] || { echo "apt has no entry for $spec" >&2; exit 1; }
    lines+=("$l")
done

pool=$(show "libstd-rust-web-dev=$version" | sed -n 's/^Filename: //p')
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
case "$pool" in
pool/updates/*) first=$codename-security ;;
*) first=$codename ;;
esac
suites=$first
for other in "$codename-security" "$codename" "$codename-updates" "$codename-proposed-updates"; do
    [ "$other" = "$first" ] || suites="$suites $other"
done
bases=$( (sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
    awk '/^deb / && $2 ~ /^http/ {print $2}' /etc/apt/sources.list 2>/dev/null || true) | sed 's#/*$##' | awk 'NF && !seen[$0]++')
entry_of() { # index file (compressed): the libstd-rust-web-dev stanza of $version
    case "$1" in *.xz) xz -dc "$1" ;; *) gzip -dc "$1" ;; esac |
        awk -v v="$version" 'BEGIN{RS=""} index($0, "Package: libstd-rust-web-dev\n") == 1 && index($0, "\nVersion: " v "\n")'
}
verified_entry() { # arch: prints the stanza from an index that matches a gpgv-verified InRelease
    local arch=$1 try s base compressed candidate expected url
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
                    for url in "$base/dists/$s/main/binary-$arch/by-hash/SHA256/$expected" "$base/dists/$s/$candidate"; do
                        curl -fsSL "$url" -o "Packages-$arch.$compressed" 2>/dev/null || continue
                        if echo "$expected  Packages-$arch.$compressed" | sha256sum -c --quiet >/dev/null 2>&1; then
                            local entry
                            entry=$(entry_of "Packages-$arch.$compressed")
                            if [ -n "$entry" ]; then
                                echo "$arch: listed in $url, verified against $s's InRelease" >&2
                                echo "$entry"
                                return 0
                            fi
                            break
                        fi
                        echo "WARNING: $url does not match $s's signed InRelease (mirror mid-sync?)" >&2
                    done
                done
            done
        done
        [ "$try" = 3 ] || { echo "WARNING: no verified $arch index lists libstd-rust-web-dev $version; trying again in 60 s" >&2; sleep 60; }
    done
    return 1
}
security_base=$(echo "$bases" | grep security | head -n1)
main_base=$(echo "$bases" | grep -v security | head -n1)
for arch in arm64 armhf; do
    if [[ " $trusted " == *" $arch "* ]]; then
        case "$first" in *-security) base=$security_base ;; *) base=$main_base ;; esac
        url=$base/dists/$first/main/binary-$arch/Packages.xz
        curl -fsSL "$url" -o "Packages-$arch.xz"
        entry=$(entry_of "Packages-$arch.xz")
        how="index-not-matching-InRelease-$(date -u +%F)"
        echo "WARNING: $arch's entry taken from $url without checking it against InRelease (--trust-index)" >&2
    else
        entry=$(verified_entry "$arch") || {
            echo "no $arch index that matches a signed InRelease lists libstd-rust-web-dev $version;" \
                 "the lock is left as it was (--trust-index $arch takes the index as served, and says so in the lock)" >&2
            exit 1
        }
        how=InRelease-verified
    fi
    l=$(echo "$entry" | line_of "$arch" "$how")
    [ -n "$l" ] || { echo "no libstd-rust-web-dev $version for $arch" >&2; exit 1; }
    lines+=("$l")
done

{
    cat <<'HEAD'
# The Debian packages cross/setup.sh unpacks into the cross toolchain, pinned
# by version, pool path and SHA-256 (as Cargo.lock pins crates). setup.sh
# fetches each from the archive's pool by its path and checks it against its
# SHA-256; it reads no index. Written by cross/pin.sh, which takes each line
# from an index verified against the archive's signed Release files (the
# last column says how); run it again when setup.sh says the archive offers
# another rustc-web, and commit this file.
#
# arch package version pool-path sha256 how-verified
HEAD
    printf '%s\n' "${lines[@]}"
} >"$lock.new"
mv "$lock.new" "$lock"
echo "wrote $lock:"
grep -v '^#' "$lock"
