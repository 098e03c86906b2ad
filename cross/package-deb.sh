#!/usr/bin/env bash
# Builds the drover-agent and drover .deb packages from already built
# binaries, with dpkg-deb (Debian's own tool) rather than a cargo plugin, so
# packaging needs nothing beyond dpkg-dev and binutils.
#
#   cross/package-deb.sh ARCH BIN_DIR OUT_DIR [PACKAGE ...]
#
# ARCH is a Debian architecture (amd64, arm64, armhf); BIN_DIR holds the
# binaries built for it. PACKAGE is drover-agent or drover (default: both);
# each needs its binary in BIN_DIR. The binaries are stripped here.
set -euo pipefail
usage="usage: package-deb.sh ARCH BIN_DIR OUT_DIR [drover-agent] [drover]"
arch=${1:?$usage}
bin_dir=${2:?$usage}
out=${3:?$usage}
shift 3
packages=("$@")
[ ${#packages[@]} -gt 0 ] || packages=(drover-agent drover)
wanted() { [[ " ${packages[*]} " == *" $1 "* ]]; }
for p in "${packages[@]}"; do
  case "$p" in
    drover-agent | drover) [ -x "$bin_dir/$p" ] || { echo "$bin_dir/$p: no such binary" >&2; exit 1; } ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)-1
case "$arch" in
  amd64) strip=strip ;;
  arm64) strip=aarch64-linux-gnu-strip ;;
  armhf) strip=arm-linux-gnueabihf-strip ;;
  *) echo "unknown architecture $arch" >&2; exit 2 ;;
esac
command -v "$strip" >/dev/null || strip=strip
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The glibc floor of the binaries and libgcc_s: the control plane's symbols
# need GLIBC_2.34 at most; the agent is linked with packed relative
# relocations (agent/build.rs), which glibc reads from 2.36.
depends="libc6 (>= 2.34), libgcc-s1 (>= 4.3)"
agent_depends="libc6 (>= 2.36), libgcc-s1 (>= 4.3)"

doc() { # package
  local dir=$1/usr/share/doc/$2
  install -d -m 0755 "$dir"
  install -m 0644 "$root/README.md" "$dir/README.md"
  cat > "$dir/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: drover
Source: https://drover.invalid/

Files: *
Copyright: 2026 The Drover authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 can be found in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
  printf '%s (%s) unstable; urgency=medium\n\n  * Release %s.\n\n -- Drover authors <drover@drover.invalid>  %s\n' \
    "$2" "$version" "$version" "$(date -R -d @"${SOURCE_DATE_EPOCH:-$(date +%s)}")" | gzip -9n > "$dir/changelog.Debian.gz"
}

# DEBIAN/md5sums: what debsums and dpkg --verify check the files against.
md5sums() { # dir
  (cd "$1" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | sort -z | xargs -0 md5sum) > "$1/DEBIAN/md5sums"
  chmod 0644 "$1/DEBIAN/md5sums"
}

# Man pages and shell completions, generated from the CLI definitions and
# committed under docs/ (tests/tests/docs.rs keeps them current).
manuals() { # dir command section
  local page
  install -d -m 0755 "$1/usr/share/man/man$3"
  for page in "$root"/docs/man/"$2".$3 "$root"/docs/man/"$2"-*.$3; do
    [ -f "$page" ] || continue
    gzip -9n < "$page" > "$1/usr/share/man/man$3/$(basename "$page").gz"
    chmod 0644 "$1/usr/share/man/man$3/$(basename "$page").gz"
  done
  install -D -m 0644 "$root/docs/completions/$2" "$1/usr/share/bash-completion/completions/$2"
  install -D -m 0644 "$root/docs/completions/_$2" "$1/usr/share/zsh/vendor-completions/_$2"
  install -D -m 0644 "$root/docs/completions/$2.fish" "$1/usr/share/fish/vendor_completions.d/$2.fish"
}

control() { # dir package description long-description extra-depends [depends]
  local depends=${6:-$depends}
  md5sums "$1"
  local size
  size=$(du -sk --exclude=DEBIAN "$1" | cut -f1)
  cat > "$1/DEBIAN/control" <<CONTROL
Package: $2
Version: $version
Architecture: $arch
Maintainer: Drover authors <drover@drover.invalid>
Installed-Size: $size
Depends: $depends$5
Recommends: ca-certificates
Section: admin
Priority: optional
Homepage: https://drover.invalid/
Description: $3
$4
CONTROL
}

