"""training.loop.plot: a real run's metrics.jsonl becomes a PNG, from Python and from `berth plot`."""

from __future__ import annotations

import argparse
import json
import struct

import pytest
import torch

from berth.cli import SUBCOMMAND_MODULES
from berth.commands import plot as plot_cli
from tests.training.tiny_training import MaskedTokens, collate, tiny_pretraining_model
from training.loop.metrics_log import METRICS_FILE
from training.loop.plot import plot_metrics, read_metrics
from training.loop.settings import TrainSettings
from training.loop.trainer import train


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        settings = TrainSettings(output_dir=out, progress_bar=False, max_steps=6, batch_size=4, log_every_steps=1,
                                 eval_every_steps=3)
        train(tiny_pretraining_model(), MaskedTokens(), collate, settings,
              evaluate=lambda model: {"loss": 1.5, "dev_f1": 0.3})
    finally:
        torch.set_num_threads(threads)
    return out


def test_plot_writes_a_png_with_a_panel_per_metric(run_folder, tmp_path):
    train_records, eval_records = read_metrics(run_folder / METRICS_FILE)
    assert len(train_records) == 6 and [r["step"] for r in eval_records] == [3, 6]

    png = plot_metrics(run_folder / METRICS_FILE, tmp_path / "all.png")
    width, height = png_size(png)
    # loss, mlm_loss, nsp_loss, mlm_accuracy, nsp_accuracy, learning_rate, tokens_per_s, grad_norm, and
    # eval's dev_f1 (its "loss" shares the training loss panel): 9 panels, 2 columns, 5 rows of 300 px.
    assert (width, height) == (1200, 1500)

    one = plot_metrics(run_folder / METRICS_FILE, tmp_path / "loss.png", keys=["loss"])
    assert png_size(one) == (600, 300)
    with pytest.raises(ValueError, match="no metric"):
        plot_metrics(run_folder / METRICS_FILE, tmp_path / "x.png", keys=["bleu"])


def test_a_torn_last_line_is_skipped(tmp_path):
    metrics = tmp_path / METRICS_FILE
    lines = [json.dumps({"step": s, "loss": 1.0 / s, "learning_rate": 1e-4}) for s in range(1, 4)]
    metrics.write_text("\n".join(lines) + '\n{"step": 4, "lo')
    assert [r["step"] for r in read_metrics(metrics)[0]] == [1, 2, 3]
    assert png_size(plot_metrics(metrics, tmp_path / "m.png")) == (1200, 300)


def test_berth_plot_command(run_folder, tmp_path, capsys):
    assert "berth.commands.plot" in SUBCOMMAND_MODULES
    parser = argparse.ArgumentParser(prog="berth")
    plot_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["plot", str(run_folder), "-o", str(tmp_path / "cli.png"), "--keys", "loss,mlm_accuracy"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli.png")
    assert png_size(tmp_path / "cli.png") == (1200, 300)
