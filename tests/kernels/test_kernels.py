"""ivtrace.ko on the guest kernels users run (`make test-kernels`; docs/guest-kernel.md).

For each kernel (conftest.py: bookworm's 6.1, trixie's newest 6.12 and trixie-backports'
newest 7.x, resolved from the archive now): the guest built for it (its module built in the
kernel's build root for another Debian release), one TCG boot with ivtrace.ko events=all ftrace=1
and ftrace's sched events on from boot, a short workload, recorded by `ivtrace record` and read
back by babeltrace2. Checked: the kernel booted is the one resolved; sched_switch; system calls
with their string arguments; printk; events relayed from ftrace; nothing lost anywhere; rmmod
clean; no BUG, WARNING, Oops or deprecation line in dmesg. Then the packaged module
(ivtrace-dkms) built by DKMS in the kernel's build root, and the probes' prototype check seen
failing the build when a prototype changes.

A boot that dies before the script starts loading ivtrace.ko (TCG has crashed 7.x guests in
code patching before any module was loaded) is retried once; the retry and its console are
printed in the summary. Anything else is a failure.
"""
import contextlib
import re
import subprocess
import uuid
from pathlib import Path

import pytest

import losses
from e2e import guest as g
from ivtools import buildroot
from kernels import conftest as kc

SHM_SIZE = "32M"
BOOT_APPEND = "trace_clock=x86-tsc trace_event=sched:sched_switch,sched:sched_process_exec"
MARK_LOADING = "KT: loading ivtrace.ko"

# Module loaded by the script (not by /init), so that a boot that dies earlier is known to have
# died before ivtrace.ko was loaded. Tracing off before the relay stops: nothing stays behind
# in ftrace's buffer.
SCRIPT = r"""
T={token}
echo "KT: kernel $(uname -r)"
echo "{mark}"
insmod /lib/modules/$(uname -r)/extra/ivtrace.ko events=all ftrace=1
echo "KT: insmod rc=$?"
n=0
until pidof ivtrace-ftrace >/dev/null; do n=$((n + 1)); [ $n -gt 200 ] && break; sleep 0.1; done
echo "KT: relay after $n waits"
sleep 1
echo "<3>ivtrace-kernels: printk $T" > /dev/kmsg
cat /tmp/ivt-kernels-$T-absent 2>/dev/null
echo "$T" > /tmp/ivt-kernels-$T
cat /tmp/ivt-kernels-$T > /dev/null
for i in 1 2 3; do /bin/true; done
ls /sys/kernel/tracing/events/sched > /dev/null
sleep 1
echo 0 > /sys/kernel/tracing/tracing_on
killall ivtrace-ftrace
while pidof ivtrace-ftrace >/dev/null; do sleep 0.1; done
rmmod ivtrace
echo "KT: rmmod rc=$?"
dmesg | grep 'ivtrace-ftrace: pages' | sed 's/^.*ivtrace-ftrace: /KT-RELAY: /'
dmesg | grep -E 'BUG|WARNING|Oops|Call Trace|refcount_t|general protection' | sed 's/^/KT-DMESG: /'
dmesg | grep -i -E 'deprecat' | sed 's/^/KT-DMESG: /'
echo "KT: done"
"""


def died_before_loading(r) -> bool:
    """The boot ended (panic, hang, no /init) before the script began loading ivtrace.ko."""
    return MARK_LOADING not in r.console_text and not r.ok


def boot_and_record(kut, tmp: Path, attempt: int):
    token = uuid.uuid4().hex[:10]
    shm = g.shm_path(f"kernels-{attempt}")
    out = tmp / f"trace-{attempt}"
    rec = g.Recorder(shm, out)
    try:
        with g.ivtvm.VM(SCRIPT.format(token=token, mark=MARK_LOADING), shm=str(shm),
                        shm_size=SHM_SIZE, shm_clear=True, smp=2, append=BOOT_APPEND,
                        add=kut.guest.add("ivtrace.ko", "ivtrace-ftrace"), out=kut.out,
                        build=False, log=str(tmp / f"console-{attempt}.log")) as vm:
            r = vm.wait(timeout=g.TIMEOUT)
        if died_before_loading(r):
            rec.stop()
            return r, None, out, token
        summary = rec.wait(timeout=120)
    finally:
        rec.stop()
        shm.unlink(missing_ok=True)
    return r, summary, out, token