# --- drover-agent -----------------------------------------------------------
if wanted drover-agent; then
pkg=$work/drover-agent
install -d -m 0755 "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/etc/drover" "$pkg/lib/systemd/system"
install -m 0755 "$bin_dir/drover-agent" "$pkg/usr/bin/drover-agent"
"$strip" --strip-unneeded "$pkg/usr/bin/drover-agent"
install -m 0644 "$root/systemd/agent.toml" "$pkg/etc/drover/agent.toml"
# The agent reports this as its version, so the control plane shows which
# package revision a device runs.
install -d -m 0755 "$pkg/usr/share/drover-agent"
echo "$version" > "$pkg/usr/share/drover-agent/version"
chmod 0644 "$pkg/usr/share/drover-agent/version"
install -m 0644 "$root/systemd/drover-agent.service" "$pkg/lib/systemd/system/drover-agent.service"
doc "$pkg" drover-agent
manuals "$pkg" drover-agent 8
# Reading dpkg's own state is the point: the agent detects an interrupted
# dpkg from its journal and notices package changes from the status file.
install -d -m 0755 "$pkg/usr/share/lintian/overrides"
{
    echo "drover-agent: uses-dpkg-database-directly [usr/bin/drover-agent]"
    # Not uploaded to Debian: there is no ITP bug for the changelog to close.
    echo "drover-agent: initial-upload-closes-no-bugs [usr/share/doc/drover-agent/changelog.Debian.gz:1]"
} > "$pkg/usr/share/lintian/overrides/drover-agent"
echo /etc/drover/agent.toml > "$pkg/DEBIAN/conffiles"
cat > "$pkg/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
    # Members of this group may read the agent's status socket.
    getent group drover >/dev/null || addgroup --quiet --system drover
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper enable drover-agent.service >/dev/null || true
    fi
    # Never restart a running agent here: it may be in the middle of the very
    # apt run that is installing this package. The agent restarts itself into
    # the new binary once no job runs (A9). Start it only on first install,
    # and only once it is configured.
    if [ -z "$2" ] && [ -d /run/systemd/system ] \
        && drover-agent --config /etc/drover/agent.toml check >/dev/null 2>&1; then
        deb-systemd-invoke start drover-agent.service >/dev/null || true
    fi
fi
exit 0
SCRIPT
cat > "$pkg/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
# Stop on removal only; an upgrade leaves the running agent alone (A9).
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    deb-systemd-invoke stop drover-agent.service >/dev/null || true
fi
exit 0
SCRIPT
cat > "$pkg/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = purge ]; then
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper purge drover-agent.service >/dev/null || true
    fi
    # The jobs and their history go with a purge, and so does the device's
    # token (a secret the operator put there); a remove keeps them.
    rm -rf /var/lib/drover-agent
    rm -f /etc/drover/agent.token
    rmdir --ignore-fail-on-non-empty /etc/drover 2>/dev/null || true
fi
exit 0
SCRIPT
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/prerm" "$pkg/DEBIAN/postrm"
control "$pkg" drover-agent "Drover fleet agent: jobs and full system upgrades" \
" Runs fleet jobs one at a time on Debian and Raspberry Pi OS devices. Its
 main job is a full apt system upgrade that survives crashes, power loss and
 the reboot it causes, and never runs the same job twice. It talks to the
 Drover control plane over WebSocket, MQTT or NATS JetStream." ", adduser" "$agent_depends"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$out/drover-agent_${version}_${arch}.deb" >/dev/null
fi

# --- drover (control plane and CLI) -----------------------------------------
if wanted drover; then
pkg=$work/drover
install -d -m 0755 "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system"
install -m 0755 "$bin_dir/drover" "$pkg/usr/bin/drover"
"$strip" --strip-unneeded "$pkg/usr/bin/drover"
install -m 0644 "$root/systemd/drover.service" "$pkg/lib/systemd/system/drover.service"
doc "$pkg" drover
manuals "$pkg" drover 1
# The YAML parser (unsafe-libyaml) is a Rust translation of libyaml compiled
# into the binary, not a copy of the C library.
install -d -m 0755 "$pkg/usr/share/lintian/overrides"
{
    echo "drover: embedded-library libyaml [usr/bin/drover]"
    echo "drover: initial-upload-closes-no-bugs [usr/share/doc/drover/changelog.Debian.gz:1]"
} > "$pkg/usr/share/lintian/overrides/drover"
cat > "$pkg/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = configure ] && command -v deb-systemd-helper >/dev/null; then
    # Neither enabled nor started: the operator chooses listen addresses and
    # certificates first (`drover init`), then `systemctl enable --now drover`.
    deb-systemd-helper update-state drover.service >/dev/null || true
fi
exit 0
SCRIPT
cat > "$pkg/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = purge ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper purge drover.service >/dev/null || true
fi
exit 0
SCRIPT
chmod 0755 "$pkg/DEBIAN/postinst" "$pkg/DEBIAN/postrm"
control "$pkg" drover "fleet control plane and CLI for Drover agents" \
" Plans and releases fleet tasks (full system upgrades) over Drover agents:
 frozen target plans, canary-first release, deadlines; deployments with
 concurrency limits, maintenance windows in each site's time zone and
 retries. Keeps its state in an embedded database, or in NATS JetStream for
 several replicas." ", tzdata"
dpkg-deb --root-owner-group -Zxz --build "$pkg" "$out/drover_${version}_${arch}.deb" >/dev/null
fi

ls -l "$out"/*_"${version}_${arch}".deb
