"""Saves that never leave half a folder, and that say so in one line when the disk cannot take them.

A save fills a temporary sibling and renames it into place (`atomic_directory`), or fills a temporary folder and
moves its files into a folder that holds other things, the file that marks it finished last (`publish_files`).
A kill or a failed write leaves the previous complete save, or none. `ensure_free_space` refuses a save whose
size is known before writing a byte; `disk_errors` turns a write the disk refused (full, over a quota or a file
size limit) into a UserFacingError naming the folder, the free space and what was kept.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from training.errors import UserFacingError

FREE_SPACE_MARGIN = 1.05  # a save's known size, plus what the file formats add around the tensors
_FULL, _QUOTA, _TOO_LARGE = "the disk is full", "the disk quota is used up", "a file would pass the file size limit"
_REFUSED = {errno.ENOSPC: _FULL, errno.EDQUOT: _QUOTA, errno.EFBIG: _TOO_LARGE}
# safetensors says it in words; torch.save only as a RuntimeError of its zip writer ("unexpected pos").
_REFUSED_WORDS = {"no space left": _FULL, "os error 28": _FULL, "disk quota": _QUOTA, "os error 122": _QUOTA,
                  "file too large": _TOO_LARGE, "os error 27": _TOO_LARGE,
                  "unexpected pos": "the write stopped short (a full disk, a quota or a file size limit)"}


def megabytes(size: float) -> str:
    return f"{size / 2**20:,.1f} MB"


def free_bytes(folder: Path) -> int:
    """Free space for an unprivileged writer on the filesystem of `folder` (or of its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def ensure_free_space(folder: Path, needed: int, what: str) -> None:
    """UserFacingError when the filesystem of `folder` has less room than `needed` bytes (with a margin)."""
    free = free_bytes(folder)
    if needed * FREE_SPACE_MARGIN > free:
        raise UserFacingError(f"not enough free space to save {what} in {folder}: it needs about "
                              f"{megabytes(needed * FREE_SPACE_MARGIN)}, {megabytes(free)} are available; free some "
                              "space or write elsewhere")


def tensor_bytes(value: Any) -> int:
    """The bytes of every tensor or array in a nested structure of dicts, lists and tuples."""
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v) for v in value)
    if hasattr(value, "element_size") and hasattr(value, "nelement"):  # a torch tensor
        return value.element_size() * value.nelement()
    return int(getattr(value, "nbytes", 0) or 0)


def refused_write(error: BaseException) -> str | None:
    """Why the disk refused a write, if that is what `error` (or an error it came from) says; else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _REFUSED:
            return _REFUSED[current.errno]
        text = str(current).lower()
        for words, reason in _REFUSED_WORDS.items():
            if words in text:
                return reason
        current = current.__cause__ or current.__context__
    return None


@contextlib.contextmanager
def disk_errors(folder: Path, what: str, kept: str) -> Iterator[None]:
    """Turn a write the disk refused inside the block into one UserFacingError: what could not be saved where,
    why, the free space there, and `kept` (what is left instead)."""
    try:
        yield
    except UserFacingError:
        raise
    except Exception as error:
        reason = refused_write(error)
        if reason is None:
            raise
        raise UserFacingError(f"could not save {what} in {folder}: {reason} ({megabytes(free_bytes(folder))} free "
                              f"there); {kept}") from error


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling of `final` to fill; on success fsync it and rename it to `final`.

    A reader sees either no `final` or a complete one: a kill or an exception while writing leaves at
    most a hidden ".tmp-" folder (removed on exception here, and by `clean_stale_temporaries`).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        fsync_tree(tmp)
        replace_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """`path` holds its old text or all of `text`, never a part: a temporary sibling, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def file_in_the_way(folder: Path) -> Path | None:
    """The first of `folder` and its parents that exists and is not a folder (mkdir would fail on it), or None."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def replace_directory(source: Path, final: Path) -> None:
    """Rename the complete folder `source` to `final`, replacing it: the old one is moved aside first (a rename
    is atomic only onto nothing), so a kill in between leaves the new folder under its temporary name."""
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(source, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(source, final)
    fsync_path(final.parent)


def publish_files(staging: Path, folder: Path, marker: str) -> None:
    """Move every file of the complete folder `staging` into `folder` (same filesystem), `marker` (the file that
    says the folder is finished) removed first and moved last, then remove `staging`. A kill in between leaves a
    folder without its marker: never one that looks finished with half its files."""
    staging, folder = Path(staging), Path(folder)
    fsync_tree(staging)
    (folder / marker).unlink(missing_ok=True)
    fsync_path(folder)
    names = sorted(p.name for p in staging.iterdir() if p.name != marker)
    for name in [*names, marker]:
        target = folder / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(staging / name, target)
    fsync_path(folder)
    shutil.rmtree(staging, ignore_errors=True)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))


def clean_stale_temporaries(folder: Path) -> None:
    """Remove the ".tmp-" leftovers of a save that a kill interrupted, and the ".old-" ones; an ".old-" folder
    whose replacement never arrived (a kill between the two renames) is put back under its name instead."""
    if not folder.is_dir():
        return
    for child in sorted(folder.iterdir()):
        if child.name.startswith(".old-"):
            name = child.name[len(".old-"):].rsplit("-", 1)[0]
            if not (folder / name).exists():
                os.rename(child, folder / name)
                continue
        if child.name.startswith((".tmp-", ".old-")):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
