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

# Waits (at most 300 s) for the local upgrade job to end; sets $state to
# Succeeded or Failed, and prints the agent's jobs.
wait_job() {
    state=
    for _ in $(seq 1 300); do
        line=$(drover-agent jobs 2>/dev/null | grep systemUpgradeV1 | head -n1 || true)
        case "$line" in
            *Succeeded*) state=Succeeded; break ;;
            *Failed* | *Expired* | *Rejected*) state=Failed; break ;;
        esac
        sleep 1
    done
    drover-agent jobs
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
    write_config upgrade
    systemctl enable --now drover-agent >/dev/null 2>&1
}
