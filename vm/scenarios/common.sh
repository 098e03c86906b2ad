# Shared by the scenarios (sourced from the scenario disk).
check() { # name command...: one PASS or FAIL line
    name=$1
    shift
    if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fi
}

# The agent's config: no control plane reachable (the scenarios drive it
# through its status socket), the updater in MODE.
write_config() { # mode
    cat >/etc/drover/agent.toml <<CONF
device_id = "vm-1"
intent_public_keys = ["0000000000000000000000000000000000000000000000000000000000000000"]
[transport]
kind = "websocket"
server_url = "ws://127.0.0.1:9"
token = "vm-test-token"
[updater]
mode = "$1"
min_free_mib = 50
CONF
}
export DEBIAN_FRONTEND=noninteractive

# Waits (at most 300 s) until COUNT upgrade jobs (default 1) ended; sets
# $state to Succeeded when they all succeeded, else Failed, and prints the
# agent's jobs.
wait_job() { # [count]
    state=
    for _ in $(seq 1 300); do
        jobs=$(drover-agent jobs 2>/dev/null | grep systemUpgradeV1 || true)
        if echo "$jobs" | grep -Eq "Failed|Expired|Rejected|Cancelled"; then
            state=Failed
            break
        fi
        if [ "$(echo "$jobs" | grep -c Succeeded)" -ge "${1:-1}" ]; then
            state=Succeeded
            break
        fi
        sleep 1
    done
    drover-agent jobs
}

# Waits (at most SECONDS) until COMMAND... succeeds; fails if it never does.
wait_for() { # seconds command...
    limit=$1
    shift
    for _ in $(seq 1 "$limit"); do
        "$@" && return 0
        sleep 1
    done
    "$@"
}

# Waits (at most 120 s) until the agent is connected and has sent every
# status, so the control plane on the host has what the guest saw.
wait_sent() {
    for _ in $(seq 1 120); do
        status=$(drover-agent status 2>/dev/null || true)
        if echo "$status" | grep -q "unsent status: 0" && echo "$status" | grep -q " connected"; then
            return 0
        fi
        sleep 1
    done
    echo "FAIL the agent did not send every status to the control plane"
    drover-agent status || true
}

# Waits (at most 300 s) for a test package's preinst to hold dpkg mid-unpack
# (vm/packages.sh); it goes on once /run/drover-go-VERSION exists.
wait_held() { # version
    for _ in $(seq 1 300); do
        [ -e "/var/lib/drover-held-$1" ] && return 0
        sleep 1
    done
    return 1
}

# The transient unit apt's full-upgrade runs in, if one runs.
apt_unit() {
    systemctl list-units --plain --no-legend 'drover-call-*' | awk '/full-upgrade/ {print $1; exit}'
}

# How many full-upgrades apt ran on this machine (its own history).
full_upgrades() {
    grep -c '^Commandline: .*full-upgrade' /var/log/apt/history.log || true
}

# Boot 1 of an upgrade scenario: the agent installed from the scenario disk,
# PACKAGE 1.0 from repo1, apt pointed at NEXT_REPO, the agent running in
# upgrade mode.
prepare_upgrade() { # package next_repo
    apt-get install -y -q /mnt/scenario/drover-agent.deb >/tmp/apt.log 2>&1
    echo 'deb [trusted=yes] file:/mnt/scenario/repos/repo1 ./' >/etc/apt/sources.list
    apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "$1" >/dev/null 2>&1
    check "$1 1.0 installed" test "$(dpkg-query -W -f '${Version}' "$1")" = 1.0
    echo "deb [trusted=yes] file:/mnt/scenario/repos/$2 ./" >/etc/apt/sources.list
    if [ -f /mnt/scenario/agent.toml ]; then
        # Made by vm/host.sh: the control plane on the host, over wss.
        install -m 0644 /mnt/scenario/agent.toml /mnt/scenario/ca.pem /etc/drover/
        install -m 0600 /mnt/scenario/agent.token /etc/drover/agent.token
    else
        write_config upgrade
    fi
    systemctl enable --now drover-agent >/dev/null 2>&1
}
