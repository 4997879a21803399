#!/usr/bin/env bash
# kernel-vm.sh runs a command under another Linux kernel than the machine's:
# Debian 12's Linux 6.1 by default, the kernel of Debian 12, Amazon Linux
# 2023, Bottlerocket and COS, and older than every mechanism shunt takes a
# fallback for (tcx 6.6, sk_msg links 6.10, bpf_sock_destroy 6.5, DSR's GSO
# decapsulation 6.3). It boots that kernel in a KVM virtual machine with the
# machine's own filesystem as its root, so the command runs the binaries and
# test binaries built here, against that kernel's verifier and helpers.
# The VM is emulated (QEMU's TCG), not KVM: on the machines this project is
# built on (themselves VMs) /dev/kvm exists but nested guests run far slower
# than emulation (a boot did not reach the kernel's first line in 60 s, where
# TCG boots in 7). KERNEL_VM_ACCEL overrides it, e.g. "-enable-kvm -cpu host"
# on a host with working KVM.
#
#   scripts/kernel-vm.sh [--kernel PACKAGE] [--cpus N] [--mem MiB] [--timeout SECONDS] -- COMMAND [ARG...]
#
# PACKAGE: a Debian package with a kernel image (default: the newest
# linux-image-6.1.0-N-amd64 the archive has). It is downloaded with
# `apt-get download` and unpacked under /var/cache/shunt/kernels, never
# installed: /boot and the machine's modules are not touched.
#
# COMMAND runs as root in the VM, in the current directory, with the
# environment variables named in KERNEL_VM_ENV (space-separated) passed
# through. The VM sees the machine's filesystem read-only beneath a layer
# of its own memory: whatever the command writes is gone when it ends, and
# nothing reaches the machine's files. What it prints is printed here; its
# exit status is this script's. The VM has loopback only: network traffic
# stays in namespaces the command creates.
#
# Needs qemu-system-x86_64, depmod and cpio (scripts/setup.sh installs
# them).
set -euo pipefail

kernel_pkg=
cpus=2
mem=3072
timeout_s=1800
while [ $# -gt 0 ]; do
	case $1 in
	--kernel) kernel_pkg=$2; shift 2 ;;
	--cpus) cpus=$2; shift 2 ;;
	--mem) mem=$2; shift 2 ;;
	--timeout) timeout_s=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "kernel-vm: unknown option $1 (usage: scripts/kernel-vm.sh [--kernel PACKAGE] [--cpus N] [--mem MiB] [--timeout SECONDS] -- COMMAND...)" >&2; exit 2 ;;
	esac
done
if [ $# -eq 0 ]; then
	echo "kernel-vm: no command (usage: scripts/kernel-vm.sh [options] -- COMMAND...)" >&2
	exit 2
fi
if [ "$(id -u)" != 0 ]; then
	echo "kernel-vm: needs root (the kernel's cache, and the command runs as root in the VM)" >&2
	exit 2
fi
accel=${KERNEL_VM_ACCEL:--accel tcg,thread=multi -cpu max}
for prog in qemu-system-x86_64 depmod cpio busybox; do
	command -v "$prog" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "$prog" >/dev/null || {
		echo "kernel-vm: $prog not found: run scripts/setup.sh" >&2
		exit 2
	}
done
export PATH=$PATH:/usr/sbin:/sbin

# --- the kernel: downloaded and unpacked once, kept in a cache ------------
if [ -z "$kernel_pkg" ]; then
	kernel_pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -1)
	if [ -z "$kernel_pkg" ]; then
		echo "kernel-vm: no linux-image-6.1.0-N-amd64 package in the apt archive (run apt-get update?)" >&2
		exit 2
	fi
