#!/usr/bin/env bash
# Builds the scenario repositories into OUT: repo1 with drover-slow 1.0 and
# drover-reboot 1.0; repo2 with drover-slow 2.0, whose postinst (the first
# time it runs) says so on the console and then takes 300 s, long enough for
# the host to cut the power or kill the agent in the middle of dpkg; repo3
# with drover-reboot 2.0 (its postinst asks for a reboot) and AGENT_DEB
# repacked as the next Debian revision, so a job upgrades its own agent.
set -euo pipefail
out=${1:?usage: vm/packages.sh OUT AGENT_DEB}
agent=${2:?usage: vm/packages.sh OUT AGENT_DEB}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
build() { # version repo postinst
    local tree=$work/drover-slow_$1
    mkdir -p "$tree/DEBIAN" "$tree/usr/share/doc/drover-slow" "$out/$2"
    printf 'Package: drover-slow\nVersion: %s\nArchitecture: all\nMaintainer: Drover tests <tests@drover.invalid>\nDescription: Drover VM test package\n' \
        "$1" >"$tree/DEBIAN/control"
    echo "$1" >"$tree/usr/share/doc/drover-slow/version"
    if [ -n "$3" ]; then
        printf '#!/bin/sh\nset -e\n%s\nexit 0\n' "$3" >"$tree/DEBIAN/postinst"
        chmod 0755 "$tree/DEBIAN/postinst"
    fi
    dpkg-deb --root-owner-group -Zgzip --build "$tree" "$out/$2/drover-slow_$1_all.deb" >/dev/null
}
index() { (cd "$out/$1" && dpkg-scanpackages -m . 2>/dev/null >Packages); }
build 1.0 repo1 ""
build 2.0 repo2 'if [ "$1" = configure ] && [ ! -e /var/lib/drover-slow-once ]; then
    touch /var/lib/drover-slow-once; sync
    echo "DROVER-VM: IN-POSTINST" >/dev/ttyS0
    sleep 300
fi'
mkdir -p "$out/repo3"
for v in 1.0 2.0; do
    d=$work/reboot-$v
    mkdir -p "$d/DEBIAN" "$d/usr/share/doc/drover-reboot"
    printf 'Package: drover-reboot\nVersion: %s\nArchitecture: all\nMaintainer: Drover tests <tests@drover.invalid>\nDescription: Drover VM test package\n' "$v" >"$d/DEBIAN/control"
    echo "$v" >"$d/usr/share/doc/drover-reboot/version"
done
printf '#!/bin/sh\nset -e\ntouch /run/reboot-required\necho drover-reboot >>/run/reboot-required.pkgs\nexit 0\n' >"$work/reboot-2.0/DEBIAN/postinst"
chmod 0755 "$work/reboot-2.0/DEBIAN/postinst"
dpkg-deb --root-owner-group -Zgzip --build "$work/reboot-1.0" "$out/repo1/drover-reboot_1.0_all.deb" >/dev/null
dpkg-deb --root-owner-group -Zgzip --build "$work/reboot-2.0" "$out/repo3/drover-reboot_2.0_all.deb" >/dev/null
# The agent itself, one Debian revision newer.
dpkg-deb -R "$agent" "$work/agent"
sed -i 's/^Version: \(.*\)-\([0-9]*\)$/Version: \1-99/' "$work/agent/DEBIAN/control"
dpkg-deb --root-owner-group -Zxz --build "$work/agent" "$out/repo3/drover-agent_next_amd64.deb" >/dev/null
index repo1
index repo2
index repo3
