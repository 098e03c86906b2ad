#!/usr/bin/env bash
# Tests cross/fetch-pinned.sh against a mirror of its own on loopback
# (python3's http.server in a temporary directory) whose armhf index does
# not match its InRelease, as Debian's security mirror's did for days in
# December 2026: the pinned package is fetched from the pool all the same;
# a pool file that does not match its pin is refused and never cached; a
# cached file is used without the mirror, and a spoilt one is fetched
# again; a pin the pool no longer holds says how to move the pin.
#
#   bash cross/test-pin.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
server=
cleanup() {
    [ -z "$server" ] || kill "$server" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
passed=0
ok() { echo "ok: $1"; passed=$((passed + 1)); }
fail() { echo "FAILED: $1" >&2; exit 1; }

# The mirror: a real .deb in the security archive's pool, an InRelease and
# an armhf index that does not match it.
mirror=$work/mirror/debian-security
pool=pool/updates/main/d/drover-pin-test
mkdir -p "$work/pkg/DEBIAN" "$work/pkg/usr/share/drover-pin-test" "$mirror/$pool" "$mirror/dists/bookworm-security/main/binary-armhf"
printf 'Package: drover-pin-test\nVersion: 1.0-1\nArchitecture: armhf\nMaintainer: Drover <drover@invalid>\nDescription: test\n' >"$work/pkg/DEBIAN/control"
echo payload >"$work/pkg/usr/share/drover-pin-test/file"
dpkg-deb --root-owner-group -b "$work/pkg" "$mirror/$pool/drover-pin-test_1.0-1_armhf.deb" >/dev/null
sha=$(sha256sum "$mirror/$pool/drover-pin-test_1.0-1_armhf.deb" | cut -d' ' -f1)
echo "stale index" | xz >"$mirror/dists/bookworm-security/main/binary-armhf/Packages.xz"
printf 'SHA256:\n %s 1 main/binary-armhf/Packages.xz\n' "$(echo other | sha256sum | cut -d' ' -f1)" >"$mirror/dists/bookworm-security/InRelease"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
serve() { # the mirror on $port, returned once it answers
    python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work/mirror" >"$work/http.log" 2>&1 &
    server=$!
    for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/" >/dev/null && break; sleep 0.1; done
}
serve
export DROVER_CROSS_MIRRORS="http://127.0.0.1:$port/debian-security"
lock=$work/test.lock
pin() { echo "# test" >"$lock"; echo "armhf drover-pin-test $1 $pool/$2 $3 test" >>"$lock"; }
cache=$work/cache

# 1. The index is stale; the pinned file comes from the pool all the same.
pin 1.0-1 drover-pin-test_1.0-1_armhf.deb "$sha"
out=$(bash "$here/fetch-pinned.sh" "$lock" "$cache" 2>"$work/err") || { cat "$work/err" >&2; fail "a pinned package on a mirror with a stale index"; }
[ "$out" = "$cache/drover-pin-test_1.0-1_armhf.deb" ] && dpkg-deb -f "$out" Version | grep -qx 1.0-1 ||
    fail "fetch-pinned.sh printed '$out'"
ok "fetched from the pool while the armhf index does not match its InRelease"

# 2. The cache serves it with no mirror at all.
kill "$server"; wait "$server" 2>/dev/null || true; server=
bash "$here/fetch-pinned.sh" "$lock" "$cache" 2>"$work/err" >/dev/null && grep -q "cached in" "$work/err" ||
    fail "the cached package was not used without the mirror: $(cat "$work/err")"
ok "a cached package is used without the mirror"
serve

# 3. A spoilt cached copy is not used: it is fetched again and checked.
echo spoilt >"$cache/drover-pin-test_1.0-1_armhf.deb"
bash "$here/fetch-pinned.sh" "$lock" "$cache" 2>"$work/err" >/dev/null && grep -q "fetched and checked" "$work/err" &&
    echo "$sha  $cache/drover-pin-test_1.0-1_armhf.deb" | sha256sum -c --quiet ||
    fail "a spoilt cached copy: $(cat "$work/err")"
ok "a cached copy that does not match its pin is fetched again"

# 4. The pool's file does not match the pin: refused, and not cached.
rm -f "$cache"/*
pin 1.0-1 drover-pin-test_1.0-1_armhf.deb "$(echo other | sha256sum | cut -d' ' -f1)"
if bash "$here/fetch-pinned.sh" "$lock" "$cache" >/dev/null 2>"$work/err"; then fail "a package that does not match its pin was taken"; fi
grep -q "does not match its pin" "$work/err" || fail "no word of the mismatch: $(cat "$work/err")"
[ -z "$(ls -A "$cache")" ] || fail "a package that does not match its pin was left in the cache: $(ls "$cache")"
ok "a pool file that does not match its pin is refused and not cached"

# 5. The pool no longer holds the pinned version: the message says how to move the pin.
pin 0.9-1 drover-pin-test_0.9-1_armhf.deb "$sha"
if bash "$here/fetch-pinned.sh" "$lock" "$cache" >/dev/null 2>"$work/err"; then fail "a version the pool does not hold was taken"; fi
grep -q "cannot fetch drover-pin-test 0.9-1 (armhf)" "$work/err" && grep -q "bash cross/pin.sh" "$work/err" ||
    fail "the message for a pin the pool no longer holds: $(cat "$work/err")"
ok "a pin the pool no longer holds says how to move the pin"
echo "pin tests: $passed passed, 0 failed"
