"""`berth pretrain` past one machine: real torchrun launchers on 127.0.0.1 over gloo, each on a free port.

Two launchers started as two machines would start them (`--nnodes 2`, c10d rendezvous) train the same weights,
bit for bit, as one launcher with two processes, and only rank 0 writes into the output folder; a 2-rank run
killed after a checkpoint and started again with the same command ends where the uninterrupted run ends; a node
whose --out is not the folder the others see, and a launch with nothing prepared, stop with one line each.
Every run is tiny: the tiny preset on 64-token instances of six inaugural addresses, 8 steps, one thread a rank.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.numpy import load_file

from berth.cli import main
from training.loop.training_state import list_training_states

REPO = Path(__file__).resolve().parents[3]
TORCHRUN = Path(sys.executable).with_name("torchrun")
AUDITED_BERTH = "tests.training.pretraining.write_audit"  # berth.cli, its writes recorded per rank
STEPS = 8  # 76 training instances, 16 a step: the run crosses an epoch boundary
TRAIN = ["--preset", "tiny", "--max-seq-length", "64", "--batch-size", "8", "--max-steps", str(STEPS),
         "--save-every-steps", "2", "--log-every-steps", "1", "--threads", "1", "--no-progress-bar"]
RUN_RECORD = "pretrain_run.json"
LAUNCH_TIMEOUT_S = 300  # a hang fails the test instead of blocking the suite


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(port: int) -> list[str]:
    """The launcher of one of two machines: each runs it, c10d rendezvous at the first one's address (the node
    ranks are given by the order in which launchers join, so --node-rank is not needed)."""
    return ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--local-addr", "127.0.0.1"]


def one_node(port: int) -> list[str]:
    return ["--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]


@pytest.fixture(scope="module")
def corpus(shared_data) -> list[str]:
    return [str(f) for f in sorted((shared_data / "pretraining" / "inaugural").glob("*.txt"))[:6]]


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> Path:
    """The corpus prepared once, in one process, as a torchrun launch needs it."""
    out = tmp_path_factory.mktemp("prepared")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["pretrain", *corpus, "--out", str(out), "--vocab-size", "1000", *TRAIN, "--prepare-only"]) == 0
    return out / "data"


class Launch:
    """One torchrun launcher running `berth pretrain`, in its own process group, its output in a file."""

    def __init__(self, tmp: Path, name: str, launcher: list[str], berth_args: list[str]):
        self.log = tmp / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": "1", "BERTH_AUDIT_ROOT": str(tmp / "runs"), "BERTH_AUDIT_DIR": str(tmp)}
        with self.log.open("w") as log:
            self.process = subprocess.Popen([str(TORCHRUN), *launcher, "-m", AUDITED_BERTH, "pretrain", *berth_args],
                                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def wait(self, timeout: float = LAUNCH_TIMEOUT_S) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the launch did not end within {timeout} s:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL everything it started, as a machine that dies: its process group and the workers, which torchrun
        starts in sessions of their own."""
        family = descendants(self.process.pid)
        os.killpg(self.process.pid, signal.SIGKILL)
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def descendants(pid: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def succeeded(*launches: Launch) -> None:
    for launch in launches:
        assert launch.wait() == 0, launch.output()[-4000:]


def weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))


def losses(out: Path) -> list[tuple[int, float]]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in lines if "loss" in r and r.get("split") != "eval"]


def writes(tmp: Path, rank: int) -> list[list[str]]:
    return json.loads((tmp / f"rank-{rank}.json").read_text())


def assert_same_weights(got: dict, expected: dict) -> None:
    assert sorted(got) == sorted(expected)
    differing = [name for name in expected if not (got[name] == expected[name]).all()]
    assert not differing, f"weights differ: {differing[:5]}"


@pytest.fixture(scope="module")
def one_node_run(prepared, tmp_path_factory) -> Path:
    """The reference: one launcher, two processes."""
    tmp = tmp_path_factory.mktemp("one-node")
    out = tmp / "runs" / "out"
    succeeded(Launch(tmp, "one-node", one_node(free_port()), [str(prepared), "--out", str(out), *TRAIN]))
    return out


