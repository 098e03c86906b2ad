#!/usr/bin/env bash
# The NATS cluster tests (tests/tests/nats_cluster.rs), N times (default
# 10): three nodes, three control-plane replicas, the JetStream meta leader
# or a follower and a replica SIGKILLed mid-rollout. The README's test
# command runs them once; this repeats them to measure how reliable they
# are (issue 18). Prints how many runs passed; a failed run's output stays
# in target/cluster-run-N.log.
# Usage: bash scripts/test-cluster.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
cargo build --workspace --bins
cargo build -p drover-agent --bins --features testing,sled-store
DROVER_TEST_CLUSTER_NATS_SERVER=$(bash scripts/fetch-nats-server.sh)
export DROVER_TEST_CLUSTER_NATS_SERVER
passed=0
for i in $(seq "$runs"); do
  if cargo test -q -p drover-tests --test nats_cluster > "target/cluster-run-$i.log" 2>&1; then
    passed=$((passed + 1))
  else
    echo "run $i failed: target/cluster-run-$i.log"
  fi
done
echo "cluster kill tests: $passed of $runs runs passed"
