"""KernelShark's KVM combo plot on a KVM-like session (issue 28): this machine's guests run under
TCG, where kvm_entry/kvm_exit never fire, so the session is built from records laid out by this
host's real kvm and sched format files (host/crates/tracecmd/examples/kvm_session.rs, the
recorder's own decoder) and exported by `ivtrace export`'s code. KernelShark 2.2.1 opens the host
and guest files together; each guest CPU is drawn over its vCPU's host thread, and with the
kvm_combo plugin on, the plugin draws the vCPU's runs in the guest (kvm_entry .. kvm_exit) between
them: the same session with the plugin off differs exactly there. Screenshots are kept beside
the test's output (printed)."""
import json
import subprocess

import pytest

from common import REPO
from tracecmd import kshark

BASE = 1_700_000_000_000_000_000  # the session's time 0 (kvm_session.rs)
VCPUS = (4001, 4002)


@pytest.fixture(scope="module")
def kvm(tmp_path_factory):
    missing = kshark.missing_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/deps.sh installs them)")
    out = tmp_path_factory.mktemp("kshark-kvm")
    p = subprocess.run(["cargo", "run", "--release", "--locked", "-q", "--manifest-path",
                        str(REPO / "host" / "Cargo.toml"), "-p", "ivtrace-tracecmd",
                        "--example", "kvm_session", "--", str(out)],
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr
    return out, json.loads(p.stdout)


def shot(out, name, plugin):
    host, guest = out / "trace-cmd" / "host.dat", out / "trace-cmd" / "guest-rec.dat"
    sess = kshark.session(
        [kshark.stream(0, host, [0, 1], VCPUS, plugin), kshark.stream(1, guest, [0, 1], [], plugin)],
        combos=[(1, v, 0, VCPUS[v]) for v in (0, 1)],
        # 1 .. 3 ms: a few runs of each vCPU, wide enough to see.
        time_range=(BASE + 1_000_000, BASE + 3_000_000))
    s = kshark.run(sess, out, name)
    print(f"\nKernelShark screenshot: {s.png}")
    return s


def test_the_kvm_combo_plugin_draws_the_vcpus_runs(kvm):
    out, exported = kvm
    assert exported["host"]["events"]["kvm:kvm_entry"] > 100
    on = shot(out, "kvm-combo", True)
    off = shot(out, "kvm-combo-off", False)
    # Both files open as one session: KernelShark saved both streams and both combos.
    for s in (on, off):
        streams = s.saved["data streams"]
        assert [x["data"]["file"] for x in streams] == [
            str((out / "trace-cmd" / f).resolve()) for f in ("host.dat", "guest-rec.dat")]
        assert streams[0]["TaskPlots"] == list(VCPUS)
        assert len(s.saved["ComboPlots"]) == 2, s.saved["ComboPlots"]
    rows = kshark.bands(on.png)
    # Host CPUs, the two vCPU threads, the guest CPUs, then the two combos (guest CPU over thread).
    assert len(rows) >= 10, rows
    diff = kshark.differ(on.png, off.png)
    print(f"{len(diff)} pixels drawn by the KVM combo plugin; rows {rows}")
    assert len(diff) > 500, "the plugin drew nothing"
    first_combo = rows[6][0]
    outside = [d for d in diff if d[1] < first_combo - 2]
    assert not outside, f"the plugin changed plots that are not combos: {outside[:10]}"
