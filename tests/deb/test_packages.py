"""The Debian packages installed as an administrator installs them (`apt-get install
./build/deb/*.deb`), then used: the host tools, their manual pages and completions, the
systemd unit (systemd-analyze verify, and its ExecStart run as the unit runs it), DKMS
building ivtrace.ko for the demo guest's kernel and that module tracing a real guest, and
a program built against libivtrace with pkg-config and recorded by the installed ivtrace.

Needs `make deb` first (`make test-deb` does both) and root (it installs packages).
"""
import grp
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

import ctf
from deb import system
from deb.system import sh
from ivtools import ivtvm

REPO = system.REPO

IVTRACE = "/usr/bin/ivtrace"
TIMEOUT = float(os.environ.get("IVTRACE_VM_TIMEOUT", "300"))


def cargo_version():
    text = (REPO / "host" / "Cargo.toml").read_text()
    return re.search(r'^version = "([^"]+)"', text, re.M).group(1)


def test_lintian_reports_no_error_or_warning():
    text = (system.DEB_DIR / "lintian.txt").read_text()
    bad = [l for l in text.splitlines() if re.match(r"^[EW]: ", l)]
    assert not bad, "\n".join(bad)


def test_host_tools_installed(packages):
    assert packages["ivtrace"].split("-")[0] == cargo_version()
    out = sh([IVTRACE, "--version"]).stdout
    assert out.strip() == f"ivtrace {cargo_version()}"
    for page in ("ivtrace", "ivtrace-record", "ivtrace-serve", "ivtrace-ctl", "ivtrace-report",
                 "ivtrace-snapshot", "ivtrace-export"):
        assert sh(["man", "-w", page]).stdout.strip().endswith(f"/man1/{page}.1.gz")
    text = sh(["man", "-P", "cat", "ivtrace-serve"], env=dict(os.environ, MANWIDTH="120")).stdout
    assert "--socket-group" in text and "ivshmem" in text
    for f in ("/usr/share/bash-completion/completions/ivtrace",
              "/usr/share/zsh/vendor-completions/_ivtrace",
              "/usr/share/fish/vendor_completions.d/ivtrace.fish"):
        assert Path(f).stat().st_size > 1000, f


def test_bash_completes_subcommands_and_options(packages):
    script = ("source /usr/share/bash-completion/completions/ivtrace; "
              "COMP_WORDS=(ivtrace se); COMP_CWORD=1; _ivtrace ivtrace se ivtrace; "
              "echo \"${COMPREPLY[*]}\"; "
              "COMP_WORDS=(ivtrace serve --socket-); COMP_CWORD=2; _ivtrace ivtrace --socket- serve; "
              "echo \"${COMPREPLY[*]}\"")
    lines = sh(["bash", "-c", script]).stdout.splitlines()
    assert lines[0].split() == ["serve"], lines
    assert "--socket-group" in lines[1].split(), lines


def test_group_state_directory_and_conffiles(packages):
    grp.getgrnam("ivtrace")
    st = os.stat("/var/lib/ivtrace")
    assert (st.st_uid, grp.getgrgid(st.st_gid).gr_name, stat.S_IMODE(st.st_mode)) == \
        (0, "ivtrace", 0o750)
    conffiles = sh(["dpkg-query", "-W", "-f=${Conffiles}", "ivtrace", "ivtrace-dkms"]).stdout
    for f in ("/etc/default/ivtrace", "/etc/modprobe.d/ivtrace.conf"):
        assert f in conffiles, conffiles


def test_systemd_analyze_verify_is_clean(packages):
    p = sh(["systemd-analyze", "verify", str(system.UNIT_FILE)], check=False)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), \
        f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"


