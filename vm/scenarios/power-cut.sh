# Scenario: a full upgrade through the real unit, apt in its own transient
# unit (systemd-run, A9). Boot 1: dpkg is held in the new package's preinst,
# mid-unpack (dpkg has marked it half-installed), and the host cuts the
# power. Boot 2: the agent starts by itself, repairs dpkg, runs the step
# again and the job succeeds once, every package installed and configured.
set -u
. /mnt/scenario/common.sh
boot=$1
if [ "$boot" = 1 ]; then
    prepare_upgrade drover-slow repo2
    check "the agent is active" test "$(systemctl is-active drover-agent)" = active
    drover-agent upgrade >/tmp/upgrade.log 2>&1 &
    check "dpkg is unpacking drover-slow 2.0" wait_held 2.0
    unit=$(apt_unit)
    check "apt runs in its own transient unit" test -n "$unit"
    echo "apt's unit: $unit"
    status=$(dpkg-query -W -f '${db:Status-Abbrev}' drover-slow)
    echo "drover-slow's dpkg status at the cut: '$status'"
    # i: wanted installed; H: half-installed; R: reinstall required.
    check "dpkg has marked drover-slow half-installed" test "$status" = "iHR"
    sync
    echo "CUT-POWER"
    sleep 600
else
    # Boot 2: the agent was started by systemd; wait for the job to end.
    wait_job
    check "the interrupted upgrade succeeded after the power cut" test "$state" = Succeeded
    check "drover-slow 2.0 is installed and configured" \
        test "$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' drover-slow)" = "ii 2.0"
    check "one job, not two" test "$(drover-agent jobs | grep -c 'systemUpgradeV1')" = 1
    check "dpkg has nothing left to do" sh -c '[ -z "$(dpkg --audit)" ]'
    echo DONE
    systemctl poweroff
fi
