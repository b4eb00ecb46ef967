"""Do two builds of `ivtrace record` write the same trace from the same region?

For a change that must not change behaviour (a refactor of the writers): each build records
its own copy of one region (a prefill of ivtrace-loadgen, or a region file a real guest left
behind, e.g. a `make demo` backing file saved after the guest ended), into directories of
the same name, and the two trees are compared file by file:

- stream files (everything but metadata and the sidecar): byte for byte, or, where the bytes
  differ, event for event apart from times (babeltrace2 reads both traces: each stream's
  events, their names and fields, and the packet contexts but for their timestamps): the
  guest traces count nanoseconds converted with this run's clock mapping;
- CTF metadata: line by line, except the lines that carry the clock mapping of this run
  (frequency, offset, precision, the error bound and the description that quotes it) and its date;
- the sidecar ivtrace.json: key by key, except the clock's measured values and the
  durations, rates and dates of the run.

    PYTHONPATH=bench:python python3 -m harness.same_trace --a A_BIN_DIR --b B_BIN_DIR \\
        --region FILE

exits 0 when every file is the same under those rules, 1 when one differs (the differences
are printed), 2 on a usage or recording error.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Metadata lines that carry this run's clock mapping (the loopback or sync measurement) or
# the date it was written.
CLOCK_LINE = re.compile(
    r"^\s*(freq|offset|offset_s|precision|ivtrace_clock_\w+|description|trace_creation_datetime)\s*=")
# Sidecar keys whose values are this run's times, rates or clock measurements.
RUN_KEYS = re.compile(
    r"(^|_)(ns|s|us|ms|per_s|mb_per_s|date|time|started|ended|elapsed|wall|cpu|error|"
    r"offset|freq|rtt|bound|precision|points|windows|at|seconds|datetime)$|clock|duration|rate", re.I)


def metadata_diff(a: Path, b: Path) -> list[str]:
    la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    if len(la) != len(lb):
        return [f"{a.name}: {len(la)} lines vs {len(lb)}"]
    return [f"{a.name}:{i + 1}: {x!r} vs {y!r}" for i, (x, y) in enumerate(zip(la, lb))
            if x != y and not (CLOCK_LINE.match(x) and CLOCK_LINE.match(y))]


def json_diff(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if RUN_KEYS.search(k):
                continue
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'b' if k not in a else 'a'}")
            else:
                out += json_diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def events_apart_from_times(trace: Path) -> list:
    """Each stream's messages of the CTF trace in `trace` (a directory with a metadata file),
    without their times: (stream, packet context but timestamps, event name, fields)."""
    import bt2  # only where stream bytes differ; the byte comparison needs no babeltrace2
    out = []
    it = bt2.TraceCollectionMessageIterator(str(trace))
    for msg in it:
        if type(msg) is bt2._EventMessageConst:
            ev = msg.event
            ctx = ev.packet.context_field if ev.packet else None
            ctx = {k: str(v) for k, v in (ctx or {}).items() if "timestamp" not in k}
            fields = [str(f) if f is not None else None for f in
                      (ev.payload_field, ev.specific_context_field, ev.common_context_field)]
            out.append((ev.stream.id, sorted(ctx.items()), ev.name, fields))
    out.sort(key=lambda e: e[0])  # stable: each stream keeps its order
    return out


def streams_apart_from_times(a: Path, b: Path, rels: list[Path]) -> list[str]:
    """The traces holding the stream files `rels` whose bytes differ, compared event by
    event apart from times; a difference per trace that is not the same."""
    out = []
    for trace in sorted({rel.parent for rel in rels}):
        try:
            same = events_apart_from_times(a / trace) == events_apart_from_times(b / trace)
        except Exception as e:  # noqa: BLE001 - a trace babeltrace2 refuses differs
            out.append(f"{trace}: babeltrace2 could not read it: {e}")
            continue
        if not same:
            out += [f"{rel}: stream bytes differ, and events apart from times too"
                    for rel in rels if rel.parent == trace]
    return out


def compare(a: Path, b: Path) -> dict:
    """The two output trees compared file by file: {files, identical, same_but_clock, differ}."""
    fa = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    fb = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    r = {"files": len(fa | fb), "identical": 0, "same_but_clock": 0, "differ": []}
    streams = []
    for rel in sorted(fa ^ fb):
        r["differ"].append(f"{rel}: only in {'a' if rel in fa else 'b'}")
    for rel in sorted(fa & fb):
        pa, pb = a / rel, b / rel
        if pa.read_bytes() == pb.read_bytes():
            r["identical"] += 1
            continue
        if rel.name == "metadata":
            d = metadata_diff(pa, pb)
        elif rel.name == "ivtrace.json":
            d = json_diff(json.loads(pa.read_text()), json.loads(pb.read_text()))
        else:
            streams.append(rel)
            continue
        if d:
            r["differ"] += [f"{rel}: {x}" for x in d]
        else:
            r["same_but_clock"] += 1
    differ = streams_apart_from_times(a, b, streams)
    r["differ"] += differ
    r["same_but_clock"] += len(streams) - len(differ)
    return r


def record_copy(ivtrace: Path, region: Path, work: Path, out: Path) -> None:
    """`ivtrace record` of a fresh copy of `region` (recording consumes what it reads)."""
    copy = work / "region.copy"
    shutil.copyfile(region, copy)
    try:
        p = subprocess.run([str(ivtrace), "record", "--shm", str(copy), "-o", str(out)],
                           capture_output=True, text=True, timeout=900)
    finally:
        copy.unlink(missing_ok=True)
    if p.returncode != 0:
        raise RuntimeError(f"{ivtrace} record exited {p.returncode}: {p.stderr[-800:]}")


def record_each(ivtraces: dict[str, Path], region: Path, work: Path) -> dict[str, Path]:
    """Each build records a copy of `region` into `work/LABEL/trace` (one directory name for
    all, since the name goes into the metadata); the output directories by label."""
    outs = {}
    for label, bin_ in ivtraces.items():
        (work / label).mkdir()
        outs[label] = work / label / "trace"
        record_copy(bin_, region, work, outs[label])
    return outs


def record_both(ivtraces: dict[str, Path], region: Path) -> dict:
    """Each build records a copy of `region`; the two trees compared."""
    with tempfile.TemporaryDirectory(prefix="same-trace-") as tmp:
        a, b = record_each(ivtraces, region, Path(tmp)).values()
        return compare(a, b)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m harness.same_trace", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, type=Path, help="directory of build A's ivtrace")
    ap.add_argument("--b", required=True, type=Path, help="directory of build B's ivtrace")
    ap.add_argument("--region", required=True, type=Path,
                    help="a region file (each build records a copy of it)")
    a = ap.parse_args(argv)
    if not a.region.is_file():
        print(f"same_trace: {a.region}: no such region file", file=sys.stderr)
        return 2
    try:
        r = record_both({"a": a.a / "ivtrace", "b": a.b / "ivtrace"}, a.region)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        print(f"same_trace: {e}", file=sys.stderr)
        return 2
    print(f"same_trace: {r['files']} files: {r['identical']} byte-identical, "
          f"{r['same_but_clock']} equal but for this run's clock values and times, "
          f"{len(r['differ'])} differences")
    for d in r["differ"][:40]:
        print(f"  {d}")
    return 1 if r["differ"] else 0


if __name__ == "__main__":
    sys.exit(main())
