#!/usr/bin/env bash
# check-no-test-hooks.sh AGENT [RUNNER...]: proves that a drover-agent built
# without its `testing` feature (what the .deb ships) refuses every test hook
# in its config: the `[testing]` table (hold before a step, skewed clock,
# short job budget) and `boot_id_path`. RUNNER runs a foreign binary (qemu).
set -euo pipefail
agent=$1; shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
base='device_id = "hooks-check"
intent_public_keys = ["4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065"]
[transport]
kind = "websocket"
server_url = "ws://127.0.0.1:9"
token = "t"
[updater]
mode = "simulate"'
printf '%s\n' "$base" > "$work/good.toml"
"$@" "$agent" --config "$work/good.toml" check >/dev/null
check() {
    local name=$1 text=$2 key=$3
    shift 3
    printf '%s\n' "$text" > "$work/$name.toml"
    if out=$("$@" "$agent" --config "$work/$name.toml" check 2>&1); then
        echo "the agent accepted the test hook $key: $out" >&2
        exit 1
    fi
    grep -q "\`$key\` is a test hook" <<<"$out" || { echo "unclear refusal of $key: $out" >&2; exit 1; }
}
check hold "$base
[testing]
hold_before_step = \"full-upgrade\"
hold_file = \"/tmp/h\"
reached_file = \"/tmp/r\"" testing "$@"
check clock "$base
[testing]
clock_offset_seconds = 3600" testing "$@"
check boot "boot_id_path = \"/tmp/boot\"
$base" boot_id_path "$@"
echo "$(basename "$agent"): test hooks refused (built without the testing feature)"
