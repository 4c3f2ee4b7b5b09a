"""Mixed precision: what `auto` picks on this CPU, and a forced bf16 fine-tune on the real checkpoint.

The expected precision comes from /proc/cpuinfo (the kernel's flags), not from the torch probes the
code uses; the dtypes of weights and AdamW moments are read back from the saved training state.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tasks.runtime.tokenizer import load_tokenizer
from tests.training.tiny_training import MaskedTokens, collate, tiny_pretraining_model
from training.bert.checkpoint import load_pretrained
from training.bert.model import BertForSequenceClassification
from training.finetuning import task_data
from training.finetuning.finetune import FinetuneSettings, run_finetune
from training.loop.precision import precision_name, probe_cpu_precision, resolve_precision
from training.loop.settings import TrainSettings
from training.loop.trainer import train
from training.loop.training_state import latest_training_state, load_training_state

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "data" / "samples"
TOPICS = SAMPLES / "topics" / "train.jsonl"


def kernel_says_native_bf16() -> bool | None:
    """True/False from /proc/cpuinfo's flags (avx512_bf16 or amx_bf16/amx_tile); None off Linux."""
    if os.environ.get("BERTH_CPU_BF16") in ("0", "1"):  # the suite run as a CPU with (1) or without (0) bf16
        return os.environ["BERTH_CPU_BF16"] == "1"
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    lines = [line for line in text.splitlines() if line.startswith("flags")]
    flags = lines[0].split(":", 1)[1].split() if lines else []
    return bool({"avx512_bf16", "amx_bf16", "amx_tile"} & set(flags))


def test_auto_follows_the_cpu_flags_then_a_measurement_and_the_run_records_it(tmp_path):
    native = kernel_says_native_bf16()
    if native is None:
        pytest.skip("no /proc/cpuinfo to check the detection against")
    assert resolve_precision("auto", torch.device("cpu")) == (torch.bfloat16 if native else None)
    settings = TrainSettings(output_dir=tmp_path, batch_size=4, max_steps=4, save_every_steps=2, seed=3,
                             num_threads=1, progress_bar=False)
    assert settings.precision == "auto"
    result = train(tiny_pretraining_model(), MaskedTokens(size=8), collate, settings)
    record = json.loads((tmp_path / "train_settings.json").read_text())
    if native:  # both were timed on the run's batches; the faster one trained
        probe = record["precision_probe"]
        assert set(probe["measured_ms"]) == {"fp32", "bf16"} and all(v > 0 for v in probe["measured_ms"].values())
        expected = min(probe["measured_ms"], key=probe["measured_ms"].get)
    else:  # no native bf16: fp32 without a probe
        assert record["precision_probe"] is None
        expected = "fp32"
    assert result.precision == record["precision"] == expected
    assert load_training_state(latest_training_state(tmp_path))["precision"] == expected

    # A resumed run keeps what the run chose instead of measuring again (a different choice would not be exact):
    # drop the last checkpoint (as a kill before it would) and run again from the one before.
    shutil.rmtree(latest_training_state(tmp_path))
    resumed = train(tiny_pretraining_model(), MaskedTokens(size=8), collate, settings)
    assert resumed.precision == expected and resumed.steps == 4
    assert json.loads((tmp_path / "train_settings.json").read_text())["precision_probe"] is None


@pytest.mark.parametrize("slower", ["fp32", "bf16"])
def test_the_probe_keeps_the_faster_precision(slower):
    seen = []

    def step(dtype):
        seen.append(dtype)
        time.sleep(0.02 if precision_name(dtype) == slower else 0.001)

    chosen, record = probe_cpu_precision(step, repeats=2)
    faster = "bf16" if slower == "fp32" else "fp32"
    assert precision_name(chosen) == record["chosen"] == faster
    assert record["measured_ms"][slower] >= 20
    assert seen.count(None) == seen.count(torch.bfloat16) == 3  # one warm-up and two timed passes each


def test_the_old_amp_setting_still_reads():
    assert TrainSettings(output_dir="x", amp="off").precision == "fp32"
    assert TrainSettings(output_dir="x", amp="bf16").precision == "bf16"


def test_the_cpu_override_decides_what_auto_means(monkeypatch):
    monkeypatch.setenv("BERTH_CPU_BF16", "1")
    assert resolve_precision("auto", torch.device("cpu")) == torch.bfloat16
    monkeypatch.setenv("BERTH_CPU_BF16", "0")
    assert resolve_precision("auto", torch.device("cpu")) is None
    assert resolve_precision("fp32", torch.device("cpu")) is None  # an explicit precision is never overridden
    monkeypatch.setenv("BERTH_CPU_BF16", "maybe")
    with pytest.raises(ValueError, match="BERTH_CPU_BF16"):
        resolve_precision("auto", torch.device("cpu"))


def test_forcing_bf16_without_native_support_warns(caplog, monkeypatch):
    monkeypatch.delenv("BERTH_CPU_BF16", raising=False)  # the warning is about the real CPU
    if kernel_says_native_bf16() is not False:
        pytest.skip("this CPU has native bf16 (or cannot tell)")
    with caplog.at_level(logging.WARNING, logger="training.loop.precision"):
        assert resolve_precision("bf16", torch.device("cpu")) == torch.bfloat16
    assert "emulated" in caplog.text


