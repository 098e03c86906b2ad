#!/usr/bin/env bash
# Runs the workspace's tests as `cargo test --workspace --all-features`
# would, but the end-to-end test binaries (tests/tests/*.rs) several at a
# time: most of their time is spent waiting (a minute's cron tick, a
# broker's restart, a job held in a step), not computing, and one after
# another they took 14 minutes on 2 cores. Binaries whose tests race a
# deadline against a loaded machine (a deployment's 40 s, a cluster's
# leader election) run afterwards, alone. Each binary's output goes to
# target/test-artefacts/logs/NAME.log and is printed whole when it ends;
# the run fails if any binary failed, naming it.
#   DROVER_TEST_JOBS  binaries at once (default 2; 1 runs them one by one)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${DROVER_TEST_JOBS:-2}
logs=target/test-artefacts/logs
rm -rf "$logs"
mkdir -p "$logs"
# Where hostile.rs's tables record the rows they ran (its rows_dir()).
rm -rf "${CARGO_TARGET_DIR:-target}/tmp/hostile-rows"

# Every crate's unit and doc tests but the end-to-end ones, in cargo's order.
# (Cargo's JSON messages are counted by scripts/cargo-tally.py, which passes
# the tests' own output through.)
cargo test --workspace --all-features --exclude drover-tests --message-format=json-render-diagnostics |
  python3 scripts/cargo-tally.py "unit tests"
cargo test -p drover-tests --all-features --lib --message-format=json-render-diagnostics |
  python3 scripts/cargo-tally.py "the tests' library"

# The end-to-end binaries: built once, then run directly, longest first.
cargo test -p drover-tests --all-features --tests --no-run --message-format=json \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])
    if m.get("reason") == "compiler-artifact":
        print(json.dumps({"reason": "compiler-artifact", "fresh": m.get("fresh")}), file=sys.stderr)
' 2> >(python3 scripts/cargo-tally.py "end-to-end test binaries" >&2) > "$logs/binaries.txt"
longest_first="nats schedule apt_upgrade package mqtt hostile scenarios demo packages"
alone="deployment nats_cluster"
{
  for name in $longest_first; do grep "^$name " "$logs/binaries.txt" || true; done
  grep -v -E "^($(echo "$longest_first $alone" | tr ' ' '|')) " "$logs/binaries.txt" || true
} | awk '{print NR-1, $1, $2}' > "$logs/order.txt"
for name in $alone; do grep "^$name " "$logs/binaries.txt" || true; done \
  | awk -v n="$(wc -l < "$logs/order.txt")" '{print n+NR-1, $1, $2}' > "$logs/alone.txt"
count=$(( $(wc -l < "$logs/order.txt") + $(wc -l < "$logs/alone.txt") ))
[ "$count" -gt 0 ] || { echo "no end-to-end test binaries were built"; exit 1; }
echo "running $count end-to-end test binaries, $jobs at a time, then $(wc -l < "$logs/alone.txt") alone"

run_one() {
  local block=$1 name=$2 exe=$3 logs=$4 started=$SECONDS rc=0
  (cd tests && DROVER_TEST_PORT_BLOCK=$block "$exe") > "$logs/$name.log" 2>&1 || rc=$?
  echo "$rc" > "$logs/$name.rc"
  # One binary's output at a time, whole.
  (
    flock 9
    echo "     Running tests/$name.rs ($((SECONDS - started)) s, exit $rc)"
    cat "$logs/$name.log"
  ) 9> "$logs/.print"
}
export -f run_one
xargs -P "$jobs" -L 1 bash -c 'run_one "$0" "$1" "$2" '"$logs" < "$logs/order.txt"
xargs -P 1 -L 1 bash -c 'run_one "$0" "$1" "$2" '"$logs" < "$logs/alone.txt"

failed=()
while read -r _ name _; do
  [ "$(cat "$logs/$name.rc" 2>/dev/null || echo 1)" = 0 ] || failed+=("$name")
done < <(cat "$logs/order.txt" "$logs/alone.txt")
if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAILED end-to-end test binaries: ${failed[*]} (logs in $logs)"
  exit 1
fi
echo "all $count end-to-end test binaries passed"
# The hostile rows that ran, counted once every table has recorded its own.
hostile=$(awk '$1 == "hostile" {print $2}' "$logs/binaries.txt")
[ -n "$hostile" ] || { echo "no hostile test binary was built"; exit 1; }
(cd tests && "$hostile" --ignored --exact the_tables_hold_at_least_80_rows)
