"""The tracers the guest benchmark compares ivtrace.ko with, built for the guest kernel:

* LTTng's kernel tracer: Debian's `lttng-modules-dkms` source (fetched with `apt-get
  download`, never installed on the host) built against the guest kernel's headers with a
  plain kbuild, the make call dkms itself runs; the .ko files stripped of debug info;
* LTTng's user space (`lttng`, `lttng-sessiond`, `lttng-consumerd`) and `perf`: the host's
  Debian binaries (packages lttng-tools and linux-perf, installed with apt when missing),
  copied with every shared library `ldd` lists and the loader, plus the one data file
  sessiond reads (session.xsd);
* module indexes (`modules.dep.bin` and friends, from the host's kmod `depmod`): sessiond
  loads its modules through libkmod, which reads only the binary indexes, and busybox's
  depmod in the guest's /init writes only the text ones.

Why copy binaries and not build a Debian root with debootstrap: the guest is a busybox
initramfs that every test and benchmark boots; the copied closure (~80 MB, mostly ICU data
that libxml2 pulls in) rides in the same initramfs as one more `add=` overlay, needs no disk
image, no switch_root and no second /init, and the binaries are the very packages of the
guest kernel's release (bookworm). A debootstrap root would be ~300 MB of downloads for the
same three programs.

Outputs (git-ignored): vm/out/tracers/<kver>/root/{usr,lib,lib64}, with build.json saying
what is in it (versions, the probes that did not build and why). Each step is redone only
when its inputs change. Entry point: build(guest) from guestbuild.build_guest(tracers=True).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import guestbuild, proc
from .guestbuild import BuildError, log

LTTNG_PKG = "lttng-modules-dkms"
HOST_PACKAGES = ("lttng-tools", "linux-perf")
# The guest-side programs and where they live on this Debian host (and in the guest).
PROGRAMS = ("/usr/bin/lttng", "/usr/bin/lttng-sessiond",
            "/usr/lib/x86_64-linux-gnu/lttng/libexec/lttng-consumerd", "/usr/bin/perf")
DATA_FILES = ("/usr/share/xml/lttng/session.xsd",)
LOADER = "/lib64/ld-linux-x86-64.so.2"
RE_FAILED_PROBE = re.compile(r"(src/probes/lttng-probe-[\w-]+)\.o\] Error")


@dataclass
class Tracers:
    """What build() made: the root to overlay on the guest's initramfs, and what it holds."""
    root: Path
    info: dict = field(default_factory=dict)

    def add(self) -> list[str]:
        """The ivtvm `add=` list: the root's top directories at the same places in the guest."""
        return [f"{self.root / d}:/{d}" for d in ("usr", "lib", "lib64")]


# Build steps: their output merged into one stream, the end of it in a BuildError.
sh = functools.partial(proc.sh, error=BuildError, stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def key_of(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def up_to_date(key_file: Path, key: str) -> bool:
    return key_file.is_file() and key_file.read_text().strip() == key


def file_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path), st.st_size, st.st_mtime_ns)


# --------------------------------------------------------------------------- host packages

def ensure_host_packages(apt: guestbuild.Apt) -> None:
    """lttng-tools and linux-perf on the host: their binaries are what the guest runs."""
    apt.install(list(HOST_PACKAGES), "LTTng's and perf's user space, copied into the guest")
    missing = [p for p in PROGRAMS + DATA_FILES if not Path(p).is_file()]
    if missing:
        raise BuildError(f"{' '.join(HOST_PACKAGES)} are installed but {', '.join(missing)} "
                         "is missing; reinstall them (apt-get install --reinstall ...)")


def candidate_version(pkg: str) -> str:
    pol = sh(["apt-cache", "policy", pkg], what=f"apt-cache policy {pkg}").stdout
    m = re.search(r"Candidate:\s*(\S+)", pol)
    if not m or m.group(1) == "(none)":
        raise BuildError(f"apt has no candidate for {pkg}; check /etc/apt/sources.list* "
                         "(Debian 12 bookworm main) and run apt-get update")
    return m.group(1)


def download(apt: guestbuild.Apt, pkg: str, debs: Path) -> Path:
    """`apt-get download pkg` into debs/ (cached); the .deb's path."""
    debs.mkdir(parents=True, exist_ok=True)
    ver = candidate_version(pkg)
    want = f"{pkg}_{ver.replace(':', '%3a')}_"
    found = sorted(debs.glob(want + "*.deb"))
    if found:
        return found[-1]
    sandbox = ["-o", "APT::Sandbox::User=root"] if os.geteuid() == 0 else []
    for attempt in (1, 2):
        log(f"apt-get download {pkg}={ver} (into {debs}) ...")
        p = subprocess.run(["apt-get", *sandbox, "download", f"{pkg}={ver}"], cwd=debs,
                           text=True, capture_output=True)
        if p.returncode == 0:
            break
        if attempt == 2 or apt.updated or not apt.allow_update:
            raise BuildError(f"apt-get download {pkg}={ver} failed: {p.stderr.strip()[-1000:]}")
        apt.update("download failed")
    found = sorted(debs.glob(want + "*.deb"))
    if not found:
        raise BuildError(f"apt-get download {pkg} left no {want}*.deb in {debs}")
    return found[-1]


