"""Build the ivtrace demo guest: Debian kernel + matching headers + busybox initramfs, and
(build_guest, `vm/build --all`, `make guest`) what runs in it: ivtrace.ko against that kernel,
the static guest tools and the workloads. Every Python caller builds the guest through
build_guest(); a failed part is an error unless the caller asks to reuse older files.

Run through the `vm/build` wrapper.  Python 3.11 standard library only.

Outputs (all under vm/out/, git-ignored):
  vm/out/vmlinuz                   the guest kernel (copy of boot/vmlinuz-<ver> from the .deb)
  vm/out/initramfs-base.cpio.gz    busybox + /init + kernel modules (no caller files)
  vm/out/initramfs.cpio.gz         base + the files given with --add (same as base without --add)
  vm/out/guest.json                manifest: kernel version, paths, headers dir, module list
  vm/out/debs/                     the downloaded linux-image .deb (cache)
  vm/out/kernel/<ver>/             the .deb extracted with dpkg-deb -x (never installed on the host)

Everything is cached: a step is redone only when its inputs change.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import REPO, buildroot
from .buildroot import BuildError, log  # noqa: F401  (callers use guestbuild.BuildError)

VM_DIR = REPO / "vm"  # the guest's own files (vm/guest) and what the build writes (vm/out)
DEFAULT_OUT = VM_DIR / "out"
INIT_SRC = VM_DIR / "guest" / "init"

# Bump when the layout of the initramfs changes in a way the input hash cannot see.
BUILDER_VERSION = "3"

# Kernel modules copied into the initramfs (with everything modules.dep says they need).
# qemu_fw_cfg: /init reads the command to run from fw_cfg (opt/ivtrace/run).
# virtio_pci + 9p stack: host directory sharing (-virtfs), a comparison transport (9p's own
# dependencies, netfs and, before 6.12, fscache, come from modules.dep).
# virtio_net / virtio_console / virtio_blk: network, virtio-serial and disk comparison transports.
DEFAULT_MODULES = [
    "qemu_fw_cfg",
    "virtio_pci",
    "9p",
    "9pnet",
    "9pnet_virtio",
    "virtio_net",
    "failover",
    "net_failover",
    "virtio_console",
    "virtio_blk",
    "virtio_rng",
]

# Host packages the build needs: (command or file that proves it is there, Debian package).
HOST_TOOLS = [
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    ("/bin/busybox", "busybox-static"),
    ("/sbin/depmod", "kmod"),
    ("/usr/bin/dpkg-deb", "dpkg"),
    ("/usr/bin/zstd", "zstd"),
    ("/usr/bin/xz", "xz-utils"),
]

APT_LISTS = Path("/var/lib/apt/lists")
APT_MAX_AGE = 24 * 3600  # refresh the package lists when older than this


def run(cmd: list[str], *, cwd: Path | None = None, capture: bool = False,
        what: str = "", hint: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, text=True,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.PIPE if capture else None,
                           stdin=subprocess.DEVNULL)
    except FileNotFoundError as e:
        raise BuildError(f"{what or cmd[0]} failed: {e}. {hint}") from e
    if p.returncode != 0:
        detail = ""
        if capture:
            detail = "\n" + (p.stderr or "").strip()[-2000:]
        raise BuildError(f"{what or ' '.join(cmd)} failed (exit {p.returncode}).{detail}\n{hint}".rstrip())
    return p


# --------------------------------------------------------------------------- apt helpers

class Apt:
    def __init__(self, allow_update: bool, force_update: bool):
        self.allow_update = allow_update
        self.force_update = force_update
        self.updated = False

    @staticmethod
    def is_root() -> bool:
        return os.geteuid() == 0

    def lists_age(self) -> float:
        newest = 0.0
        if APT_LISTS.is_dir():
            for p in APT_LISTS.iterdir():
                if p.name.endswith(("_Packages", "_Packages.lz4", "_Packages.xz", "_Packages.gz")):
                    newest = max(newest, p.stat().st_mtime)
        return time.time() - newest if newest else float("inf")

    def update(self, reason: str) -> None:
        if self.updated:
            return
        if not self.allow_update:
            log(f"not running apt-get update ({reason}) because of --no-update")
            return
        if not self.is_root():
            raise BuildError(f"apt-get update is needed ({reason}) but this is not root; "
                             "run vm/build as root (or sudo), or run 'apt-get update' first")
        log(f"apt-get update ({reason}) ...")
        run(["apt-get", "update", "-q"], what="apt-get update",
            hint="Check the network / Debian mirror in /etc/apt/sources.list*, then rerun vm/build.")
        self.updated = True

    def maybe_refresh(self) -> None:
        age = self.lists_age()
        if self.force_update:
            self.update("--update given")
        elif age == float("inf"):
            self.update("no package lists yet")
        elif age > APT_MAX_AGE:
            self.update(f"package lists are {age / 3600:.0f} h old")

    @staticmethod
    def installed(pkg: str) -> bool:
        p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        return p.returncode == 0 and "install ok installed" in p.stdout

    def install(self, pkgs: list[str], why: str) -> None:
        pkgs = [p for p in pkgs if not self.installed(p)]
        if not pkgs:
            return
        if not self.is_root():
            raise BuildError(f"missing Debian packages {' '.join(pkgs)} ({why}); "
                             f"run as root: apt-get install {' '.join(pkgs)}")
        log(f"apt-get install {' '.join(pkgs)} ({why}) ...")
        self.retry("install failed, lists may be stale", lambda: run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *pkgs],
            what=f"apt-get install {' '.join(pkgs)}",
            hint="Check the network / mirror; 'apt-get update' may help."))

    def retry(self, reason: str, step) -> None:
        """Runs `step`; if it fails, refreshes the package lists (once, when
        allowed) and runs it again: a stale list names versions the mirror
        no longer has."""
        try:
            step()
        except BuildError:
            if self.updated or not self.allow_update:
                raise
            self.update(reason)
            step()


def ensure_host_tools(apt: Apt) -> None:
    missing = [pkg for path, pkg in HOST_TOOLS if not Path(path).exists() or not apt.installed(pkg)]
    # /bin/busybox may be the dynamic 'busybox' package: we need the static one.
    if Path("/bin/busybox").exists() and not is_static_elf(Path("/bin/busybox")):
        missing.append("busybox-static")
    missing = sorted(set(missing))
    if missing:
        if apt.lists_age() == float("inf"):
            apt.update("no package lists yet")
        apt.install(missing, "host tools for building/booting the guest")
    if not is_static_elf(Path("/bin/busybox")):
        raise BuildError("/bin/busybox is not statically linked; install busybox-static "
                         "(apt-get install busybox-static), it replaces the dynamic busybox")


def is_static_elf(path: Path) -> bool:
    """True if the ELF file has no PT_INTERP program header (statically linked)."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2:
            return False
        import struct
        e_phoff, = struct.unpack_from("<Q", ident, 0x20)
        e_phentsize, e_phnum = struct.unpack_from("<HH", ident, 0x36)
        f.seek(e_phoff)
        ph = f.read(e_phentsize * e_phnum)
        for i in range(e_phnum):
            p_type, = struct.unpack_from("<I", ph, i * e_phentsize)
            if p_type == 3:  # PT_INTERP
                return False
        return True


