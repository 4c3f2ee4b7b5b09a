"""The one progress reporter: lines on a pipe at least every interval (even while nothing moves), a bar redrawn in
place on a terminal, nothing when disabled; always stderr."""

from __future__ import annotations

import re
import time

from tasks.runtime.progress import Progress, duration


def test_a_pipe_gets_a_line_every_interval_even_while_the_work_stalls(capsys):
    with Progress("export", total=4, unit="stages", interval_s=0.2, tty=False) as progress:
        progress.update(1)
        time.sleep(0.9)  # one long stage: no update() calls at all
    out, err = capsys.readouterr()
    assert out == ""  # stdout is the command's result only
    lines = err.splitlines()
    assert len(lines) >= 4, lines  # the heartbeat kept time during the stall, and a last line
    assert all(line.startswith("export: 1/4 stages (25%), elapsed ") for line in lines)
    assert "ETA" in lines[0] and "stages/s" in lines[0] and lines[-1].endswith("(done)")


def test_every_n_units_and_the_figures_a_line_carries(capsys):
    progress = Progress("train run", total=10, unit="steps", interval_s=3600, every=5, tty=False)
    for _ in range(10):
        progress.update(1)
    progress.set_postfix(loss="0.5000")
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert [re.match(r"train run: (\d+)/10 steps", line).group(1) for line in lines] == ["5", "10", "10"]
    assert lines[-1].endswith("loss=0.5000 (done)")


def test_a_terminal_gets_one_bar_redrawn_in_place_and_a_disabled_one_nothing(capsys):
    with Progress("dev evaluation", total=3, unit="items", tty=True) as progress:
        progress.update(3)
    err = capsys.readouterr().err
    assert err.startswith("\r") and err.endswith("\n") and "[########################] 3/3 items" in err
    with Progress("quiet", total=3, enabled=False, interval_s=0.05, tty=False) as progress:
        progress.update(3)
        time.sleep(0.2)
    assert capsys.readouterr().err == ""


def test_durations_read_as_minutes_and_hours():
    assert [duration(s) for s in (5, 62, 3600 + 5 * 60)] == ["5s", "1m02s", "1h05m"]
