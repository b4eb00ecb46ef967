"""bench/: the committed results and docs/performance.md agree, and say where they come from.

No measurement here (timings are never pass/fail): the report writer regenerates the page
from the kept results and must reproduce it exactly; every kept results file follows the one
schema and is in the history index; nothing committed names a path of the machine that
produced it.
"""
import re
import subprocess
from pathlib import Path

from harness import history, results

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"

# Absolute paths that belong to one machine or one run, never to the repository.
MACHINE_PATH = re.compile(r"(/work/|/home/|/root/|/tmp/ivtvm-|/var/tmp/ivtrace-eval-|"
                          r"/var/tmp/ivtrace-guest-|/dev/shm/ivt-guestbench-)")


def kept_files():
    return sorted(p for p in RESULTS.rglob("*.json") if p.name != "history.json"
                  and not p.stem.endswith("-quick"))


# Side-by-side comparisons of two builds: directory under the preset -> the harness that writes it.
COMPARISONS = {"ab": "drain_ab", "expand_ab": "expand_ab"}


def kept_results():
    """Runs of a preset (bench/run); side-by-side comparisons of two builds are not."""
    return [p for p in kept_files() if p.parent.name not in COMPARISONS]


def kept_comparisons():
    """Two builds side by side: the drain (bench/harness/drain_ab.py, bench/results/native/ab/)
    and the kernel expansion (bench/harness/expand_ab.py, bench/results/native/expand_ab/)."""
    return [p for p in kept_files() if p.parent.name in COMPARISONS]


def test_page_is_what_the_results_give():
    p = subprocess.run([str(REPO / "bench" / "report"), "--check"], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def test_every_kept_run_follows_the_schema():
    files = kept_results()
    assert files, "no results in bench/results/"
    for f in files:
        rec = results.load(f)  # raises on another schema
        assert rec["preset"] in results.PRESETS and f.parent.name in (rec["preset"], "focused")
        assert rec["command"].startswith(f"bench/run {rec['preset']}"), f
        assert rec["machine"]["cpu"].get("model_name"), f
        assert rec["accelerator"]["name"] in ("none", "tcg", "kvm"), f
        assert (rec["guest"] is None) == (rec["preset"] in results.HOST_PRESETS), f
        assert rec["git"]["commit"], f
        assert rec["data"], f


def test_every_comparison_follows_the_schema():
    for f in kept_comparisons():
        rec = results.load(f)  # raises on another schema
        assert f.parent.parent == RESULTS / rec["preset"], f
        assert f"-m harness.{COMPARISONS[f.parent.name]} " in rec["command"], f
        ab = rec["data"]["ab"]
        assert ab["a"] and ab["b"] and ab["rounds"] > 0, f
        for p in ab.get("profiles", [ab]):
            assert p["ratio_b_over_a"] > 0 and p["instructions_b_over_a"] > 0, (f, p.get("name"))


def test_history_indexes_every_kept_run():
    indexed = {e["file"]: e for e in history.load()}
    for f in kept_results():
        e = indexed.get(results.rel(f))
        assert e, f"{results.rel(f)} is not in bench/results/history.json"
        assert e["headline"] == history.entry(results.load(f), f)["headline"], f


def test_no_machine_paths_in_committed_results_or_docs():
    files = kept_files() + [RESULTS / "history.json", REPO / "README.md",
                              *sorted((REPO / "docs").glob("*.md"))]
    for f in files:
        hits = sorted(set(MACHINE_PATH.findall(f.read_text())))
        assert not hits, f"{results.rel(f)} names machine paths: {hits}"


def test_portable_rewrites_paths():
    root = "/some/checkout"
    assert results.portable(f"{root}/bin/ivtrace -o /var/tmp/ivtrace-eval-42/rec", root) == \
        "bin/ivtrace -o $WORK/rec"
    assert results.portable({"a": ["-initrd /tmp/ivtvm-ab_12x/initrd.img"]}, root) == \
        {"a": ["-initrd $TMP/initrd.img"]}
