#!/usr/bin/env python3
"""Derive abi/syscalls/lttng-x86_64.tsv: LTTng's x86-64 system call events, per number.

    abi/syscalls/derive.py LTTNG_METADATA KERNEL_HEADERS > abi/syscalls/lttng-x86_64.tsv

LTTNG_METADATA: the TSDL metadata of a real lttng-modules 2.10 kernel trace (x86-64): its
`syscall_entry_<name>` / `syscall_exit_<name>` events give LTTng's event names, field
names, field types and field order. KERNEL_HEADERS: the guest kernel's headers tree
(/usr/src/linux-headers-<ver>-common plus its arch tree; both are read): its
arch/x86/include/generated/asm/syscalls_64.h gives number -> entry point (`sys_sendfile64`:
LTTng names events after the entry point, not the table's `sendfile`), and
include/linux/syscalls.h the prototypes, whose parameter names tie each LTTng field to an
argument. The output is committed; abi/syscalls/gen.py turns it into the module's and the
host's tables. Run this only to re-derive (a new LTTng layout or guest kernel).
"""
import re
import sys
from pathlib import Path

# Parameter names of entry points whose prototypes syscalls.h does not give (arch code) or
# gives without names (as the kernel's SYSCALL_DEFINE lines name them): name -> params.
ARCH_PROTOS = {
    "rt_sigaction": ["sig", "act", "oact", "sigsetsize"],
    "connect": ["fd", "uservaddr", "addrlen"],
    "accept": ["fd", "upeer_sockaddr", "upeer_addrlen"],
    "accept4": ["fd", "upeer_sockaddr", "upeer_addrlen", "flags"],
    "recvfrom": ["fd", "ubuf", "size", "flags", "addr", "addr_len"],
    "getsockname": ["fd", "usockaddr", "usockaddr_len"],
    "getpeername": ["fd", "usockaddr", "usockaddr_len"],
    "socketpair": ["family", "type", "protocol", "usockvec"],
    "pselect6": ["n", "inp", "outp", "exp", "tsp", "sig"],
    "ppoll": ["ufds", "nfds", "tsp", "sigmask", "sigsetsize"],
    "fanotify_mark": ["fanotify_fd", "flags", "mask", "dfd", "pathname"],
    "mmap": ["addr", "len", "prot", "flags", "fd", "off"],
    "arch_prctl": ["option", "arg2"],
    "rt_sigreturn": [],
    "iopl": ["level"],
    "modify_ldt": ["func", "ptr", "bytecount"],
    "clone": ["clone_flags", "newsp", "parent_tidptr", "child_tidptr", "tls"],
}
# LTTng field name -> parameter name, where LTTng's name (from the kernel it was generated
# on) differs from Linux 6.1's.
RENAMES = {
    ("mmap", "offset"): "off",
    ("clone", "parent_tid"): "parent_tidptr",
    ("clone", "child_tid"): "child_tidptr",
    ("poll", "timeout_msecs"): "timeout",
    ("rt_sigprocmask", "nset"): "set",
    ("rt_sigpending", "uset"): "set",
    ("socketpair", "socket"): "usockvec",
    ("recvmmsg", "mmsg"): "msg",
    ("clock_adjtime", "utx"): "tx",
    ("getcpu", "cpup"): "cpu",
    ("getcpu", "nodep"): "node",
    ("getcpu", "tcache"): "cache",
    ("pselect6", "tvp"): "tsp",
}
# The same kinds of renames, for any system call: LTTng's name -> 6.1's.
GENERAL_RENAMES = {"pathname": "path", "upid": "pid", "ruidp": "ruid", "euidp": "euid",
                   "suidp": "suid", "rgidp": "rgid", "egidp": "egid", "sgidp": "sgid",
                   "u_abs_timeout": "abs_timeout", "u_msg_ptr": "msg_ptr",
                   "u_msg_prio": "msg_prio", "u_mqstat": "mqstat", "u_omqstat": "omqstat"}


def lttng_events(path):
    text = Path(path).read_text()
    pat = re.compile(r'event \{\n\tname = "([^"]+)";\n\tid = \d+;\n\tstream_id = \d+;\n'
                     r'\tfields := struct \{\n(.*?)\t\};\n\};', re.S)
    return {m.group(1): m.group(2) for m in pat.finditer(text)}


INT = re.compile(r'^\t\tinteger \{ size = (\d+); align = \d+; signed = (\d); '
                 r'encoding = none; base = (\d+); \} _(\w+)(\[(\d+)\])?;$')


