"""One run per output folder: a lock file that names the run holding it.

A run that writes a folder takes `OUT/.berth.lock` first: it is created exclusively and holds the run's pid, host,
command and start time. A second run on the same folder is refused with one line naming the live run. A lock whose
process is gone (the run was killed) is stale: the next run says so and takes it, so a killed run's folder resumes
with the same command. The process's start time is recorded beside its pid, so a recycled pid is not mistaken for
the run. A lock written on another host cannot be checked from here: the message says how to remove it.

The lock is re-entrant within one process (the command line takes it before writing its config, the run again)
and only the process that took it removes it.

    with output_lock(out, "berth finetune"):
        ...
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from training.errors import UserFacingError
from training.loop.saving import file_in_the_way

LOCK_FILE = ".berth.lock"
log = logging.getLogger("berth.lock")


class OutputInUse(UserFacingError):
    """Another live run writes this output folder."""


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), None where unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 else None


def _alive(holder: dict) -> bool:
    pid = int(holder.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    recorded, now = holder.get("start"), _process_start(pid)
    return recorded is None or now is None or recorded == now


def _describe(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("time", 0)))
    return f"{holder.get('command', 'a run')} (pid {holder.get('pid')} on {holder.get('host')}, since {since})"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # half-written or damaged: treated as stale below


def _try_create(path: Path, record: dict) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
    return True


def acquire(folder: str | Path, command: str) -> bool:
    """Take the folder's lock for this process. True when this call took it, False when this process already held
    it; raises OutputInUse when a live run holds it."""
    folder = Path(folder)
    blocked = file_in_the_way(folder)  # mkdir's FileExistsError would be a traceback
    if blocked is not None:
        raise UserFacingError(f"--out {folder}: {blocked} is a file; name a folder for the run's outputs")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    host = socket.gethostname()
    record = {"pid": os.getpid(), "host": host, "command": command, "time": time.time(),
              "start": _process_start(os.getpid())}
    for _ in range(3):  # another run may take or drop the lock between our read and our create
        if _try_create(path, record):
            return True
        holder = _read(path)
        if holder is None:
            continue
        if holder.get("pid") == os.getpid() and holder.get("host") == host:
            return False
        if holder.get("host") not in (None, host):
            raise OutputInUse(f"{folder} is in use by {_describe(holder)}: another host, so this one cannot tell "
                              f"whether it still runs; if it does not, delete {path}")
        if holder and _alive(holder):
            raise OutputInUse(f"{folder} is in use by {_describe(holder)}: wait for it to end, or give another "
                              "output folder")
        log.warning("%s: a stale lock of %s, which no longer runs (killed?): taking it over", folder,
                    _describe(holder) if holder else "an unreadable lock file")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    raise OutputInUse(f"{folder}: could not take {path} (other runs keep taking it)")


def release(folder: str | Path) -> None:
    """Remove the folder's lock if this process holds it."""
    path = Path(folder) / LOCK_FILE
    holder = _read(path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def output_lock(folder: str | Path, command: str) -> Iterator[None]:
    """Hold the folder's lock for the block (re-entrant within a process; the outermost holder releases it)."""
    took = acquire(folder, command)
    try:
        yield
    finally:
        if took:
            release(folder)
