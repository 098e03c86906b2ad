#!/usr/bin/env bash
# The heavier suite: sets up the cross toolchain from Debian's packages,
# builds release binaries and .debs for arm64, armhf and amd64 with Debian's
# rustc-web (which also proves the workspace builds at its rust-version
# floor), runs them under qemu-user, and installs the arm64 and armhf
# packages into Debian roots of those architectures. About 30 minutes on 2
# cores, cold (roots cached afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."
bash cross/setup.sh
bash cross/build.sh
bash cross/check.sh
# The packages installed into a Debian root of their own architecture.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)-1
for arch in arm64 armhf; do
    if [ -f "target/debs/drover-agent_${version}_${arch}.deb" ]; then
        bash cross/install-check.sh "$arch"
    else
        echo "$arch: not built (see cross/setup.sh's warnings); install check skipped"
    fi
done
command -v lintian >/dev/null && lintian --fail-on warning --tag-display-limit 0 target/debs/*.deb
echo "cross suite: 1 passed, 0 failed"
