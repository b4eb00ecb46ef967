#!/usr/bin/env python3
"""Render docs/abi.md's kernel event table from abi/kernel_events.json.

    abi/tools/kernel_events_doc.py --write docs/abi.md   # replace the table
    abi/tools/kernel_events_doc.py --check docs/abi.md   # exit 1 if it differs

The table sits between the two marker lines below; everything else in the
file is left alone. The JSON is printed from ivtrace/kernel_events.h by
abi/tests/kernel_events.c (`make -C abi kernel-events` runs both steps).
"""
import argparse
import json
import sys
from pathlib import Path

BEGIN = ("<!-- kernel-events: generated from abi/include/ivtrace/kernel_events.h "
         "by `make -C abi kernel-events`; do not edit -->")
END = "<!-- kernel-events: end -->"
JSON = Path(__file__).resolve().parent.parent / "kernel_events.json"


def field_text(f: dict) -> str:
    ty = f"char[{f['count']}]" if f["type"] == "chars" else f["type"]
    flag = {"hex": " hex", "tid_comm": " [c]"}.get(f["flag"], "")
    return f"{f['name']} {ty}{flag}"


def wire_bytes(e: dict) -> str:
    """Bytes on the wire with the 4-byte compact header, padded to 4."""
    fixed = 4 + e["payload_size"]
    if any(f["type"] in ("string", "bytes") for f in e["fields"]):
        return f"{fixed} + text"
    return str((fixed + 3) // 4 * 4)


def table(events: list) -> str:
    rows = ["| id | event (LTTng name) | group | wire fields (in order) "
            "| wire bytes incl. header | host expansion |",
            "|---|---|---|---|---|---|"]
    for e in events:
        fields = ", ".join(field_text(f) for f in e["fields"])
        rows.append(f"| {e['id']} | `{e['name']}` | {e['group']} | {fields} "
                    f"| {wire_bytes(e)} | {e['host']} |")
    return "\n".join(rows)


def splice(doc: str, block: str) -> str:
    try:
        head, rest = doc.split(BEGIN + "\n", 1)
        _, tail = rest.split(END, 1)
    except ValueError:
        sys.exit(f"kernel_events_doc: the markers of the kernel event table are missing "
                 f"from the document; add the lines\n{BEGIN}\n{END}\nwhere the table goes")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DOC")
    mode.add_argument("--check", metavar="DOC")
    args = ap.parse_args()
    doc_path = Path(args.write or args.check)
    doc = doc_path.read_text()
    new = splice(doc, table(json.loads(JSON.read_text())))
    if args.write:
        doc_path.write_text(new)
        return 0
    if new != doc:
        print(f"kernel_events_doc: the kernel event table in {doc_path} is stale; "
              "run 'make -C abi kernel-events' and commit it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