def test_service_runs_as_its_unit_says(packages, unit_dirs, tmp_path):
    """ExecStart as the unit runs it: root in group ivtrace with only CAP_CHOWN, no new
    privileges, umask 0027. Its sockets are 0660 for libvirt-qemu and ivtrace; a member
    of ivtrace uses `ivtrace ctl`, anyone else is refused; SIGTERM ends it cleanly."""
    run = unit_dirs["/run/ivtrace"]
    unit = system.Unit(unit_dirs, tmp_path / "serve.log").start(ready=run / "ctl.sock")
    try:
        status = Path(f"/proc/{unit.proc.pid}/status").read_text()
        field = dict(l.split(":", 1) for l in status.splitlines())
        assert int(field["CapEff"], 16) == 1 << 0, "CapEff must be CAP_CHOWN only"   # CAP_CHOWN = 0
        assert int(field["CapBnd"], 16) == 1 << 0
        assert field["NoNewPrivs"].strip() == "1"
        assert field["Gid"].split()[0] == str(grp.getgrnam("ivtrace").gr_gid)
        assert field["Umask"].strip() == "0027"
        assert stat.S_IMODE(run.stat().st_mode) == 0o755
        for sock, group in (("qemu.sock", "libvirt-qemu"), ("ctl.sock", "ivtrace")):
            st = (run / sock).stat()
            assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660, sock
            assert grp.getgrgid(st.st_gid).gr_name == group, sock
        ctl = [IVTRACE, "ctl", "--ctl-socket", run / "ctl.sock", "list"]
        member = sh(["setpriv", "--reuid=nobody", "--regid=nogroup", "--groups=ivtrace", *ctl])
        assert "no guest has connected" in member.stdout + member.stderr
        other = sh(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *ctl],
                   check=False)
        assert other.returncode == 2 and "ermission denied" in other.stderr, other.stderr
    finally:
        rc = unit.stop()
    assert rc == 0, f"SIGTERM is a clean stop for systemd (exit 0)\n{unit.output()}"
    assert not (run / "qemu.sock").exists() and not (run / "ctl.sock").exists()


def test_service_refuses_a_missing_group_with_a_hint(packages, unit_dirs, tmp_path):
    unit = system.Unit(unit_dirs, tmp_path / "serve.log")
    unit.env["IVTRACE_QEMU_GROUP"] = "no-such-group-ivtrace-packaging"
    unit.make_directories()
    p = sh(["setpriv", *unit.credentials(), "--", *unit.argv()], check=False, timeout=30)
    assert p.returncode == 2, p.stderr
    assert "no-such-group-ivtrace-packaging: no such group" in p.stderr
    assert "/etc/default/ivtrace" in p.stderr
    assert not list(unit_dirs["/run/ivtrace"].iterdir()), "no socket may be left behind"


def guest_kernel():
    man = ivtvm.ensure_built()
    return man["kernel_version"]


def test_dkms_builds_the_module_for_the_demo_guest_kernel(packages):
    """dkms builds and installs ivtrace.ko from the guest package for the demo guest's
    kernel (its headers come from the guest build: vm/build installs linux-headers-KVER)."""
    kver = guest_kernel()
    version = packages["ivtrace-dkms"].split("-")[0]
    mod = f"ivtrace/{version}"
    sh(["dkms", "build", "--force", mod, "-k", kver], timeout=900)
    sh(["dkms", "install", "--force", mod, "-k", kver], timeout=300)
    status = sh(["dkms", "status", mod, "-k", kver]).stdout
    assert re.search(rf"ivtrace/{re.escape(version)}, {re.escape(kver)}, x86_64: installed",
                     status), status
    ko = Path(f"/lib/modules/{kver}/updates/dkms/ivtrace.ko")
    assert sh(["modinfo", "-F", "vermagic", ko]).stdout.startswith(kver + " ")
    assert "dev_access" in sh(["modinfo", "-F", "parm", ko]).stdout