fi
cache=/var/cache/shunt/kernels/$kernel_pkg
if ! [ -f "$cache/ready" ]; then
	rm -rf "$cache"
	mkdir -p "$cache/deb"
	# A package list older than the archive names a file no longer there:
	# read the lists again once.
	(cd "$cache/deb" && { apt-get download "$kernel_pkg" 2>/dev/null || { apt-get update -qq && apt-get download "$kernel_pkg"; }; } 2>&1 |
		grep -v '^W: Download is performed unsandboxed' || true)
	deb=$(ls "$cache"/deb/*.deb 2>/dev/null | head -1)
	if [ -z "$deb" ]; then
		echo "kernel-vm: apt-get download $kernel_pkg fetched nothing" >&2
		exit 2
	fi
	dpkg-deb -x "$deb" "$cache/root"
	rm -rf "$cache/deb"
	kver=$(ls "$cache/root/lib/modules")
	depmod -b "$cache/root" "$kver"
	touch "$cache/ready"
fi
kver=$(ls "$cache/root/lib/modules")
vmlinuz=$cache/root/boot/vmlinuz-$kver

work=$(mktemp -d /tmp/shunt-kernel-vm.XXXXXX)
cleanup() { rm -rf "$work"; }
trap cleanup EXIT

# --- the initramfs: busybox, the modules to reach the root, an init -------
# The VM's root is the machine's / over 9p (virtio), read-only, under an
# overlay of tmpfs; the kernel has those as modules, loaded here in the
# order modprobe gives.
mkdir -p "$work/initrd/bin" "$work/initrd/modules" "$work/out"
cp "$(command -v busybox)" "$work/initrd/bin/busybox"
: >"$work/initrd/modules/order"
for m in virtio_pci 9pnet_virtio 9p overlay; do
	modprobe -d "$cache/root" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' | while read -r ko; do
	cp "$ko" "$work/initrd/modules/"
	basename "$ko" >>"$work/initrd/modules/order"
done

echo "$cache/root/lib/modules/$kver" >"$work/initrd/modules/dir"

# What runs in the VM: the command, in this directory, with the variables
# asked for. Its output goes to the VM's console, which is this script's.
{
	echo '#!/bin/bash'
	for v in ${KERNEL_VM_ENV:-}; do
		[ -n "${!v+x}" ] && printf 'export %s=%q\n' "$v" "${!v}"
	done
	printf 'cd %q\n' "$PWD"
	printf '%q ' "$@"
	echo
} >"$work/out/command.sh"

cat >"$work/initrd/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules/order); do
	insmod "/modules/$m" || echo "kernel-vm: insmod $m failed"
done
mkdir -p /host /layer /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,ro hostroot /host
mount -t tmpfs -o size=80% layer /layer
mkdir -p /layer/upper /layer/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/layer/upper,workdir=/layer/work /newroot
mkdir -p /newroot/kernel-vm /newroot/kernel-vm-modules
mount --bind "/host$(cat /modules/dir)" /newroot/kernel-vm-modules
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 out /newroot/kernel-vm
for d in proc sys dev; do mount --move /$d /newroot/$d; done
# The command's root becomes the root of everything (switch_root, not
# chroot): setns into a pod's mount namespace resets a process's root to
# the namespace's, which under a chroot would be this initramfs; and the
# kernel runs its module helper (modprobe) from init's root.
exec switch_root /newroot /bin/bash /kernel-vm/stage2.sh
INIT
cat >"$work/out/stage2.sh" <<'STAGE2'
mount -t tmpfs tmpfs /run
# This kernel's modules where modprobe looks for them (veth, vxlan,
# sch_ingress and the like load on demand).
mkdir -p /lib/modules/$(uname -r) && mount --bind /kernel-vm-modules /lib/modules/$(uname -r)
echo /sbin/modprobe >/proc/sys/kernel/modprobe
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t bpf bpf /sys/fs/bpf
mount -t tmpfs cgroup /sys/fs/cgroup && mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
ip link set lo up
echo "kernel-vm: $(uname -r), $(nproc) CPUs, running: $(tail -1 /kernel-vm/command.sh)"
bash /kernel-vm/command.sh
echo $? >/kernel-vm/status
sync
# Power off (this shell is init: its end would be a panic, which
# panic=-1 and -no-reboot turn into qemu's exit too).
echo o >/proc/sysrq-trigger
sleep 10
STAGE2
chmod +x "$work/initrd/init"
(cd "$work/initrd" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

# --- the VM ----------------------------------------------------------------
set +e
timeout --foreground "$timeout_s" qemu-system-x86_64 \
	$accel -smp "$cpus" -m "$mem" \
	-nographic -no-reboot -nodefaults -serial stdio \
	-kernel "$vmlinuz" -initrd "$work/initrd.gz" \
	-append "console=ttyS0 ${KERNEL_VM_CMDLINE:-quiet loglevel=3} panic=-1 rdinit=/init" \
	-fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
	-device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
	-fsdev local,id=out,path="$work/out",security_model=none \
	-device virtio-9p-pci,fsdev=out,mount_tag=out
qemu_rc=$?
set -e
if [ "$qemu_rc" = 124 ]; then
	echo "kernel-vm: the VM ran past --timeout $timeout_s s and was stopped" >&2
	exit 124
fi
if ! [ -f "$work/out/status" ]; then
	echo "kernel-vm: the VM stopped (qemu exit $qemu_rc) before the command ended (see its console above)" >&2
	exit 1
fi
exit "$(cat "$work/out/status")"
