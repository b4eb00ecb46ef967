"""The repository is self-contained: no document, source file or comment refers to files
outside it, and every relative link of docs/ and the READMEs points at a file that exists.
(bench/results/ and the generated docs/performance.md record commands as they ran.)"""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
        *(p for d in ("vm", "bench", "tests", "python") for p in sorted((REPO / d).rglob("README.md")))]
OUTSIDE = re.compile(r"(specs\.md|doorbell-msix\.md|anchors_\w+\.md|aesthetics\.md|"
                     r"reference/|\.\./shared|/work/shared)")
TRACKED = [REPO / p for p in subprocess.run(
    ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    if not p.startswith("bench/results/") and p not in ("docs/performance.md", "tests/test_docs.py")]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_no_reference_outside_the_repository():
    for f in DOCS:
        hits = sorted(set(OUTSIDE.findall(f.read_text())))
        assert not hits, f"{f.relative_to(REPO)} refers to files outside the repository: {hits}"


def test_no_source_file_refers_outside_the_repository():
    hits = []
    for f in TRACKED:
        try:
            text = f.read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        hits += [f"{f.relative_to(REPO)}: {m}" for m in sorted(set(OUTSIDE.findall(text)))]
    assert not hits, f"files refer to files outside the repository: {hits}"


def test_relative_links_resolve():
    for f in DOCS:
        for target in LINK.findall(f.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            assert (f.parent / target).exists(), f"{f.relative_to(REPO)}: broken link {target}"