# --------------------------------------------------------------------------- kernel

def kernel_version(apt: Apt, override: str | None) -> str:
    if override:
        return override
    for attempt in (1, 2):
        pol = run(["apt-cache", "policy", "linux-image-amd64"], capture=True,
                  what="apt-cache policy linux-image-amd64").stdout
        m = re.search(r"Candidate:\s*(\S+)", pol)
        cand = m.group(1) if m else "(none)"
        if cand != "(none)":
            show = run(["apt-cache", "show", f"linux-image-amd64={cand}"], capture=True,
                       what="apt-cache show linux-image-amd64").stdout
            for line in show.splitlines():
                if line.startswith("Depends:"):
                    dm = re.search(r"linux-image-(\d[^\s,(|]*)", line)
                    if dm:
                        return dm.group(1)
            raise BuildError(f"linux-image-amd64 {cand} does not depend on a linux-image-<ver> "
                             f"package:\n{show[:500]}")
        if attempt == 1:
            apt.update("linux-image-amd64 has no candidate version")
    raise BuildError("cannot find the Debian kernel: 'apt-cache policy linux-image-amd64' has no "
                     "candidate. Check /etc/apt/sources.list* (Debian 12 'bookworm' main) and run "
                     "'apt-get update'.")


def resolve_kernel(apt: Apt, spec: str | None) -> buildroot.Kernel:
    """The guest kernel: the host release's newest without a spec, else the spec's (a suite or
    an ABI name, python/ivtools/buildroot.py), kernels of other releases coming from their build root."""
    if not spec:
        return buildroot.Kernel(kernel_version(apt, None), None, "")
    return buildroot.resolve(spec, lambda: kernel_version(apt, None))


