#!/usr/bin/env bash
# The control plane on the host, for scenarios that say `# uses: control-plane`.
# vm/run.sh calls it; the guest asks for things with console lines
# "DROVER-VM: HOST COMMAND ARGS" (each handled once, in order):
#   start WORK SCENARIO_DIR  (run.sh, before boot 1) a real `drover serve` on
#                            loopback with TLS for agents made here (a CA and
#                            a certificate for 10.0.2.2, the host as the guest
#                            sees it), Device vm-1, and the agent's config,
#                            token and CA file on the scenario disk; for
#                            devices that enroll, one file per enrollment
#                            token from `enrollment-tokens create
#                            --agent-config` (its id from the machine id):
#                            enroll-auto.toml accepts at once,
#                            enroll-manual.toml waits for an operator
#   apply-run NAME           once vm-1's agent has connected: a TaskRun NAME
#                            (systemUpgradeV1) for it
#   expect-run NAME          the run is Complete with its one device Succeeded
#   expect-version VERSION   vm-1 reported agent version VERSION
#   expect-key DEVICE STATE BY
#                            DEVICE enrolled its own key, which is STATE
#                            (pending, accepted), decided by BY (- for none)
#   accept DEVICE            an operator accepts DEVICE's key
#   apply-run-for NAME DEVICE
#                            once DEVICE's agent has connected: a TaskRun NAME
#                            for it alone
#   stop WORK                (run.sh, at the end) stops the control plane
# Checks print "PASS ..." or "FAIL ...", which count in the scenario's verdict.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
command=${1:?usage: vm/host.sh COMMAND WORK ARGS}
work=${2:?usage: vm/host.sh COMMAND WORK ARGS}
shift 2
drover_bin=${DROVER_BIN:-$here/../target/release/drover}
[ -f "$work/cp.env" ] && . "$work/cp.env"
drover() { "$drover_bin" "$@"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

json() { # expression over the JSON on stdin
    python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"
}

# Polls CONDITION (a shell function) every 2 s for at most SECONDS.
poll() { # seconds condition
    local deadline=$(($(date +%s) + $1))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        if "$2"; then return 0; fi
        sleep 2
    done
    return 1
}

device_field() { # field [device]
    drover get device "${2:-vm-1}" -o json 2>/dev/null | json "d['status'].get('$1')" 2>/dev/null || true
}

key_field() { # device field: of the device's enrolled key
    drover devices keys -o json 2>/dev/null |
        json "[k.get('$2') for k in d if k['device'] == '$1'][0] if any(k['device'] == '$1' for k in d) else None" 2>/dev/null || true
}

case "$command" in
start)
    scenario=${1:?start needs SCENARIO_DIR}
    tls=$work/tls
    mkdir -p "$tls"
    # A CA the agent pins and a server certificate it signs, for 10.0.2.2.
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=drover-vm-ca -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
        -subj /CN=10.0.2.2 -keyout "$tls/key.pem" -out "$tls/req.pem" 2>/dev/null
    printf 'subjectAltName=IP:10.0.2.2\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$tls/ext"
    openssl x509 -req -in "$tls/req.pem" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" -CAcreateserial \
        -days 2 -extfile "$tls/ext" -out "$tls/cert.pem" 2>/dev/null
    api=$(free_port)
    agent=$(free_port)
    printf 'export DROVER_SERVER=http://127.0.0.1:%s DROVER_DATA=%s\n' "$api" "$work/cp" >"$work/cp.env"
    . "$work/cp.env"
    "$drover_bin" serve --listen "127.0.0.1:$api" --agent-listen "127.0.0.1:$agent" --download-listen 127.0.0.1:0 \
        --agent-tls-cert "$tls/cert.pem" --agent-tls-key "$tls/key.pem" >"$work/cp.log" 2>&1 &
    echo $! >"$work/cp.pid"
    up() { drover get devices >/dev/null 2>&1; }
    poll 60 up || { echo "the control plane did not start:"; cat "$work/cp.log"; exit 1; }
    printf 'apiVersion: fleet.nationtech.io/v1alpha1\nkind: Device\nmetadata:\n  name: vm-1\nspec:\n  groups: [vm]\n' >"$work/device.yaml"
    drover apply -f "$work/device.yaml" >/dev/null
    drover token vm-1 >"$scenario/agent.token"
    cp "$tls/ca.pem" "$scenario/ca.pem"
    cat >"$scenario/agent.toml" <<CONF
