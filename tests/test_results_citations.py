"""The recorded results the documents cite exist: every ``benchmarks/results/...`` path written out
in the repository's text (README, CHANGELOG, docs, tuning_db/README.md, fa_autotune's comments and
docstrings, the search spaces, the results' own markdown) names a file or folder that is there
(a ``*`` in it must match something), and no abandoned ``.patch`` sits under benchmarks/
(benchmarks/README.md says how an experiment is recorded)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("README.md", "CHANGELOG.md", "docs/**/*.md", "tuning_db/README.md", "fa_autotune/**/*.py",
           "search_spaces/*.yaml", "benchmarks/**/*.md")
CITATION = re.compile(r"benchmarks/results/[A-Za-z0-9_.*{},/-]*")


def citing_files(root: Path) -> list[Path]:
    return sorted({p for pattern in SOURCES for p in root.glob(pattern) if p.is_file()})


def _expand(path: str) -> list[str]:
    """``bench.{json,md}`` -> ``bench.json``, ``bench.md``."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in _expand(path[:m.start()] + alt + path[m.end():])]


def missing_citations(root: Path) -> list[str]:
    missing = []
    for source in citing_files(root):
        text = source.read_text(errors="replace")
        for m in CITATION.finditer(text):
            cited = m.group(0).rstrip(".,;:")
            for path in _expand(cited):
                found = any(root.glob(path.rstrip("/"))) if "*" in path else (root / path).exists()
                if not found:
                    line = text.count("\n", 0, m.start()) + 1
                    missing.append(f"{source.relative_to(root)}:{line}: {path}")
    return missing


def test_the_check_reads_the_citing_documents():
    names = {p.relative_to(ROOT).as_posix() for p in citing_files(ROOT)}
    assert "README.md" in names and "tuning_db/README.md" in names and "benchmarks/README.md" in names
    assert any(n.startswith("fa_autotune/") for n in names) and any(n.startswith("search_spaces/") for n in names)


def test_every_cited_results_path_exists():
    assert missing_citations(ROOT) == []


def test_a_wrong_path_is_caught(tmp_path):
    (tmp_path / "benchmarks/results/2026-12-04-h200-x").mkdir(parents=True)
    (tmp_path / "benchmarks/results/2026-12-04-h200-x/bench.md").write_text("")
    (tmp_path / "README.md").write_text(
        "ok (benchmarks/results/2026-12-04-h200-x/bench.md), ok `benchmarks/results/2026-12-04-h200-*/`,\n"
        "ok benchmarks/results/2026-12-04-h200-x/bench.{md}.\n"
        "wrong: benchmarks/results/2026-12-04-h200-x/bench.json; benchmarks/results/2026-12-05-*/\n")
    assert missing_citations(tmp_path) == ["README.md:3: benchmarks/results/2026-12-04-h200-x/bench.json",
                                           "README.md:3: benchmarks/results/2026-12-05-*/"]


@pytest.mark.parametrize("folder", ["benchmarks"])
def test_no_patch_files_under_benchmarks(folder):
    assert sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / folder).rglob("*.patch")) == []
