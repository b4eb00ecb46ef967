"""scripts/install-tracecompass: how it finds the Debian mirror in apt's sources (both forms),
and that what it installed is what the tests run (no VM, no network: the parser is fed text)."""
import importlib.machinery
import importlib.util
import json

import pytest

from tracecompass import tc as t


def load_installer():
    loader = importlib.machinery.SourceFileLoader("install_tracecompass", str(t.INSTALL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


inst = load_installer()

DEB822 = """\
Types: deb
# a comment line
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """\
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/etc/apt/keyrings/x.gpg] https://one.example/debian/ bookworm main
"""


def test_deb822_entries_keep_suites_uris_and_keyring():
    es = inst.deb822_entries(DEB822)
    assert [e["uris"] for e in es] == [["http://mirror.example/debian"],
                                       ["http://mirror.example/debian-security"]]
    assert es[0]["suites"] == ["bookworm", "bookworm-updates"]
    assert es[0]["signed_by"] == "/usr/share/keyrings/debian-archive-keyring.gpg"


def test_deb822_disabled_stanzas_and_inline_keys_are_handled():
    text = DEB822.replace("Types: deb\n# a comment line", "Types: deb\nEnabled: no", 1)
    assert [e["uris"] for e in inst.deb822_entries(text)] == [
        ["http://mirror.example/debian-security"]]
    inline = ("Types: deb\nURIs: http://m.example/debian\nSuites: bookworm\nComponents: main\n"
              "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n abc\n")
    assert inst.deb822_entries(inline)[0]["signed_by"] is None


def test_one_line_entries_skip_comments_and_sources():
    es = inst.one_line_entries(ONE_LINE)
    assert len(es) == 1
    assert es[0]["uris"] == ["https://one.example/debian/"]
    assert es[0]["signed_by"] == "/etc/apt/keyrings/x.gpg"


def test_the_mirror_is_the_main_archive_not_security(monkeypatch):
    monkeypatch.delenv("IVTRACE_DEBIAN_MIRROR", raising=False)
    es = inst.deb822_entries(DEB822)
    assert inst.debian_mirror(list(reversed(es))) == (
        "http://mirror.example/debian", "/usr/share/keyrings/debian-archive-keyring.gpg")
    assert inst.debian_mirror(inst.one_line_entries(ONE_LINE)) == (
        "https://one.example/debian", "/etc/apt/keyrings/x.gpg")
    with pytest.raises(inst.InstallError, match="no Debian main archive"):
        inst.debian_mirror(es[1:])


def test_this_machines_sources_name_a_mirror(monkeypatch):
    monkeypatch.delenv("IVTRACE_DEBIAN_MIRROR", raising=False)
    uri, keyring = inst.debian_mirror(inst.apt_entries())
    assert uri.startswith(("http://", "https://")) and keyring.startswith("/")


def test_the_installed_package_is_bullseyes_tracecompass(tracecompass):
    stamp = json.loads((t.REPO / "build" / "tracecompass" / "installed.json").read_text())
    assert stamp["package"] == "eclipse-tracecompass" and stamp["suite"] == "bullseye"
    assert stamp["version"].startswith("6.2.0")
    assert len(stamp["sha256"]) == 64
    deb = next((t.REPO / "build" / "tracecompass" / "deb").glob("eclipse-tracecompass_*.deb"))
    assert inst.sha256(deb) == stamp["sha256"]