# --------------------------------------------------------------------------- lttng-modules

def unpack_source(deb: Path, work: Path) -> Path:
    """The lttng-modules source tree of the .deb (usr/src/lttng-modules-VER), fresh."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    sh(["dpkg-deb", "-x", str(deb), str(work)], what=f"dpkg-deb -x {deb.name}")
    trees = sorted((work / "usr" / "src").glob("lttng-modules-*"))
    if not trees or not (trees[-1] / "Makefile").is_file():
        raise BuildError(f"{deb.name} has no usr/src/lttng-modules-*/Makefile")
    return trees[-1]


def kbuild(src: Path, headers: Path) -> subprocess.CompletedProcess:
    """The package's own Makefile with KERNELDIR (what dkms.conf's MAKE line does)."""
    return subprocess.run(["make", f"-j{os.cpu_count() or 1}", f"KERNELDIR={headers}",
                           "modules"], cwd=src, text=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def drop_probes(src: Path, probes: list[str]) -> None:
    """Leave probe modules out of src/probes/Kbuild (one `obj-... += NAME.o` line each)."""
    kb = src / "src" / "probes" / "Kbuild"
    names = {Path(p).name for p in probes}
    lines = kb.read_text().splitlines(keepends=True)
    kept = [ln for ln in lines if not any(re.search(rf"\b{re.escape(n)}\.o\b", ln)
                                          for n in names)]
    kb.write_text("".join(kept))


def first_error(output: str, probe: str) -> str:
    """The compiler's first error line for one probe, for the record."""
    for ln in output.splitlines():
        if f"/{Path(probe).name}" in ln or "error:" in ln:
            if "error:" in ln:
                return ln.split("error:", 1)[1].strip()[:200]
    return "did not compile"


def build_modules(src: Path, headers: Path) -> dict[str, str]:
    """Build every module; probes that do not compile against this kernel (a stable update
    can change a tracepoint's prototype under a released lttng-modules) are left out and
    returned with their error. Anything else failing is an error."""
    dropped: dict[str, str] = {}
    for _ in range(5):
        p = kbuild(src, headers)
        if p.returncode == 0:
            return dropped
        failed = sorted(set(RE_FAILED_PROBE.findall(p.stdout)) - set(dropped))
        if not failed:
            raise BuildError(f"building lttng-modules against {headers} failed:\n"
                             f"{p.stdout.strip()[-3000:]}")
        for probe in failed:
            dropped[Path(probe).name] = first_error(p.stdout, probe)
            log(f"lttng-modules: {Path(probe).name} does not build against this kernel "
                f"({dropped[Path(probe).name]}); leaving it out")
        drop_probes(src, failed)
    raise BuildError(f"lttng-modules: still failing after leaving out {sorted(dropped)}")


def install_modules(src: Path, dest: Path) -> list[str]:
    """Every built .ko, stripped of debug info, under dest/ with its place in the tree."""
    if dest.exists():
        shutil.rmtree(dest)
    names = []
    for ko in sorted(src.rglob("*.ko")):
        rel = ko.relative_to(src / "src")
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        sh(["strip", "--strip-debug", "-o", str(out), str(ko)], what=f"strip {ko.name}")
        names.append(ko.stem)
    if "lttng-tracer" not in names:
        raise BuildError(f"the lttng-modules build left no lttng-tracer.ko in {src}")
    return names


def lttng_modules(apt: guestbuild.Apt, kver: str, headers: Path, out: Path,
                  root: Path) -> dict:
    """lttng-modules for kver, in root/lib/modules/<kver>/extra/lttng/ (cached)."""
    deb = download(apt, LTTNG_PKG, out.parent / "debs")
    key = key_of(deb.name, kver, file_key(headers / "Makefile"))
    info_f = out / "lttng-modules.json"
    dest = root / "lib" / "modules" / kver / "extra" / "lttng"
    if up_to_date(out / "lttng-modules.key", key) and info_f.is_file() and dest.is_dir():
        return json.loads(info_f.read_text())
    log(f"building {deb.name} against {headers} (a plain kbuild, as dkms runs it) ...")
    src = unpack_source(deb, out / "lttng-src")
    dropped = build_modules(src, headers)
    names = install_modules(src, dest)
    info = {"package": deb.name, "source": src.name, "kernel": kver,
            "modules": names, "probes_left_out": dropped,
            "make": f"make KERNELDIR={headers} modules (in {src.name})"}
    info_f.write_text(json.dumps(info, indent=1) + "\n")
    (out / "lttng-modules.key").write_text(key + "\n")
    shutil.rmtree(out / "lttng-src", ignore_errors=True)
    return info


# --------------------------------------------------------------------------- user space

def shared_libraries(program: str) -> list[str]:
    """The absolute paths `ldd` resolves for a program (the loader included)."""
    p = sh(["ldd", program], what=f"ldd {program}")
    libs = []
    for ln in p.stdout.splitlines():
        if "not found" in ln:
            raise BuildError(f"ldd {program}: {ln.strip()}; install the library's package")
        m = re.search(r"=>\s*(/\S+)", ln) or re.match(r"\s*(/\S+)", ln)
        if m:
            libs.append(m.group(1))
    return libs


