"""Read traces with babeltrace2's Python bindings, the independent reader.

Nothing in this module knows ivtrace's wire format: babeltrace2 decodes, these
helpers only turn its messages into plain Python values.
"""

import re
import subprocess
from dataclasses import dataclass

import bt2


@dataclass
class Event:
    stream: tuple  # (stream class id, stream id)
    ns: int  # ns from the clock's origin
    name: str
    payload: dict  # None when not requested
    cycles: int = None  # the clock's value (its cycles), as the event carries it
    cpu: int = None  # the packet context's cpu_id, where there is one


@dataclass
class Discarded:
    stream: tuple
    count: int  # None when the trace does not say


def value(f):
    """Plain Python value of a bt2 field (strings stay str, arrays become lists)."""
    if isinstance(f, bt2._StringFieldConst):
        return str(f)
    if isinstance(f, bt2._ArrayFieldConst):
        return [value(x) for x in f]
    if isinstance(f, bt2._StructureFieldConst):
        return {k: value(v) for k, v in f.items()}
    if isinstance(f, bt2._RealFieldConst):
        return float(f)
    return int(f)


def messages(path, want_payload=lambda name: True):
    """Yield Event and Discarded objects for every such message under `path`."""
    for msg in bt2.TraceCollectionMessageIterator(str(path)):
        kind = type(msg)
        if kind is bt2._EventMessageConst:
            ev = msg.event
            key = (ev.stream.cls.id, ev.stream.id)
            body = None
            if want_payload(ev.name):
                body = {k: value(v) for k, v in ev.payload_field.items()}
            snap = msg.default_clock_snapshot
            ctx = ev.packet.context_field if ev.packet is not None else None
            cpu = int(ctx["cpu_id"]) if ctx is not None and "cpu_id" in ctx else None
            yield Event(key, snap.ns_from_origin, ev.name, body, snap.value, cpu)
        elif kind is bt2._DiscardedEventsMessageConst:
            yield Discarded((msg.stream.cls.id, msg.stream.id), msg.count)


def events(path, want_payload=lambda name: True):
    return [m for m in messages(path, want_payload) if isinstance(m, Event)]


def discarded(path):
    """Total discarded events the trace reports (fails on an unknown count)."""
    total = 0
    for m in messages(path, lambda name: False):
        if isinstance(m, Discarded):
            assert m.count is not None, "discarded-events message without a count"
            total += m.count
    return total


def babeltrace2_discarded(path):
    """Discarded events the `babeltrace2` command warns about when it prints every trace under
    `path` (its text output; it must succeed). Its warnings read
    `WARNING: Tracer discarded N events between [...] and [...] in trace ...` ("1 event")."""
    p = subprocess.run(["babeltrace2", str(path)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=600)
    assert p.returncode == 0, f"babeltrace2 {path} failed:\n{p.stderr[-3000:]}"
    return sum(int(n) for n in re.findall(r"Tracer discarded (\d+) events?\b", p.stderr))
