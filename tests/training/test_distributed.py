"""DDP: sharding like DistributedSampler, and a real two-process gloo run under torchrun on the CPU."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data.distributed import DistributedSampler

from tests.training.tiny_training import LabelledTokens, collate_labelled, state_hash, tiny_classifier
from training.loop.distributed import resolve_device, setup_distributed, shard
from training.loop.metrics_log import METRICS_FILE
from training.loop.settings import TrainSettings
from training.loop.trainer import SETTINGS_FILE, train
from training.loop.training_state import list_training_states, load_training_state

REPO = Path(__file__).resolve().parents[2]
# Per rank: 24 of the 48 examples, micro-batches of 4, 2 per step: 3 steps per epoch, 6 in all.
DDP_SETTINGS = {"seed": 11, "epochs": 2, "batch_size": 4, "grad_accum_steps": 2, "learning_rate": 1e-3,
                "warmup_steps": 1, "log_every_steps": 1, "save_every_steps": 2, "keep_last_states": None,
                "num_threads": 1, "precision": "fp32"}  # compared with fp32 sums at 1e-5


@pytest.mark.parametrize("examples,world_size", [(10, 2), (11, 2), (10, 3), (7, 4), (5, 1)])
def test_shard_deals_like_distributed_sampler(examples, world_size):
    order = list(range(examples))
    for rank in range(world_size):
        sampler = DistributedSampler(order, num_replicas=world_size, rank=rank, shuffle=False)
        assert shard(order, rank, world_size) == list(sampler)


def test_without_torchrun_there_is_one_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = setup_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.enabled) == (0, 1, True, False)
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("group_by_length", [False, True], ids=["random-order", "length-grouped"])
def test_two_process_ddp_run_on_cpu(tmp_path, group_by_length):
    settings = {**DDP_SETTINGS, "group_by_length": group_by_length, "length_group_batches": 2}
    out = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
               "-m", "tests.training.tiny_training", str(out), "--task", "classification",
               "--settings", json.dumps(settings)] + (["--variable-lengths"] if group_by_length else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["hash"] == ranks[1]["hash"]  # both replicas end with the same weights
    assert ranks[0]["result"]["steps"] == 6 and ranks[0]["result"]["effective_batch_size"] == 16
    assert json.loads((out / SETTINGS_FILE).read_text())["world_size"] == 2

    # One writer: one set of checkpoints, no leftovers, the last one holding those weights.
    checkpoints = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert checkpoints == ["step-00000002", "step-00000004", "step-00000006"]
    final = load_training_state(list_training_states(out)[-1])
    assert len(final["rng"]) == 2  # every rank's random state, for an exact resume
    model = tiny_classifier()
    model.load_state_dict(final["model"])
    assert state_hash(model) == ranks[0]["hash"]
    records = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]

    # Two ranks x 2 micro-batches of 4 see the same 16 examples per step as one process with 2 x 8:
    # with dropout off, the same losses (averaged over ranks) and the same weights.
    torch.set_num_threads(1)
    single = {**settings, "batch_size": 8}
    train(tiny_classifier(), LabelledTokens(variable_lengths=group_by_length), collate_labelled,
          TrainSettings(output_dir=tmp_path / "single", progress_bar=False, **single))
    expected = [json.loads(line) for line in (tmp_path / "single" / METRICS_FILE).read_text().splitlines()]
    assert [r["loss"] for r in records] == pytest.approx([r["loss"] for r in expected], abs=1e-5)
    single_final = load_training_state(list_training_states(tmp_path / "single")[-1])["model"]
    for name, tensor in single_final.items():
        torch.testing.assert_close(final["model"][name], tensor, rtol=0, atol=1e-5, msg=name)
