#!/usr/bin/env bash
# The heavier suite: sets up the cross toolchain from Debian's packages,
# builds the agent's release binaries and .debs for arm64, armhf and amd64
# and the control plane's for amd64 with Debian's rustc-web (which also
# proves the agent and the control plane build at the rust-version floor),
# runs them under qemu-user, and installs the arm64 and armhf agent packages
# into Debian roots of those architectures.
#
# The control plane is built for amd64 only here: each of its release
# builds takes 8-9 minutes on 2 cores, and CI's time goes to what runs on
# devices. Its ARM packages come from `bash cross/build.sh` (all six) and
# differ from amd64's only in the compiler's target; the VM suites' install
# scenario checks its unit on amd64.
#
# Every check counts: arm64 and armhf must be built and install (the
# toolchain's packages are pinned in cross/toolchain.lock and fetched from
# the pool, so no mirror's index can make one go missing); the closing line
# counts what ran.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/target-cache.sh
passed=0
bash cross/test-pin.sh
passed=$((passed + 1)) # the pinned toolchain's fetch, on a mirror with a stale index
bash cross/setup.sh
bash cross/build.sh --control-plane amd64
passed=$((passed + 1)) # the release builds and .debs
bash cross/check.sh
passed=$((passed + 1)) # the binaries under qemu-user
# The packages installed into a Debian root of their own architecture.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)-1
for arch in arm64 armhf; do
    deb="target/debs/drover-agent_${version}_${arch}.deb"
    [ -f "$deb" ] || { echo "$arch: $deb was not built; the cross suite fails" >&2; exit 1; }
    bash cross/install-check.sh "$arch"
    passed=$((passed + 1))
done
command -v lintian >/dev/null || { echo "lintian is missing (scripts/test.sh installs it)" >&2; exit 1; }
lintian --fail-on warning --tag-display-limit 0 target/debs/*.deb
passed=$((passed + 1))
echo "cross suite: $passed passed, 0 failed"