def fields(body):
    """[(name, type)] or None if a field is not a plain integer, string or fixed array."""
    out = []
    for line in body.splitlines():
        if not line.strip():
            continue
        m = INT.match(line)
        if m:
            size, signed, base, name, _, n = m.groups()
            ty = ("s" if signed == "1" else "u") + size + ("x" if base == "16" else "")
            out.append((name, f"{ty}[{n}]" if n else ty))
            continue
        m = re.match(r"^\t\tstring _(\w+);$", line)
        if m:
            out.append((m.group(1), "string"))
            continue
        return None
    return out


def simple_prefix(body):
    """The leading plain fields of an event whose later fields are compound."""
    out = []
    for line in body.splitlines():
        m = INT.match(line)
        if not m or m.group(5):
            break
        size, signed, base, name = m.group(1), m.group(2), m.group(3), m.group(4)
        out.append((name, ("s" if signed == "1" else "u") + size + ("x" if base == "16" else "")))
    return out


def entry_points(headers):
    p = next(Path(h) / "arch/x86/include/generated/asm/syscalls_64.h" for h in headers
             if (Path(h) / "arch/x86/include/generated/asm/syscalls_64.h").exists())
    out = {}
    for nr, fn in re.findall(r"__SYSCALL\((\d+), (\w+)\)", p.read_text()):
        if fn != "sys_ni_syscall":
            out[int(nr)] = fn.removeprefix("sys_")
    return out


def prototypes(headers):
    p = next(Path(h) / "include/linux/syscalls.h" for h in headers
             if (Path(h) / "include/linux/syscalls.h").exists())
    text = re.sub(r"\s+", " ", p.read_text())
    out = {}
    for name, params in re.findall(r"asmlinkage long sys_(\w+)\(([^)]*)\);", text):
        params = params.strip()
        if params in ("", "void"):
            out.setdefault(name, [])
            continue
        names = []
        for param in params.split(","):
            m = re.search(r"(\w+)\s*(\[\])?$", param.strip())
            names.append(m.group(1) if m else "?")
        out.setdefault(name, names)
    return out


PROBLEMS = []


def arg_index(name, field, params):
    for want in (RENAMES.get((name, field)), field, GENERAL_RENAMES.get(field)):
        if want in params:
            return params.index(want)
    return None


def row(nr, name, ev, protos):
    params = ARCH_PROTOS.get(name, protos.get(name))
    entry = ev.get(f"syscall_entry_{name}")
    exit_ = ev.get(f"syscall_exit_{name}")
    if entry is None or exit_ is None or params is None:
        n = len(params) if params is not None else 6
        return [str(nr), name, str(n), "-", "ret:-:s64", "generic"]
    note = "lttng-2.10"
    ef, xf = fields(entry), fields(exit_)
    if ef is None:
        ef, note = simple_prefix(entry), "lttng-2.10-partial"
    if xf is None:
        xf, note = simple_prefix(exit_), "lttng-2.10-partial"
    cols = []
    for flist, is_exit in ((ef, False), (xf, True)):
        items = []
        for fname, ty in flist:
            if is_exit and fname == "ret":
                items.append(f"ret:-:{ty}")
                continue
            i = arg_index(name, fname, params)
            if i is None and len(params) == len(ef) and not is_exit:
                i = [f for f, _ in ef].index(fname)  # unnamed prototype: by position
            if i is None and note == "lttng-2.10-partial":
                continue  # a length or overflow flag of a compound field left out
            if i is None:
                PROBLEMS.append(f"{name}: no argument for LTTng field {fname} (params "
                                f"{params}); add it to RENAMES or ARCH_PROTOS")
                continue
            items.append(f"{fname}:{i}:{ty}")
        cols.append(",".join(items) or "-")
    return [str(nr), name, str(len(params)), cols[0], cols[1], note]


def main():
    ev = lttng_events(sys.argv[1])
    headers = sys.argv[2:]
    eps, protos = entry_points(headers), prototypes(headers)
    print("# LTTng's x86-64 system call events on the guest kernel's numbers; derived by "
          "abi/syscalls/derive.py (see there) from")
    print("# the metadata of an lttng-modules 2.10 kernel trace and Linux 6.1's syscall "
          "table and prototypes. Do not edit: re-derive.")
    print("# fields: name:argument:type; argument '-' is the return value; types u8..s64, "
          "x = base 16, string = a user string")
    print("# (the argument is a pointer to it), u32[2] = two u32 the argument points to "
          "(read at exit).")
    print("# source: lttng-2.10 = LTTng's fields; lttng-2.10-partial = its plain fields "
          "only (compound ones left out);")
    print("# generic = LTTng 2.10 has no such event: args0..args<nargs-1> and ret.")
    print("# nr\tname\tnargs\tentry fields\texit fields\tsource")
    for nr in sorted(eps):
        print("\t".join(row(nr, eps[nr], ev, protos)))
    for p in PROBLEMS:
        print(f"derive: {p}", file=sys.stderr)
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main())
