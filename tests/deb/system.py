"""The machine side of the package tests: the packages installed as an administrator
installs them, and the packaged service run as its unit runs it.

systemd is not PID 1 on these machines (and a systemd booted in a namespace of the shared
root filesystem runs systemd-tmpfiles, which empties the host's /tmp: never do that here),
so `Unit` runs the installed unit's ExecStart line by hand the way systemd would: the
unit's EnvironmentFile= and Environment= with systemd's $VAR / ${VAR} expansion, its
Group=, UMask=, CapabilityBoundingSet= and NoNewPrivileges= (through setpriv), and the
RuntimeDirectory= / StateDirectory= it declares, created with their modes and owner. The
namespace-based sandboxing (ProtectSystem=, ProtectHome=, PrivateTmp=, DevicePolicy=) and
the seccomp filter are not reproduced. Each test maps /run/ivtrace and /var/lib/ivtrace to
directories of its own, so it never touches or sees anyone else's sockets or traces.
"""
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from common import run as sh

REPO = Path(__file__).resolve().parents[2]
DEB_DIR = REPO / "build" / "deb"
PACKAGES = ("ivtrace", "ivtrace-dkms", "libivtrace0", "libivtrace-dev")


def debs():
    """The package files `make deb` left in build/deb (debug symbols left out)."""
    found = {}
    for pkg in PACKAGES:
        hits = sorted(DEB_DIR.glob(f"{pkg}_*.deb"))
        if len(hits) != 1:
            pytest.fail(f"expected one {pkg}_*.deb in {DEB_DIR}, found {len(hits)}: run `make deb`")
        found[pkg] = hits[0]
    return found


def deb_version(path):
    return sh(["dpkg-deb", "-f", path, "Version"]).stdout.strip()


def installed_version(pkg):
    p = sh(["dpkg-query", "-W", "-f=${Status} ${Version}", pkg], check=False)
    parts = p.stdout.split()
    return parts[-1] if p.returncode == 0 and parts[:3] == ["install", "ok", "installed"] else None


def install_packages():
    """`apt-get install ./build/deb/*.deb`, as docs/install.md tells an administrator. A build
    already installed in this session (same package files) is not installed again: the
    stamp is in build/deb, which every `make deb` starts afresh."""
    files = debs()
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in files.values())).hexdigest()[:16]
    stamp = DEB_DIR / f".installed-{digest}"
    versions = {pkg: deb_version(p) for pkg, p in files.items()}
    if stamp.exists() and all(installed_version(k) == v for k, v in versions.items()):
        return versions
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    sh(["apt-get", "install", "-y", "-q", "--reinstall", "--no-install-recommends",
        *[f"./{p.relative_to(REPO)}" for p in files.values()]], timeout=900, cwd=REPO, env=env)
    for pkg, v in versions.items():
        assert installed_version(pkg) == v, f"{pkg} {v} is not installed after apt-get install"
    stamp.touch()
    return versions


UNIT_FILE = Path("/lib/systemd/system/ivtrace.service")


def unit_settings(path=UNIT_FILE):
    """The [Service] section of a unit file: {key: [values, in order]} (continuation lines
    joined, comments dropped), as systemd reads it."""
    settings, section, pending = {}, None, ""
    for raw in Path(path).read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        if section == "Service" and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def environment_file(path):
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (quotes removed)."""
    env = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def expand_exec(line, env):
    """ExecStart's words with systemd's rules: `${VAR}` is exactly one argument (its whole
    value, empty if unset), a word `$VAR` is the value split at whitespace (zero or more)."""
    words = []
    for word in shlex.split(line):
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                                lambda m: env.get(m.group(1), ""), word))
    return words


class Unit:
    """The installed ivtrace.service, run by hand as systemd would run it (module doc).

    `paths` maps the unit's own directories (/run/ivtrace, /var/lib/ivtrace) to the
    test's; the ExecStart words are rewritten with it, nothing else is."""

    def __init__(self, paths, log, unit_file=UNIT_FILE):
        self.s = unit_settings(unit_file)
        self.paths = dict(paths)
        self.log = Path(log)
        self.env = {}
        for f in self.s.get("EnvironmentFile", []):
            optional = f.startswith("-")
            f = f.lstrip("-")
            if Path(f).exists() or not optional:
                self.env.update(environment_file(f))
        for e in self.s.get("Environment", []):
            for assignment in shlex.split(e):
                k, v = assignment.split("=", 1)
                self.env[k] = v
        self.proc = None

    def one(self, key, default=None):
        values = self.s.get(key)
        return values[-1] if values else default

    def argv(self):
        words = expand_exec(self.one("ExecStart").lstrip("-@:+!"), self.env)
        for real, test in self.paths.items():
            words = [w.replace(real, str(test)) for w in words]
        return words

    def credentials(self):
        """setpriv's options for User=, Group=, CapabilityBoundingSet=, NoNewPrivileges=."""
        user, group = self.one("User", "root"), self.one("Group", "root")
        opts = [f"--reuid={user}", f"--regid={group}", "--clear-groups"]
        caps = self.one("CapabilityBoundingSet")
        if caps is not None:
            names = [c.lower().removeprefix("cap_") for c in caps.split()]
            opts += [f"--bounding-set=-all{''.join(',+' + n for n in names)}",
                     "--inh-caps=-all"]
        if self.one("NoNewPrivileges", "no") in ("yes", "true", "1"):
            opts.append("--no-new-privs")
        return opts

    def make_directories(self):
        """RuntimeDirectory= and StateDirectory= under their test paths, owned as systemd
        owns them (User:Group) and with their modes."""
        group = self.one("Group", "root")
        for kind, base in (("RuntimeDirectory", "/run"), ("StateDirectory", "/var/lib")):
            mode = int(self.one(f"{kind}Mode", "0755"), 8)
            for name in (self.one(kind) or "").split():
                d = Path(self.paths.get(f"{base}/{name}", f"{base}/{name}"))
                d.mkdir(parents=True, exist_ok=True)
                shutil.chown(d, self.one("User", "root"), group)
                d.chmod(mode)

    def start(self, ready, timeout=20):
        """Starts ExecStart; waits until `ready` (a path) exists."""
        self.make_directories()
        cmd = ["setpriv", *self.credentials(), "--", *self.argv()]
        umask = int(self.one("UMask", "0022"), 8)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                              **self.env}, umask=umask)
        deadline = time.monotonic() + timeout
        while not Path(ready).exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the service did not come up ({' '.join(cmd)}):\n{self.output()}")
            time.sleep(0.05)
        return self

    def output(self):
        return self.log.read_text(errors="replace")

    def stop(self):
        """KillSignal= (SIGTERM), then SIGKILL after TimeoutStopSec=, as systemd stops it."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        sig = getattr(signal, self.one("KillSignal", "SIGTERM"))
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=float(self.one("TimeoutStopSec", "90")))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the service ignored {sig.name} for TimeoutStopSec:\n{self.output()}")

def state_dir(tag):
    """A fresh directory to stand in for /var/lib/ivtrace (same owner and mode as the
    package's), under /var/tmp so that it outlives nothing but the test."""
    d = Path(tempfile.mkdtemp(prefix=f"{tag}-state-", dir="/var/tmp"))
    shutil.chown(d, "root", "ivtrace")
    d.chmod(0o750)
    return d
