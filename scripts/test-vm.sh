#!/usr/bin/env bash
# The VM suite: the agent's .deb on a real systemd (PID 1) in a disposable
# Debian bookworm VM (QEMU, TCG; direct kernel boot), one fresh overlay per
# scenario. Proves what chroots cannot: Type=notify readiness, the watchdog,
# apt in its own transient unit (systemd-run), the agent's cgroup killed
# mid-upgrade, a power cut resumed at the next boot, and a reboot by the
# guest. The image and QEMU are made once per architecture and cached in
# /var/tmp/drover-vm; three scenarios talk to a real `drover serve` on this
# host, and one of them (enroll) boots two machines from the one image.
#
#   bash scripts/test-vm.sh                      # amd64, every scenario
#   bash scripts/test-vm.sh --arch arm64         # install, power-cut, reboot
#   bash scripts/test-vm.sh --arch armhf         # install, power-cut
#   bash scripts/test-vm.sh --arch armhf --all   # all six
#   bash scripts/test-vm.sh --arch arm64 --only install,power-cut
#
# The ARM packages come from the cross suite (cross/build.sh), which this
# script runs when they are missing. docs/testing.md gives each scenario's
# measured time per architecture.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/target-cache.sh
started=$(date +%s)
arch=amd64
all=0
only=
while [ $# -gt 0 ]; do
    case "$1" in
    --arch) arch=${2:?--arch needs amd64, arm64 or armhf}; shift 2 ;;
    --all) all=1; shift ;;
    --only) only=${2:?--only needs scenario names, comma-separated}; shift 2 ;;
    *) echo "usage: scripts/test-vm.sh [--arch amd64|arm64|armhf] [--all] [--only A,B]" >&2; exit 2 ;;
    esac
done
# Without --all, each architecture runs what its binary could break there
# (CI's choice: each ARM scenario takes 2-4 minutes under TCG). amd64 runs
# all six. arm64, the fleet's main device class: the package under
# systemd, a power cut mid-dpkg, the reboot through a job with the agent's
# own upgrade. armhf: the package, and a power cut (its 32-bit store
# recovering). agent-restart (systemd's cgroups) and loop (the agent's
# crash-loop rule) are about systemd and the agent's logic, not the
# machine: amd64 runs them.
every="install agent-restart power-cut reboot loop enroll"
case "$arch" in
amd64) scenarios=$every ;;
arm64) scenarios="install power-cut reboot" ;;
armhf) scenarios="install power-cut" ;;
*) echo "unknown architecture $arch" >&2; exit 2 ;;
esac
[ "$all" = 1 ] && scenarios=$every
[ -n "$only" ] && scenarios=${only//,/ }
command -v debootstrap >/dev/null && command -v qemu-img >/dev/null && command -v dpkg-scanpackages >/dev/null || {
    apt-get -o DPkg::Lock::Timeout=600 update -q || true
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends \
        debootstrap qemu-utils dpkg-dev e2fsprogs python3
}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)-1
deb=target/debs/drover-agent_${version}_${arch}.deb
if [ ! -f "$deb" ]; then
    if [ "$arch" = amd64 ]; then
        cargo build --release -p drover-agent -p drover
        bash cross/package-deb.sh amd64 target/release target/debs
    else
        bash cross/setup.sh
        bash cross/build.sh "$arch"
        [ -f "$deb" ] || { echo "$arch: $deb was not built (see cross/setup.sh's and cross/build.sh's output)" >&2; exit 1; }
    fi
fi
# The control plane the hosted scenarios run on this host (vm/host.sh): the
# cross suite's amd64 build (CI's, built this run), else a release build,
# else the test command's debug build.
for bin in target/cross/x86_64-unknown-linux-gnu/release/drover target/release/drover target/debug/drover; do
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
image=$(bash vm/image.sh "$arch")
echo "$arch vm image ready after $(($(date +%s) - started)) s"
[ -s "$image/kernel.release" ] || { echo "vm/image.sh printed '$image', which holds no kernel.release" >&2; exit 1; }
bash vm/packages.sh "$extra/repos" "$deb" "$(cat "$image/kernel.release")"
# The control plane's package too: the install scenario runs drover.service.
# CI builds it for amd64 only (scripts/test-cross.sh): on ARM without it,
# the scenario says so and checks the agent's unit alone.
cp_deb=target/debs/drover_${version}_${arch}.deb
if [ -f "$cp_deb" ]; then
    cp_file=$extra/drover.deb
    cp "$cp_deb" "$cp_file"
elif [ "$arch" != amd64 ]; then
    echo "no $cp_deb: the cross suite builds the control plane for amd64 only (cross/build.sh without --control-plane builds it for $arch)" | tee "$extra/drover.absent"
    cp_file=$extra/drover.absent
else
    echo "no $cp_deb" >&2
    exit 1
fi
passed=0
failed=0
for scenario in $scenarios; do
    t0=$(date +%s)
    if bash vm/run.sh "$scenario" "$deb" "$extra/repos" "$cp_file"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
    echo "scenario $scenario ($arch) took $(($(date +%s) - t0)) s (load: $(cut -d' ' -f1-3 /proc/loadavg))"
done
echo "vm suite ($arch): $passed passed, $failed failed in $(($(date +%s) - started)) s"
[ "$failed" = 0 ]