def fetch_kernel(apt: Apt, ver: str, out: Path) -> Path:
    """Download linux-image-<ver> and extract it (dpkg-deb -x). Returns the extracted root."""
    root = out / "kernel" / ver
    if (root / "boot" / f"vmlinuz-{ver}").is_file() and \
            (root / "lib" / "modules" / ver / "modules.dep").is_file():
        return root
    debs = out / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    pkg = f"linux-image-{ver}"
    found = sorted(debs.glob(f"{pkg}_*.deb"))
    if not found:
        log(f"apt-get download {pkg} (into {debs}) ...")
        # _apt cannot write into vm/out: download as root without the sandbox warning.
        sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
        apt.retry("download failed", lambda: run(
            ["apt-get", *sandbox, "download", pkg], cwd=debs, what=f"apt-get download {pkg}",
            hint="The package lists may be stale or the mirror unreachable."))
        found = sorted(debs.glob(f"{pkg}_*.deb"))
        if not found:
            raise BuildError(f"apt-get download {pkg} left no {pkg}_*.deb in {debs}")
    deb = found[-1]
    log(f"extracting {deb.name} with dpkg-deb -x (not installed on the host) ...")
    tmp = Path(tempfile.mkdtemp(prefix=f".extract-{ver}-", dir=out))
    try:
        run(["dpkg-deb", "-x", str(deb), str(tmp)], what=f"dpkg-deb -x {deb.name}",
            hint=f"The .deb may be corrupt: delete {deb} and rerun vm/build.")
        if not (tmp / "boot" / f"vmlinuz-{ver}").is_file():
            raise BuildError(f"{deb.name} has no boot/vmlinuz-{ver}")
        mdir = tmp / "lib" / "modules" / ver
        if not mdir.is_dir():
            raise BuildError(f"{deb.name} has no lib/modules/{ver}")
        if not (mdir / "modules.dep").is_file():
            # The .deb ships no modules.dep (dpkg's postinst runs depmod); make one in place.
            log(f"depmod -b {tmp} {ver} (the .deb ships no modules.dep) ...")
            run(["/sbin/depmod", "-b", str(tmp), ver], what="depmod on the extracted kernel tree")
        if root.exists():
            shutil.rmtree(root)
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp.rename(root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def ensure_headers(apt: Apt, ver: str) -> Path:
    pkg = f"linux-headers-{ver}"
    if not apt.installed(pkg):
        apt.install([pkg], "to build the ivtrace kernel module against the guest kernel")
    for cand in (Path(f"/lib/modules/{ver}/build"), Path(f"/usr/src/linux-headers-{ver}")):
        if (cand / "Makefile").is_file():
            return cand
    raise BuildError(f"{pkg} is installed but neither /lib/modules/{ver}/build nor "
                     f"/usr/src/linux-headers-{ver} has a Makefile")


# --------------------------------------------------------------------------- modules

def parse_modules_dep(mdir: Path) -> dict[str, list[str]]:
    deps: dict[str, list[str]] = {}
    for line in (mdir / "modules.dep").read_text().splitlines():
        if ":" not in line:
            continue
        mod, rest = line.split(":", 1)
        deps[mod.strip()] = rest.split()
    return deps


def mod_name(relpath: str) -> str:
    base = relpath.rsplit("/", 1)[-1]
    base = re.sub(r"\.ko(\.(xz|zst|gz))?$", "", base)
    return base.replace("-", "_")


def resolve_modules(mdir: Path, wanted: list[str]) -> list[str]:
    """Relative paths (as in modules.dep) of the wanted modules plus dependencies, load order."""
    deps = parse_modules_dep(mdir)
    by_name = {mod_name(p): p for p in deps}
    builtin = set()
    bf = mdir / "modules.builtin"
    if bf.is_file():
        builtin = {mod_name(l.strip()) for l in bf.read_text().splitlines() if l.strip()}
    order: list[str] = []
    seen: set[str] = set()

    def visit(path: str, stack: tuple[str, ...]) -> None:
        if path in seen:
            return
        if path in stack:
            raise BuildError(f"dependency cycle in modules.dep: {' -> '.join(stack + (path,))}")
        for d in deps.get(path, []):
            visit(d, stack + (path,))
        seen.add(path)
        order.append(path)

    for name in wanted:
        n = name.replace("-", "_")
        if n in by_name:
            visit(by_name[n], ())
        elif n in builtin:
            log(f"module {name} is built into this kernel; nothing to copy")
        else:
            raise BuildError(f"kernel module '{name}' is neither in modules.dep nor built in "
                             f"({mdir}); check the name or the kernel config")
    return order


def decompress_module(src: Path) -> bytes:
    data = src.read_bytes()
    name = src.name
    if name.endswith(".ko"):
        return data
    if name.endswith(".ko.xz"):
        return lzma.decompress(data)
    if name.endswith(".ko.gz"):
        return gzip.decompress(data)
    if name.endswith(".ko.zst"):
        p = subprocess.run(["zstd", "-dc", str(src)], stdout=subprocess.PIPE, check=True)
        return p.stdout
    raise BuildError(f"unknown module compression: {src}")


# --------------------------------------------------------------------------- cpio (newc)

class Cpio:
    """A deterministic newc writer: uid/gid 0, mtime 0, sorted by the caller."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.ino = 300000
        self.names: set[str] = set()

    def _entry(self, name: str, mode: int, data: bytes = b"", rdev: tuple[int, int] = (0, 0),
               nlink: int = 1) -> None:
        name = name.lstrip("/")
        self.ino += 1
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(f"{v:08X}" for v in (
            self.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rdev[0], rdev[1], len(nb), 0))
        self.buf.write(hdr.encode() + nb)
        self.buf.write(b"\0" * ((4 - (110 + len(nb)) % 4) % 4))
        self.buf.write(data)
        self.buf.write(b"\0" * ((4 - len(data) % 4) % 4))
        if name != "TRAILER!!!":
            self.names.add(name)

    def dir(self, name: str, perm: int = 0o755) -> None:
        name = name.strip("/")
        if not name or name in self.names:
            return
        parent = name.rsplit("/", 1)[0] if "/" in name else ""
        if parent:
            self.dir(parent)
        self._entry(name, stat.S_IFDIR | perm, nlink=2)

    def _parents(self, name: str) -> None:
        name = name.strip("/")
        if "/" in name:
            self.dir(name.rsplit("/", 1)[0])

    def file(self, name: str, data: bytes, perm: int = 0o644) -> None:
        self._parents(name)
        self._entry(name, stat.S_IFREG | perm, data)

    def symlink(self, name: str, target: str) -> None:
        self._parents(name)
        self._entry(name, stat.S_IFLNK | 0o777, target.encode())

    def chardev(self, name: str, major: int, minor: int, perm: int = 0o600) -> None:
        self._parents(name)
        self._entry(name, stat.S_IFCHR | perm, rdev=(major, minor))

    def finish(self) -> bytes:
        self._entry("TRAILER!!!", 0)
        data = self.buf.getvalue()
        return data + b"\0" * ((512 - len(data) % 512) % 512)


def gz(data: bytes, level: int = 6) -> bytes:
    """gzip with a fixed header (mtime 0) and padded to 4 bytes, so archives can be concatenated."""
    out = gzip.compress(data, compresslevel=level, mtime=0)
    return out + b"\0" * ((4 - len(out) % 4) % 4)


# --------------------------------------------------------------------------- --add handling

def parse_add(spec: str, kver: str) -> tuple[Path, str]:
    """SRC[:DEST] -> (src path, absolute dest inside the initramfs).

    Without DEST: *.ko goes to /lib/modules/<ver>/extra/, anything else to /usr/local/bin/.
    A DEST ending in '/' is a directory: the source keeps its base name.
    '{kver}' in DEST is replaced by the kernel version.
    """
    if ":" in spec:
        src_s, dest = spec.split(":", 1)
    else:
        src_s, dest = spec, ""
    src = Path(src_s).expanduser()
    if not src.is_absolute():
        src = Path.cwd() / src
    if not src.exists():
        raise BuildError(f"--add {spec}: {src} does not exist (build it first)")
    if not dest:
        dest = f"/lib/modules/{kver}/extra/" if src.name.endswith(".ko") else "/usr/local/bin/"
    dest = dest.replace("{kver}", kver)
    if not dest.startswith("/"):
        dest = "/" + dest
    if dest.endswith("/"):
        dest += src.name
    if ".." in dest.split("/"):
        raise BuildError(f"--add {spec}: destination may not contain '..'")
    return src, dest


def add_files_to(cpio: Cpio, adds: list[tuple[Path, str]], h: hashlib._Hash | None = None) -> None:
    for src, dest in adds:
        items = []
        if src.is_dir():
            for p in sorted(src.rglob("*")):
                items.append((p, dest.rstrip("/") + "/" + p.relative_to(src).as_posix()))
            cpio.dir(dest)
        else:
            items.append((src, dest))
        for p, d in items:
            if p.is_symlink():
                tgt = os.readlink(p)
                cpio.symlink(d, tgt)
                if h:
                    h.update(f"L{d}\0{tgt}\0".encode())
            elif p.is_dir():
                cpio.dir(d)
                if h:
                    h.update(f"D{d}\0".encode())
            else:
                data = p.read_bytes()
                perm = stat.S_IMODE(p.stat().st_mode)
                cpio.file(d, data, perm)
                if h:
                    h.update(f"F{d}\0{perm}\0".encode() + hashlib.sha256(data).digest())


def overlay_initramfs(add_specs: list[str], kver: str) -> bytes:
    """A gzip'd cpio with just the --add files; appended after a base archive (the kernel
    unpacks concatenated archives in order, later files replace earlier ones)."""
    adds = [parse_add(s, kver) for s in add_specs]
    c = Cpio()
    add_files_to(c, adds)
    return gz(c.finish(), level=1)


# --------------------------------------------------------------------------- initramfs

def busybox_applets(bb: Path) -> list[str]:
    p = run([str(bb), "--list-full"], capture=True, what="busybox --list-full")
    return sorted(l.strip() for l in p.stdout.splitlines() if l.strip())


def build_base(kroot: Path, ver: str, modules: list[str], out: Path) -> tuple[Path, dict]:
    mdir = kroot / "lib" / "modules" / ver
    order = resolve_modules(mdir, modules)
    bb = Path("/bin/busybox")
    init = INIT_SRC.read_bytes()

    h = hashlib.sha256()
    h.update(f"builder {BUILDER_VERSION}\0kernel {ver}\0".encode())
    h.update(hashlib.sha256(init).digest())
    h.update(hashlib.sha256(bb.read_bytes()).digest())
    h.update(("\0".join(order)).encode())
    for rel in order:
        st = (mdir / rel).stat()
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    key = h.hexdigest()

    target = out / "initramfs-base.cpio.gz"
    keyf = out / "initramfs-base.key"
    info = {"modules": [mod_name(p) for p in order], "module_paths": order}
    if target.is_file() and keyf.is_file() and keyf.read_text().strip() == key:
        log(f"initramfs-base is up to date ({target})")
        return target, info

    log(f"building {target.name}: busybox, /init, {len(order)} kernel modules ...")
    c = Cpio()
    for d in ("bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin", "dev", "proc", "sys", "tmp",
              "run", "mnt", "root", "etc", "var", "workload", f"lib/modules/{ver}/extra"):
        c.dir(d)
    c.chardev("dev/console", 5, 1)
    c.chardev("dev/null", 1, 3, 0o666)
    c.file("bin/busybox", bb.read_bytes(), 0o755)
    for applet in busybox_applets(bb):
        applet = applet.lstrip("/")
        if applet == "bin/busybox" or applet == "linuxrc":
            continue
        depth = applet.count("/")
        c.symlink(applet, "../" * depth + "bin/busybox" if depth else "bin/busybox")
    c.file("init", init, 0o755)
    c.file("etc/ivtrace/kernel.version", (ver + "\n").encode())
    c.file("etc/ivtrace/modules.load", ("\n".join(mod_name(p) for p in order) + "\n").encode())
    c.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n")
    c.file("etc/group", b"root:x:0:\n")

    # Modules: copied uncompressed (busybox insmod handles plain .ko only), then depmod
    # over the staged tree so that busybox modprobe resolves dependencies in the guest.
    stage = Path(tempfile.mkdtemp(prefix=".modstage-", dir=out))
    try:
        sm = stage / "lib" / "modules" / ver
        sm.mkdir(parents=True)
        for aux in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
            if (mdir / aux).is_file():
                shutil.copy2(mdir / aux, sm / aux)
        for rel in order:
            dst_rel = re.sub(r"\.ko\.(xz|zst|gz)$", ".ko", rel)
            dst = sm / dst_rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(decompress_module(mdir / rel))
        if (sm / "modules.order").is_file():
            kept = {re.sub(r"\.ko\.(xz|zst|gz)$", ".ko", r) for r in order}
            lines = [re.sub(r"\.ko\.(xz|zst|gz)$", ".ko", l)
                     for l in (sm / "modules.order").read_text().splitlines()]
            (sm / "modules.order").write_text("".join(l + "\n" for l in lines if l in kept))
        run(["/sbin/depmod", "-b", str(stage), ver], what="depmod on the initramfs module tree")
        for p in sorted(stage.rglob("*")):
            rel = p.relative_to(stage).as_posix()
            if p.is_dir():
                c.dir(rel)
            else:
                c.file(rel, p.read_bytes(), 0o644)
    finally:
        shutil.rmtree(stage, ignore_errors=True)

    data = gz(c.finish())
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(target)
    keyf.write_text(key + "\n")
    log(f"wrote {target} ({len(data) / 1e6:.1f} MB)")
    return target, info


def build_final(base: Path, add_specs: list[str], ver: str, out: Path) -> Path:
    final = out / "initramfs.cpio.gz"
    adds = [parse_add(s, ver) for s in add_specs]
    h = hashlib.sha256(base.read_bytes())
    c = Cpio()
    add_files_to(c, adds, h)
    key = h.hexdigest()
    keyf = out / "initramfs.key"
    if final.is_file() and keyf.is_file() and keyf.read_text().strip() == key:
        log(f"initramfs is up to date ({final})")
        return final
    data = base.read_bytes()
    if adds:
        data += gz(c.finish(), level=6)
        for src, dest in adds:
            log(f"added {src} -> {dest}")
    tmp = final.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.rename(final)
    keyf.write_text(key + "\n")
    log(f"wrote {final} ({len(data) / 1e6:.1f} MB)")
    return final


@contextlib.contextmanager
def locked(out: Path, name: str = ".lock"):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(add: list[str] | None = None, *, out: Path = DEFAULT_OUT, kernel: str | None = None,
          headers: bool = True, allow_update: bool = True, force_update: bool = False,
          extra_modules: list[str] | None = None, offline: bool = False,
          final: bool = True) -> dict:
    """Build (or reuse) everything; returns the manifest (also written to out/guest.json).

    offline: no apt at all, reuse the kernel already extracted in `out`.
    final=False: only (re)build the base initramfs, keep initramfs.cpio.gz and its --add list.
    """
    add = add or []
    out = Path(out)
    with locked(out):
        manifest_f = out / "guest.json"
        if offline:
            if not manifest_f.is_file():
                raise BuildError(f"--offline but nothing built yet in {out}")
            m = json.loads(manifest_f.read_text())
            kernel = kernel or m["kernel_version"]
            allow_update = False
        apt = Apt(allow_update=allow_update, force_update=force_update)
        if not offline:
            ensure_host_tools(apt)
            apt.maybe_refresh()
        k = resolve_kernel(apt, kernel)
        ver = k.version
        log(f"guest kernel: {ver}" + (f" ({k.release} build root)" if k.release else ""))
        hdr = None
        if k.release:
            kroot, hdr = buildroot.prepare(k)
        else:
            kroot = fetch_kernel(apt, ver, out)
        if headers and not offline and not k.release:
            hdr = ensure_headers(apt, ver)
        if hdr:
            log(f"kernel headers for the module build: {hdr}")
        vml = out / "vmlinuz"
        src_vml = kroot / "boot" / f"vmlinuz-{ver}"
        if not vml.is_file() or vml.read_bytes() != src_vml.read_bytes():
            shutil.copyfile(src_vml, vml)
        base, info = build_base(kroot, ver, DEFAULT_MODULES + (extra_modules or []), out)
        prev = json.loads(manifest_f.read_text()) if manifest_f.is_file() else {}
        if final or not (out / "initramfs.cpio.gz").is_file():
            final_p = build_final(base, add, ver, out)
            added = [{"src": str(s), "dest": d} for s, d in (parse_add(a, ver) for a in add)]
        else:
            # Keep the files of the last `vm/build --add`, but on top of the current base.
            added = [a for a in prev.get("added", []) if Path(a["src"]).exists()]
            for a in prev.get("added", []):
                if a not in added:
                    log(f"warning: {a['src']} (added by the last vm/build) is gone; dropped")
            final_p = build_final(base, [f"{a['src']}:{a['dest']}" for a in added], ver, out)
        if hdr is None:
            hdr = prev.get("headers") or (Path(f"/lib/modules/{ver}/build")
                                          if Path(f"/lib/modules/{ver}/build").exists() else None)
        manifest = {
            "kernel_version": ver,
            "kernel_release": k.release,
            "vmlinuz": str(vml),
            "initramfs": str(final_p),
            "initramfs_base": str(base),
            "kernel_tree": str(kroot),
            "modules_dir": str(kroot / "lib" / "modules" / ver),
            "headers": str(hdr) if hdr else None,
            "modules": info["modules"],
            "added": added,
        }
        tmp = manifest_f.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        tmp.rename(manifest_f)
        return manifest


# --------------------------------------------------------------------------- what runs in the guest

@dataclass(frozen=True)
class Part:
    """One piece of the guest's software: the make call that builds it (run from the repository
    root, `{kver}` replaced by the guest kernel version) and the files it leaves."""
    what: str
    make: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)  # name -> path in the repository


EV_WORKLOADS = ("ev-int", "ev-syscall", "ev-tar", "ev-gzip", "ev-forkexec", "ev-nop", "ev-helper",
                "gb-work")

PARTS = (
    Part("ivtrace.ko and its test module, against the guest kernel",
         ("-C", "guest/kmod", "KVER={kver}"),
         {"ivtrace.ko": "guest/kmod/ivtrace.ko",
          "ivtrace_test.ko": "guest/kmod/tests/ivtrace_test.ko"}),
    Part("the ftrace relay ivtrace-ftrace", ("-C", "guest/ftrace"),
         {"ivtrace-ftrace": "build/guest/ftrace/ivtrace-ftrace"}),
    Part("libivtrace's static ivtrace-loadgen",
         ("-C", "guest/lib", "build/ivtrace-loadgen-static"),
         {"ivtrace-loadgen-static": "guest/lib/build/ivtrace-loadgen-static"}),
    Part("the demo workload's helper ivtwl", ("-C", "vm/guest/workload"),
         {"ivtwl": "vm/guest/workload/ivtwl"}),
    Part("the benchmark workloads", ("-C", "bench/guest/workloads"),
         {n: f"build/bench/guest/{n}" for n in EV_WORKLOADS}),
    Part("the doorbell benchmark's guest side", ("-C", "bench/doorbell", "guest"),
         {"dbguest": "build/bench/doorbell/dbguest"}),
)


@dataclass
class GuestBuild:
    """What build_guest() made: the kernel manifest, every guest file by name, and the parts
    whose build failed and whose older files were used instead (only with reuse_stale)."""
    manifest: dict
    files: dict[str, Path]
    stale: list[dict]
    tracers: object | None = None   # tracers.Tracers when built with tracers=True

    @property
    def kernel_version(self) -> str:
        return self.manifest["kernel_version"]

    def add(self, *names: str) -> list[str]:
        """The ivtvm `add=` list for these files (each to its default place in the guest)."""
        return [str(self.files[n]) for n in names]


def kernel_ready(out: Path) -> dict:
    """The kernel and initramfs, built when missing; when vm/out is there, only refreshed
    offline (no apt), unless the headers the module build needs are missing."""
    manifest_f = out / "guest.json"
    if manifest_f.is_file():
        kver = json.loads(manifest_f.read_text())["kernel_version"]
        if Path(f"/lib/modules/{kver}/build/Makefile").is_file():
            return build(out=out, offline=True, final=False)
    return build(out=out, final=False)


def make_part(part: Part, kver: str, log_file: Path | None) -> str | None:
    """Run the part's make; None on success, else the end of its output."""
    cmd = ["make", *(a.replace("{kver}", kver) for a in part.make)]
    p = subprocess.run(cmd, cwd=REPO, text=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if log_file is not None:
        with open(log_file, "a") as f:
            f.write(f"\n$ {' '.join(cmd)}\n{p.stdout}")
    if p.returncode == 0:
        return None
    return f"`{' '.join(cmd)}` failed (exit {p.returncode}):\n{p.stdout.strip()[-3000:]}"


def kernel_out(ver: str) -> Path:
    """Where the guest of a kernel other than the default one is built."""
    return DEFAULT_OUT / "kernels" / ver


def build_guest(*, reuse_stale: bool = False, out: Path | None = None,
                log_file: Path | None = None, tracers: bool = False,
                kernel: str | None = None) -> GuestBuild:
    """`make guest`: the kernel and initramfs, then ivtrace.ko against that kernel, the static
    guest tools and the workloads. Every Python caller (vm/demo, the tests, bench/run) builds
    the guest through this function. tracers=True (`vm/build --all --tracers`, the guest
    benchmark) also builds the tracers it compares ivtrace.ko with: LTTng's kernel tracer
    against the guest kernel, LTTng's and perf's user space (python/ivtools/tracers.py; minutes the
    first time, cached after).

    kernel= (a suite such as trixie-backports, or an ABI name; python/ivtools/buildroot.py) builds the guest
    of that kernel in vm/out/kernels/<ver>/ (or out), its ivtrace.ko in the kernel's build root
    for another Debian release, copied to <out>/kmod/; without it, the default guest (the
    host release's newest kernel) in vm/out, its module built in guest/kmod.

    A part whose build fails is an error (BuildError, with make's output). reuse_stale=True
    (`bench/run --reuse-stale-binaries`) uses the files an earlier build left instead, when
    they all exist; each such part is listed in `.stale` and the caller records it."""
    k = None
    if kernel:
        k = resolve_kernel(Apt(allow_update=True, force_update=False), kernel)
        out = Path(out) if out else kernel_out(k.version)
        manifest = build(out=out, kernel=k.version, final=False)
    else:
        out = Path(out) if out else DEFAULT_OUT
        manifest = kernel_ready(out)
    kver = manifest["kernel_version"]
    files: dict[str, Path] = {}
    stale: list[dict] = []
    with locked(out, ".software.lock"):
        for part in PARTS:
            if k is not None and "ivtrace.ko" in part.files:
                files.update(buildroot.build_module(k, out / "kmod", log_file=log_file))
                continue
            paths = {n: REPO / rel for n, rel in part.files.items()}
            error = make_part(part, kver, log_file)
            missing = [str(p) for p in paths.values() if not p.is_file()]
            if error is None and missing:
                error = f"make succeeded but left no {', '.join(missing)}"
            if error is not None:
                if not reuse_stale or missing:
                    raise BuildError(f"building {part.what} failed: {error}\nFix the build; "
                                     "a benchmark may go on with the files of an earlier build "
                                     "only when asked to (bench/run --reuse-stale-binaries).")
                log(f"WARNING: building {part.what} failed; using the files of an earlier "
                    "build (--reuse-stale-binaries, recorded)")
                stale.append({"part": part.what, "files": sorted(part.files.values()),
                              "error": error.splitlines()[0]})
            files.update(paths)
    built = GuestBuild(manifest, files, stale)
    if tracers:
        from . import tracers as comparison  # only the guest benchmark needs it
        built.tracers = comparison.build(manifest, files["ivtrace.ko"], out)
    return built


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="vm/build",
        description="Build the ivtrace demo guest (Debian kernel, headers, busybox initramfs) "
                    "into vm/out/. Idempotent: only changed inputs are rebuilt.")
    ap.add_argument("--add", action="append", default=[], metavar="SRC[:DEST]",
                    help="put a host file or directory into the initramfs (repeatable). Without "
                         "DEST: *.ko -> /lib/modules/<ver>/extra/, else /usr/local/bin/. A DEST "
                         "ending in / keeps the base name; {kver} expands to the kernel version.")
    ap.add_argument("--module", action="append", default=[], metavar="NAME",
                    help="copy one more module of the Debian kernel (with its dependencies)")
    ap.add_argument("--kernel", metavar="SPEC",
                    help="the guest kernel instead of the one this host's linux-image-amd64 "
                         "depends on: a suite (bookworm, trixie, trixie-backports: its newest "
                         "kernel, resolved from the archive now) or an ABI name (6.1.0-56-amd64, "
                         "6.12.117+deb13-amd64). Built in vm/out/kernels/<ver>/ (unless --out); "
                         "another release's kernel and module in its build root "
                         "(python/ivtools/buildroot.py)")
    ap.add_argument("--no-headers", action="store_true", help="do not install linux-headers-<ver>")
    ap.add_argument("--no-update", action="store_true", help="never run apt-get update")
    ap.add_argument("--update", action="store_true", help="run apt-get update first")
    ap.add_argument("--offline", action="store_true",
                    help="no apt at all: reuse the kernel already in vm/out (rebuild the initramfs only)")
    ap.add_argument("--out", help="output directory (default vm/out, or vm/out/kernels/<ver> "
                                  "with --kernel)")
    ap.add_argument("--print", dest="print_key", metavar="KEY",
                    help="print one manifest value (e.g. kernel_version, headers) on stdout")
    ap.add_argument("--all", action="store_true",
                    help="then build what runs in the guest: ivtrace.ko against that kernel, "
                         "the static guest tools and the workloads (`make guest`)")
    ap.add_argument("--tracers", action="store_true",
                    help="with --all: also LTTng's kernel tracer (lttng-modules built against "
                         "the guest kernel), LTTng's and perf's user space (python/ivtools/tracers.py)")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        # --all alone keeps the files of the last --add in initramfs.cpio.gz (make guest
        # must not undo what vm/demo baked in); a plain vm/build resets it to the base.
        kver = out = None
        if a.kernel:
            apt = Apt(allow_update=not a.no_update, force_update=a.update)
            kver = resolve_kernel(apt, a.kernel).version
        out = Path(a.out) if a.out else kernel_out(kver) if kver else DEFAULT_OUT
        m = build(a.add, out=out, kernel=kver, headers=not a.no_headers,
                  allow_update=not a.no_update, force_update=a.update,
                  extra_modules=a.module, offline=a.offline, final=bool(a.add) or not a.all)
        software = (build_guest(out=out, tracers=a.tracers, kernel=kver) if a.all else None)
    except BuildError as e:
        log(f"ERROR: {e}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    if a.print_key:
        v = m.get(a.print_key)
        print(v if isinstance(v, str) else json.dumps(v))
    else:
        log(f"done in {time.monotonic() - t0:.1f} s")
        print(f"kernel:    {m['kernel_version']}")
        print(f"vmlinuz:   {m['vmlinuz']}")
        print(f"initramfs: {m['initramfs']}")
        print(f"headers:   {m['headers']}")
        print(f"modules:   {' '.join(m['modules'])}")
        for name, path in (software.files.items() if software else ()):
            print(f"{name + ':':<25}{path.relative_to(REPO)}")
        if out != DEFAULT_OUT:
            print(f"boot it:   vm/run --out {out.relative_to(REPO) if out.is_relative_to(REPO) else out}"
                  " --shm ivt0 --run 'uname -r'")
        if software and software.tracers:
            print(f"{'tracers:':<25}{software.tracers.root.relative_to(REPO)} "
                  f"({software.tracers.info['root_mb']} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
