"""Memory and descriptors per guest and per stream stay bounded (issue 10: serve grew by a few
MiB per second under a writer that never let it idle, and one region with 4096 channels cost
4 GiB of buffers and 4096 descriptors). Sizes, not timings: RSS samples and /proc counts.
"""
import os
import subprocess
import time

from hostile.helpers import IVTRACE, FakeClient, Server, loadgen, need_tools, rss_kib, sidecar, wait_for


def test_serve_memory_stays_flat_under_a_writer_that_never_idles(tmp_path):
    need_tools()
    srv = Server(tmp_path / "traces", "--size", "2M")     # what this geometry takes
    try:
        c = FakeClient(srv.sock)
        shm = wait_for(lambda: srv.guest("guest1"), 10, "guest1")["shm"]
        lg = loadgen(shm, "--events", 100_000_000, "--rate", 400_000, "--channels", 4,
                     "--threads", 4, "--subbufs", 64, "--subbuf-size", 4096, "--size", 16,
                     "--no-close", wait=False)
        srv.wait_guest("guest1", "recording", timeout=30)
        time.sleep(5)
        samples, events = [], []
        for _ in range(15):
            samples.append(rss_kib(srv.pid))
            events.append(srv.guest("guest1")["events"])
            time.sleep(1)
        lg.kill()
        lg.wait()
        c.close()
        srv.stop()
    finally:
        srv.cleanup()
    print(f"\nserve RSS over 15 s of a never-idle writer (KiB): {samples}; "
          f"events {events[0]} .. {events[-1]}")
    assert events[-1] - events[0] > 1_000_000, "the guest was not recorded meanwhile"
    assert max(samples) - samples[0] <= 2048, "serve's memory grows with the packets it drains"


def test_4096_channels_cost_a_bounded_number_of_descriptors_and_buffers(shm, tmp_path):
    need_tools()
    loadgen(shm, "--channels", 4096, "--threads", 4096, "--subbufs", 2, "--subbuf-size", 65536,
            "--events", 4, "--size", 16)
    region_kib = os.stat(shm).st_size // 1024
    out = tmp_path / "t"
    p = subprocess.Popen([str(IVTRACE), "record", "--shm", str(shm), "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    max_fds = peak_kib = 0
    while p.poll() is None:
        try:
            max_fds = max(max_fds, len(os.listdir(f"/proc/{p.pid}/fd")))
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmPeak:"):
                    peak_kib = max(peak_kib, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.002)
    assert p.returncode == 0, p.stderr.read()
    beyond_region_mib = (peak_kib - region_kib) // 1024
    print(f"\n4096 channels: at most {max_fds} descriptors, {beyond_region_mib} MiB of address "
          f"space besides the {region_kib >> 10} MiB region")
    assert len(list((out / "user").glob("user_chan*"))) == 4096
    assert max_fds <= 128
    assert beyond_region_mib <= 256
    res = sidecar(out)["resources"]["stream_files"]
    assert res["max_open_files"] <= 64 and res["buffer_per_file"] * 64 <= 16 << 20


def test_max_size_stops_writing_and_counts_every_later_event_as_lost(shm, tmp_path):
    """--max-size bounds a recording's output (as LTTng's --tracefile-size without rotation):
    the stream files stop at the limit but for the empty packets that announce the losses,
    every event not written is counted (over_limit), and CTF readers see exactly those losses
    as discarded events."""
    need_tools()
    import losses
    from hostile.helpers import record
    stats = loadgen(shm, "--events", 100_000, "--threads", 2, "--size", 24, "--subbufs", 128,
                    "--subbuf-size", 65536, "--channels", 2)
    out = tmp_path / "t"
    p = record("--shm", shm, "-o", out, "--max-size", "1M")
    assert p.returncode == 0, p.stderr
    d = sidecar(out)
    written = sum(f.stat().st_size for f in (out / "user").glob("user_chan*"))
    # Past the limit only the packets that announce the losses: header only (88 bytes), at
    # most two per channel (babeltrace2 needs a first packet that announces none).
    assert 0 < written <= (1 << 20) + 2 * 2 * 88, written
    over = sum(c["lost"]["over_limit"] for c in d["channels"])
    recorded = sum(c["events"] for c in d["channels"])
    print(f"\n--max-size 1M: {written} bytes, {recorded} events recorded, {over} over the limit")
    assert over > 0 and recorded + over + stats["dropped"] == stats["attempted"], stats
    losses.assert_every_loss_is_in_the_ctf(out, want=("over_limit",))
