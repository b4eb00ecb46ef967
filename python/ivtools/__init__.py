"""ivtools: the Python tooling that vm/, bench/ and tests/ share.

A module belongs here when more than one of those rooms imports it; code that one room
alone uses stays in that room (a test's helper in tests/, a preset in bench/harness/, the
demo in vm/). Before writing a helper in a room, look here: running a command, waiting for
a condition and printing progress (`proc`), a QEMU process's threads seen from the host
(`qemu_threads`), free TCP ports (`ports`), the QEMU launcher (`ivtvm`) and the guest build
(`guestbuild`).

Nothing installs this package. Its folder, python/, is put on the module search path the two
documented ways: pytest's `pythonpath` option (pytest.ini) for the tests, and PYTHONPATH set
by the entry points (vm/run, vm/build, vm/demo, vm/demo-vmview, bench/run, bench/report).
Every checkout, worktree and CI clone so imports its own copy, with no install step and
nothing written to the system's Python (Debian marks it externally managed). python/README.md
says more.
"""

from pathlib import Path

# The repository this copy of ivtools belongs to (python/ivtools/__init__.py -> ../..).
REPO = Path(__file__).resolve().parents[2]
