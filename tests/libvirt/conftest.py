"""The libvirt test shares tests/deb's fixtures (installed packages, unit directories)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from deb.conftest import packages, unit_dirs  # noqa: E402,F401