@pytest.fixture(scope="module")
def run(kut, tmp_path_factory):
    """The kernel's boot (retried once if it died before ivtrace.ko was loaded), its trace
    read by babeltrace2, and what every reader says was lost."""
    tmp = tmp_path_factory.mktemp(f"kernel-{kut.version}")
    r, summary, out, token = boot_and_record(kut, tmp, 1)
    boots = 1
    if summary is None:
        kc.RETRIES.append(f"{kut.version}: boot 1 died before ivtrace.ko was loaded "
                          f"({r.summary()}); its console's last lines:\n"
                          + "\n".join("    " + ln for ln in r.tail(40).splitlines()))
        print(kc.RETRIES[-1])
        r, summary, out, token = boot_and_record(kut, tmp, 2)
        boots = 2
    assert summary is not None, (f"{kut.version}: both boots died before ivtrace.ko was "
                                 f"loaded:\n{r.summary()}\n{r.tail(60)}")
    events, _ = g.read(out)
    account = losses.account(out)
    problems = g.marks(r.console_text, "KT-DMESG: ") + r.kernel_problems
    lost = sum(account[k] for k in ("bt2", "report_ctf", "report_recorded"))
    kut.row.update(events=len(events), lost=lost, dmesg_problems=len(problems), boots=boots)
    print(f"{kut.version}: {r.summary()}; {len(events)} events; losses {account}")
    return {"boot": r, "summary": summary, "events": events, "account": account,
            "problems": problems, "token": token, "out": out}


def names(run, name):
    return [e for e in run["events"] if e.name == name]


def test_booted_the_resolved_kernel(kut, run):
    assert g.marks(run["boot"].console_text, "KT: kernel ") == [kut.version], run["boot"].tail(40)
    assert g.marks(run["boot"].console_text, "KT: insmod rc=") == ["0"], run["boot"].tail(40)


def test_sched_switch(run):
    switches = names(run, "sched_switch")
    assert len(switches) > 50, len(switches)
    assert any(e.payload["prev_tid"] != e.payload["next_tid"] for e in switches)


def test_syscalls_with_their_string_arguments(run):
    t = run["token"]
    opened = {e.payload["filename"] for e in names(run, "syscall_entry_openat")}
    assert f"/tmp/ivt-kernels-{t}-absent" in opened and f"/tmp/ivt-kernels-{t}" in opened, \
        sorted(x for x in opened if "ivt-kernels" in x)
    assert "/bin/true" in {e.payload["filename"] for e in names(run, "syscall_entry_execve")}
    exits = names(run, "syscall_exit_openat")
    assert exits and any(e.payload["ret"] == -2 for e in exits), "no ENOENT openat exit"


def test_printk(run):
    msgs = [e.payload["msg"] for e in names(run, "printk_console")]
    assert any(f"ivtrace-kernels: printk {run['token']}" in m for m in msgs), msgs[-10:]


def test_ftrace_relayed_events(run):
    ft = [e for e in run["events"] if e.stream[0] == 2]
    switches = [e for e in ft if e.name == "ftrace:sched:sched_switch"]
    execs = {e.payload["filename"] for e in ft if e.name == "ftrace:sched:sched_process_exec"}
    assert len(switches) > 50, len(switches)
    # from boot (trace_event=) and from the workload, after the relay started
    assert "/init" in execs and "/bin/true" in execs, execs


def test_relay_maps_the_ring_buffer_where_the_kernel_can(kut, run):
    """6.10+ lets user space map ftrace's ring buffer (TRACE_MMAP_IOCTL_GET_READER): the relay
    copies pages from the mapping there, and reads trace_pipe_raw before."""
    said = g.marks(run["boot"].console_text, "KT-RELAY: ")
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", kut.version).groups())
    want = "pages from the mapped ring buffer" if (major, minor) >= (6, 10) else \
        "pages by read(2) of trace_pipe_raw"
    assert said and said[0].startswith(want), said
    kut.row["relay"] = "mmap" if "mapped" in said[0] else "read(2)"


def test_nothing_lost(run):
    a = run["account"]
    assert (a["bt2"], a["babeltrace2"], a["report_ctf"], a["report_recorded"]) == (0, 0, 0, 0), a
    assert not a["reasons"], a
    for c in run["summary"]["ftrace"]["cpus"]:
        assert c["lost"] == 0 and c["recorded"] == c["produced"], c


def test_unload_clean(run):
    r = run["boot"]
    assert r.ok, r.summary() + "\n" + r.tail(60)
    assert g.marks(r.console_text, "KT: rmmod rc=") == ["0"], r.tail(60)
    assert g.marks(r.console_text, "KT: done"), r.tail(60)


def test_dmesg_clean(run):
    assert not run["problems"], "\n".join(run["problems"])


# --------------------------------------------------------------------------- the build


