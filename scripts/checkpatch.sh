#!/usr/bin/env bash
# scripts/checkpatch.sh [ARGS...] - run the Linux kernel's checkpatch.pl with ARGS.
#
# checkpatch.pl ships only in the kernel source, not in the headers or kbuild packages.
# The first run takes it from Debian's linux-source-<major.minor> package of the guest
# kernel's series (apt-get download through this machine's apt sources, ~140 MB, once),
# and keeps checkpatch.pl, spelling.txt and const_structs.checkpatch in
# $IVT_CACHE/checkpatch-<series>/ (default: build/ of this repository). CHECKPATCH=PATH
# uses that script instead. Prints the script's path with --path.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
kver=${KVER:-$(make -s -C "$repo/guest/kmod" kver 2>/dev/null || true)}
series=$(echo "$kver" | sed -n 's/^\([0-9]*\.[0-9]*\)\..*/\1/p')
[ -n "$series" ] || { echo "checkpatch: cannot tell the guest kernel series (KVER='$kver'); pass KVER=" >&2; exit 2; }
cache=${IVT_CACHE:-$repo/build}/checkpatch-$series

fetch() {
	local tmp deb
	tmp=$(mktemp -d "${TMPDIR:-/tmp}/ivt-checkpatch.XXXXXX")
	trap 'rm -rf "$tmp"' RETURN
	echo "checkpatch: fetching checkpatch.pl from Debian's linux-source-$series (apt-get download, once)" >&2
	(cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "linux-source-$series" >&2) || {
		echo "checkpatch: apt-get download linux-source-$series failed; run 'apt-get update' and retry," >&2
		echo "            or pass CHECKPATCH=/path/to/checkpatch.pl" >&2
		exit 2
	}
	deb=$(ls "$tmp"/linux-source-"$series"_*.deb)
	mkdir -p "$tmp/src"
	dpkg-deb --fsys-tarfile "$deb" | tar -xO "./usr/src/linux-source-$series.tar.xz" |
		tar -xJ -C "$tmp/src" --wildcards '*/scripts/checkpatch.pl' '*/scripts/spelling.txt' \
			'*/scripts/const_structs.checkpatch'
	mkdir -p "$cache"
	cp "$tmp"/src/*/scripts/{checkpatch.pl,spelling.txt,const_structs.checkpatch} "$cache/"
	chmod +x "$cache/checkpatch.pl"
}

script=${CHECKPATCH:-$cache/checkpatch.pl}
if [ -z "${CHECKPATCH:-}" ] && [ ! -x "$script" ]; then
	fetch
fi
if [ "${1:-}" = "--path" ]; then
	echo "$script"
	exit 0
fi
# checkpatch.pl finds spelling.txt and const_structs.checkpatch beside itself.
exec perl "$script" "$@"
