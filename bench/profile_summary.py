"""Where a process's threads spent their samples: a `py-spy record --format raw --threads` file summed by thread,
then, for the threads whose name contains `--thread`, each function's share of their samples by itself (self)
and with what it calls (inclusive).

    py-spy record --format raw --threads -r 200 -d 15 --pid <berth serve> -o serve.txt   # while under load
    python -m bench.profile_summary serve.txt --thread MainThread > bench/results/profile-serve.txt
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path


def summary(path: Path, thread: str | None, top: int) -> str:
    threads: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        stack, _, count = line.rpartition(" ")
        samples, frames = int(count), stack.split(";")
        threads[frames[0]] += samples
        if thread and thread not in frames[0]:
            continue
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames[1:]):
            inclusive[frame] += samples
    lines = ["samples by thread:", *(f"  {n:7d} {name}" for name, n in threads.most_common())]
    for title, counter in (("self", own), ("inclusive", inclusive)):
        lines.append(f"{title}, share of {total} samples of the threads named {thread or '(all)'}:")
        lines += [f"  {n / max(total, 1):6.1%} {frame}" for frame, n in counter.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("raw", type=Path, help="py-spy's --format raw output")
    parser.add_argument("--thread", help="only the threads whose name contains this (e.g. MainThread)")
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    print(summary(args.raw, args.thread, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