def copy_file(src: str, root: Path, dest: str | None = None) -> None:
    """src (symlinks followed) at the same absolute path, or at dest, under root."""
    out = root / (dest or src).lstrip("/")
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(Path(src).resolve(), out)


def userspace(root: Path, out: Path) -> dict:
    """The programs, their libraries and data files, at their Debian paths under root."""
    inputs = [file_key(Path(p)) for p in PROGRAMS + DATA_FILES]
    key = key_of(inputs)
    if up_to_date(out / "userspace.key", key) and (root / "usr" / "bin" / "lttng").is_file():
        return json.loads((out / "userspace.json").read_text())
    libs = sorted({lib for prog in PROGRAMS for lib in shared_libraries(prog)})
    for path in PROGRAMS + DATA_FILES:
        copy_file(path, root)
    for lib in libs:
        # Libraries at the path the loader searches (/lib/x86_64-linux-gnu, as ldd shows
        # them on this usrmerged host); the loader at the path every binary names.
        copy_file(lib, root, LOADER if Path(lib).name == Path(LOADER).name else
                  f"/lib/x86_64-linux-gnu/{Path(lib).name}")
    info = {"programs": list(PROGRAMS), "libraries": len(libs),
            "packages": {p: guestbuild_version(p) for p in
                         HOST_PACKAGES + ("liblttng-ctl0",)}}
    (out / "userspace.json").write_text(json.dumps(info, indent=1) + "\n")
    (out / "userspace.key").write_text(key + "\n")
    return info


def guestbuild_version(pkg: str) -> str | None:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Version}", pkg], capture_output=True,
                       text=True)
    return p.stdout.strip() or None


# --------------------------------------------------------------------------- module indexes

def module_indexes(manifest: dict, root: Path, extra: list[Path], out: Path) -> None:
    """modules.dep.bin & co. for the guest's module tree (the initramfs's kernel modules,
    ivtrace.ko and lttng-modules), written with the host's kmod depmod into
    root/lib/modules/<kver>/; they replace the base initramfs's indexes in the guest."""
    kver = manifest["kernel_version"]
    mdir = Path(manifest["modules_dir"])
    lttng = root / "lib" / "modules" / kver / "extra" / "lttng"
    base = guestbuild.resolve_modules(mdir, guestbuild.DEFAULT_MODULES)
    ltt = sorted(lttng.rglob("*.ko"))
    key = key_of(kver, base, [file_key(p) for p in extra + ltt])
    if up_to_date(out / "indexes.key", key):
        return
    with tempfile.TemporaryDirectory(prefix=".depmod-", dir=out) as tmp:
        sm = Path(tmp) / "lib" / "modules" / kver
        for rel in base:
            dst = sm / re.sub(r"\.ko\.(xz|zst|gz)$", ".ko", rel)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(guestbuild.decompress_module(mdir / rel))
        for aux in ("modules.builtin", "modules.builtin.modinfo", "modules.order"):
            if (mdir / aux).is_file():
                shutil.copy2(mdir / aux, sm / aux)
        (sm / "extra").mkdir(parents=True, exist_ok=True)
        for ko in extra:
            shutil.copy2(ko, sm / "extra" / ko.name)
        shutil.copytree(lttng, sm / "extra" / "lttng")
        sh(["/sbin/depmod", "-b", tmp, kver], what="depmod over the guest's module tree")
        for f in sorted(sm.glob("modules.*")):
            shutil.copy2(f, root / "lib" / "modules" / kver / f.name)
    (out / "indexes.key").write_text(key + "\n")


# --------------------------------------------------------------------------- entry point

def build(manifest: dict, ivtrace_ko: Path, out_dir: Path = guestbuild.DEFAULT_OUT) -> Tracers:
    """LTTng (modules + user space) and perf for the guest of `manifest` (guestbuild's kernel
    manifest), with module indexes that also cover ivtrace_ko. Errors say what failed."""
    kver = manifest["kernel_version"]
    headers = Path(manifest.get("headers") or f"/lib/modules/{kver}/build")
    if not (headers / "Makefile").is_file():
        raise BuildError(f"no kernel headers at {headers}: run vm/build (it installs "
                         f"linux-headers-{kver})")
    out = Path(out_dir) / "tracers" / kver
    root = out / "root"
    root.mkdir(parents=True, exist_ok=True)
    apt = guestbuild.Apt(allow_update=True, force_update=False)
    with guestbuild.locked(out, ".lock"):
        ensure_host_packages(apt)
        mods = lttng_modules(apt, kver, headers, out, root)
        user = userspace(root, out)
        module_indexes(manifest, root, [ivtrace_ko], out)
    info = {"kernel": kver, "lttng_modules": mods, "userspace": user,
            "root_mb": round(sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
                             / 1e6, 1)}
    (out / "build.json").write_text(json.dumps(info, indent=1) + "\n")
    return Tracers(root, info)
