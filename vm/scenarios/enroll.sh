# uses: control-plane
# machines: 2
# Scenario (issue 55): one image, many devices. Two machines are made from
# the one image, each with its own machine id, the agent's package and one
# file for any device (its id from the machine id, an enrollment token, the
# CA; no token of its own). Each agent makes its own key at its first
# start and asks to join the control plane on the host: the first with an
# auto-accept token, accepted at once; the second with a token that waits
# for an operator, who accepts it. Each then runs a system upgrade from a
# TaskRun for it alone.
set -u
. /mnt/scenario/common.sh
machine=$(cat /mnt/scenario/machine)
apt-get install -y -q /mnt/scenario/drover-agent.deb >/tmp/apt.log 2>&1
check "apt installs the package" test "$(dpkg-query -W -f '${db:Status-Abbrev}' drover-agent)" = "ii "
# A machine made from an image gets a machine id of its own at its first
# boot: the image's is replaced here by a random one, as systemd makes for
# an image whose machine id was cleared (systemd-machine-id-setup would take
# QEMU's UUID, the same for both machines).
tr -d '-' </proc/sys/kernel/random/uuid >/etc/machine-id
# The journal is kept under the machine id: journald takes the new one.
systemctl restart systemd-journald
device=vm-$(cat /etc/machine-id)
echo "machine $machine is $device"
# What to upgrade: drover-slow 1.0 now, 2.0 waiting (not held: its go file
# is there before the job).
echo 'deb [trusted=yes] file:/mnt/scenario/repos/repo1 ./' >/etc/apt/sources.list
apt-get update -q >/dev/null 2>&1 && apt-get install -y -q drover-slow >/dev/null 2>&1
echo 'deb [trusted=yes] file:/mnt/scenario/repos/repo2 ./' >/etc/apt/sources.list
touch /run/drover-go-2.0
# One file, as `drover enrollment-tokens create --agent-config` made it for
# the machine's token: its id's template, the token, the CA, the intent key.
if [ "$machine" = 1 ]; then kind=auto; else kind=manual; fi
install -m 0600 "/mnt/scenario/enroll-$kind.toml" /etc/drover/agent.toml
systemctl enable drover-agent >/dev/null 2>&1
systemctl restart drover-agent >/dev/null 2>&1
check "the agent made its own key" wait_for 60 test -s /var/lib/drover-agent/device.key
check "the agent keeps the CA from its one file" test -s /var/lib/drover-agent/ca.pem
check "only root reads it" test "$(stat -c %a /var/lib/drover-agent/device.key)" = 600
if [ "$kind" = auto ]; then
    echo "HOST expect-key $device accepted token/vm-image"
else
    waiting() { journalctl -u drover-agent -o cat | grep -q "waiting for an operator"; }
    check "the agent waits for an operator" wait_for 120 waiting
    echo "HOST expect-key $device pending -"
    echo "HOST accept $device"
fi
echo "HOST apply-run-for enroll-$machine $device"
wait_job
check "machine $machine's upgrade succeeded" test "$state" = Succeeded
check "drover-slow 2.0 is installed" test "$(dpkg-query -W -f '${Version}' drover-slow)" = 2.0
wait_sent
echo "HOST expect-run enroll-$machine"
echo DONE
systemctl poweroff
