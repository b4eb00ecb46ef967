"""Guest kernels of other Debian releases than this host's: build roots, versions, module builds.

The demo guest boots the host's own Debian kernel (bookworm's 6.1), built against headers
installed on the host (python/ivtools/guestbuild.py). Users also run trixie's 6.12 LTS and the newest 7.x of
trixie-backports. Their headers need trixie's gcc-14 and a glibc newer than bookworm's, so they
are never installed here: each Debian release gets a *build root*, a minimal Debian tree made by
`mmdebstrap` from the mirror this machine's apt already uses, in which the kernel packages are
installed and ivtrace.ko (or DKMS) is built. The guest boots the root's /boot/vmlinuz-<ver> and
takes modules from its /usr/lib/modules/<ver>.

Kernel specs (vm/build --kernel, make guest KERNEL=, build_guest(kernel=)):
  bookworm / trixie / trixie-backports   the newest kernel of that suite (linux-image-amd64's
                                         dependency there), resolved from the archive when asked
  6.12.117+deb13-amd64                   an exact ABI name ("+debN" says the release; without it,
                                         the host's own release)

Cache (outside the repository, shared by every checkout on the machine): $IVTRACE_CACHE, else
/var/cache/ivtrace as root, else ~/.cache/ivtrace:
  roots/<suite>/          the build root (mmdebstrap), with the kernels installed so far
  roots/<suite>.lock      flock: one apt run at a time per root

Python 3.11 standard library only; needs root (mmdebstrap, chroot, unshare). python/ivtools/guestbuild.py
builds the guests on top of it (and re-exports BuildError).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import REPO

# Debian releases by the number in a kernel ABI name's "+debN" suffix (none: the host's).
RELEASES = {12: "bookworm", 13: "trixie", 14: "forky"}
# What a build root holds besides its kernels: a compiler and make for kbuild, dkms for the
# packaged module, and an initramfs tool that needs nothing (a kernel image depends on one).
ROOT_PACKAGES = ("build-essential", "kmod", "dkms", "tiny-initramfs", "ca-certificates")
ROOT_STAMP = ".ivtrace-build-root"
# The module's sources, in the repository's layout (as the ivtrace-dkms package has them).
KMOD_SOURCES = ("guest/kmod", "abi/include")
KMOD_SKIP = re.compile(r"(\.(o|ko|mod|mod\.c|cmd|a|order|symvers)$)|(^\.)|(/\.)|(^tools/probe_cost$)")


class BuildError(Exception):
    """A failure with a message that says what failed, why and what to do."""


def log(msg: str) -> None:
    print(f"vm/build: {msg}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    env = os.environ.get("IVTRACE_CACHE")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/cache/ivtrace")
    return Path.home() / ".cache" / "ivtrace"


# --------------------------------------------------------------------------- the archive

def host_codename() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip().strip('"')
    raise BuildError("/etc/os-release has no VERSION_CODENAME: is this Debian?")


def apt_entries() -> list[tuple[str, str, list[str]]]:
    """(URI, suite, components) of every enabled `deb` entry in /etc/apt/sources.list*,
    one-line and deb822 formats alike."""
    entries = []
    files = [Path("/etc/apt/sources.list")] + sorted(Path("/etc/apt/sources.list.d").glob("*"))
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".sources":
            entries += deb822_entries(text)
        elif f.suffix == ".list" or f.name == "sources.list":
            for line in text.splitlines():
                m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
                if m:
                    entries.append((m[1].rstrip("/"), m[2], m[3].split()))
    return entries


def deb822_entries(text: str) -> list[tuple[str, str, list[str]]]:
    entries = []
    for stanza in re.split(r"\n\s*\n", text):
        fields = {}
        for line in stanza.splitlines():
            m = re.match(r"([A-Za-z-]+):\s*(.*)", line)
            if m and not line.startswith("#"):
                fields[m[1].lower()] = m[2].split()
        if "deb" not in fields.get("types", []) or fields.get("enabled", ["yes"]) == ["no"]:
            continue
        for uri in fields.get("uris", []):
            for suite in fields.get("suites", []):
                entries.append((uri.rstrip("/"), suite, fields.get("components", [])))
    return entries


def debian_mirror() -> str:
    """The Debian archive this machine's apt uses: the URI that serves the host's own suite
    (never written into the repository; IVTRACE_DEBIAN_MIRROR overrides it)."""
    env = os.environ.get("IVTRACE_DEBIAN_MIRROR")
    if env:
        return env.rstrip("/")
    codename = host_codename()
    for uri, suite, comps in apt_entries():
        if suite == codename and "main" in comps:
            return uri
    raise BuildError(f"no apt source serves '{codename} main' in /etc/apt/sources.list*, so the "
                     "Debian mirror to make build roots from is unknown; set "
                     "IVTRACE_DEBIAN_MIRROR=URI (a Debian archive) and retry")


def root_sources(suite: str) -> list[str]:
    """The root's sources.list lines: the host's own release as the host has it (main, with its
    updates and security suites); another release from the same mirror, with its backports."""
    codename = host_codename()
    if suite == codename:
        lines = [f"deb {uri} {s} main" for uri, s, comps in apt_entries()
                 if "main" in comps and re.fullmatch(rf"{codename}(-updates|-security)?", s)]
        if lines:
            return lines
    mirror = debian_mirror()
    return [f"deb {mirror} {suite} main", f"deb {mirror} {suite}-backports main"]


# --------------------------------------------------------------------------- build roots

# The root locks this process holds: lock file -> [open file, depth].
_LOCKS: dict[Path, list] = {}


class BuildRoot:
    """A Debian release's build root (see the top), made on first use and reused after."""

    def __init__(self, suite: str, cache: Path | None = None):
        self.suite = suite
        base = (cache or cache_dir()) / "roots"
        self.path = base / suite
        self.lock_path = base / f"{suite}.lock"
        self.updated = False

    @contextlib.contextmanager
    def locked(self):
        """One apt run at a time in this root, across every checkout and developer. Reentrant
        within this process (a flock taken twice through two descriptors would wait for
        itself)."""
        held = _LOCKS.get(self.lock_path)
        if held is not None:
            held[1] += 1
            try:
                yield
            finally:
                held[1] -= 1
            return
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "w") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            _LOCKS[self.lock_path] = [f, 1]
            try:
                yield
            finally:
                del _LOCKS[self.lock_path]
                fcntl.flock(f, fcntl.LOCK_UN)

    def ensure(self) -> BuildRoot:
        if (self.path / ROOT_STAMP).is_file():
            return self
        need_root("make a build root (mmdebstrap)")
        if not shutil.which("mmdebstrap"):
            install_host_package("mmdebstrap")
        with self.locked():
            if (self.path / ROOT_STAMP).is_file():
                return self
            self.create()
        return self

    def create(self) -> None:
        tmp = self.path.with_name(f".{self.suite}.new-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        sources = root_sources(self.suite)
        log(f"making the {self.suite} build root with mmdebstrap in {self.path} "
            f"(once; ~2 min): {'; '.join(sources)}")
        t0 = time.monotonic()
        cmd = ["mmdebstrap", "--mode=root", "--variant=apt", "--quiet",
               f"--include={','.join(ROOT_PACKAGES)}", self.suite, str(tmp), *sources]
        p = subprocess.run(cmd, text=True, stdin=subprocess.DEVNULL, capture_output=True)
        if p.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(f"mmdebstrap of {self.suite} failed (exit {p.returncode}):\n"
                             f"{(p.stdout + p.stderr).strip()[-3000:]}\nCheck the mirror "
                             f"({sources[0]}) and the network, then retry.")
        (tmp / ROOT_STAMP).write_text(f"{self.suite}\n" + "\n".join(sources) + "\n")
        shutil.rmtree(self.path, ignore_errors=True)
        tmp.rename(self.path)
        log(f"{self.suite} build root ready in {time.monotonic() - t0:.0f} s")

    def run(self, argv: list[str], *, what: str, capture: bool = True,
            timeout: float = 3600) -> subprocess.CompletedProcess:
        """argv inside the root: chroot in a private mount and pid namespace with its own
        /proc (objtool and initramfs tools read it), gone with the command."""
        cmd = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={self.path}/proc",
               "chroot", str(self.path), "/usr/bin/env", "-i",
               "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LC_ALL=C.UTF-8",
               "DEBIAN_FRONTEND=noninteractive", *argv]
        p = subprocess.run(cmd, text=True, stdin=subprocess.DEVNULL, timeout=timeout,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.STDOUT if capture else None)
        if p.returncode:
            out = (p.stdout or "").strip()[-4000:]
            raise BuildError(f"{what} failed in the {self.suite} build root (exit "
                             f"{p.returncode}): `{' '.join(argv)}`\n{out}")
        return p

    def update(self) -> None:
        """apt-get update once per process: "newest" is what the archive says now."""
        if self.updated:
            return
        with self.locked():
            self.run(["apt-get", "update", "-q"], what="apt-get update")
        self.updated = True

    def release_of(self, pkg: str) -> str:
        """The suite of pkg's newest version (the root's own suite, or its -backports)."""
        out = self.run(["apt-cache", "madison", pkg], what=f"apt-cache madison {pkg}").stdout
        # " pkg | version | URI suite/component arch Packages", newest first
        for line in out.splitlines():
            cols = [c.strip() for c in line.split("|")]
            if len(cols) == 3 and len(cols[2].split()) >= 2:
                return cols[2].split()[1].split("/")[0]
        raise BuildError(f"{pkg} is not in the {self.suite} build root's archive "
                         f"({'; '.join(root_sources(self.suite))})")

    def newest_kernel(self, release: str) -> str:
        """The ABI name linux-image-amd64 of `release` depends on (the suite's newest kernel)."""
        out = self.run(["apt-cache", "-t", release, "depends", "linux-image-amd64"],
                       what=f"apt-cache depends linux-image-amd64 ({release})").stdout
        m = re.search(r"Depends: linux-image-(\d\S*-amd64)\b", out)
        if not m:
            raise BuildError(f"linux-image-amd64 in {release} depends on no linux-image-<ver>:\n"
                             f"{out[:800]}")
        return m[1]

    def has_kernel(self, ver: str) -> bool:
        return ((self.path / "boot" / f"vmlinuz-{ver}").is_file()
                and (self.path / "usr/lib/modules" / ver / "modules.dep").is_file()
                and (self.path / "usr/src" / f"linux-headers-{ver}" / "Makefile").is_file())

    def install_kernel(self, ver: str) -> None:
        """linux-image-<ver> (the guest's kernel and modules) and linux-headers-<ver> (to build
        against), from whichever suite has them, with that suite's dependencies."""
        if self.has_kernel(ver):
            return
        self.update()
        release = self.release_of(f"linux-image-{ver}")
        log(f"installing linux-image-{ver} and linux-headers-{ver} ({release}) in the "
            f"{self.suite} build root ...")
        with self.locked():
            self.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                      "-t", release, f"linux-image-{ver}", f"linux-headers-{ver}"],
                     what=f"installing the {ver} kernel packages")
        if not self.has_kernel(ver):
            raise BuildError(f"linux-image-{ver} is installed in {self.path} but boot/vmlinuz-{ver}"
                             f", usr/lib/modules/{ver}/modules.dep or usr/src/linux-headers-{ver}"
                             " is missing")


