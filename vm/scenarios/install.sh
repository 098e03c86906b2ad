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
systemctl start drover-agent 2>/dev/null || true
sleep 8
check "an unconfigured agent is not restarted" test "$(systemctl show -p NRestarts --value drover-agent)" = 0
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
echo DONE
systemctl poweroff