def test_two_launchers_train_the_weights_of_one_launcher_with_two_processes_and_rank_0_alone_writes(
        prepared, one_node_run, tmp_path):
    out = tmp_path / "runs" / "out"
    port = free_port()
    nodes = [Launch(tmp_path, f"node-{i}", two_nodes(port), [str(prepared), "--out", str(out), *TRAIN])
             for i in range(2)]
    succeeded(*nodes)

    assert_same_weights(weights(out), weights(one_node_run))
    assert losses(out) == losses(one_node_run) and [s for s, _ in losses(out)] == list(range(1, STEPS + 1))
    assert json.loads((out / RUN_RECORD).read_text())["train_result"]["steps"] == STEPS
    printed = [node.output() for node in nodes]
    assert sum(f"saved BertForPreTraining to {out}" in text for text in printed) == 1  # one launcher reports
    assert writes(tmp_path, 1) == []
    written = {path for _, path in writes(tmp_path, 0)}
    assert {"out/config.yaml", "out/metrics.jsonl", f"out/{RUN_RECORD}"} <= written
    assert [p.name for p in list_training_states(out)] == [f"step-{STEPS:08d}"]


@pytest.mark.slow  # ~70 s: three 2-rank launches; the one-process kill and resume runs in the default suite
def test_a_killed_two_rank_run_resumed_with_the_same_command_ends_with_the_uninterrupted_weights(
        prepared, one_node_run, tmp_path):
    out = tmp_path / "runs" / "out"
    command = (one_node(free_port()), [str(prepared), "--out", str(out), *TRAIN])
    first = Launch(tmp_path, "killed", *command)
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not list_training_states(out) and first.process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    first.kill()
    kept = list_training_states(out)
    assert kept and not (out / RUN_RECORD).exists(), "the run was not killed between a checkpoint and its end"
    killed_at = int(kept[-1].name.split("-")[1])
    assert killed_at < STEPS

    resumed = Launch(tmp_path, "resumed", *command)
    succeeded(resumed)
    assert f"resumed from {kept[-1]}: step {killed_at}," in resumed.output()
    assert_same_weights(weights(out), weights(one_node_run))
    assert losses(out) == losses(one_node_run)


def test_a_node_whose_out_is_not_the_shared_folder_stops_both_launchers_with_one_line(prepared, tmp_path):
    port = free_port()
    nodes = [Launch(tmp_path, f"node-{i}", two_nodes(port),
                    [str(prepared), "--out", str(tmp_path / "runs" / f"out-{i}"), *TRAIN]) for i in range(2)]
    for node in nodes:
        assert node.wait(timeout=180) != 0
        printed = node.output()
        lines = [line for line in printed.splitlines() if line.startswith("berth pretrain: ")]
        assert len(lines) == 1, printed[-4000:]
        assert "is not shared between the machines: rank 1 on " in lines[0] and "same --out" in lines[0]
        assert "UserFacingError" not in printed  # no traceback from berth itself
    assert not (tmp_path / "runs" / "out-0" / "checkpoints").exists()
    assert not (tmp_path / "runs" / "out-1" / "checkpoints").exists()
    assert writes(tmp_path, 1) == []


@pytest.mark.slow  # ~30 s each: the refusal itself is one function, tested in the default suite by a single process
@pytest.mark.parametrize("named", ["corpus", "prepared-folder"])
def test_a_torchrun_launch_without_prepared_data_says_prepare_first(named, corpus, prepared, tmp_path):
    """The corpus itself with nothing prepared in --out, or --out's data folder named before it was prepared."""
    out = tmp_path / "runs" / "out"
    if named == "corpus":
        given, why = [*corpus], f"no tokenizer has been prepared in {out / 'data'}"
    else:
        given, why = [str(out / "data"), "--tokenizer", str(prepared)], f"{out / 'data'}: no such corpus file"
    launch = Launch(tmp_path, "unprepared", one_node(free_port()), [*given, "--out", str(out), *TRAIN])
    assert launch.wait() != 0
    printed = launch.output()
    lines = [line for line in printed.splitlines() if line.startswith("berth pretrain: ")]
    assert len(lines) == 2, printed[-4000:]  # one from each rank
    for line in lines:
        assert why in line and "no data is built inside a torchrun launch" in line and "--prepare-only" in line
        assert f"--out {out}" in line
    assert "UserFacingError" not in printed
    assert not (out / "data").exists()
