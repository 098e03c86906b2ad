#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with a Rust toolchain:
# installs what the tests need, builds every binary the end-to-end tests start
# as processes, then runs formatting, lints and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."
# ./target kept under /var/tmp between clones (see the script).
. scripts/target-cache.sh

command -v apt-get >/dev/null || { echo "the tests need a Debian-based system (apt-get)"; exit 1; }
# Host tools of the tests: debootstrap makes the disposable Debian roots,
# dpkg-deb and dpkg-scanpackages build their local repository, python3 holds
# fcntl locks as apt takes them, setsid/chroot run apt inside the roots;
# nats-server (with JetStream) is the broker of the NATS tests, mosquitto
# that of the MQTT tests (mosquitto-clients to watch it); lintian and
# binutils check and strip the .deb packages; chromium and chromedriver run
# the dashboard's browser tests (fonts-dejavu-core: readable screenshots);
# curl fetches the cluster tests' nats-server (scripts/fetch-nats-server.sh).
need_apt=()
for pair in curl:curl debootstrap:debootstrap dpkg-scanpackages:dpkg-dev python3:python3 setsid:util-linux chroot:coreutils nats-server:nats-server mosquitto:mosquitto mosquitto_sub:mosquitto-clients lintian:lintian strip:binutils chromium:chromium chromedriver:chromium-driver; do
  command -v "${pair%%:*}" >/dev/null || need_apt+=("${pair#*:}")
done
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
# tzdata: maintenance windows in each site's time zone.
[ -e /usr/share/zoneinfo/Europe/Sofia ] || need_apt+=(tzdata)
if [ "${#need_apt[@]}" -gt 0 ]; then
  # Mirrors sometimes serve a stale index; a failing update must not stop the install.
  apt-get update || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need_apt[@]}"
fi

export CARGO_TERM_COLOR=never
# mdBook builds the docs book (docs/book.toml) at the end; a machine without
# it builds it once with cargo (about 80 s on 2 cores), the version pinned.
mdbook=$(command -v mdbook || true)
if [ -z "$mdbook" ]; then
  cargo install mdbook --locked --no-default-features --version 0.5.4
  mdbook=${CARGO_HOME:-$HOME/.cargo}/bin/mdbook
fi
cargo fmt --all -- --check
# Each build's JSON messages go through scripts/cargo-tally.py, which counts
# what the target cache held (cargo renders the diagnostics itself).
tally() { python3 scripts/cargo-tally.py "$@"; }
cargo clippy --workspace --all-targets --all-features --message-format=json-render-diagnostics -- -D warnings | tally clippy
# The end-to-end tests run drover and drover-agent as processes. First the
# agent as the .deb ships it (no test hooks), which must refuse every test
# hook in its config; then the agent the end-to-end tests drive, with hooks.
cargo build --workspace --bins --features drover/demo --message-format=json-render-diagnostics | tally "debug binaries"
bash scripts/check-no-test-hooks.sh target/debug/drover-agent
# The packaged drover (built without features) links no test roots.
if cargo tree -p drover -e normal --prefix none | grep -q '^drover-sandbox '; then
  echo "the drover binary links drover-sandbox without --features demo"; exit 1
fi
cargo build -p drover-agent --bins --features testing,sled-store --message-format=json-render-diagnostics | tally "the agent with test hooks"
# The cluster tests' nats-server (2.10: see the script).
DROVER_TEST_CLUSTER_NATS_SERVER=$(bash scripts/fetch-nats-server.sh)
export DROVER_TEST_CLUSTER_NATS_SERVER
# A test that cannot run here says so in this file (drover_tests::
# cannot_run_here; under CI=true it fails instead); it is counted below.
skipped=target/test-artefacts/skipped.txt
rm -f "$skipped"
bash scripts/run-tests.sh
# The docs book: every chapter in SUMMARY.md and every link resolving are
# checked by tests/tests/docs.rs; here it is built as readers get it.
"$mdbook" build docs
if [ -s "$skipped" ]; then
    echo "SKIPPED: $(wc -l < "$skipped") test(s) could not run on this machine:"
    sed 's/^/  /' "$skipped"
else
    echo "skipped: 0"
fi
