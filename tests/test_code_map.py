"""docs/code-map.md names every module of the source packages: each folder of Python modules has its row, the row
names each of its modules (`name.py`), and names none that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE_MAP = ROOT / "docs" / "code-map.md"
PACKAGES = ("berth", "export", "service", "training", "predict", "tasks", "bench", "scripts")
NOT_SOURCE = {"results", "__pycache__"}  # bench/results: records, not code
ROW = re.compile(r"^\| `([^`]+/)` \|(.*)$", re.M)
MODULE_NAME = re.compile(r"`(\w+\.py)`")


def modules_by_folder(root: Path) -> dict[str, set[str]]:
    """`folder/` -> the names of its modules (not __init__.py), for every folder of the packages holding one."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            relative = path.relative_to(root)
            if NOT_SOURCE & set(relative.parts) or path.name == "__init__.py":
                continue
            found.setdefault(f"{relative.parent.as_posix()}/", set()).add(path.name)
    return found


def unnamed(map_text: str, root: Path) -> list[str]:
    """The modules under `root` that the map's row for their folder does not name (or that have no row)."""
    rows = dict(ROW.findall(map_text))
    return sorted(f"{folder}{name}" for folder, names in modules_by_folder(root).items() for name in names
                  if f"`{name}`" not in rows.get(folder, ""))


def named_but_absent(map_text: str, root: Path) -> list[str]:
    """The `name.py` a source folder's row names that are not modules of that folder."""
    return sorted(f"{folder}{name}" for folder, text in ROW.findall(map_text)
                  if folder.split("/")[0] in PACKAGES for name in MODULE_NAME.findall(text)
                  if not (root / folder / name).is_file())


def test_the_code_map_names_every_module():
    missing = unnamed(CODE_MAP.read_text(encoding="utf-8"), ROOT)
    assert not missing, f"docs/code-map.md does not name these modules in their folder's row: {missing}"


def test_the_code_map_names_no_module_that_is_not_there():
    stale = named_but_absent(CODE_MAP.read_text(encoding="utf-8"), ROOT)
    assert not stale, f"docs/code-map.md names modules that do not exist: {stale}"


def test_a_module_left_out_of_its_row_is_found(tmp_path):
    """The check fails on a map that leaves a real module out, and on one naming a module that is gone."""
    text = CODE_MAP.read_text(encoding="utf-8")
    assert "`trainer.py`" in text
    assert unnamed(text.replace("`trainer.py`", "the loop"), ROOT) == ["training/loop/trainer.py"]
    assert named_but_absent(text.replace("`trainer.py`", "`trainer.py`, `gone.py`"), ROOT) == [
        "training/loop/gone.py"]
