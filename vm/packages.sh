#!/usr/bin/env bash
# Builds the scenario repositories into OUT:
#   repo1  drover-slow 1.0, drover-reboot 1.0, drover-loop 1.0
#   repo2  drover-slow 2.0: its preinst holds dpkg mid-unpack (the package is
#          half-installed) until /run/drover-go-2.0 exists, at most 300 s,
#          the first time it runs; long enough for the host to cut the power
#          or for the guest to kill or restart the agent while dpkg unpacks
#   repo3  drover-reboot 2.0 (its postinst asks for a reboot) and AGENT_DEB
#          repacked as the next Debian revision with a binary that differs,
#          so a job upgrades its own agent
#   repo4  drover-slow 3.0, held like 2.0 until /run/drover-go-3.0
#   repo5  drover-loop 2.0: its postinst kills the agent and its own call,
#          every time it runs
set -euo pipefail
out=${1:?usage: vm/packages.sh OUT AGENT_DEB}
agent=${2:?usage: vm/packages.sh OUT AGENT_DEB}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

package() { # name version repo [preinst body] [postinst body]
    local tree=$work/$1_$2
    mkdir -p "$tree/DEBIAN" "$tree/usr/share/doc/$1" "$out/$3"
    printf 'Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: Drover tests <tests@drover.invalid>\nDescription: Drover VM test package\n' \
        "$1" "$2" >"$tree/DEBIAN/control"
    echo "$2" >"$tree/usr/share/doc/$1/version"
    local script
    for script in preinst postinst; do
        local body=${4:-}
        [ "$script" = postinst ] && body=${5:-}
        [ -n "$body" ] || continue
        printf '#!/bin/sh\nset -e\n%s\nexit 0\n' "$body" >"$tree/DEBIAN/$script"
        chmod 0755 "$tree/DEBIAN/$script"
    done
    dpkg-deb --root-owner-group -Zgzip --build "$tree" "$out/$3/$1_$2_all.deb" >/dev/null
}

hold() { # version: the preinst body that holds dpkg mid-unpack, once
    cat <<HOLD
if [ "\$1" = upgrade ] && [ ! -e /var/lib/drover-held-$1 ]; then
    touch /var/lib/drover-held-$1
    sync
    echo "DROVER-VM: dpkg is held in drover-slow $1's preinst" >/dev/ttyS0 2>/dev/null || true
    i=0
    while [ ! -e /run/drover-go-$1 ] && [ \$i -lt 300 ]; do sleep 1; i=\$((i + 1)); done
fi
HOLD
}

package drover-slow 1.0 repo1
package drover-slow 2.0 repo2 "$(hold 2.0)"
package drover-slow 3.0 repo4 "$(hold 3.0)"
package drover-reboot 1.0 repo1
package drover-reboot 2.0 repo3 "" 'touch /run/reboot-required
echo drover-reboot >>/run/reboot-required.pkgs'
package drover-loop 1.0 repo1
package drover-loop 2.0 repo5 "" 'if [ "$1" = configure ]; then
    echo "DROVER-VM: drover-loop postinst: killing the agent and this call" >/dev/ttyS0 2>/dev/null || true
    echo x >>/var/lib/drover-loop-runs
    sync
    systemctl kill --signal=KILL drover-agent.service
    systemctl kill --signal=KILL "$(sed -n "s#^0::.*/##p" /proc/self/cgroup)"
    sleep 30
fi'

# The agent itself, one Debian revision newer; its binary differs (bytes
# appended to the ELF file, which the loader ignores), so the scenario can
# tell which binary the running agent executes.
dpkg-deb -R "$agent" "$work/agent"
sed -i 's/^Version: \(.*\)-\([0-9]*\)$/Version: \1-99/' "$work/agent/DEBIAN/control"
next=$(sed -n 's/^Version: //p' "$work/agent/DEBIAN/control")
echo "$next" >"$work/agent/usr/share/drover-agent/version"
printf 'drover-vm-next-agent\n' >>"$work/agent/usr/bin/drover-agent"
if [ -f "$work/agent/DEBIAN/md5sums" ]; then
    (cd "$work/agent" && find . -type f ! -path './DEBIAN/*' -printf '%P\n' | sort | xargs md5sum) >"$work/agent/DEBIAN/md5sums"
fi
sha256sum "$work/agent/usr/bin/drover-agent" | cut -d' ' -f1 >"$out/next-agent.sha256"
echo "$next" >"$out/next-agent.version"
dpkg-deb --root-owner-group -Zxz --build "$work/agent" "$out/repo3/drover-agent_next_amd64.deb" >/dev/null
for repo in repo1 repo2 repo3 repo4 repo5; do
    (cd "$out/$repo" && dpkg-scanpackages -m . 2>/dev/null >Packages)
done