def test_a_changed_prototype_fails_the_build(kut):
    """The probes' build-time check (ivtk_probes.c, IVTK_PROBES): ivtk_probes.o builds as it
    is, and with the other side of the hrtimer_expire_entry switch of wrapper/compat.h (the
    7.1 prototype change that crashed 7.x guests) the build stops, naming the probe."""
    t = kernels_tree(kut)
    ok = t.run_make("ivtk_probes.o")
    assert ok.returncode == 0, ok.stdout[-3000:]
    compat = t.host / "guest/kmod/wrapper/compat.h"
    line = "#if LINUX_VERSION_CODE >= KERNEL_VERSION(7, 1, 0)"
    text = compat.read_text()
    assert text.count(line) == 1, "the hrtimer switch of wrapper/compat.h moved"
    compat.write_text(text.replace(line, "#if !(LINUX_VERSION_CODE >= KERNEL_VERSION(7, 1, 0))"))
    bad = t.run_make("ivtk_probes.o")
    assert bad.returncode != 0, "the build accepted a probe with the wrong prototype"
    assert re.search(r"static assertion failed: \"ivtk_hrtimer_expire_entry\(\) does not match "
                     r"the TP_PROTO of tracepoint hrtimer_expire_entry", bad.stdout), bad.stdout[-3000:]


def kernels_tree(kut):
    return buildroot.module_tree(kut.kernel, "kmod-protocheck")


@pytest.fixture(scope="session")
def dkms_deb():
    """build/deb's ivtrace-dkms package, built again (scripts/build-deb) when the module's
    sources or debian/ changed since."""
    repo = kc.REPO
    debs = sorted((repo / "build" / "deb").glob("ivtrace-dkms_*_all.deb"))
    newest_src = max(p.stat().st_mtime for top in ("guest/kmod", "abi/include", "debian")
                     for p in (repo / top).rglob("*") if p.is_file())
    if not debs or debs[-1].stat().st_mtime < newest_src:
        p = subprocess.run([str(repo / "scripts" / "build-deb")], cwd=repo, text=True,
                           capture_output=True, timeout=3600)
        debs = sorted((repo / "build" / "deb").glob("ivtrace-dkms_*_all.deb"))
        assert p.returncode == 0 and debs, f"scripts/build-deb failed:\n{p.stderr[-3000:]}"
    return debs[-1]


@pytest.fixture(scope="session")
def dkms_installed(dkms_deb):
    """install(root): ivtrace-dkms installed in that build root once (apt-get install of the
    .deb, as a guest of that release would; its postinst builds for the kernels whose headers
    are there), the root locked until the session ends, then the package purged, so the shared
    root keeps no checkout's module source. Returns the module's dkms name."""
    version = subprocess.run(["dpkg-deb", "-f", str(dkms_deb), "Version"], capture_output=True,
                             text=True, check=True).stdout.strip().split("-")[0]
    done: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        def install(root):
            if root.suite in done:
                return done[root.suite]
            stack.enter_context(root.locked())
            inside = f"/tmp/{uuid.uuid4().hex[:8]}-{dkms_deb.name}"
            (root.path / inside.lstrip("/")).write_bytes(dkms_deb.read_bytes())
            stack.callback((root.path / inside.lstrip("/")).unlink, missing_ok=True)
            stack.callback(root.run, ["apt-get", "purge", "-y", "-q", "ivtrace-dkms"],
                           what="purging ivtrace-dkms")
            root.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", inside],
                     what="installing ivtrace-dkms")
            done[root.suite] = f"ivtrace/{version}"
            return done[root.suite]
        yield install


def test_dkms_builds_the_packaged_module(kut, dkms_installed):
    """ivtrace-dkms in the kernel's build root: built for this kernel (by the package's
    postinst, else by `dkms build`), with this kernel's vermagic."""
    root = kut.root.ensure()
    root.install_kernel(kut.version)
    mod = dkms_installed(root)
    done = re.compile(rf"{re.escape(mod)}, {re.escape(kut.version)}, x86_64: (built|installed)")
    built_by = "postinst"
    if not done.search(root.run(["dkms", "status", mod, "-k", kut.version],
                                what="dkms status").stdout):
        built_by = "dkms build"
        root.run(["dkms", "build", mod, "-k", kut.version], what=f"dkms build {mod} -k {kut.version}")
    status = root.run(["dkms", "status", mod, "-k", kut.version], what="dkms status").stdout
    vermagic = root.run(["sh", "-c", f"modinfo -F vermagic /var/lib/dkms/{mod}/{kut.version}"
                                     "/x86_64/module/ivtrace.ko*"], what="modinfo").stdout
    assert done.search(status), status
    assert vermagic.split()[0] == kut.version, vermagic
    kut.row["dkms"] = f"built ({built_by})"
