# uses: control-plane
# Scenario: two system upgrade jobs from the control plane on the host (a
# real `drover serve`, reached over wss). In the first, while dpkg unpacks,
# the agent's whole cgroup is killed (`systemctl kill --signal=KILL`); in the
# second, `systemctl restart drover-agent`. Each time apt and dpkg live on in
# their own transient unit, systemd starts the agent again, it re-attaches
# to the running apt, and the job succeeds once: apt's history shows one
# full-upgrade per job, and the control plane counts each run Complete.
# Then a job's lines are found in the journal by its JOB_ID field, and
# `drover-agent logs` prints what dpkg said.
set -u
. /mnt/scenario/common.sh
prepare_upgrade drover-slow repo2
echo "HOST apply-run restart-1"

# Run 1: kill the agent's cgroup while dpkg unpacks.
check "job 1: dpkg is unpacking drover-slow 2.0" wait_held 2.0
unit=$(apt_unit)
check "job 1: apt runs in its own transient unit" test -n "$unit"
pid=$(systemctl show -p MainPID --value drover-agent)
systemctl kill --signal=KILL drover-agent
gone() { ! kill -0 "$pid" 2>/dev/null; }
check "job 1: the agent's process is gone" wait_for 30 gone
check "job 1: apt's unit outlived the agent's cgroup" test "$(systemctl is-active "$unit")" = active
check "job 1: dpkg is still running" sh -c 'pgrep -x dpkg >/dev/null'
restarted() {
    for _ in $(seq 1 60); do
        now=$(systemctl show -p MainPID --value drover-agent)
        [ "$now" != 0 ] && [ "$now" != "$1" ] && [ "$(systemctl is-active drover-agent)" = active ] && return 0
        sleep 1
    done
    return 1
}
check "job 1: systemd started the agent again" restarted "$pid"
reattached() { journalctl -u drover-agent -o cat | grep -c "re-attaching to a call still running"; }
# Job N (drover-slow V held mid-unpack, the agent just replaced): lets dpkg
# go on once the new agent re-attached, then checks the job ended once,
# with one full-upgrade and a report of what dpkg upgraded.
finish_job() { # n version
    # The agent looks for its call at once; give it the time TCG needs.
    for _ in $(seq 1 30); do [ "$(reattached)" = "$1" ] && break; sleep 1; done
    touch "/run/drover-go-$2"
    wait_job "$1"
    check "job $1: every job so far succeeded" test "$state" = Succeeded
    check "job $1: drover-slow $2 is installed and configured" \
        test "$(dpkg-query -W -f '${db:Status-Abbrev}${Version}' drover-slow)" = "ii $2"
    check "job $1: apt ran one full-upgrade per job" test "$(full_upgrades)" = "$1"
    check "job $1: the restarted agent re-attached to the running apt" test "$(reattached)" = "$1"
    check "job $1: its report names the package dpkg upgraded" \
        test "$(drover-agent jobs | grep -c "upgrade: 1 upgraded")" = "$1"
}
finish_job 1 2.0
wait_sent
echo "HOST expect-run restart-1"

# Run 2: restart the agent while dpkg unpacks.
echo 'deb [trusted=yes] file:/mnt/scenario/repos/repo4 ./' >/etc/apt/sources.list
echo "HOST apply-run restart-2"
check "job 2: dpkg is unpacking drover-slow 3.0" wait_held 3.0
unit=$(apt_unit)
check "job 2: apt runs in its own transient unit" test -n "$unit"
pid=$(systemctl show -p MainPID --value drover-agent)
systemctl restart drover-agent
check "job 2: systemctl restart gave a new agent" test "$(systemctl show -p MainPID --value drover-agent)" != "$pid"
check "job 2: apt's unit outlived the restart" test "$(systemctl is-active "$unit")" = active
finish_job 2 3.0
check "no call was ever taken for lost" test "$(journalctl -u drover-agent -o cat | grep -c "a call was lost")" = 0
check "two jobs, not more" test "$(drover-agent jobs | grep -c systemUpgradeV1)" = 2
check "dpkg has nothing left to do" sh -c '[ -z "$(dpkg --audit)" ]'
# Issue 56: each job's journal lines carry its id as a field of their own,
# and the device keeps apt's and dpkg's whole output for `drover-agent logs`.
# (An upgrade's: the agent's own assessments are jobs too, and list first.)
job=$(drover-agent jobs | awk '$3 == "systemUpgradeV1" { print $2; exit }')
check "a job id to look for" test -n "$job"
check "journalctl finds the job's lines by JOB_ID" sh -c "journalctl -u drover-agent JOB_ID=$job -o cat | grep -q 'job progress'"
check "drover-agent logs shows dpkg unpacking drover-slow" sh -c "drover-agent logs $job | grep -q 'Unpacking drover-slow'"
wait_sent
echo "HOST expect-run restart-2"
echo DONE
systemctl poweroff
