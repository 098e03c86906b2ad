#!/usr/bin/env bash
# Installs the .debs of ARCH into a disposable Debian root of that
# architecture and proves them there: dpkg -i, --version, the agent answering
# on its status socket, remove keeping config and state, purge leaving
# nothing. Foreign binaries run through qemu-user-static registered in a
# private binfmt_misc of a user namespace (cross/userns-run.sh), so the
# host's binfmt table is never touched. The root is made once per machine
# (debootstrap --foreign, then its second stage under emulation, ~4 min) and
# copied per run.
#
#   bash cross/install-check.sh arm64|armhf
set -euo pipefail
arch=${1:?usage: install-check.sh arm64|armhf}
here=$(cd "$(dirname "$0")" && pwd)
root_dir=$(cd "$here/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root_dir/Cargo.toml" | head -n1)-1
deb=$root_dir/target/debs/drover-agent_${version}_${arch}.deb
[ -f "$deb" ] || { echo "no $deb; run cross/build.sh $arch" >&2; exit 1; }
cache=${DROVER_TEST_ROOTS:-/var/tmp/drover-test-roots}
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
mirror=$(sed -n 's/^URIs: //p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -n1)
mirror=${mirror:-http://deb.debian.org/debian}
pristine=$cache/$suite-$arch-minbase
run() { bash "$here/userns-run.sh" "$work/root" "$arch" "$@"; }

mkdir -p "$cache/debs"
exec 9>"$cache/lock-$arch"
flock 9
if [ ! -e "$pristine.ready" ]; then
    rm -rf "$pristine"
    debootstrap --arch="$arch" --foreign --variant=minbase --cache-dir="$cache/debs" "$suite" "$pristine" "$mirror"
    bash "$here/userns-run.sh" "$pristine" "$arch" /debootstrap/debootstrap --second-stage
    touch "$pristine.ready"
fi
flock -u 9

work=$(mktemp -d "$cache/drover-$arch-XXXXXX")
agent=
# The agent runs inside the namespace, under emulation: find it by its config.
stop_agent() {
    if [ -n "$agent" ]; then
        pkill -TERM -f -- "$agent" 2>/dev/null || true
        for _ in $(seq 50); do pgrep -f -- "$agent" >/dev/null || break; sleep 0.1; done
        pkill -KILL -f -- "$agent" 2>/dev/null || true
        wait 2>/dev/null || true
        agent=
    fi
}
cleanup() {
    stop_agent
    rm -rf "$work"
}
trap cleanup EXIT
cp -a "$pristine" "$work/root"
cp "$deb" "$work/root/tmp/"
run dpkg -i "/tmp/$(basename "$deb")"
reported=$(run drover-agent --version)
[[ "$reported" == "drover-agent ${version%-1}" ]] || { echo "--version said: $reported" >&2; exit 1; }
grep -q '^drover:' "$work/root/etc/group" || { echo "no drover group" >&2; exit 1; }
[ -f "$work/root/lib/systemd/system/drover-agent.service" ] || { echo "no unit" >&2; exit 1; }
[ -s "$work/root/var/lib/dpkg/info/drover-agent.md5sums" ] || { echo "no md5sums" >&2; exit 1; }
run dpkg --verify drover-agent || { echo "dpkg --verify failed" >&2; exit 1; }
echo "$arch: installed, --version runs, md5sums verify"

config=/etc/drover/install-check-$arch.toml
cat > "$work/root$config" <<CONFIG
device_id = "install-$arch"
intent_public_keys = ["4131ea6931676e90420f76f3c1b8042b04b929b48156310c02c9a7b80adfe065"]
[transport]
kind = "websocket"
server_url = "ws://127.0.0.1:9"
token = "t"
[updater]
mode = "simulate"
CONFIG
run drover-agent --config "$config" run 2>"$work/agent.log" &
agent=$config
for _ in $(seq 300); do [ -S "$work/root/run/drover-agent/status.sock" ] && break; sleep 0.1; done
status=$(run drover-agent --config "$config" status --json || true)
grep -q "\"deviceId\": \"install-$arch\"" <<<"$status" \
    || { echo "the agent did not answer on its status socket: $status" >&2; tail -20 "$work/agent.log" >&2; exit 1; }
echo "$arch: the agent answers on its status socket"
stop_agent
rm -rf "$work/root/run/drover-agent" "$work/root$config"

# The operator's token, mode 0600 as the README says.
install -m 0600 /dev/null "$work/root/etc/drover/agent.token"
echo t > "$work/root/etc/drover/agent.token"
run dpkg -r drover-agent
[ -f "$work/root/etc/drover/agent.token" ] || { echo "remove dropped the token" >&2; exit 1; }
[ ! -e "$work/root/usr/bin/drover-agent" ] || { echo "binary left after remove" >&2; exit 1; }
[ -f "$work/root/etc/drover/agent.toml" ] || { echo "remove dropped the conffile" >&2; exit 1; }
[ -d "$work/root/var/lib/drover-agent" ] || { echo "remove dropped the state directory" >&2; exit 1; }
run dpkg -P drover-agent
for path in /etc/drover /var/lib/drover-agent /usr/share/doc/drover-agent /lib/systemd/system/drover-agent.service; do
    [ ! -e "$work/root$path" ] || { echo "$path left after purge" >&2; exit 1; }
done
echo "$arch: remove keeps config and state; purge leaves nothing"
