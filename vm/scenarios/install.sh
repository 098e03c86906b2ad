# Scenario: the .deb installs with apt, the unit is active only once the
# agent said READY=1 (it answers on its status socket the moment `systemctl
# start` returns), and the watchdog restarts an agent that stops answering.
set -u
. /mnt/scenario/common.sh
apt-get install -y -q /mnt/scenario/drover-agent.deb >/tmp/apt.log 2>&1
check "apt installs the package" test "$(dpkg-query -W -f '${db:Status-Abbrev}' drover-agent)" = "ii "
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
