#!/usr/bin/env bash
# Makes (once, cached) what the VM suite boots: QEMU 7.2 unpacked from
# Debian's packages (not installed: the host's newer qemu-utils Breaks
# qemu-system-common), and a bookworm image of ARCH (amd64, arm64, armhf)
# with systemd, a kernel, and the drover-agent package's dependencies, for
# direct kernel boot under TCG. Prints the image's directory, which holds
# boot.sh: QEMU with that architecture's machine, CPU, kernel and console
# (run.sh adds the disks, the network card and the serial file).
#   bash vm/image.sh [amd64|arm64|armhf]
# The ARM images are made with debootstrap --foreign and its second stage
# under qemu-user (cross/userns-run.sh, the host's binfmt table untouched).
# ../shared/research/disposable-roots.md has the measurements behind it.
set -euo pipefail
arch=${1:-amd64}
here=$(cd "$(dirname "$0")" && pwd)
case "$arch" in
amd64) kernel_package=linux-image-amd64 console=ttyS0 ;;
arm64) kernel_package=linux-image-arm64 console=ttyAMA0 ;;
# The LPAE flavour: Cortex-A7/A15 class cores (Raspberry Pi 2 and later).
armhf) kernel_package=linux-image-armmp-lpae console=ttyAMA0 ;;
*) echo "unknown architecture $arch (amd64, arm64 or armhf)" >&2; exit 2 ;;
esac
cache=${DROVER_VM_CACHE:-/var/tmp/drover-vm}
mkdir -p "$cache/$arch"
exec 9>"$cache/lock"
flock 9

