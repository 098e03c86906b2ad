#!/usr/bin/env bash
# Fetches the packages a lock file pins (cross/toolchain.lock's format:
# arch package version pool-path sha256 how) from the archive's pool by
# their paths into DIR, checks each against its pinned SHA-256, and prints
# each file's path. A file already in DIR that matches its pin is not
# fetched again; one that does not match is never used. No index is read.
#
#   bash cross/fetch-pinned.sh LOCK DIR
#
# The archives are the apt sources' base URIs (pool/updates/ paths from the
# security archive, the others from the main one), or the space-separated
# DROVER_CROSS_MIRRORS (the cross suite's test of this script).
set -euo pipefail
lock=${1:?usage: fetch-pinned.sh LOCK DIR}
dir=${2:?usage: fetch-pinned.sh LOCK DIR}
mkdir -p "$dir"
if [ -n "${DROVER_CROSS_MIRRORS:-}" ]; then
    bases=$(tr ' ' '\n' <<<"$DROVER_CROSS_MIRRORS")
else
    bases=$( (sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
        awk '/^deb / && $2 ~ /^http/ {print $2}' /etc/apt/sources.list 2>/dev/null || true) | sed 's#/*$##' | awk 'NF && !seen[$0]++')
    [ -n "$bases" ] || bases=$'http://deb.debian.org/debian\nhttp://deb.debian.org/debian-security'
fi
matches() { echo "$1  $2" | sha256sum -c --quiet >/dev/null 2>&1; }
grep -v '^#' "$lock" | awk 'NF' | while read -r arch package pinned path sha how; do
    file=$dir/$(basename "$path")
    if [ -f "$file" ] && matches "$sha" "$file"; then
        echo "$arch $package $pinned: cached in $file" >&2
        echo "$file"
        continue
    fi
    got=no
    tried=
    for base in $bases; do
        case "$path" in
        pool/updates/*) [[ "$base" == *security* ]] || continue ;;
        *) [[ "$base" == *security* ]] && continue ;;
        esac
        tried="$tried $base/$path"
        curl -fsSL --retry 3 --retry-delay 5 "$base/$path" -o "$file.part" 2>/dev/null || continue
        if matches "$sha" "$file.part"; then
            mv "$file.part" "$file"
            got=yes
            break
        fi
        echo "WARNING: $base/$path does not match its pin $sha in $(basename "$lock")" >&2
    done
    rm -f "$file.part"
    if [ "$got" = no ]; then
        echo "cannot fetch $package $pinned ($arch) pinned in $(basename "$lock") with SHA-256 $sha; tried:${tried:- no archive serves $path}" >&2
        echo "If the archive has moved on from $pinned, move the pin: bash cross/pin.sh, check the diff, commit cross/toolchain.lock." >&2
        exit 1
    fi
    echo "$arch $package $pinned: fetched and checked against its pin ($how)" >&2
    echo "$file"
done
