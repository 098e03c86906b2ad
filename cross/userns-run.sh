#!/usr/bin/env bash
# userns-run.sh ROOT ARCH CMD...: runs CMD chrooted into ROOT inside a user
# namespace (uids 0-65535 mapped to the host's) with a private binfmt_misc
# that runs ARCH binaries through qemu-user-static. The host's binfmt table
# is never touched.
set -euo pipefail
root=$1; arch=$2; shift 2
case "$arch" in
  arm64) name=qemu-aarch64; interp=/usr/libexec/qemu-binfmt/aarch64-binfmt-P ;;
  armhf) name=qemu-arm; interp=/usr/libexec/qemu-binfmt/arm-binfmt-P ;;
  *) echo "unknown arch $arch" >&2; exit 2 ;;
esac
magic=$(sed -n 's/^magic //p' /usr/share/binfmts/$name)
mask=$(sed -n 's/^mask //p' /usr/share/binfmts/$name)
fifo=$(mktemp -u); mkfifo "$fifo"
unshare --user --mount --fork -- /bin/sh -c '
  read go < "$0"
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  printf ":%s:M::%s:%s:%s:OPF" "$1" "$2" "$3" "$4" > /proc/sys/fs/binfmt_misc/register
  r=$5; shift 5
  mount --rbind /proc "$r/proc" 2>/dev/null || true
  mount --rbind /dev "$r/dev" 2>/dev/null || true
  mount --rbind /sys "$r/sys" 2>/dev/null || true
  exec chroot "$r" /usr/bin/env container=lxc "$@"
' "$fifo" "$name" "$magic" "$mask" "$interp" "$root" "$@" &
pid=$!
for _ in $(seq 50); do [ -e /proc/$pid/uid_map ] && break; sleep 0.05; done
sleep 0.2
echo "0 0 65536" > /proc/$pid/uid_map
echo "0 0 65536" > /proc/$pid/gid_map
echo go > "$fifo"
rm -f "$fifo"
wait $pid