mirror() {
    local uri
    uri=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null |
        tr ' ' '\n' | grep -v security | head -n1 || true)
    if [ -z "$uri" ]; then
        uri=$(awk '/^deb / && $2 ~ /^http/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# --- QEMU --------------------------------------------------------------------
if [ ! -x "$cache/qemu/usr/bin/qemu-system-x86_64" ] || [ ! -x "$cache/qemu/usr/bin/qemu-system-aarch64" ]; then
    rm -rf "$cache/qemu" "$cache/qemu-debs"
    mkdir -p "$cache/qemu-debs"
    (cd "$cache/qemu-debs" && apt-get download qemu-system-x86 qemu-system-arm qemu-system-common qemu-system-data \
        seabios ipxe-qemu libbrlapi0.8 libcacard0 libcapstone4 libepoxy0 libfdt1 libibverbs1 libpmem1 \
        librdmacm1 libslirp0 libsndio7.0 libspice-server1 libusb-1.0-0 libusbredirparser1 libvdeplug2 \
        libndctl6 libdaxctl1 libnl-3-200 libnl-route-3-200 >/dev/null)
    for deb in "$cache"/qemu-debs/*.deb; do dpkg-deb -x "$deb" "$cache/qemu"; done
fi
# boot.sh: the machine each architecture boots (TCG; direct kernel boot;
# the kernel's console on the serial port run.sh reads).
case "$arch" in
amd64) system=x86_64 machine="-cpu max" ;;
# Cortex-A72: the Raspberry Pi 4's core (ARMv8.0: no pointer
# authentication, which TCG emulates slowly).
arm64) system=aarch64 machine="-M virt -cpu cortex-a72" ;;
# Cortex-A15 with LPAE, for the armmp-lpae kernel.
armhf) system=arm machine="-M virt,highmem=off -cpu cortex-a15" ;;
esac
img=$cache/$arch
cat >"$img/boot.sh" <<QEMU
#!/bin/sh
q=$cache/qemu
LD_LIBRARY_PATH=\$q/usr/lib/x86_64-linux-gnu:\$q/lib/x86_64-linux-gnu exec \$q/usr/bin/qemu-system-$system \\
  -L \$q/usr/share/seabios -L \$q/usr/share/qemu -L \$q/usr/lib/ipxe/qemu \\
  -accel tcg,thread=multi $machine -smp 2 -m 1024 -kernel $img/vmlinux -initrd $img/initrd.img \\
  -append "console=$console root=/dev/vda rw panic=-1 quiet systemd.show_status=0" "\$@"
QEMU
chmod 0755 "$img/boot.sh"

# --- the image -----------------------------------------------------------------
# The image is remade when this script changes.
stamp=$(sha256sum "$0" | cut -c1-16)
in_root() { # command...: run inside the image's root (emulated for ARM)
    if [ "$arch" = amd64 ]; then
        chroot "$root" "$@"
    else
        bash "$here/../cross/userns-run.sh" "$root" "$arch" "$@"
    fi
}
if [ "$(cat "$img/image.ready" 2>/dev/null)" != "$stamp" ]; then
    root=$img/vmroot
    rm -rf "$root" "$img/disk.raw"
    mkdir -p "$cache/debs"
    include=systemd-sysv,udev,dbus,$kernel_package,kmod,procps,libgcc-s1,adduser
    if [ "$arch" = amd64 ]; then
        debootstrap --variant=minbase --cache-dir="$cache/debs" --include="$include" \
            bookworm "$root" "$(mirror)" >"$img/debootstrap.log" 2>&1
    else
        # The second stage runs the packages' scripts under qemu-user (the
        # kernel's initramfs hook is most of its time).
        debootstrap --arch="$arch" --foreign --variant=minbase --cache-dir="$cache/debs" \
            --include="$include" bookworm "$root" "$(mirror)" >"$img/debootstrap.log" 2>&1
        # The kernel's postinst builds an initramfs; with every module (the
        # default) that takes most of an hour under qemu-user. The small one
        # is made below.
        mkdir -p "$root/etc/initramfs-tools/conf.d"
        echo MODULES=list >"$root/etc/initramfs-tools/conf.d/drover-vm"
        in_root /debootstrap/debootstrap --second-stage >>"$img/debootstrap.log" 2>&1
    fi
    echo drover-vm >"$root/etc/hostname"
    printf '/dev/vda / ext4 rw 0 1\n' >"$root/etc/fstab"
    in_root passwd -d root >/dev/null
    # No network in the guest: apt reads only what the scenario disk holds.
    : >"$root/etc/apt/sources.list"
    rm -f "$root"/etc/apt/sources.list.d/*
    # A scenario that talks to a control plane on the host gets QEMU's
    # user-mode network: the guest is 10.0.2.15 and 10.0.2.2 is the host's
    # loopback. A static address, so no boot waits for DHCP; no wait-online,
    # so boots without a network card are not slower.
    mkdir -p "$root/etc/systemd/network"
    printf '[Match]\nName=en* eth*\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' \
        >"$root/etc/systemd/network/50-drover-vm.network"
    in_root systemctl enable systemd-networkd.service >/dev/null 2>&1
    in_root systemctl mask systemd-networkd-wait-online.service >/dev/null 2>&1
    # The scenario runner: mounts the scenario disk, runs its script with
    # every line on the serial console, and powers off unless the script
    # asked for something else (a reboot, or nothing: the host cuts power).
    cat >"$root/usr/local/sbin/drover-vm-scenario" <<'RUNNER'
#!/bin/sh
mkdir -p /mnt/scenario
mount -o ro LABEL=scenario /mnt/scenario || { echo "DROVER-VM: no scenario disk"; exit 0; }
boot=$(cat /var/lib/drover-vm-boots 2>/dev/null || echo 0)
boot=$((boot + 1))
echo "$boot" >/var/lib/drover-vm-boots
sync
echo "DROVER-VM: boot $boot"
sh /mnt/scenario/run.sh "$boot" 2>&1 | sed -u 's/^/DROVER-VM: /'
RUNNER
    chmod 0755 "$root/usr/local/sbin/drover-vm-scenario"
    cat >"$root/etc/systemd/system/drover-vm-scenario.service" <<'UNIT'
[Unit]
Description=Drover VM test scenario
After=local-fs.target systemd-udev-settle.service
Wants=systemd-udev-settle.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/drover-vm-scenario
StandardOutput=tty
StandardError=tty
TTYPath=/dev/$console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
    sed -i "s|^TTYPath=.*|TTYPath=/dev/$console|" "$root/etc/systemd/system/drover-vm-scenario.service"
    in_root systemctl enable drover-vm-scenario.service >/dev/null 2>&1
    # Quieter, faster boots: no getty on the console, no timers.
    in_root systemctl mask "serial-getty@$console.service" getty@tty1.service \
        apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true
    # A small initrd (the modules a virtio disk needs) and, on amd64, an
    # uncompressed kernel for PVH boot: both cut the boot under TCG.
    kernel=$(ls "$root"/boot/vmlinuz-* | head -n1)
    version=${kernel##*/vmlinuz-}
    sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
    printf 'virtio_pci\nvirtio_blk\next4\ncrc32c_generic\n' >>"$root/etc/initramfs-tools/modules"
    in_root update-initramfs -c -k "$version" -b /tmp >/dev/null 2>&1
    cp "$root/tmp/initrd.img-$version" "$img/initrd.img"
    case "$arch" in
    amd64) # bzImage (xz) -> vmlinux
        python3 -c "import lzma,sys;d=open(sys.argv[1],'rb').read();open(sys.argv[2],'wb').write(lzma.LZMADecompressor().decompress(d[d.find(b'\xfd7zXZ\x00'):]))" \
            "$kernel" "$img/vmlinux" ;;
    arm64) # a gzipped Image
        python3 -c "import gzip,sys;d=open(sys.argv[1],'rb').read();open(sys.argv[2],'wb').write(gzip.decompress(d) if d[:2]==b'\x1f\x8b' else d)" \
            "$kernel" "$img/vmlinux" ;;
    armhf) cp "$kernel" "$img/vmlinux" ;; # a zImage decompresses itself
    esac
    echo "$version" >"$img/kernel.release"
    rm -rf "$root/tmp/"* "$root/var/cache/apt/archives/"*.deb
    mkfs.ext4 -q -F -L root -d "$root" "$img/disk.raw" 2G >/dev/null
    rm -rf "$root"
    echo "$stamp" >"$img/image.ready"
fi
echo "$img"
