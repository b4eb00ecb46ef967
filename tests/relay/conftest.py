"""Fixtures of the relay tests: the serve tests' guest build (tests/serve/conftest.py)."""
from serve.conftest import serve_add  # noqa: F401
