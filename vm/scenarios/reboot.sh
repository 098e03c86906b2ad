# uses: control-plane
# Scenario: two system upgrade jobs from the control plane on the host, each
# ending in a real reboot by the agent.
# Job 1 upgrades the agent's own package and a package that asks for a
# reboot (/run/reboot-required). dpkg replaces the running agent's binary
# without stopping it (A9), the agent reboots the machine, and the job
# succeeds only under the new boot id, once, no step run twice. The agent
# that runs afterwards is the new binary and reports the new version.
# Job 2 installs a kernel of the running kernel's flavour, one ABI newer,
# and nothing writes /run/reboot-required (as on Raspberry Pi OS): the
# agent's kernel rule alone reboots the machine. The new kernel is a
# stand-in the VM does not boot (vm/packages.sh): what is shown is the
# rule's reading and the reboot, and that the job ends once after it.
set -u
. /mnt/scenario/common.sh
boot=$1
if [ "$boot" = 1 ]; then
    prepare_upgrade drover-reboot repo3
    cat /proc/sys/kernel/random/boot_id >/var/lib/drover-vm-boot1
    sync
    old=$(cat /usr/share/drover-agent/version)
    echo "HOST expect-version $old"
    echo "HOST apply-run self-upgrade"
    # The job reboots the machine; if it does not, say so.
    sleep 500
    echo "FAIL the job did not reboot the machine"
    drover-agent jobs
    echo DONE
    systemctl poweroff
elif [ "$boot" = 2 ]; then
    wait_job
    check "the job succeeded after the reboot" test "$state" = Succeeded
    check "it is one job" test "$(drover-agent jobs | grep -c systemUpgradeV1)" = 1
    # The upgrade job's steps only: the agent's own assessment follows it
    # at once and may be listed (running, its steps not tried yet) above it.
    tries=$(drover-agent jobs | awk '/ systemUpgradeV1 / {inside = 1; next} / patchAssessmentV1 |^$/ {inside = 0}
        inside && $2 ~ /^[0-9][0-9][0-9][0-9]-/ {printf "%s=%s ", $1, $5}')
    echo "each step's tries: $tries"
    check "no step ran twice" sh -c "[ -n \"\$1\" ] && ! echo \"\$1\" | grep -Eq '=([02-9]|1[0-9])'" - "$tries"
    check "the machine really rebooted" test "$(cat /proc/sys/kernel/random/boot_id)" != "$(cat /var/lib/drover-vm-boot1)"
    next=$(cat /mnt/scenario/repos/next-agent.version)
    check "the job upgraded its own agent" test "$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' drover-agent)" = "ii $next"
    check "and the package that asked for the reboot" test "$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' drover-reboot)" = "ii 2.0"
    check "the agent runs again" test "$(systemctl is-active drover-agent)" = active
    pid=$(systemctl show -p MainPID --value drover-agent)
    check "the running agent is the new binary" \
        test "$(sha256sum "/proc/$pid/exe" | cut -d' ' -f1)" = "$(cat /mnt/scenario/repos/next-agent.sha256)"
    check "the agent says its new version" sh -c "drover-agent status | grep -q \"agent: *\$1\$\"" - "$next"
    check "dpkg has nothing left to do" sh -c '[ -z "$(dpkg --audit)" ]'
    wait_sent
    echo "HOST expect-version $next"
    echo "HOST expect-run self-upgrade"
    # Job 2: a kernel of the running flavour. The journal is kept on disk
    # from here, so the next boot reads why the agent rebooted.
    mkdir -p /var/log/journal
    systemd-tmpfiles --create --prefix /var/log/journal >/dev/null 2>&1 || true
    journalctl --flush
    cat /proc/sys/kernel/random/boot_id >/var/lib/drover-vm-boot2
    echo "deb [trusted=yes] file:/mnt/scenario/repos/repo6 ./" >/etc/apt/sources.list
    sync
    echo "running kernel $(uname -r); offered linux-image-$(cat /mnt/scenario/repos/next-kernel.release)"
    echo "HOST apply-run kernel"
    # The job reboots the machine; if it ends or waits without, say so.
    for _ in $(seq 1 500); do
        jobs=$(drover-agent jobs 2>/dev/null | grep systemUpgradeV1 || true)
        [ "$(echo "$jobs" | grep -c Succeeded)" -ge 2 ] && break
        echo "$jobs" | grep -Eq "Failed|Expired|Rejected|Cancelled" && break
        sleep 1
    done
    echo "FAIL the kernel job did not reboot the machine"
    drover-agent jobs
    echo DONE
    systemctl poweroff
else
    wait_job 2
    check "the kernel job succeeded after the reboot" test "$state" = Succeeded
    check "two jobs, not more" test "$(drover-agent jobs | grep -c systemUpgradeV1)" = 2
    check "the machine rebooted again" test "$(cat /proc/sys/kernel/random/boot_id)" != "$(cat /var/lib/drover-vm-boot2)"
    kernel=$(cat /mnt/scenario/repos/next-kernel.release)
    check "the kernel of the running flavour is installed" \
        test "$(dpkg-query -W -f '${db:Status-Abbrev}' "linux-image-$kernel")" = "ii "
    why=$(journalctl -b -1 -u drover-agent -o cat | grep "reboot needed" | tail -n1)
    echo "the agent's reason: $why"
    check "the kernel rule asked for the reboot, not a reboot-required file" \
        sh -c "echo \"\$1\" | grep -q \"kernel \$2 is installed, \$3 is running\"" - "$why" "$kernel" "$(uname -r)"
    check "dpkg has nothing left to do" sh -c '[ -z "$(dpkg --audit)" ]'
    wait_sent
    echo "HOST expect-run kernel"
    echo DONE
    systemctl poweroff
fi
