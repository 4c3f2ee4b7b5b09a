"""One progress reporter for long work: training, dev evaluation, export's gates, predict, build-defaults.

On a terminal it redraws a bar in place; otherwise (a log file, CI, a Kubernetes Job, a pipe) it writes
a line at least every `interval_s` seconds (default 30, or $BERTH_PROGRESS_SECONDS), and every `every`
units when given, even while nothing moves (a background thread keeps time), then a last line at close.
A line says position/total, elapsed, ETA and throughput, e.g.

    finetune: 120/500 steps (24%), elapsed 1m02s, ETA 3m16s, 1.93 steps/s, loss=0.4312

Always to stderr: stdout carries a command's result only. Torch-free and dependency-free, so the service
side and `berth predict` can use it. The trainer's uses of tqdm (update, total, set_postfix, disable,
close) work on it too.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ENV_INTERVAL = "BERTH_PROGRESS_SECONDS"
DEFAULT_INTERVAL_S = 30.0
BAR_WIDTH = 24
TTY_REDRAW_S = 0.2


def progress_interval() -> float:
    """Seconds between lines when stderr is not a terminal: $BERTH_PROGRESS_SECONDS, else 30."""
    try:
        return max(0.05, float(os.environ.get(ENV_INTERVAL, DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


class Progress:
    """Position out of `total` (None: unknown) in `unit`s, reported as the module says; use as a context
    manager or call close(). `enabled=False` reports nothing (e.g. ranks other than 0)."""

    def __init__(self, label: str, total: float | None = None, unit: str = "it", initial: float = 0,
                 enabled: bool = True, interval_s: float | None = None, every: int | None = None,
                 tty: bool | None = None):
        self.label, self.unit, self.every = label, unit, every
        self._total = total
        self.position = self.initial = initial
        self._dirty = False  # moved since the last line
        self.disable = not enabled
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.interval_s = progress_interval() if interval_s is None else interval_s
        self.postfix: dict[str, Any] = {}
        self.started = self.shown = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = False
        self._thread = None
        if not self.disable and not self.tty:  # a heartbeat, so a stall (a long step, an export) still shows
            self._thread = threading.Thread(target=self._heartbeat, name=f"progress-{label}", daemon=True)
            self._thread.start()

    # -- what callers move

    @property
    def total(self) -> float | None:
        return self._total

    @total.setter
    def total(self, value: float | None) -> None:  # a plan that changed length (a budget fit)
        self._total = value

    def update(self, n: float = 1) -> None:
        if self.disable:
            return
        before = self.position
        self.position += n
        self._dirty = True
        now = time.monotonic()
        crossed = bool(self.every) and int(self.position // self.every) > int(before // self.every)
        if self.tty and now - self.shown >= TTY_REDRAW_S or not self.tty and (crossed or self._due(now)):
            self._emit(now)

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        """Figures shown after the rate (e.g. loss=0.43); kept until replaced."""
        self.postfix.update(values)
        self._dirty = True
        if refresh and not self.disable:
            self._emit(time.monotonic())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self.disable or not self.tty and not self._dirty and self._total and self.position >= self._total:
            return  # the last line already said it was complete
        self._emit(time.monotonic(), final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the text

    def line(self, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        elapsed = now - self.started
        rate = (self.position - self.initial) / elapsed if elapsed > 0 else 0.0
        total = self._total
        where = f"{_number(self.position)}/{_number(total)} {self.unit}" if total else \
            f"{_number(self.position)} {self.unit}"
        if total:
            where += f" ({min(self.position / total, 1):.0%})"
        parts = [where, f"elapsed {duration(elapsed)}"] if total or self.position else [f"elapsed {duration(elapsed)}"]
        if total and rate > 0 and self.position < total:
            parts.append(f"ETA {duration((total - self.position) / rate)}")
        if self.position > self.initial:
            parts.append(f"{rate:.3g} {self.unit}/s")
        parts += [f"{k}={v}" for k, v in self.postfix.items()]
        return f"{self.label}: " + ", ".join(parts)

    def _bar(self, now: float) -> str:
        total = self._total
        filled = round(BAR_WIDTH * min(self.position / total, 1)) if total else 0
        bar = "#" * filled + "-" * (BAR_WIDTH - filled) if total else ""
        text = self.line(now)
        label, rest = text.split(": ", 1)
        return f"{label} [{bar}] {rest}" if bar else text

    def _due(self, now: float) -> bool:
        return now - self.shown >= self.interval_s

    def _emit(self, now: float, final: bool = False) -> None:
        with self._lock:
            self.shown, self._dirty = now, False
            if self.tty:
                end = "\n" if final else ""
                sys.stderr.write("\r" + self._bar(now) + "\x1b[K" + end)
            else:
                sys.stderr.write(self.line(now) + (" (done)" if final else "") + "\n")
            sys.stderr.flush()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.interval_s, 1.0) / 2):
            now = time.monotonic()
            if self._due(now) and not self._closed:
                self._emit(now)


def duration(seconds: float) -> str:
    """1m02s, 2h05m, 12s."""
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def _number(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def counted(runner: Callable[[dict[str, Any]], dict[str, Any]], progress: Progress) -> Callable[[dict[str, Any]],
                                                                                                dict[str, Any]]:
    """A Runner (padded feeds -> outputs, tasks/runtime/inference.py) that moves `progress` by each batch's rows."""
    def run(feeds: dict[str, Any]) -> dict[str, Any]:
        out = runner(feeds)
        progress.update(len(next(iter(feeds.values()))) if feeds else 0)
        return out

    return run
