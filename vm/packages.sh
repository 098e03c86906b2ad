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
#   repo6  with the image's KERNEL_RELEASE (vm/image.sh's kernel.release):
#          linux-image-NEXT, a kernel of the same flavour one ABI newer
#          (its module tree and /boot/vmlinuz-NEXT, a stand-in: the VM
#          boots the image's kernel directly, so it never runs), pulled in
#          as Debian's are, by a newer linux-image-FLAVOUR (epoch 1, so it
#          is newer than the image's), and no /run/reboot-required: the
#          agent's kernel rule alone asks for the reboot; NEXT is in
#          OUT/next-kernel.release
set -euo pipefail
out=${1:?usage: vm/packages.sh OUT AGENT_DEB [KERNEL_RELEASE]}
agent=${2:?usage: vm/packages.sh OUT AGENT_DEB [KERNEL_RELEASE]}
kernel_release=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name version repo [preinst body] [postinst body] [depends] [files: one
# absolute path a line, each shipped holding a line that says what it is]
package() {
    local tree=$work/$1_$2 file
    mkdir -p "$tree/DEBIAN" "$tree/usr/share/doc/$1" "$out/$3"
    printf 'Package: %s\nVersion: %s\nArchitecture: all\n%bMaintainer: Drover tests <tests@drover.invalid>\nDescription: Drover VM test package\n' \
        "$1" "$2" "${6:+Depends: $6\n}" >"$tree/DEBIAN/control"
    echo "$2" >"$tree/usr/share/doc/$1/version"
    for file in ${7:-}; do
        mkdir -p "$tree$(dirname "$file")"
        echo "drover VM stand-in from $1 $2" >"$tree$file"
    done
    local script
    for script in preinst postinst; do
        local body=${4:-}
        [ "$script" = postinst ] && body=${5:-}
        [ -n "$body" ] || continue
        printf '#!/bin/sh\nset -e\n%s\nexit 0\n' "$body" >"$tree/DEBIAN/$script"
        chmod 0755 "$tree/DEBIAN/$script"
    done
    dpkg-deb --root-owner-group -Zgzip --build "$tree" "$out/$3/$1_${2#*:}_all.deb" >/dev/null
}

hold() { # version: the preinst body that holds dpkg mid-unpack, once
    cat <<HOLD
if [ "\$1" = upgrade ] && [ ! -e /var/lib/drover-held-$1 ]; then
    touch /var/lib/drover-held-$1
    sync
    echo "DROVER-VM: dpkg is held in drover-slow $1's preinst" >/dev/console 2>/dev/null || true
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
    echo "DROVER-VM: drover-loop postinst: killing the agent and this call" >/dev/console 2>/dev/null || true
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
dpkg-deb --root-owner-group -Zxz --build "$work/agent" \
    "$out/repo3/drover-agent_next_$(dpkg-deb -f "$agent" Architecture).deb" >/dev/null
repos="repo1 repo2 repo3 repo4 repo5"
if [ -n "$kernel_release" ]; then
    # 6.1.0-50-arm64 -> 6.1.0-51-arm64: the same upstream and flavour.
    abi=$(echo "$kernel_release" | cut -d- -f2)
    next_kernel="${kernel_release%%-*}-$((abi + 1))-${kernel_release#*-*-}"
    version="${kernel_release%%-*}-$((abi + 1))"
    package "linux-image-$next_kernel" "$version" repo6 "" "" "" \
        "/lib/modules/$next_kernel/modules.dep /boot/vmlinuz-$next_kernel"
    package "linux-image-${kernel_release#*-*-}" "1:$version" repo6 "" "" "linux-image-$next_kernel"
    echo "$next_kernel" >"$out/next-kernel.release"
    repos="$repos repo6"
fi
for repo in $repos; do
    (cd "$out/$repo" && dpkg-scanpackages -m . 2>/dev/null >Packages)
done
