#!/usr/bin/env bash
# The benchmark: one command that builds what it measures and prints the
# performance figures of docs/benchmarks.md. It asserts nothing about time.
#   1. the agent's footprint over each transport beside Debian's
#      mender-client daemon (installed here from Debian's packages):
#      idle RSS/PSS and threads, bytes written idle and per job, peak RSS,
#      stripped binary sizes (arm64 and armhf too once cross/build.sh ran),
#      intent → accepted p50/p99 over 1,000 jobs per transport, and the
#      same agent on sled 0.34 beside redb (idle and per-job figures);
#   2. the fleet figures: drover-sim bench over WebSocket, NATS and MQTT,
#      and a Deployment 1,000 at once; then past one process: four
#      `drover serve` replicas on one JetStream store holding WebSocket
#      agents (a replica here admits 15,795 agents, 80 % of its 20,000
#      open files, so three cannot hold 50,000), and NATS agents over a
#      three-node cluster, at 10,000 and 50,000 devices (the simulator in
#      several processes);
#   3. the patch figures: 20,000 devices reporting one assessment each
#      (control-plane CPU, store growth, writes) and the patch views' times;
#   4. enrollment: 1,000 and 10,000 devices asking to join at once with an
#      auto-accept token over WebSocket, then connecting by their keys.
# Usage: bash scripts/bench.sh [--quick]
#   (--quick: 10 s idle, 100 acceptances, 1,000 devices)
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
[ "${1:-}" = --quick ] && quick=1
need=()
command -v nats-server >/dev/null || need+=(nats-server)
command -v mosquitto >/dev/null || need+=(mosquitto)
[ -x /usr/bin/mender ] || need+=(mender-client)
if [ "${#need[@]}" -gt 0 ]; then
    apt-get -o DPkg::Lock::Timeout=600 update -q || true
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${need[@]}"
fi
cargo build --release -p drover -p drover-sim
# The agent on its own, as the figures are about it; first the sled variant
# (its store chosen in the config), kept under another name.
cargo build --release -p drover-agent --features sled-store
cp target/release/drover-agent target/release/drover-agent-sled
cargo build --release -p drover-agent
ulimit -n "$(ulimit -Hn)"
sim=target/release/drover-sim
cross=()
for pair in arm64:aarch64-unknown-linux-gnu armhf:armv7-unknown-linux-gnueabihf; do
    bin=target/cross/${pair#*:}/release/drover-agent
    [ -f "$bin" ] && cross+=(--cross "${pair%%:*}=$bin")
done
echo "## $(date -u +%Y-%m-%d), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo), $(. /etc/os-release && echo "$PRETTY_NAME")"
echo
if [ "$quick" = 1 ]; then
    "$sim" footprint --idle-seconds 10 --jobs 2 --latency-jobs 100 \
        --variant sled=target/release/drover-agent-sled "${cross[@]}"
    sizes=1000
    large=1000
    replicated=1000
    patch=2000
else
    "$sim" footprint --idle-seconds 120 --jobs 5 --latency-jobs 500 \
        --variant sled=target/release/drover-agent-sled "${cross[@]}"
    sizes=1000,10000
    large=1000,10000,15000
    replicated=10000,50000
    patch=20000,50000
fi
# NATS on the nats-server 2.10 the cluster tests run (a cluster needs it:
# docs/operations.md), one node and three, in the same run.
DROVER_NATS_SERVER=$(bash scripts/fetch-nats-server.sh)
export DROVER_NATS_SERVER
echo
echo "NATS rows: $("$DROVER_NATS_SERVER" --version)"
echo
"$sim" bench --devices "$large" --transport websocket
"$sim" bench --devices "$sizes" --transport nats | tail -n +3
"$sim" bench --devices "$sizes" --transport nats --nats-cluster | tail -n +3
"$sim" bench --devices "$sizes" --transport mqtt | tail -n +3
echo
"$sim" bench --devices "$large" --transport websocket --deployment-concurrency 1000
echo
"$sim" bench --devices "$replicated" --transport websocket --replicas 4
"$sim" bench --devices "$replicated" --transport nats --nats-cluster | tail -n +3
echo
"$sim" patch --devices "$patch"
echo
# Enrollment (issue 55): devices of one image asking to join at once with
# one auto-accept token over WebSocket, then connecting by their keys.
"$sim" enroll --devices "$sizes"