def need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise BuildError(f"cannot {what} without root: run as root (or sudo)")


def install_host_package(pkg: str) -> None:
    need_root(f"install {pkg}")
    log(f"apt-get install {pkg} ...")
    p = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                        "-o", "DPkg::Lock::Timeout=600", pkg], text=True, capture_output=True,
                       stdin=subprocess.DEVNULL, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if p.returncode:
        raise BuildError(f"apt-get install {pkg} failed:\n{p.stderr.strip()[-1500:]}")


# --------------------------------------------------------------------------- kernels

@dataclass(frozen=True)
class Kernel:
    """A resolved guest kernel: its ABI name and the release whose build root builds for it
    (None: the host's own release, built on the host as python/ivtools/guestbuild.py always did)."""
    version: str
    release: str | None
    spec: str

    @property
    def root(self) -> BuildRoot | None:
        return BuildRoot(self.release) if self.release else None


def release_of_version(ver: str) -> str | None:
    """trixie for 6.12.117+deb13-amd64; None for a name without "+debN" (the host's release)."""
    m = re.search(r"\+deb(\d+)", ver)
    if not m:
        return None
    n = int(m[1])
    if n not in RELEASES:
        raise BuildError(f"kernel {ver}: Debian {n} is not a release this build knows "
                         f"({', '.join(f'{k} {v}' for k, v in RELEASES.items())})")
    rel = RELEASES[n]
    return None if rel == host_codename() else rel


