#!/usr/bin/env bash
# scripts/deps.sh - install what ivtrace needs on a fresh Debian 12 machine.
# Idempotent and quick when everything is present. Run as root (or with sudo).
#   scripts/deps.sh          the apt packages, then the pip tools (below)
#   scripts/deps.sh pip      the pip tools only (no root needed): ruff, pinned, into
#                            build/pytools of this checkout (`make lint` runs it from there)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Python tools pip installs (Debian 12 has no ruff). Pinned: a new version brings new rules,
# so moving it is a commit that also fixes what it finds. They go to build/pytools with
# `pip install --target`: per checkout, nothing written to the system's Python (which Debian
# marks externally managed), the index is whatever this machine's pip is configured with.
RUFF_VERSION=0.17.6
PYTOOLS=$repo/build/pytools

pip_tools() {
	if [ "$("$PYTOOLS/bin/ruff" --version 2>/dev/null)" = "ruff $RUFF_VERSION" ]; then
		return 0
	fi
	echo "deps: installing ruff $RUFF_VERSION into build/pytools (pip)" >&2
	if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
		echo "deps: pip is missing: run scripts/deps.sh as root (it installs python3-pip)" >&2
		return 2
	fi
	rm -rf "$PYTOOLS"
	/usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore \
		--target "$PYTOOLS" "ruff==$RUFF_VERSION" || {
		echo "deps: pip install ruff==$RUFF_VERSION failed (see above); check this machine's pip" >&2
		echo "      index (pip config list) and retry: scripts/deps.sh pip" >&2
		return 2
	}
}

if [ "${1:-}" = pip ]; then
	pip_tools
	exit
fi

# zlib1g-dev: the evaluation's static gzip workload; openssh-client: its SSH transport.
# dpkg-dev .. lintian: `make deb`; libvirt-daemon-system: the libvirt test (tests/libvirt);
# mmdebstrap, gpg, debian-archive-keyring: the build roots of guest kernels of other Debian
# releases (python/ivtools/buildroot.py, make test-kernels); mmdebstrap checks the other
# release's archive with the keyring's keys, and gpg reads them (a recommends of mmdebstrap).
# python3-pip .. codespell: `make lint`; gcc-multilib: the ABI tests built with -m32.
# kernelshark .. imagemagick: KernelShark under Xvfb, driven and photographed (tests/tracecmd).
# chromium: `ivtrace boot --png` renders the boot chart with it (tests/boot, make demo-boot).
APT_PACKAGES=(
	build-essential pkg-config zlib1g-dev openssh-client
	qemu-system-x86 busybox-static cpio zstd xz-utils
	babeltrace2 python3-bt2 babeltrace python3-pytest python3-matplotlib
	lttng-tools liblttng-ust-dev trace-cmd hyperfine
	linux-perf procps util-linux
	dpkg-dev debhelper dh-dkms dkms lintian
	libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients
	python3-pip shellcheck codespell gcc-multilib
	kernelshark xvfb xauth xdotool imagemagick chromium
	mmdebstrap gpg debian-archive-keyring
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A keyring older than 2023.3+deb12u1 lacks trixie's keys, and mmdebstrap of the trixie build
# root then fails on the archive's signature: upgrade it (apt-get install does).
if [ ! -e /usr/share/keyrings/debian-archive-trixie-stable.gpg ]; then
	missing+=(debian-archive-keyring)
fi
if [ ${#missing[@]} -gt 0 ]; then
	echo "deps: installing ${missing[*]}" >&2
	SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
	$SUDO apt-get -o DPkg::Lock::Timeout=600 update -q
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -q \
		--no-install-recommends "${missing[@]}"
fi

pip_tools

if ! command -v cargo >/dev/null 2>&1; then
	echo "deps: cargo not found; install Rust with rustup (https://rustup.rs)" >&2
	exit 2
fi