def _mean_loss(model: torch.nn.Module, batches: list[dict[str, torch.Tensor]]) -> float:
    """Mean fp32 loss over the batches in eval mode (no dropout): the independent yardstick."""
    model.eval()
    with torch.no_grad():
        losses = [float(model(**b)["loss"]) for b in batches]
    model.train()
    return sum(losses) / len(losses)


def test_forced_bf16_trains_the_real_checkpoint_with_fp32_master_weights(tmp_path, base_path):
    settings = FinetuneSettings(task="classification", train_file=TOPICS, out=tmp_path / "unused",
                                max_train_examples=8, max_seq_length=24)
    adapter = task_data.adapter_for(settings, load_tokenizer(base_path))
    examples = adapter.read(TOPICS, limit=8, seed=0)
    spec = adapter.spec(examples)
    features = adapter.features(examples, spec)
    torch.manual_seed(0)
    model, _ = load_pretrained(BertForSequenceClassification, base_path, num_labels=len(spec.labels),
                               classifier_pooling="mean")
    batches = [task_data.collate(features)]
    before = _mean_loss(model, batches)
    loop = TrainSettings(output_dir=tmp_path / "state", precision="bf16", batch_size=4, max_steps=4,
                         learning_rate=3e-4, warmup_steps=0, save_every_steps=4, num_threads=2, seed=0,
                         progress_bar=False, group_by_length=True)
    result = train(model, features, task_data.collate, loop)
    assert result.precision == "bf16" and result.steps == 4
    assert _mean_loss(model, batches) < 0.8 * before  # it learned (in fp32, the trained weights score better)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = load_training_state(latest_training_state(tmp_path / "state"))
    assert state["precision"] == "bf16"
    assert all(t.dtype == torch.float32 for t in state["model"].values() if t.is_floating_point())
    moments = [v for s in state["optimizer"]["state"].values() for k, v in s.items()
               if k in ("exp_avg", "exp_avg_sq")]
    assert moments and all(m.dtype == torch.float32 for m in moments)


def test_a_bf16_finetune_saves_a_folder_that_loads(tmp_path, base_path):
    out = tmp_path / "bf16"
    settings = FinetuneSettings(task="classification", train_file=TOPICS, out=out, max_train_examples=8,
                                max_seq_length=24, batch_size=4, max_steps=2, precision="bf16", num_threads=2)
    run_finetune(settings)
    record = json.loads((out / "finetune_run.json").read_text())
    assert record["precision"] == "bf16" and record["train_result"]["precision"] == "bf16"
    model, report = load_pretrained(BertForSequenceClassification, out)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not report.fresh and not report.unused and not report.resized  # every weight saved, every one read


# bf16 keeps 8 significant bits: one rounding moves a value by at most 2**-8 of itself. A forward pass of the
# tiny model rounds each product's inputs once, so its loss may move by a few of those; 4 is the budget here.
BF16_RELATIVE = 4 * 2.0**-8


def test_a_bf16_run_tracks_the_fp32_run_within_bf16_precision(tmp_path):
    """The same seeded run in bf16 and fp32: the first step's loss (no update yet) agrees to bf16's precision
    and training still lowers it; runs on every CPU (emulated bf16 where the CPU has none)."""
    from tests.training.tiny_training import LabelledTokens, collate_labelled, tiny_classifier
    from training.loop.metrics_log import METRICS_FILE

    losses = {}
    for precision in ("fp32", "bf16"):
        settings = TrainSettings(output_dir=tmp_path / precision, precision=precision, seed=5, epochs=2,
                                 batch_size=8, learning_rate=1e-3, warmup_steps=2, log_every_steps=1,
                                 num_threads=1, progress_bar=False)
        assert train(tiny_classifier(), LabelledTokens(), collate_labelled, settings).precision == precision
        lines = (tmp_path / precision / METRICS_FILE).read_text().splitlines()
        losses[precision] = [r["loss"] for r in map(json.loads, lines) if "loss" in r]
    assert losses["bf16"][0] == pytest.approx(losses["fp32"][0], rel=BF16_RELATIVE)
    assert losses["bf16"][0] != losses["fp32"][0]  # it did compute in bf16
    assert min(losses["bf16"][-3:]) < losses["bf16"][0]


NUMERIC_TESTS = ["tests/training/test_trainer.py", "tests/training/test_distributed.py"]


@pytest.mark.slow  # `make test-bf16` runs the whole training suite in that mode
def test_the_numeric_tests_pass_as_the_other_kind_of_cpu_would():
    """The suite as a CPU of the other kind would run it (bf16 on an AVX2-only CPU, fp32-only on a bf16 one):
    a test that leaves its precision to `auto` and compares with fp32 fails here on every machine."""
    native = kernel_says_native_bf16()
    if native is None:
        pytest.skip("no /proc/cpuinfo to tell which kind of CPU this is")
    env = {**os.environ, "BERTH_CPU_BF16": "0" if native else "1"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NUMERIC_TESTS],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