def resolve(spec: str, host_newest) -> Kernel:
    """A kernel spec (see the top) to a Kernel; host_newest() gives the host release's newest
    kernel (guestbuild.kernel_version). Suite names are resolved from the archive now."""
    codename = host_codename()
    if spec in (codename, f"{codename}-updates"):
        return Kernel(host_newest(), None, spec)
    m = re.fullmatch(r"([a-z]+)(-backports)?", spec)
    if m:
        if m[1] not in RELEASES.values():
            raise BuildError(f"unknown kernel spec '{spec}': give a suite ({codename}, "
                             "trixie, trixie-backports) or a kernel ABI name such as "
                             "6.12.117+deb13-amd64")
        root = BuildRoot(m[1]).ensure()
        root.update()
        ver = root.newest_kernel(spec)
        log(f"kernel {spec}: {ver} (newest in the archive's {spec})")
        return Kernel(ver, m[1], spec)
    if not re.fullmatch(r"\d+\.\d+\.\d+[^/\s]*", spec):
        raise BuildError(f"'{spec}' is neither a suite nor a kernel ABI name (e.g. 6.1.0-56-amd64)")
    return Kernel(spec, release_of_version(spec), spec)


def prepare(k: Kernel) -> tuple[Path, Path]:
    """(kernel tree, headers) of a kernel of another release: installed in its build root. The
    tree has boot/vmlinuz-<ver> and lib/modules/<ver> as the .deb's do; the headers are the
    root's /usr/src/linux-headers-<ver>, seen from the host."""
    root = k.root.ensure()
    root.install_kernel(k.version)
    return root.path, root.path / "usr" / "src" / f"linux-headers-{k.version}"


