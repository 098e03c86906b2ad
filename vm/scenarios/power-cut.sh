# Scenario: a full upgrade through the real unit, apt in its own transient
# unit (systemd-run, A9). Boot 1: while dpkg runs the new package's
# postinst, the agent's whole cgroup is killed (apt must live on in its own
# unit), then the host cuts the power. Boot 2: the agent starts by itself,
# repairs dpkg, runs the step again and the job succeeds once.
set -u
. /mnt/scenario/common.sh
boot=$1
if [ "$boot" = 1 ]; then
    prepare_upgrade drover-slow repo2
    check "the agent is active" test "$(systemctl is-active drover-agent)" = active
    drover-agent upgrade >/tmp/upgrade.log 2>&1 &
    for _ in $(seq 1 240); do
        [ -e /var/lib/drover-slow-once ] && break
        sleep 1
    done
    check "dpkg reached the new postinst" test -e /var/lib/drover-slow-once
    unit=$(systemctl list-units --plain --no-legend 'drover-call-*' | awk '/full-upgrade/ {print $1; exit}')
    check "apt runs in its own transient unit" test -n "$unit"
    echo "apt's unit: $unit"
    systemctl kill --signal=KILL drover-agent
    sleep 2
    check "apt's unit outlived the agent's cgroup" test "$(systemctl is-active "$unit")" = active
    check "dpkg is still running" sh -c 'pgrep -x dpkg >/dev/null'
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
