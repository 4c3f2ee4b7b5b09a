"""The docs site: the reference pages are what scripts/docs_reference.py writes from the code (so a route or a
flag cannot change without its page), `mkdocs build --strict` passes, and the same build fails on a broken
link or anchor, so a page that moves or loses a heading fails the tests."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")
WORKPLACE_PATH = re.compile(r"shared/data")


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    if not MKDOCS.is_file():
        pytest.fail(f"{MKDOCS} is missing: install the docs extra (pip install -e '.[docs]')")
    return subprocess.run([str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def reference_script():
    """scripts/docs_reference.py as a module."""
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def site_copy(tmp_path: Path) -> Path:
    """mkdocs.yml and docs/ copied into tmp_path, to be broken there; returns the config."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path / "mkdocs.yml"


def test_the_reference_pages_are_up_to_date():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "docs_reference.py"), "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_every_route_and_command_has_a_page():
    reference = reference_script()
    routes = {(method, path) for path, operations in reference.openapi_document()["paths"].items()
              for method in operations}
    for method, path in routes:
        assert (REPO / reference.REFERENCE / "http" / f"{reference.route_slug(method, path)}.md").is_file(), path
    for name in reference.subcommand_parsers():
        assert (REPO / reference.REFERENCE / "cli" / f"{name}.md").is_file(), name
    assert "berth serve" in (REPO / reference.REFERENCE / "cli" / "index.md").read_text(encoding="utf-8")


def test_the_site_builds_strict(tmp_path):
    done = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "http" / "post-v1-ner.html").is_file()
    assert (tmp_path / "site" / "data.html").is_file()


@pytest.mark.parametrize(("link", "reported"), [
    ("[the old page](no-such-page.md)", "no-such-page.md"),  # a broken link
    ("[a moved section](SERVICE.md#no-such-heading)", "no-such-heading"),  # a broken anchor
])
def test_a_broken_link_or_anchor_fails_the_build(tmp_path, link, reported):
    config = site_copy(tmp_path)
    with (tmp_path / "docs" / "tutorial.md").open("a", encoding="utf-8") as page:
        page.write(f"\nSee {link}.\n")
    done = mkdocs_build(config, tmp_path / "site")
    assert done.returncode != 0
    assert reported in done.stderr


def test_the_readme_links_resolve():
    """README.md is read on its own (not a page of the site): its relative links name files that exist."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    targets = [link.split("#")[0] for link in re.findall(r"\]\(([^)\s]+)\)", text)
               if not link.startswith(("http://", "https://", "#"))]
    assert targets
    missing = [target for target in targets if not (REPO / target).exists()]
    assert not missing, missing


def test_the_site_and_the_readme_name_no_workplace_path():
    """Where the data sets are is docs/data.md's business; no page tells a user about a folder of this project's
    build machines."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    named = [f"{page.relative_to(REPO)}:{number}" for page in pages
             for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if WORKPLACE_PATH.search(line)]
    assert not named, named


SOURCE_PATH = re.compile(
    r"(?<![\w/.:-])((?:tasks|service|training|export|berth|predict|bench|scripts|tests)/[\w/.-]*\.py)\b")
TEST_FILE_NAME = re.compile(r"(?<![\w/.:-])(test_\w+\.py)\b")


def written_in_backticks(text: str) -> list[str]:
    """The text of a page's fenced code blocks and inline code spans."""
    pieces = text.split("```")
    fenced = pieces[1::2]
    inline = [span for prose in pieces[0::2] for span in re.findall(r"`([^`\n]+)`", prose)]
    return fenced + inline


def test_the_source_files_the_pages_name_exist():
    """A module or test that moves or is renamed takes its mentions with it: every source path written in
    backticks in README.md or a docs page (`service/batcher.py`, `python bench/engine.py`) names a file of the
    repository, and every test file named on its own (`test_routes.py`) is one of tests/."""
    test_files = {path.name for path in (REPO / "tests").rglob("test_*.py")}
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        for code in written_in_backticks(page.read_text(encoding="utf-8")):
            missing += [f"{page.relative_to(REPO)}: {path}" for path in SOURCE_PATH.findall(code)
                        if not (REPO / path).is_file()]
            missing += [f"{page.relative_to(REPO)}: {name}" for name in TEST_FILE_NAME.findall(code)
                        if name not in test_files]
    assert not missing, missing