device_id = "vm-1"
intent_public_keys = ["$(drover intent-key)"]
[transport]
kind = "websocket"
server_url = "wss://10.0.2.2:$agent"
token_file = "/etc/drover/agent.token"
ca_file = "/etc/drover/ca.pem"
[updater]
mode = "upgrade"
min_free_mib = 50
CONF
    # One file per enrollment token, as the README makes it: the id's
    # template, the token, the CA inline, the intent key. Only quicker
    # timings and a smaller free-space floor for the VM's disk are added.
    for kind in auto manual; do
        case $kind in
        auto) token=(vm-image --groups vm --auto-accept) ;;
        manual) token=(vm-by-hand --groups vm) ;;
        esac
        drover enrollment-tokens create "${token[@]}" --device-id 'vm-{machine-id}' \
            --agent-config "wss://10.0.2.2:$agent" --agent-ca-file "$tls/ca.pem" 2>/dev/null |
            sed -e 's/^\[transport\]$/[transport]\nheartbeat_seconds = 5\nbackoff_max_seconds = 5/' \
                -e 's/^mode = "upgrade"$/mode = "upgrade"\nmin_free_mib = 50/' >"$scenario/enroll-$kind.toml"
        grep -q '^min_free_mib = 50$' "$scenario/enroll-$kind.toml" ||
            { echo "enrollment-tokens create --agent-config made no config:"; cat "$scenario/enroll-$kind.toml"; exit 1; }
    done
    echo "control plane on 127.0.0.1:$api, agents on 127.0.0.1:$agent (10.0.2.2:$agent in the guest)"
    ;;
expect-key)
    device=${1:?expect-key needs DEVICE STATE BY}
    want_state=${2:?expect-key needs DEVICE STATE BY}
    want_by=${3:?expect-key needs DEVICE STATE BY}
    [ "$want_by" = - ] && want_by=None
    stands() { [ "$(key_field "$device" state)" = "$want_state" ]; }
    poll 300 stands || true
    got="$(key_field "$device" state) $(key_field "$device" decidedBy)"
    if [ "$got" = "$want_state $want_by" ]; then
        echo "PASS [host] $device enrolled its key: $got"
    else
        echo "FAIL [host] $device's key: state and decided by = $got, not $want_state $want_by"
    fi
    ;;
accept)
    device=${1:?accept needs DEVICE}
    if drover devices accept "$device" >/dev/null; then
        echo "[host] accepted $device"
    else
        echo "FAIL [host] drover devices accept $device"
    fi
    ;;
apply-run-for)
    name=${1:?apply-run-for needs NAME DEVICE}
    device=${2:?apply-run-for needs NAME DEVICE}
    present() { [ "$(device_field agentPresent "$device")" = True ]; }
    if ! poll 300 present; then
        echo "FAIL [host] $device's agent never connected"
        exit 0
    fi
    echo "PASS [host] $device is in the fleet, in group(s) $(drover get device "$device" -o json | json "','.join(d['spec']['groups'])")"
    printf 'apiVersion: fleet.nationtech.io/v1alpha1\nkind: TaskRun\nmetadata:\n  name: %s\nspec:\n  allowedGroups: [vm]\n  targetSelector:\n    matchLabels:\n      device-id: %s\n  deadlineSeconds: 3600\n  systemUpgradeV1: {}\n' \
        "$name" "$device" >"$work/$name.yaml"
    drover apply -f "$work/$name.yaml" >/dev/null
    echo "[host] applied TaskRun $name for $device"
    ;;
apply-run)
    name=${1:?apply-run needs NAME}
    present() { [ "$(device_field agentPresent)" = True ]; }
    if ! poll 300 present; then
        echo "FAIL [host] vm-1's agent never connected"
        exit 0
    fi
    printf 'apiVersion: fleet.nationtech.io/v1alpha1\nkind: TaskRun\nmetadata:\n  name: %s\nspec:\n  allowedGroups: [vm]\n  deadlineSeconds: 3600\n  systemUpgradeV1: {}\n' \
        "$name" >"$work/$name.yaml"
    drover apply -f "$work/$name.yaml" >/dev/null
    echo "[host] applied TaskRun $name"
    ;;
expect-run)
    name=${1:?expect-run needs NAME}
    ended() {
        phase=$(drover get taskrun "$name" -o json 2>/dev/null | json "d['status']['phase']" 2>/dev/null || true)
        case "$phase" in Complete | Failed | DeadlineExceeded | Cancelled) return 0 ;; esac
        return 1
    }
    poll 300 ended || true
    counts=$(drover get taskrun "$name" -o json | json "'%s %s %s %s' % (d['status']['phase'], d['status']['targets'], d['status']['succeeded'], d['status']['failed'])")
    if [ "$counts" = "Complete 1 1 0" ]; then
        echo "PASS [host] TaskRun $name is Complete at the control plane: 1 target, 1 succeeded"
    else
        echo "FAIL [host] TaskRun $name: phase, targets, succeeded, failed = $counts"
    fi
    ;;
expect-version)
    want=${1:?expect-version needs VERSION}
    reported() { [ "$(device_field agentVersion)" = "$want" ]; }
    if poll 120 reported; then
        echo "PASS [host] vm-1 reports agent version $want"
    else
        echo "FAIL [host] vm-1 reports agent version $(device_field agentVersion), not $want"
    fi
    ;;
stop)
    if [ -f "$work/cp.pid" ]; then kill "$(cat "$work/cp.pid")" 2>/dev/null || true; fi
    ;;
*)
    echo "FAIL [host] unknown command $command"
    ;;
esac
