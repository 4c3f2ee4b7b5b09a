"""bench/results kept by the policy of its README: every file there named in the README's tables and every name
there a file, every record a doc cites present, the compressed records readable, and the text under its ceiling.
Each check is also run on a small planted tree, to show that it fails when its rule is broken."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from bench.records import read_record

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
CEILING_LINES = 30_000
CITATION = re.compile(r"bench/results/([\w.{},*/-]+)")
BRACES = re.compile(r"\{([^{}]*)\}")


def expand(pattern: str) -> list[str]:
    """`a-{x,y}.json` -> `a-x.json`, `a-y.json` (as the shell does)."""
    found = BRACES.search(pattern)
    if not found:
        return [pattern]
    head, tail = pattern[:found.start()], pattern[found.end():]
    return [name for choice in found.group(1).split(",") for name in expand(head + choice + tail)]


def matches(results: Path, pattern: str) -> list[Path]:
    return [path for name in expand(pattern.rstrip("/")) for path in results.glob(name)]


def records(results: Path) -> list[Path]:
    return sorted(path for path in results.rglob("*") if path.is_file() and path != results / "README.md")


def readme_names(results: Path) -> list[str]:
    """The backquoted names in the first column of the README's tables."""
    rows = [line.split("|")[1] for line in (results / "README.md").read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    return [name for cell in rows for name in re.findall(r"`([^`]+)`", cell)]


def unnamed_records(results: Path) -> list[str]:
    named = {path for name in readme_names(results) for path in matches(results, name)}
    return [path.relative_to(results).as_posix() for path in records(results) if path not in named]


def names_without_records(results: Path) -> list[str]:
    return [name for name in readme_names(results) if not matches(results, name)]


def missing_citations(pages: list[Path], results: Path) -> list[str]:
    """Records the docs' prose cites that are not there. Commands in fenced blocks and `--out` targets name what a
    run writes (then compressed, or not kept), so they are not citations; nor are `<placeholder>` names."""
    missing = []
    for page in pages:
        fenced = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for found in CITATION.finditer(line):
                name = found.group(1).rstrip(".,")
                placeholder = line[found.end():found.end() + 1] == "<"
                if placeholder or line[:found.start()].endswith("--out ") or matches(results, name):
                    continue
                missing.append(f"{page.relative_to(page.parents[1])}:{number}: bench/results/{name}")
    return missing


def text_lines(results: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in records(results) if path.suffix != ".gz") + \
        (results / "README.md").read_bytes().count(b"\n")


def doc_pages() -> list[Path]:
    return sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]


def test_every_record_is_named_in_the_readme_and_every_name_is_a_record() -> None:
    assert unnamed_records(RESULTS) == [], "add each to a table of bench/results/README.md (or drop it)"
    assert names_without_records(RESULTS) == []


def test_every_record_the_docs_cite_is_there() -> None:
    assert missing_citations(doc_pages(), RESULTS) == []


def test_the_text_stays_under_the_ceiling() -> None:
    lines = text_lines(RESULTS)
    largest = sorted(records(RESULTS), key=lambda p: p.stat().st_size if p.suffix != ".gz" else 0)[-3:]
    assert lines <= CEILING_LINES, f"{lines:,} lines; the largest text records: {[p.name for p in largest]}"


def test_compressed_records_read_back() -> None:
    compressed = [path for path in records(RESULTS) if path.suffix == ".gz"]
    assert compressed
    for path in compressed:
        if path.name.endswith(".json.gz"):
            assert read_record(path), path
        else:
            assert gzip.decompress(path.read_bytes()).strip(), path


def test_each_check_fails_on_a_planted_tree(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    (results / "side").mkdir(parents=True)
    (results / "README.md").write_text("| record | feeds |\n|---|---|\n| `run-{a,b}.json`, `gone.json` | x |\n",
                                       encoding="utf-8")
    for name in ("run-a.json", "run-b.json", "side/stray.log"):
        (results / name).write_text("{}\n" * 3, encoding="utf-8")
    page = tmp_path / "docs" / "PAGE.md"
    page.parent.mkdir()
    page.write_text("See `bench/results/run-a.json`, `bench/results/run-c.json`.\n"
                    "`python -m x --out bench/results/new.json` and `bench/results/memory-<step>.json`\n"
                    "```\nbench/results/written-by-a-command.json\n```\n", encoding="utf-8")

    assert unnamed_records(results) == ["side/stray.log"]
    assert names_without_records(results) == ["gone.json"]
    assert missing_citations([page], results) == ["docs/PAGE.md:1: bench/results/run-c.json"]
    assert text_lines(results) == 9 + 3
    assert expand("p/{x,y}-{1,2}.gz") == ["p/x-1.gz", "p/x-2.gz", "p/y-1.gz", "p/y-2.gz"]
