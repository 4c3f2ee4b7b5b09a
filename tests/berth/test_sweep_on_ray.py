"""`berth sweep --ray` on a real 2-node Ray cluster (started on 127.0.0.1 by the test, the harness of the
`berth predict --ray` tests): a 2 x 2 sweep of the tiny BERT gives the records and the winner of the same
sweep run locally; with --ray-asha every trial is still recorded (ok or stopped early), and the refusals
come before any training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.berth import test_sweep
from tests.berth.test_sweep import GRID, ROOT, run_cli, sweep_args

pytest.importorskip("ray.tune", reason="berth sweep --ray needs Ray Tune (pip install 'berth[ray]')")

from tests.predict.ray_cluster import RayCluster  # noqa: E402

tiny_base = test_sweep.tiny_base  # the 2-layer H32 BERT of the local sweep tests (a module fixture)
ONE_THREAD = ["--threads", "1"]  # the same threads locally and on Ray: one CPU per trial, two trials at once


@pytest.fixture(scope="module")
def two_nodes():
    cluster = RayCluster(nodes=2, cpus_per_node=1)
    try:
        yield cluster
    finally:
        cluster.stop()


def run_sweep(argv: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-m", "berth.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    json.loads(done.stdout)  # stdout is one JSON document, Tune's output notwithstanding
    return json.loads((Path(argv[argv.index("--out") + 1]) / "sweep.json").read_text())


def comparable(trial: dict) -> tuple:
    return trial["id"], trial["cell"], trial["seed"], trial["status"], trial["settings"], sorted(trial["dev_metrics"])


def test_a_sweep_on_two_ray_nodes_has_the_records_and_winner_of_a_local_run(tiny_base, two_nodes, tmp_path):
    local = run_sweep(sweep_args(tiny_base, tmp_path / "local", *GRID, *ONE_THREAD))
    on_ray = run_sweep(sweep_args(tiny_base, tmp_path / "ray", *GRID, *ONE_THREAD, "--ray", two_nodes.address))
    assert on_ray["counts"] == local["counts"] == {"ok": 4, "failed": 0, "not_run": 0}
    assert [comparable(t) for t in on_ray["trials"]] == [comparable(t) for t in local["trials"]]
    for mine, theirs in zip(on_ray["trials"], local["trials"], strict=True):
        for name, value in theirs["dev_metrics"].items():
            assert mine["dev_metrics"][name] == pytest.approx(value, abs=1e-6), (mine["id"], name)
        assert mine["steps"] == theirs["steps"] and mine["threads"] == theirs["threads"] == 1
    assert (on_ray["winner"]["id"], on_ray["winner"]["seed"]) == (local["winner"]["id"], local["winner"]["seed"])
    assert on_ray["winner"]["value"] == pytest.approx(local["winner"]["value"], abs=1e-6)
    for mine, theirs in zip(on_ray["cells"], local["cells"], strict=True):
        assert mine["mean"] == pytest.approx(theirs["mean"], abs=1e-6) and mine["ok"] == theirs["ok"] == 2
    assert on_ray["ray"] == {"address": two_nodes.address, "asha": None}
    best = json.loads((tmp_path / "ray" / "best" / "sweep_trial.json").read_text())
    assert best["id"] == local["winner"]["id"] and (tmp_path / "ray" / "best" / "model.safetensors").is_file()
    beaten = [t["id"] for t in on_ray["trials"] if t["id"] != on_ray["winner"]["id"]]
    assert not any((tmp_path / "ray" / "trials" / key / "model.safetensors").exists() for key in beaten)


def test_asha_stops_trials_on_their_dev_evaluations_and_records_every_trial(tiny_base, two_nodes, tmp_path):
    record = run_sweep(sweep_args(tiny_base, tmp_path / "asha", *GRID, *ONE_THREAD, "--eval-every-steps", "4",
                                  "--ray", two_nodes.address, "--ray-asha"))
    statuses = [t["status"] for t in record["trials"]]
    assert len(statuses) == 4 and set(statuses) <= {"ok", "stopped"} and "ok" in statuses
    assert sum(record["counts"].values()) == 4 and record["counts"]["not_run"] == 0
    assert record["winner"]["id"] in {t["id"] for t in record["trials"] if t["status"] == "ok"}
    for trial in record["trials"]:
        if trial["status"] == "stopped":  # at one of its dev evaluations (every 4 of its 16 steps), at a rung
            stop = trial["stopped_early"]
            assert stop["by"] == "asha" and stop["step"] in (4, 8, 12, 16) and stop["evaluations"] in (1, 4)
            assert stop["dev_sample_metrics"]["accuracy"] == stop["objective"]
            assert not (tmp_path / "asha" / "trials" / trial["id"] / "model.safetensors").exists()
    assert record["ray"]["asha"]["reduction_factor"] == 4


def test_ray_asha_refusals_come_before_any_training(tiny_base, tmp_path, capsys):
    code, _, err = run_cli(capsys, sweep_args(tiny_base, tmp_path / "a", *GRID, "--ray-asha"))
    assert code == 2 and "--ray-asha schedules the trials of --ray" in err
    code, _, err = run_cli(capsys, sweep_args(tiny_base, tmp_path / "b", *GRID, "--ray", "--ray-asha"))
    assert code == 2 and "give --eval-every-steps" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_trial_no_node_can_hold_is_refused_before_any_training(tiny_base, two_nodes, tmp_path):
    done = subprocess.run([sys.executable, "-m", "berth.cli", *sweep_args(tiny_base, tmp_path / "big", *GRID, "--ray",
                                                                          two_nodes.address)],  # --threads 2
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no node of the Ray cluster has the 2 CPUs a trial asks for" in done.stderr
    assert not (tmp_path / "big" / "trials").exists()
