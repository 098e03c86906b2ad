#!/usr/bin/env bash
# Boots the VM image of the agent package's architecture (vm/image.sh) on a
# fresh overlay with a scenario disk and runs one scenario
# (vm/scenarios/NAME.sh) to its end, across the reboots it asks for and the
# power cuts the host makes. Usage:
#   vm/run.sh NAME AGENT_DEB [EXTRA_FILE...]
# The scenario's lines reach the serial console as "DROVER-VM: ...". A line
# "DROVER-VM: CUT-POWER" makes the host kill QEMU at once (a power cut) and
# boot again on the same disk; a guest reboot boots again too; a poweroff
# ends the run. Prints the scenario's lines; exits 1 if it printed FAIL or
# never printed DONE. A scenario that says "# machines: N" runs on N
# machines made from the one image, one after the other, each on its own
# fresh overlay with the file "machine" on its scenario disk saying which
# (1..N); each must print DONE. A boot that prints nothing of the scenario's
# for DROVER_VM_SILENT_SECONDS (240) is stuck before the guest's system
# started (TCG has hung in the firmware, rarely): it is killed and booted
# again, once per machine, and said so.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: vm/run.sh NAME AGENT_DEB [FILE...]}
deb=${2:?usage: vm/run.sh NAME AGENT_DEB [FILE...]}
shift 2
arch=$(dpkg-deb -f "$deb" Architecture)
image=$(bash "$here/image.sh" "$arch")
work=$(mktemp -d /var/tmp/drover-vm-run.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/scenario"
cp "$here/scenarios/$name.sh" "$work/scenario/run.sh"
cp "$here/scenarios/common.sh" "$work/scenario/common.sh"
cp "$deb" "$work/scenario/drover-agent.deb"
for extra in "$@"; do cp -r "$extra" "$work/scenario/"; done
# A scenario that says "# uses: control-plane" gets one on the host (vm/host.sh)
# and a user-mode network card to reach it; its "DROVER-VM: HOST ..." lines
# are run by vm/host.sh, and their PASS/FAIL lines count in the verdict.
nic=(-nic none)
hosted=0
: >"$work/host.log"
if grep -q '^# uses: control-plane' "$here/scenarios/$name.sh"; then
    hosted=1
    trap 'bash "$here/host.sh" stop "$work" || true; rm -rf "$work"' EXIT
    bash "$here/host.sh" start "$work" "$work/scenario" | tee -a "$work/host.log"
    nic=(-netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=)
fi
handled=0
host_requests() { # serial: runs the HOST lines not yet handled
    local lines count
    lines=$(grep -a "DROVER-VM: HOST " "$1" | sed 's/\r$//; s/.*DROVER-VM: HOST //' || true)
    count=$(printf '%s' "$lines" | grep -c . || true)
    while [ "$handled" -lt "$count" ]; do
        handled=$((handled + 1))
        # shellcheck disable=SC2086 # the request's words are its arguments
        set -- $(printf '%s\n' "$lines" | sed -n "${handled}p")
        local request=$1
        shift
        bash "$here/host.sh" "$request" "$work" "$@" 2>&1 | tee -a "$work/host.log" | sed 's/^/[host] /'
    done
}
machines=$(sed -n 's/^# machines: \([0-9]*\)$/\1/p' "$here/scenarios/$name.sh")
machines=${machines:-1}
boot_limit=${DROVER_VM_BOOT_SECONDS:-420}
silent_limit=${DROVER_VM_SILENT_SECONDS:-240}
# Boots machine N (a fresh overlay of the image) until its scenario ends;
# its consoles are $work/serial.N.BOOT.
run_machine() { # machine
local machine=$1
echo "$machine" >"$work/scenario/machine"
rm -f "$work/scenario.img" "$work/disk.qcow2"
qemu-img create -q -f qcow2 -b "$image/disk.raw" -F raw "$work/disk.qcow2"
mkfs.ext4 -q -L scenario -d "$work/scenario" "$work/scenario.img" 256M
local boot=0 stuck_again=0
while [ "$boot" -lt 4 ]; do
    boot=$((boot + 1))
    serial=$work/serial.$machine.$boot
    : >"$serial"
    handled=0 # HOST lines handled in this boot's console
    started=$(date +%s)
    "$image/boot.sh" \
        -drive "file=$work/disk.qcow2,if=virtio,format=qcow2" \
        -drive "file=$work/scenario.img,if=virtio,format=raw,readonly=on" \
        "${nic[@]}" -nographic -serial "file:$serial" -monitor none -no-reboot &
    qemu=$! # boot.sh execs QEMU: this is QEMU itself
    cut=0 stuck=0
    while kill -0 "$qemu" 2>/dev/null; do
        [ "$hosted" = 1 ] && host_requests "$serial"
        if grep -aq "DROVER-VM: CUT-POWER" "$serial"; then
            kill -9 "$qemu" # the power cut: no shutdown, no flush
            cut=1
            break
        fi
        if [ "$stuck_again" = 0 ] && [ $(($(date +%s) - started)) -gt "$silent_limit" ] &&
            ! grep -aq "DROVER-VM: " "$serial"; then
            echo "[boot $boot] nothing from the guest in $silent_limit s: stuck before its system started; booting again"
            kill -9 "$qemu"
            stuck=1
            break
        fi
        if [ $(($(date +%s) - started)) -gt "$boot_limit" ]; then
            echo "[boot $boot] no end after $boot_limit s; killing the VM"
            kill -9 "$qemu"
            break
        fi
        sleep 0.5
    done
    wait "$qemu" || true
    if [ "$stuck" = 1 ]; then
        # The guest never ran its scenario: this boot is made again.
        stuck_again=1
        mv "$serial" "$serial.stuck"
        boot=$((boot - 1))
        continue
    fi
    [ "$hosted" = 1 ] && host_requests "$serial"
    seconds=$(($(date +%s) - started))
    grep -a "DROVER-VM: " "$serial" | sed 's/\r$//' | sed "s/^/[boot $boot, ${seconds}s] /" || true
    if [ "$cut" = 1 ]; then
        echo "[boot $boot] power cut by the host"
        continue
    fi
    if grep -aq "reboot: Restarting system" "$serial"; then
        echo "[boot $boot] the guest rebooted"
        continue
    fi
    break
done
last_serial=$serial
}
for machine in $(seq 1 "$machines"); do
    [ "$machines" = 1 ] || echo "[machine $machine of $machines]"
    run_machine "$machine"
    if ! grep -aq "DROVER-VM: DONE" "$work"/serial."$machine".*; then
        echo "vm scenario $name: machine $machine did not finish"
        tail -n 60 "$last_serial" | sed 's/^/    /'
        exit 1
    fi
done
all=$(cat "$work"/serial.* | grep -a "DROVER-VM: " || true)
if grep -q "^FAIL" "$work/host.log"; then
    echo "vm scenario $name: FAILED on the host's side"
    grep "^FAIL" "$work/host.log" | sed 's/^/    /'
    exit 1
fi
if echo "$all" | grep -q "DROVER-VM: FAIL"; then
    echo "vm scenario $name: FAILED"
    tail -n 60 "$last_serial" | sed 's/^/    /'
    exit 1
fi
if ! echo "$all" | grep -q "DROVER-VM: DONE"; then
    echo "vm scenario $name: did not finish"
    tail -n 60 "$last_serial" | sed 's/^/    /'
    exit 1
fi
echo "vm scenario $name: passed"
