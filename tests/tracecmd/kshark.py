"""KernelShark 2.2.1 under Xvfb, driven as a user would: a session file (the plots to draw),
a screenshot of the window, Ctrl+Q (KernelShark then saves its own view of what it drew in
its cache directory's lastsession.json). And the screenshot read back: rows of the graph area
that hold drawn (coloured) pixels, and where two screenshots differ.

Needs xvfb-run, xdotool and ImageMagick's import/convert (scripts/deps.sh installs them).
"""
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TOOLS = ("kernelshark", "xvfb-run", "xdotool", "import", "convert")
WIDTH, HEIGHT = 1600, 1000
# The graph area of a 1500x950 window with the session's splitter (700/200): right of the
# plots' name labels, below the marker buttons, above the event table.
GRAPH_X = (220, 1440)
GRAPH_Y = (110, 690)


def missing_tools():
    return [t for t in TOOLS if shutil.which(t) is None]


def stream(sd, path, cpus, tasks, kvm_combo=True):
    """One data stream of a KernelShark session (the keys KernelShark 2.2.1 writes itself)."""
    return {"type": "kshark.config.stream", "stream id": sd,
            "data": {"type": "kshark.config.data", "file": str(Path(path).resolve()),
                     "name": "top buffer", "time": int(os.stat(path).st_mtime)},
            "filters": {"type": "kshark.config.filter", "filter mask": 7},
            "plugins": {"type": "kshark.config.plugins",
                        "registered": [["kvm_combo", kvm_combo], ["missed_events", True],
                                       ["sched_events", True]]},
            "CPUPlots": list(cpus), "TaskPlots": list(tasks)}


def session(streams, combos=(), time_range=None):
    """A session: `streams` (stream()), `combos` [(guest sd, vcpu, host sd, host tid)],
    an optional visible time range (ns)."""
    s = {"type": "kshark.config.session", "MainWindow": [1500, 950], "Splitter": [700, 200],
         "data streams": list(streams),
         # KVM combo: a guest CPU (CPU | GUEST draw) over its vCPU's host thread (TASK | HOST).
         "ComboPlots": [[[g, 2 | 8, v], [h, 1 | 4, tid]] for g, v, h, tid in combos],
         "Markers": {"type": "kshark.config.markers", "markA": {"isSet": False},
                     "markB": {"isSet": False}, "Active": "A"},
         "ViewTop": 0, "ColorScheme": 0.75,
         "User Plugins": {"type": "kshark.config.plugins", "obj. files": []}}
    if time_range:
        s["Model"] = {"type": "kshark.config.model", "range": list(time_range), "bins": 1200}
    return s


SCRIPT = """
kernelshark -s "$1" > "$2" 2>&1 &
ks=$!
w=
for i in $(seq 1 120); do
    w=$(xdotool search --class kernelshark 2>/dev/null | head -1)
    [ -n "$w" ] && break
    sleep 0.5
done
[ -n "$w" ] || { echo "no KernelShark window"; kill $ks; exit 1; }
# Loaded and drawn: the screen stops changing.
prev=
for i in $(seq 1 60); do
    sleep 1
    import -window root "$3"
    sum=$(md5sum < "$3")
    [ "$sum" = "$prev" ] && break
    prev=$sum
done
xdotool windowfocus --sync "$w" key ctrl+q
for i in $(seq 1 60); do kill -0 $ks 2>/dev/null || break; sleep 0.5; done
kill $ks 2>/dev/null
wait $ks
"""


@dataclass
class Shot:
    png: Path
    log: str
    # KernelShark's own record of the session it showed (written when it quits).
    saved: dict


def run(sess, out, name):
    """Opens session `sess` in KernelShark under Xvfb; the screenshot `out/name.png`."""
    out = Path(out)
    cache = out / f"{name}.kshark-cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "setting.ini").write_text("[General]\nnoRootWarn=true\n")
    sfile = out / f"{name}.session.json"
    sfile.write_text(json.dumps(sess, indent=1))
    png, log = out / f"{name}.png", out / f"{name}.kernelshark.log"
    env = dict(os.environ, KS_USER_CACHE_DIR=str(cache))
    p = subprocess.run(["xvfb-run", "-a", "-s", f"-screen 0 {WIDTH}x{HEIGHT}x24",
                        "sh", "-c", SCRIPT, "ks", str(sfile), str(log), str(png)],
                       env=env, capture_output=True, text=True, timeout=300)
    text = log.read_text(errors="replace") if log.exists() else ""
    assert p.returncode == 0 and png.exists(), f"KernelShark run failed: {p.stdout}{p.stderr}\n{text}"
    saved_file = cache / "lastsession.json"
    saved = json.loads(saved_file.read_text()) if saved_file.exists() else {}
    return Shot(png, text, saved)


def pixels(png):
    """(width, height, RGB bytes) of a PNG, through ImageMagick."""
    p = subprocess.run(["convert", str(png), "-depth", "8", "ppm:-"], capture_output=True,
                       timeout=60, check=True)
    data = p.stdout
    fields, at = [], 0
    while len(fields) < 4:  # P6 width height maxval, whitespace separated
        while data[at:at + 1].isspace():
            at += 1
        end = at
        while not data[end:end + 1].isspace():
            end += 1
        fields.append(data[at:end])
        at = end
    assert fields[0] == b"P6", fields
    return int(fields[1]), int(fields[2]), data[at + 1:]


def coloured(rgb, w, x, y):
    """A drawn pixel: clearly coloured (not white, grey or black)."""
    i = 3 * (y * w + x)
    r, g, b = rgb[i], rgb[i + 1], rgb[i + 2]
    return max(r, g, b) - min(r, g, b) > 60


def bands(png, min_pixels=40):
    """Rows of the graph area holding drawn pixels, grouped: [(first y, last y, pixels)]."""
    w, _, rgb = pixels(png)
    out = []
    for y in range(*GRAPH_Y):
        n = sum(coloured(rgb, w, x, y) for x in range(*GRAPH_X))
        if n >= min_pixels:
            if out and y - out[-1][1] <= 3:
                out[-1] = (out[-1][0], y, out[-1][2] + n)
            else:
                out.append((y, y, n))
    return out


def differ(a, b):
    """Pixels of the graph area that differ between two screenshots: [(x, y)]."""
    wa, _, pa = pixels(a)
    wb, _, pb = pixels(b)
    assert wa == wb
    out = []
    for y in range(*GRAPH_Y):
        for x in range(*GRAPH_X):
            i = 3 * (y * wa + x)
            if pa[i:i + 3] != pb[i:i + 3]:
                out.append((x, y))
    return out
