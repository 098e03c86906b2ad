# Scenario: the .deb installs with apt, an unconfigured agent stops once
# with a clear line instead of restarting every 5 s, the unit is active only once the
# agent said READY=1 (it answers on its status socket the moment `systemctl
# start` returns), and the watchdog restarts an agent that stops answering.
set -u
. /mnt/scenario/common.sh
apt-get install -y -q /mnt/scenario/drover-agent.deb >/tmp/apt.log 2>&1
check "apt installs the package" test "$(dpkg-query -W -f '${db:Status-Abbrev}' drover-agent)" = "ii "
# Unconfigured (the shipped config names no device): the agent exits 78
# with one line saying what is wrong, and the unit does not restart it
# (RestartPreventExitStatus=78; RestartSec is still the shipped 5 s here).
# The unit's state decides, not a wait: once the agent has exited, a
# restart systemd means to make shows as the sub-state auto-restart; with
# none to come the unit is failed.
systemctl start drover-agent 2>/dev/null || true
unit_state() { echo "$(systemctl show -p ActiveState --value drover-agent)/$(systemctl show -p SubState --value drover-agent)"; }
exited() { [ "$(systemctl show -p ExecMainStatus --value drover-agent)" != 0 ]; }
check "the unconfigured agent exited" wait_for 60 exited
echo "the unit after the agent exited: $(unit_state)"
check "an unconfigured agent is not restarted" test "$(unit_state)" = failed/failed
check "nor was it restarted before" test "$(systemctl show -p NRestarts --value drover-agent)" = 0
check "it exited 78 (EX_CONFIG)" test "$(systemctl show -p ExecMainStatus --value drover-agent)" = 78
check "the journal says what to do" sh -c 'journalctl -u drover-agent --no-pager | grep -q "systemctl restart drover-agent"'
systemctl reset-failed drover-agent 2>/dev/null || true
write_config simulate
# A shorter watchdog than the shipped 120 s, so the test waits less.
mkdir -p /etc/systemd/system/drover-agent.service.d
printf '[Service]\nWatchdogSec=10\nRestartSec=1\n' >/etc/systemd/system/drover-agent.service.d/vm-test.conf
systemctl daemon-reload
check "the unit is Type=notify" test "$(systemctl show -p Type --value drover-agent)" = notify
systemctl start drover-agent
check "systemctl start returns with the unit active" test "$(systemctl is-active drover-agent)" = active
check "the agent answers at once" drover-agent --config /etc/drover/agent.toml status
pid=$(systemctl show -p MainPID --value drover-agent)
echo "main pid $pid; stopping it with SIGSTOP"
kill -STOP "$pid"
restarted=no
for _ in $(seq 1 60); do
    now=$(systemctl show -p MainPID --value drover-agent)
    if [ "$now" != "$pid" ] && [ "$now" != 0 ] && [ "$(systemctl is-active drover-agent)" = active ]; then
        restarted=yes
        break
    fi
    sleep 1
done
check "the watchdog restarted the stopped agent" test "$restarted" = yes
check "systemd says why" sh -c 'journalctl -u drover-agent --no-pager | grep -q "Watchdog timeout"'
check "the restarted agent answers" drover-agent --config /etc/drover/agent.toml status
echo "restarts: $(systemctl show -p NRestarts --value drover-agent)"
# The units' confinement as systemd itself rates it on a running system
# (the numbers docs/internals/security.md gives; lower is better).
exposure() { systemd-analyze security "$1" 2>/dev/null | sed -n 's/.*exposure level for .*: \([0-9.]*\).*/\1/p'; }
agent_exposure=$(exposure drover-agent.service)
echo "drover-agent.service exposure: $agent_exposure"
check "drover-agent.service is rated 3.0 or lower" awk -v e="$agent_exposure" 'BEGIN { exit !(e != "" && e <= 3.0) }'
# The control plane's package under its own unit: it serves (the operator's
# CLI reaches it with the token `init` wrote) with no capability, no other
# socket family and a system-call filter.
if [ -f /mnt/scenario/drover.deb ]; then
    apt-get install -y -q /mnt/scenario/drover.deb >>/tmp/apt.log 2>&1
    check "apt installs the control plane" test "$(dpkg-query -W -f '${db:Status-Abbrev}' drover)" = "ii "
    drover --data /var/lib/drover init --tls-name vm-1.test >/tmp/init.log 2>&1
    check "drover init prepares its data" test -s /var/lib/drover/operator.token
    systemctl start drover
    served=no
    for _ in $(seq 1 60); do
        if drover --data /var/lib/drover get devices >/tmp/get.log 2>&1; then
            served=yes
            break
        fi
        sleep 1
    done
    check "drover.service serves the CLI under its confinement" test "$served" = yes
    [ "$served" = yes ] || { cat /tmp/get.log; journalctl -u drover --no-pager | tail -20; }
    cp_pid=$(systemctl show -p MainPID --value drover)
    cp_user=$(ps -o user= -p "$cp_pid" 2>/dev/null || true)
    echo "drover.service runs as pid $cp_pid, user ${cp_user:-none}"
    check "it runs as its own dynamic user" sh -c "[ '$cp_pid' != 0 ] && [ -n '$cp_user' ] && [ '$cp_user' != root ]"
    cp_exposure=$(exposure drover.service)
    echo "drover.service exposure: $cp_exposure"
    check "drover.service is rated 2.0 or lower" awk -v e="$cp_exposure" 'BEGIN { exit !(e != "" && e <= 2.0) }'
elif [ -f /mnt/scenario/drover.absent ]; then
    echo "NOT CHECKED here: the control plane's unit: $(cat /mnt/scenario/drover.absent)"
else
    echo "FAIL the control plane's package is not on the scenario disk"
fi
echo DONE
systemctl poweroff
