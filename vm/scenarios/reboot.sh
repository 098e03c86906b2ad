# Scenario: one full upgrade that upgrades the agent's own package and a
# package that asks for a reboot. dpkg replaces the running agent's binary
# without stopping it (A9), the agent reboots the machine for real, and the
# job succeeds only under the new boot id, once.
set -u
. /mnt/scenario/common.sh
boot=$1
if [ "$boot" = 1 ]; then
    prepare_upgrade drover-reboot repo3
    cat /proc/sys/kernel/random/boot_id >/var/lib/drover-vm-boot1
    systemctl show -p MainPID --value drover-agent >/var/lib/drover-vm-pid1
    sync
    drover-agent upgrade >/tmp/upgrade.log 2>&1 &
    # The job reboots the machine; if it does not, say so.
    sleep 400
    echo "FAIL the job did not reboot the machine"
    cat /tmp/upgrade.log
    echo DONE
    systemctl poweroff
else
    wait_job
    check "the job succeeded after the reboot" test "$state" = Succeeded
    check "it is one job" test "$(drover-agent jobs | grep -c systemUpgradeV1)" = 1
    check "the machine really rebooted" test "$(cat /proc/sys/kernel/random/boot_id)" != "$(cat /var/lib/drover-vm-boot1)"
    check "the job upgraded its own agent" test "$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' drover-agent)" = "ii 0.1.0-99"
    check "and the package that asked for the reboot" test "$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' drover-reboot)" = "ii 2.0"
    check "the agent runs again" test "$(systemctl is-active drover-agent)" = active
    check "dpkg has nothing left to do" sh -c '[ -z "$(dpkg --audit)" ]'
    echo DONE
    systemctl poweroff
fi