def test_the_dkms_module_traces_the_demo_guest(packages, tmp_path):
    """The module DKMS installed, booted in the demo guest and recorded by the installed
    ivtrace: the guest's kernel log line arrives as a printk event."""
    kver = guest_kernel()
    ko = Path(f"/lib/modules/{kver}/updates/dkms/ivtrace.ko")
    if not ko.exists():
        sh(["dkms", "autoinstall", "-k", kver], timeout=900)
    shm = Path(f"/dev/shm/ivtrace-packaging-dkms-{os.getpid()}")
    out = tmp_path / "trace"
    marker = f"ivtrace-packaging-dkms-{os.getpid()}"
    ivtvm.prepare_shm(shm, 16 << 20, clear=True)
    rec = subprocess.Popen([IVTRACE, "record", "--shm", shm, "-o", out, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Level 3 (err): above `quiet`'s console level, so the console source sees it.
        r = ivtvm.boot(run=f"echo '<3>{marker}' > /dev/kmsg; sleep 1; rmmod ivtrace",
                       shm=str(shm), shm_size="16M", add=[str(ko)], modules=["ivtrace"],
                       modopts={"ivtrace": "events=sched,printk"}, timeout=TIMEOUT)
        assert r.ok and not r.module_errors, r.explain()
        stdout, stderr = rec.communicate(timeout=60)
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
        shm.unlink(missing_ok=True)
    assert rec.returncode == 0, stderr
    assert sum(c["events"] for c in json.loads(stdout)["channels"]) > 0
    events = ctf.events(out / "kernel")
    lines = [e.payload.get("msg", "") for e in events if e.name == "printk_console"]
    names = sorted({e.name for e in events})
    assert any(marker in str(l) for l in lines), f"no printk_console with {marker} in {names}"
    assert any(e.name == "sched_switch" for e in events)


PROGRAM = r"""
#include <ivtrace.h>
#include <stdio.h>
#include <stdint.h>

int main(int argc, char **argv)
{
	static const struct ivt_field fields[] = { { "seq", IVT_FT_U64 }, { "value", IVT_FT_U64 } };
	struct ivt_region *r;
	struct ivt_event ev;
	int err;

	if (argc != 2)
		return 2;
	err = ivt_region_create(argv[1], NULL, &r);
	if (err) {
		fprintf(stderr, "ivt_region_create: %d\n", err);
		return 1;
	}
	err = ivt_event_register(r, "pkgtest:pair", fields, 2, &ev);
	if (err) {
		fprintf(stderr, "ivt_event_register: %d\n", err);
		return 1;
	}
	for (uint64_t i = 0; i < 1000; i++) {
		uint64_t p[2] = { i, i * 3 };
		ivt_write(&ev, p, sizeof(p));
	}
	ivt_region_close(r);
	return 0;
}
"""


@pytest.mark.parametrize("linking", ["shared", "static"])
def test_a_program_builds_with_pkg_config_and_is_recorded(packages, tmp_path, linking):
    src = tmp_path / "prog.c"
    src.write_text(PROGRAM)
    flags = sh(["pkg-config", "--cflags", "--libs", *(["--static"] if linking == "static" else []),
                "ivtrace"]).stdout.split()
    exe = tmp_path / "prog"
    sh(["cc", "-std=gnu11", "-Wall", "-Werror", "-O2", src, "-o", exe,
        *(["-static"] if linking == "static" else []), *flags])
    ldd = sh(["ldd", exe], check=False).stdout
    if linking == "shared":
        assert re.search(r"libivtrace\.so\.0 => (/usr)?/lib/x86_64-linux-gnu/libivtrace\.so\.0 ", ldd), ldd
    else:
        assert "libivtrace" not in ldd
    shm = Path(f"/dev/shm/ivtrace-packaging-lib-{os.getpid()}-{linking}")
    out = tmp_path / "trace"
    shm.unlink(missing_ok=True)
    try:
        sh([exe, shm])
        rec = sh([IVTRACE, "record", "--shm", shm, "-o", out, "--json", "--duration", "20"])
    finally:
        shm.unlink(missing_ok=True)
    summary = json.loads(rec.stdout)
    assert sum(c["events"] for c in summary["channels"]) == 1000
    assert not any(any(c["lost"].values()) for c in summary["channels"])
    events = [e for e in ctf.events(out / "user") if e.name == "pkgtest:pair"]
    assert [(e.payload["seq"], e.payload["value"]) for e in events] == \
        [(i, 3 * i) for i in range(1000)]


# The guest side of /dev/ivtrace for non-root writers. busybox's /init has no udev, so the
# script applies what the package's rule says (read from the installed rule file: group
# and mode) with chgrp/chmod, then writes events as an unprivileged member of that group.
DEV_ACCESS_RUN = """
echo 'nobody:x:65534:65534::/:/bin/sh' >> /etc/passwd
echo 'nogroup:x:65534:' >> /etc/group
echo 'GROUP:x:990:nobody' >> /etc/group
chgrp GROUP /dev/ivtrace && chmod MODE /dev/ivtrace
ls -ln /dev/ivtrace
su -s /bin/sh nobody -c 'ivtrace-loadgen-static --shm /dev/ivtrace --events 500 --threads 1 --size 16'
echo "DEVACCESS: loadgen rc=$?"
rmmod ivtrace
"""


def udev_rule_settings():
    text = Path("/lib/udev/rules.d/60-ivtrace.rules").read_text()
    rule = [l for l in text.splitlines() if l.strip() and not l.startswith("#")]
    assert len(rule) == 1, rule
    fields = dict(re.findall(r'(\w+)=="?([^",]*)"?', rule[0]))
    fields.update(re.findall(r'(\w+)="([^"]*)"', rule[0]))
    return fields


@pytest.mark.parametrize("dev_access", ["file", "cap"])
def test_a_member_of_the_group_writes_through_dev_ivtrace_only_when_allowed(
        packages, guest, tmp_path, dev_access):
    """With dev_access=file the rule's group and mode let a non-root member write events
    (recorded on the host); with the default (cap) the same user is refused at open."""
    rule = udev_rule_settings()
    assert (rule["KERNEL"], rule["SUBSYSTEM"]) == ("ivtrace", "misc")
    kver = guest_kernel()
    ko = Path(f"/lib/modules/{kver}/updates/dkms/ivtrace.ko")
    shm = Path(f"/dev/shm/ivtrace-packaging-dev-{os.getpid()}-{dev_access}")
    out = tmp_path / "trace"
    ivtvm.prepare_shm(shm, 16 << 20, clear=True)
    rec = subprocess.Popen([IVTRACE, "record", "--shm", shm, "-o", out, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    script = DEV_ACCESS_RUN.replace("GROUP", rule["GROUP"]).replace("MODE", rule["MODE"])
    try:
        r = ivtvm.boot(run=script, shm=str(shm), shm_size="16M",
                       add=[str(ko), *guest.add("ivtrace-loadgen-static")],
                       modules=["ivtrace"], modopts={"ivtrace": f"dev_access={dev_access}"},
                       timeout=TIMEOUT)
        assert r.ok and not r.module_errors, r.explain()
        stdout, stderr = rec.communicate(timeout=60)
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()
        shm.unlink(missing_ok=True)
    console = r.console_text
    assert "crw-rw----    1 0        990" in console, console[-2000:]
    assert rec.returncode == 0, stderr
    loadgen = [e for e in (ctf.events(out / "user") if (out / "user").exists() else [])
               if e.name == "loadgen:payload"]
    if dev_access == "file":
        assert "DEVACCESS: loadgen rc=0" in console, console[-2000:]
        assert len(loadgen) == 500, len(loadgen)
    else:
        assert "DEVACCESS: loadgen rc=0" not in console, console[-2000:]
        assert "Operation not permitted" in console or "EPERM" in console, console[-2000:]
        assert not loadgen, f"{len(loadgen)} events from a user refused at open"
