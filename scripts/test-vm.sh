#!/usr/bin/env bash
# The VM suite: the agent's .deb on a real systemd (PID 1) in a disposable
# Debian bookworm VM (QEMU, TCG; direct kernel boot), one fresh overlay per
# scenario. Proves what chroots cannot: Type=notify readiness, the watchdog,
# apt in its own transient unit (systemd-run), the agent's cgroup killed
# mid-upgrade, and a power cut resumed at the next boot. The image and QEMU
# are made once and cached in /var/tmp/drover-vm (about 3 minutes); each
# scenario boots in 1-2 minutes; two talk to a real `drover serve` on this
# host. CI runs it after the cross suite.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
command -v debootstrap >/dev/null && command -v qemu-img >/dev/null && command -v dpkg-scanpackages >/dev/null || {
    apt-get -o DPkg::Lock::Timeout=600 update -q || true
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
        debootstrap qemu-utils dpkg-dev e2fsprogs python3
}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)-1
deb=target/debs/drover-agent_${version}_amd64.deb
if [ ! -f "$deb" ]; then
    cargo build --release -p drover-agent -p drover
    bash cross/package-deb.sh amd64 target/release target/debs
fi
# The control plane the hosted scenarios run on this host (vm/host.sh): the
# release build if there is one, else the cross suite's amd64 build, else
# the test command's debug build.
for bin in target/release/drover target/cross/x86_64-unknown-linux-gnu/release/drover target/debug/drover; do
    if [ -x "$bin" ]; then
        DROVER_BIN=$(pwd)/$bin
        break
    fi
done
if [ -z "${DROVER_BIN:-}" ]; then
    cargo build --release -p drover
    DROVER_BIN=$(pwd)/target/release/drover
fi
export DROVER_BIN
echo "control plane for the hosted scenarios: $DROVER_BIN"
extra=$(mktemp -d)
trap 'rm -rf "$extra"' EXIT
bash vm/packages.sh "$extra/repos" "$deb"
# The control plane's package too: the install scenario runs drover.service.
cp "target/debs/drover_${version}_amd64.deb" "$extra/drover.deb"
bash vm/image.sh >/dev/null
echo "vm image ready after $(($(date +%s) - started)) s"
passed=0
failed=0
for scenario in install agent-restart power-cut reboot loop; do
    t0=$(date +%s)
    if bash vm/run.sh "$scenario" "$deb" "$extra/repos" "$extra/drover.deb"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
    echo "scenario $scenario took $(($(date +%s) - t0)) s"
done
echo "vm suite: $passed passed, $failed failed in $(($(date +%s) - started)) s"
[ "$failed" = 0 ]
