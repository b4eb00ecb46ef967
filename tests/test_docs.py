"""docs/ and the READMEs of vm/, bench/ and tests/ are self-contained: no reference to files
outside the repository, and every relative link points at a file that exists. (host/ and
guest/ document themselves in their own READMEs, kept by their own rooms.)"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
        *(p for d in ("vm", "bench", "tests") for p in sorted((REPO / d).rglob("README.md")))]
OUTSIDE = re.compile(r"(specs\.md|doorbell-msix\.md|anchors_\w+\.md|aesthetics\.md|"
                     r"reference/|\.\./shared|/work/shared)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_reference_outside_the_repository():
    for f in DOCS:
        hits = sorted(set(OUTSIDE.findall(f.read_text())))
        assert not hits, f"{f.relative_to(REPO)} refers to files outside the repository: {hits}"


def test_relative_links_resolve():
    for f in DOCS:
        for target in LINK.findall(f.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            assert (f.parent / target).exists(), f"{f.relative_to(REPO)}: broken link {target}"
