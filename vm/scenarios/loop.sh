# Scenario: the loop breakers under systemd. drover-loop 2.0's postinst
# kills the agent and its own call every time it runs, so every resume of
# the upgrade (which repairs dpkg, which runs the postinst again) kills the
# agent again. The job must end Failed with a reason that names the loop
# after a bounded number of restarts (the step's lost-call limit trips
# before the job's resume limit), and the agent must then stay up.
set -u
. /mnt/scenario/common.sh
prepare_upgrade drover-loop repo5
drover-agent upgrade >/tmp/upgrade.log 2>&1 &
wait_job
check "the job ended Failed" test "$state" = Failed
error=$(drover-agent jobs | sed -n 's/^  error: //p' | head -n1)
echo "the job's error: $error"
check "the reason names the loop" sh -c "echo \"\$1\" | grep -q 'a crash or reboot loop'" - "$error"
runs=$(wc -l </var/lib/drover-loop-runs)
restarts=$(systemctl show -p NRestarts --value drover-agent)
echo "the postinst ran $runs times; systemd restarted the agent $restarts times"
check "the loop was broken after a bounded number of runs" test "$runs" -le 6
check "each run killed the agent once" test "$restarts" = "$runs"
# No more restarts once the job failed: the agent running now is the one
# that ended the job (its journal has the job's progress to Failed), nothing of apt or dpkg runs that
# could call the postinst again, and systemd counts no restart since.
pid=$(systemctl show -p MainPID --value drover-agent)
ended_by_this_agent() { journalctl _PID="$pid" -o cat | grep 'job progress' | grep -q Failed; }
no_package_manager() { ! pgrep -x 'apt|apt-get|dpkg' >/dev/null; }
check "the agent that ended the job is the one running" wait_for 60 ended_by_this_agent
check "no apt or dpkg runs" wait_for 60 no_package_manager
check "no more restarts once the job failed" test "$(systemctl show -p NRestarts --value drover-agent)" = "$restarts"
check "the agent that ended the job is still the one running" test "$(systemctl show -p MainPID --value drover-agent)" = "$pid"
check "the agent stays up and answers" drover-agent status
echo DONE
systemctl poweroff
