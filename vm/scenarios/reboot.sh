# uses: control-plane
# Scenario: a system upgrade job from the control plane on the host that
# upgrades the agent's own package and a package that asks for a reboot.
# dpkg replaces the running agent's binary without stopping it (A9), the
# agent reboots the machine for real, and the job succeeds only under the
# new boot id, once, no step run twice. The agent that runs afterwards is
# the new binary and reports the new version to the control plane.
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
else
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
    echo DONE
    systemctl poweroff
fi
