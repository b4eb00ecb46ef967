"""The libvirt test shares tests/deb's fixtures (installed packages, unit directories)."""

from deb.conftest import packages, unit_dirs  # noqa: F401  (the package tests' fixtures)
