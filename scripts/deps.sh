#!/usr/bin/env bash
# scripts/deps.sh - install what ivtrace needs on a fresh Debian 12 machine.
# Idempotent and quick when everything is present. Run as root (or with sudo).
set -euo pipefail

# zlib1g-dev: the evaluation's static gzip workload; openssh-client: its SSH transport.
# dpkg-dev .. lintian: `make deb`; libvirt-daemon-system: the libvirt test (tests/libvirt);
# mmdebstrap: the build roots of guest kernels of other Debian releases (vm/buildroot.py).
APT_PACKAGES=(
	build-essential pkg-config zlib1g-dev openssh-client
	qemu-system-x86 busybox-static cpio zstd xz-utils
	babeltrace2 python3-bt2 babeltrace python3-pytest python3-matplotlib
	lttng-tools liblttng-ust-dev trace-cmd hyperfine
	linux-perf procps util-linux
	dpkg-dev debhelper dh-dkms dkms lintian
	libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
	mmdebstrap
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}" >&2
	SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
		-o DPkg::Lock::Timeout=600 "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
	echo "deps: cargo not found; install Rust with rustup (https://rustup.rs)" >&2
	exit 2
fi
