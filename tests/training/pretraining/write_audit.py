"""`python -m tests.training.pretraining.write_audit pretrain ...`: the `berth` command, with every write it makes
under $BERTH_AUDIT_ROOT recorded into $BERTH_AUDIT_DIR/rank-$RANK.json at exit; how the multi-node tests see
which rank of a torchrun launch wrote into the output folder.

An audit hook (sys.addaudithook) sees what goes through Python: opens for writing, renames and replaces, directories
made or removed, files removed or copied. Writes made inside native code (torch.save's zip writer, safetensors)
are not seen themselves, but berth makes those inside a temporary folder that it then renames, and that is seen.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
PATH_ARGS = {  # audit event -> the positions of its arguments that are paths written
    "os.rename": (0, 1), "os.mkdir": (0,), "os.remove": (0,), "os.rmdir": (0,), "os.symlink": (1,),
    "os.link": (1,), "os.truncate": (0,), "shutil.copyfile": (1,), "shutil.rmtree": (0,), "shutil.move": (0, 1),
}


def _written_paths(event: str, args: tuple) -> list:
    if event == "open":
        path, mode, flags = args
        writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
        return [path] if writes else []
    return [args[i] for i in PATH_ARGS.get(event, ())]


def main() -> None:
    root = os.path.realpath(os.environ["BERTH_AUDIT_ROOT"])
    report = os.path.join(os.environ["BERTH_AUDIT_DIR"], f"rank-{os.environ.get('RANK', '0')}.json")
    writes: list[list[str]] = []

    def hook(event: str, args: tuple) -> None:
        for path in _written_paths(event, args):
            if isinstance(path, str | os.PathLike):
                path = os.path.abspath(os.fspath(path))
                if isinstance(path, str) and (path == root or path.startswith(root + os.sep)):
                    writes.append([event, os.path.relpath(path, root)])

    def save() -> None:
        with open(report, "w", encoding="utf-8") as f:
            json.dump(writes, f)

    atexit.register(save)
    sys.addaudithook(hook)
    runpy.run_module("berth.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
