"""Helpers of the nested test: what an L1 guest needs to run QEMU (and ivtrace) for its own
L2 guest, as ivtvm `add=` specs, and the L2 guest's initramfs.

L1 is the project's busybox initramfs guest with the host's qemu-system-x86_64 copied in: the
binary, every shared library `ldd` lists (at the same paths), the dynamic loader, and the
firmware a `-machine pc` boot reads (SeaBIOS, the option ROMs of `-kernel` boots). L2 is the
same Debian kernel with a small initramfs (the base one plus ivtrace.ko and one writer).
"""
import os
import re
import subprocess
from pathlib import Path

from ivtools import guestbuild

REPO = Path(__file__).resolve().parents[2]

QEMU = "/usr/bin/qemu-system-x86_64"
# Debian builds TCG as a loadable module, which QEMU looks for at this path.
QEMU_MODULES = ["/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so"]
# What `qemu-system-x86_64 -machine pc -kernel ... -nographic -vga none -nic none` opens.
FIRMWARE = ["bios-256k.bin", "kvmvapic.bin", "linuxboot_dma.bin", "linuxboot.bin"]
FIRMWARE_DIRS = ["/usr/share/qemu", "/usr/share/seabios"]


def shared_libraries(binary: str) -> list[str]:
    """Every library `ldd` resolves for `binary`, and the loader (absolute paths)."""
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    libs = []
    for line in out.splitlines():
        m = re.search(r"=>\s+(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if m:
            libs.append(m.group(1))
    return libs


def firmware_file(name: str) -> str:
    for d in FIRMWARE_DIRS:
        p = Path(d) / name
        if p.exists():
            return str(p.resolve())
    raise FileNotFoundError(f"QEMU firmware {name} not found in {', '.join(FIRMWARE_DIRS)}")


def qemu_adds() -> list[str]:
    """ivtvm add= specs that put a working qemu-system-x86_64 into a guest: at its own path
    (QEMU finds its modules relative to its executable's directory), its libraries and its
    TCG module at their own paths, firmware in /usr/share/qemu/."""
    adds = [f"{QEMU}:{QEMU}"]
    for lib in shared_libraries(QEMU):
        adds.append(f"{os.path.realpath(lib)}:{lib}")
    for mod in QEMU_MODULES:
        adds.append(f"{mod}:{mod}")
        for lib in shared_libraries(mod):
            adds.append(f"{os.path.realpath(lib)}:{lib}")
    for fw in FIRMWARE:
        adds.append(f"{firmware_file(fw)}:/usr/share/qemu/{fw}")
    return adds


def binary_adds(binary: Path, dest: str) -> list[str]:
    """A dynamically linked host binary (e.g. bin/ivtrace) and its libraries."""
    adds = [f"{binary}:{dest}"]
    for lib in shared_libraries(str(binary)):
        adds.append(f"{os.path.realpath(lib)}:{lib}")
    return adds


def l2_initramfs(man: dict, add_specs: list[str], out: Path) -> Path:
    """The base initramfs plus `add_specs`, one file (the kernel unpacks the two archives in
    order), for L1 to boot L2 with."""
    base = Path(man["initramfs_base"]).read_bytes()
    base += b"\0" * ((4 - len(base) % 4) % 4)
    overlay = guestbuild.overlay_initramfs(add_specs, man["kernel_version"])
    out.write_bytes(base + overlay)
    return out


def dedupe(specs: list[str]) -> list[str]:
    seen, out = set(), []
    for s in specs:
        dest = s.split(":", 1)[1] if ":" in s else s
        if dest not in seen:
            seen.add(dest)
            out.append(s)
    return out
