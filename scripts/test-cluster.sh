#!/usr/bin/env bash
# The NATS cluster kill tests (tests/tests/nats_cluster.rs), N times each
# (default 10): three nodes, three control-plane replicas, the JetStream
# meta leader or a follower and a replica SIGKILLed mid-rollout. They are
# not in the README's test command yet: about one run in ten still fails
# after the restart (issue 18). Prints how many runs passed.
# Usage: bash scripts/test-cluster.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
cargo build --workspace --bins
cargo build -p drover-agent --bins --features testing,sled-store
passed=0
for i in $(seq "$runs"); do
  if cargo test -q -p drover-tests --test nats_cluster -- --ignored > "target/cluster-run-$i.log" 2>&1; then
    passed=$((passed + 1))
  else
    echo "run $i failed: target/cluster-run-$i.log"
  fi
done
echo "cluster kill tests: $passed of $runs runs passed"