# --------------------------------------------------------------------------- module builds

def sync_tree(dest: Path) -> None:
    """Copy the module's sources (KMOD_SOURCES) into dest in the repository's layout, only the
    files that changed (mtimes kept, so kbuild rebuilds only what changed); files that left the
    repository leave dest too."""
    want: dict[str, Path] = {}
    for top in KMOD_SOURCES:
        for p in (REPO / top).rglob("*"):
            rel = p.relative_to(REPO).as_posix()
            if p.is_file() and not KMOD_SKIP.search(p.relative_to(REPO / top).as_posix()):
                want[rel] = p
    for rel, src in want.items():
        d = dest / rel
        if not d.is_file() or d.read_bytes() != src.read_bytes():
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, d)
    for top in KMOD_SOURCES:
        for p in sorted((dest / top).rglob("*"), reverse=True):
            rel = p.relative_to(dest).as_posix()
            if p.is_file() and rel not in want and not KMOD_SKIP.search(rel):
                p.unlink()


@dataclass(frozen=True)
class ModuleTree:
    """A copy of the module's sources for one kernel: `host` as this machine sees it, `make`
    as the make that builds it does (inside the build root, or the same path on the host)."""
    kernel: Kernel
    host: Path
    make: Path

    def run_make(self, *targets: str) -> subprocess.CompletedProcess:
        """make -C guest/kmod KVER=<ver> TARGETS in this tree; never raises on make's status."""
        argv = ["make", "-C", f"{self.make}/guest/kmod", f"KVER={self.kernel.version}", *targets]
        root = self.kernel.root
        if root is None:
            return subprocess.run(argv, text=True, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            return root.run(argv, what="make")
        except BuildError as e:
            return subprocess.CompletedProcess(argv, 2, str(e), None)


def module_tree(k: Kernel, name: str = "kmod") -> ModuleTree:
    """A synced copy of the sources for kernel k: in its build root (/build/ivtrace-<checkout>/
    <ver>/<name>, so checkouts and kernels never share objects) or, for the host's release,
    under build/<name>/<ver>/ of this checkout."""
    if k.release is None:
        tree = REPO / "build" / name / k.version
        sync_tree(tree)
        return ModuleTree(k, tree, tree)
    root = k.root.ensure()
    root.install_kernel(k.version)
    tag = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]
    inside = Path("/build") / f"ivtrace-{tag}" / k.version / name
    tree = root.path / inside.relative_to("/")
    sync_tree(tree)
    return ModuleTree(k, tree, inside)


def build_module(k: Kernel, dest: Path, *, log_file: Path | None = None) -> dict[str, Path]:
    """ivtrace.ko and ivtrace_test.ko for kernel k (module_tree()), with no warning, copied
    into dest."""
    t = module_tree(k)
    p = t.run_make("modules")
    if log_file is not None:
        with open(log_file, "a") as f:
            f.write(f"\n$ make -C guest/kmod KVER={k.version} ({k.release or 'host'})\n{p.stdout}")
    if p.returncode:
        raise BuildError(f"building ivtrace.ko for {k.version} failed (exit {p.returncode}):\n"
                         f"{p.stdout.strip()[-4000:]}")
    warnings = [ln for ln in p.stdout.splitlines() if re.search(r"\bwarning\b", ln, re.I)]
    if warnings:
        raise BuildError(f"ivtrace.ko for {k.version} built with warnings (it must build with "
                         "none):\n" + "\n".join(warnings[:20]))
    dest.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, rel in (("ivtrace.ko", "guest/kmod/ivtrace.ko"),
                      ("ivtrace_test.ko", "guest/kmod/tests/ivtrace_test.ko")):
        shutil.copy2(t.host / rel, dest / name)
        files[name] = dest / name
    return files
