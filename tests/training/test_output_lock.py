"""One run per output folder: a live holder (another real process) refuses a second run with one line naming it;
after the holder is killed its lock is recognised as stale and taken over; a lock from another host is not guessed
at; within one process the lock is re-entrant."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from training.errors import UserFacingError
from training.loop.output_lock import LOCK_FILE, OutputInUse, acquire, output_lock

HOLD = """
import sys, time
from training.loop.output_lock import output_lock
with output_lock(sys.argv[1], "berth finetune"):
    print("held", flush=True)
    time.sleep(300)
"""


@pytest.fixture
def holder(tmp_path):
    """Another process holding tmp_path/out's lock."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "out")], stdout=subprocess.PIPE,
                               text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert process.stdout.readline().strip() == "held"
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def test_a_live_run_refuses_a_second_naming_its_pid_and_host(tmp_path, holder):
    with pytest.raises(OutputInUse) as refused:
        acquire(tmp_path / "out", "berth finetune")
    message = str(refused.value)
    assert isinstance(refused.value, UserFacingError) and "\n" not in message
    assert f"in use by berth finetune (pid {holder.pid} on {socket.gethostname()}" in message


def test_a_killed_runs_lock_is_stale_and_taken_over(tmp_path, holder, caplog):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / "out" / LOCK_FILE).is_file()  # a kill leaves it behind
    with caplog.at_level("WARNING"), output_lock(tmp_path / "out", "berth finetune"):
        held = json.loads((tmp_path / "out" / LOCK_FILE).read_text())
        assert held["pid"] == os.getpid()
    assert f"a stale lock of berth finetune (pid {holder.pid}" in caplog.text
    assert not (tmp_path / "out" / LOCK_FILE).exists()  # released at the end


def test_a_recycled_pid_is_not_the_run(tmp_path):
    """A lock naming a live pid whose process started at another time (the pid was reused) is stale."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(),
                                                "command": "berth finetune", "time": time.time(), "start": "1"}))
    with output_lock(folder, "berth finetune"):
        assert json.loads((folder / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_a_lock_from_another_host_is_not_guessed_at(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK_FILE).write_text(json.dumps({"pid": 1, "host": "elsewhere", "command": "berth finetune",
                                                "time": 0}))
    with pytest.raises(OutputInUse, match=f"another host.*delete {folder / LOCK_FILE}"):
        acquire(folder, "berth finetune")


def test_the_lock_is_reentrant_within_a_process(tmp_path):
    with output_lock(tmp_path / "out", "berth finetune"):
        with output_lock(tmp_path / "out", "berth finetune"):
            pass
        assert (tmp_path / "out" / LOCK_FILE).is_file()  # the inner block does not release the outer's lock
    assert not (tmp_path / "out" / LOCK_FILE).exists()

