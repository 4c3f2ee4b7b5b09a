"""The training loop: exact resume after a real kill, schedule, parameter groups, accumulation, checkpoints."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.training.tiny_training import (
    LabelledTokens,
    MaskedTokens,
    collate,
    collate_labelled,
    tiny_classifier,
    tiny_pretraining_model,
)
from training.loop.data_order import epoch_batches, length_grouped_permutation
from training.loop.metrics_log import METRICS_FILE
from training.loop.optimizer import linear_schedule, parameter_groups
from training.loop.settings import TrainSettings
from training.loop.trainer import FINAL_MODEL_DIR, Plan, train
from training.loop.training_state import (
    CHECKPOINTS_DIR,
    atomic_directory,
    clean_stale_temporaries,
    latest_training_state,
    list_training_states,
    load_training_state,
    save_training_state,
)

REPO = Path(__file__).resolve().parents[2]

# 44 examples, micro-batches of 4 (11 per epoch), 2 per step: 6 steps per epoch, the last one with a
# single micro-batch; 3 epochs = 18 steps. Checkpoints every 4 steps land mid-epoch (step 8 is 4 of 11
# micro-batches into epoch 1).
RESUME_SETTINGS = {"seed": 7, "epochs": 3, "batch_size": 4, "grad_accum_steps": 2, "learning_rate": 2e-3,
                   "warmup_ratio": 0.1, "log_every_steps": 1, "save_every_steps": 4, "keep_last_states": 2,
                   "num_threads": 1, "precision": "fp32"}


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def train_records(out: Path) -> list[dict]:
    lines = (out / METRICS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("split") != "eval"]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_training_state(latest_training_state(out))["model"]


@pytest.mark.parametrize("group_by_length", [False, True], ids=["random-order", "length-grouped"])
def test_resume_after_kill_is_exact(tmp_path, group_by_length):
    run_settings = {**RESUME_SETTINGS, "group_by_length": group_by_length, "length_group_batches": 3}
    settings = TrainSettings(output_dir=tmp_path / "straight", progress_bar=False, **run_settings)
    straight = train(tiny_pretraining_model(), MaskedTokens(), collate, settings)
    assert straight.steps == 18 and straight.stopped_by == "steps"

    # A real process, SIGKILLed while fetching data for step 11; its last checkpoint is step 8,
    # so steps 9 and 10 were logged by a run whose state is lost.
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "tests.training.tiny_training", str(out), "--hang-after-step", "10",
               "--settings", json.dumps(run_settings)]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300  # a loaded shared machine starts torch slowly
        while not (out / "hanging").exists():
            assert process.poll() is None, f"the run ended instead of hanging:\n{process.stdout.read()}"
            assert time.monotonic() < deadline, "the run never reached step 10"
            time.sleep(0.1)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert [p.name for p in list_training_states(out)] == ["step-00000004", "step-00000008"]
    assert max(r["step"] for r in train_records(out)) == 10

    dataset = MaskedTokens()
    resumed = train(tiny_pretraining_model(seed=123), dataset, collate,
                    TrainSettings(output_dir=out, progress_bar=False, **run_settings))
    assert resumed.steps == 18
    assert dataset.epochs_seen == [1, 2]  # resumed inside epoch 1, without replaying epoch 0

    expected, got = train_records(tmp_path / "straight"), train_records(out)
    assert [r["step"] for r in got] == list(range(1, 19))  # the dead run's steps 9-10 were dropped
    for mine, theirs in zip(got, expected):
        for key in ("loss", "mlm_accuracy", "nsp_loss", "learning_rate", "grad_norm", "epoch"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-6), (mine["step"], key)
    for name, tensor in final_weights(tmp_path / "straight").items():
        torch.testing.assert_close(final_weights(out)[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_metrics_log_and_checkpoint_contents(tmp_path):
    settings = TrainSettings(output_dir=tmp_path, progress_bar=False, seed=1, max_steps=5, batch_size=4,
                             log_every_steps=2, eval_every_steps=3, save_every_steps=2, keep_last_states=1)
    calls = []

    def evaluate(model):
        assert not model.training
        calls.append(1)
        return {"dev_score": 0.5}

    def on_save(model, folder):
        torch.save(model.state_dict(), folder / "weights.pt")

    result = train(tiny_pretraining_model(), MaskedTokens(), collate, settings, evaluate=evaluate, on_save=on_save)
    records = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    train_lines = [r for r in records if "split" not in r]
    assert [r["step"] for r in train_lines] == [2, 4, 5]
    for key in ("loss", "learning_rate", "tokens_per_s", "examples_per_s", "elapsed_s", "epoch",
                "mlm_accuracy", "nsp_accuracy", "mlm_loss", "nsp_loss", "grad_norm"):
        assert key in train_lines[0], key
    assert train_lines[0]["tokens_per_s"] > 0
    assert [(r["step"], r["dev_score"]) for r in records if r.get("split") == "eval"] == [(3, 0.5), (5, 0.5)]
    assert len(calls) == 2
    assert result.final_loss == train_lines[-1]["loss"] and result.final_eval == {"dev_score": 0.5}
    assert result.steps == 5 and result.effective_batch_size == 4 and result.tokens_per_s > 0
    assert result.last_checkpoint == tmp_path / CHECKPOINTS_DIR / "step-00000005"
    assert list_training_states(tmp_path) == [result.last_checkpoint]  # keep_last_states=1
    state = load_training_state(result.last_checkpoint)
    assert state["step"] == 5 and set(state) >= {"model", "optimizer", "scheduler", "scaler", "rng"}
    assert torch.load(tmp_path / FINAL_MODEL_DIR / "weights.pt", weights_only=True).keys() == state["model"].keys()
    assert json.loads((tmp_path / "train_settings.json").read_text())["plan"]["total_steps"] == 5

    # Resuming a finished run trains nothing and leaves the log alone; a final model that a kill
    # prevented is still written.
    shutil.rmtree(tmp_path / FINAL_MODEL_DIR)
    again = train(tiny_pretraining_model(), MaskedTokens(), collate, settings, on_save=on_save)
    assert again.steps == 5 and [r["step"] for r in train_records(tmp_path)] == [2, 4, 5]
    saved = torch.load(tmp_path / FINAL_MODEL_DIR / "weights.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in state["model"].items())
    # resume="never" starts over, removing the old checkpoints.
    fresh = train(tiny_pretraining_model(), MaskedTokens(), collate,
                  settings.model_copy(update={"resume": "never", "max_steps": 2, "save_every_steps": None}))
    assert fresh.steps == 2 and [p.name for p in list_training_states(tmp_path)] == ["step-00000002"]


def test_time_budget_stops_with_a_checkpoint(tmp_path):
    settings = TrainSettings(output_dir=tmp_path, progress_bar=False, max_steps=50, batch_size=4,
                             max_minutes=1e-6, log_every_steps=10)
    result = train(tiny_pretraining_model(), MaskedTokens(), collate, settings)
    assert result.stopped_by == "max_minutes" and result.steps == 1
    assert latest_training_state(tmp_path).name == "step-00000001"
    assert [r["step"] for r in train_records(tmp_path)] == [1]


class SlowLabelledTokens(LabelledTokens):
    """Each item takes 50 ms to load: a step speed that the machine's load hardly moves."""

    def __getitem__(self, index: int):
        time.sleep(0.05)
        return super().__getitem__(index)


def test_a_fitted_budget_keeps_the_schedule_whole(tmp_path):
    # 400 steps planned, ~0.1 s each; a 3-second budget fits ~30 of them, warmup and decay included.
    settings = TrainSettings(output_dir=tmp_path, progress_bar=False, max_steps=400, batch_size=2, learning_rate=1e-3,
                             warmup_ratio=0.1, max_minutes=0.05, fit_schedule_to_budget=True, log_every_steps=1,
                             num_threads=1)
    result = train(tiny_classifier(), SlowLabelledTokens(), collate_labelled, settings)
    assert result.planned_steps == 400 and result.fitted_to_budget and result.stopped_by == "steps"
    assert 5 <= result.steps < 100
    assert result.elapsed_s < 0.05 * 60 * 1.1 + 1
    # The rate went up through the warmup to near its peak and decayed to almost 0 by the last step: the
    # schedule ended whole, not cut mid-way (the fit is refitted each step, so the end may move by a step).
    records = train_records(tmp_path)
    assert records[-1]["step"] == result.steps
    assert max(r["learning_rate"] for r in records) > 0.8e-3
    assert records[-1]["learning_rate"] < 0.15e-3
    state = load_training_state(result.last_checkpoint)
    assert (state["total_steps"], state["warmup_steps"]) == (result.steps, math.ceil(0.1 * result.steps))


def test_linear_warmup_then_linear_decay(tmp_path):
    factor = linear_schedule(warmup_steps=4, total_steps=12)
    assert [factor(s) for s in range(13)] == pytest.approx(
        [0, 0.25, 0.5, 0.75, 1, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0])
    assert linear_schedule(0, 4)(0) == 1.0

    # The loop applies it: warmup_ratio 0.2 of 12 steps rounds up to 3; the rate of each step is logged.
    settings = TrainSettings(output_dir=tmp_path, progress_bar=False, max_steps=12, batch_size=4,
                             learning_rate=1e-3, warmup_ratio=0.2, log_every_steps=1)
    train(tiny_classifier(), LabelledTokens(), collate_labelled, settings)
    logged = [r["learning_rate"] for r in train_records(tmp_path)]
    assert logged == pytest.approx([1e-3 * linear_schedule(3, 12)(step) for step in range(12)])


def test_plan_counts_steps_with_partial_groups():
    settings = TrainSettings(output_dir="unused", batch_size=4, grad_accum_steps=3, epochs=2.5, warmup_ratio=0.1)
    plan = Plan.make(settings, examples=50, world_size=2)  # 25 per rank -> 7 micro-batches -> 3 steps
    assert (plan.micro_batches_per_epoch, plan.steps_per_epoch, plan.total_steps, plan.warmup_steps) == (7, 3, 8, 1)
    assert Plan.make(settings.model_copy(update={"max_steps": 5}), 50, 2).total_steps == 5
    assert TrainSettings(output_dir="x").epochs == 1.0


def test_epoch_order_is_seeded_and_sharded():
    settings = TrainSettings(output_dir="unused", batch_size=3, seed=5)
    first = epoch_batches(10, settings, epoch=0)
    assert first == epoch_batches(10, settings, epoch=0)
    assert first != epoch_batches(10, settings, epoch=1)
    assert sorted(i for batch in first for i in batch) == list(range(10))
    ranks = [epoch_batches(10, settings, epoch=0, rank=r, world_size=2) for r in range(2)]
    assert [len(b) for b in ranks[0]] == [len(b) for b in ranks[1]] == [3, 2]
    assert {i for r in ranks for b in r for i in b} == set(range(10))


def padded_tokens(batches: list[list[int]], lengths: list[int]) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_length_grouping_is_a_seeded_permutation_with_less_padding():
    lengths = [int(n) for n in torch.randint(4, 128, (1000,), generator=torch.Generator().manual_seed(0))]
    settings = TrainSettings(output_dir="unused", batch_size=16, seed=3, group_by_length=True, length_group_batches=10)
    first = epoch_batches(1000, settings, epoch=0, lengths=lengths)
    assert sorted(i for b in first for i in b) == list(range(1000))  # every example once
    assert [len(b) for b in first] == [16] * 62 + [8]  # 1000 = 62 x 16 + 8: the partial batch comes last
    assert first == epoch_batches(1000, settings, epoch=0, lengths=lengths)  # a function of (seed, epoch)
    assert first != epoch_batches(1000, settings, epoch=1, lengths=lengths)
    assert first != epoch_batches(1000, settings.model_copy(update={"seed": 4}), epoch=0, lengths=lengths)
    # Batches are drawn from sorted chunks: far less padding than a random order (here ~1.5x the real
    # tokens for uniform lengths 4..127), yet the batch order is shuffled (not longest-first throughout).
    real = sum(lengths)
    grouped = padded_tokens(first, lengths)
    random_order = padded_tokens(epoch_batches(1000, settings.model_copy(update={"group_by_length": False}), 0),
                                 lengths)
    assert grouped < 1.1 * real < 1.4 * real < random_order
    longest = [max(lengths[i] for i in b) for b in first[:-1]]
    assert longest != sorted(longest, reverse=True)
    with pytest.raises(ValueError, match="one length per example"):
        epoch_batches(1000, settings, epoch=0)


def test_length_grouping_deals_each_group_to_the_ranks():
    """Under DDP the group is batch x world: rank r's micro-batch k is a slice of global group k."""
    lengths = [int(n) for n in torch.randint(1, 200, (101,), generator=torch.Generator().manual_seed(1))]
    settings = TrainSettings(output_dir="unused", batch_size=5, seed=9, group_by_length=True, length_group_batches=4)
    order = length_grouped_permutation(lengths, seed=9, epoch=2, group=10, chunk_groups=4)
    ranks = [epoch_batches(101, settings, epoch=2, rank=r, world_size=2, lengths=lengths) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 11  # 101 padded to 102 -> 51 per rank
    for k in range(10):
        assert sorted(ranks[0][k] + ranks[1][k]) == sorted(order[10 * k : 10 * k + 10])
    # The same global groups as one process with batch 10: DDP with 2 x 5 sees what 1 x 10 sees.
    single = epoch_batches(101, settings.model_copy(update={"batch_size": 10}), epoch=2, lengths=lengths)
    assert [sorted(a + b) for a, b in zip(ranks[0][:10], ranks[1][:10])] == [sorted(b) for b in single[:10]]


def test_no_weight_decay_on_biases_and_layer_norm():
    model = tiny_pretraining_model()
    decay, no_decay = parameter_groups(model, weight_decay=0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    exempt = {names[id(p)] for p in no_decay["params"]}
    assert "bert.embeddings.word_embeddings.weight" in decayed
    assert "bert.encoder.layer.0.attention.self.query.weight" in decayed
    assert "bert.embeddings.LayerNorm.weight" in exempt and "bert.encoder.layer.1.output.LayerNorm.bias" in exempt
    assert "cls.predictions.bias" in exempt and "bert.encoder.layer.0.intermediate.dense.bias" in exempt
    assert all(n.endswith("bias") or "LayerNorm" in n for n in exempt)
    assert not any(n.endswith("bias") or "LayerNorm" in n for n in decayed)
    assert decayed | exempt == set(names.values())  # every parameter once (tied decoder weight included)


def test_gradient_accumulation_matches_the_large_batch(tmp_path):
    common = {"progress_bar": False, "seed": 3, "epochs": 2, "learning_rate": 1e-3, "log_every_steps": 1,
              "warmup_steps": 1, "precision": "fp32"}  # fp32 sums on both sides, compared at 1e-5
    big = train(tiny_classifier(), LabelledTokens(), collate_labelled,
                TrainSettings(output_dir=tmp_path / "big", batch_size=8, **common))
    accumulated = train(tiny_classifier(), LabelledTokens(), collate_labelled,
                        TrainSettings(output_dir=tmp_path / "acc", batch_size=4, grad_accum_steps=2, **common))
    assert big.steps == accumulated.steps == 12
    expected, got = train_records(tmp_path / "big"), train_records(tmp_path / "acc")
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in expected], abs=1e-5)
    for name, tensor in final_weights(tmp_path / "big").items():
        torch.testing.assert_close(final_weights(tmp_path / "acc")[name], tensor, rtol=0, atol=1e-5, msg=name)


def test_checkpoint_write_is_atomic(tmp_path):
    folder = tmp_path / CHECKPOINTS_DIR / "step-00000003"
    with pytest.raises(RuntimeError), atomic_directory(folder) as tmp:
        (tmp / "trainer_state.pt").write_bytes(b"half of it")
        raise RuntimeError("disk full")
    assert not folder.exists() and list(folder.parent.iterdir()) == []

    # An object torch.save cannot write: nothing partial is left either.
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises
        save_training_state(folder, {"step": 3, "bad": lambda: None})
    assert list(folder.parent.iterdir()) == []

    save_training_state(folder, {"step": 3, "weights": torch.ones(2)})
    save_training_state(folder, {"step": 3, "weights": torch.zeros(2)})  # replacing keeps one complete folder
    assert load_training_state(folder)["weights"].tolist() == [0.0, 0.0]
    assert [p.name for p in folder.parent.iterdir()] == ["step-00000003"]

    # What a kill mid-write leaves behind is ignored, then cleaned.
    stale = folder.parent / f".tmp-step-00000009-{os.getpid() + 1}"
    stale.mkdir()
    (folder.parent / "step-00000011").mkdir()  # no state file: not a checkpoint
    assert latest_training_state(tmp_path) == folder
    clean_stale_temporaries(folder.parent)
    assert not stale.exists()


def test_checkpoints_load_without_unpickling_objects(tmp_path):
    folder = save_training_state(tmp_path / "c", {"path": Path("/x")})  # a Path is an arbitrary object
    with pytest.raises(Exception, match="[Ww]eights only"):
        load_training_state(folder)


def test_the_loop_is_the_textbook_loop(tmp_path):
    """AdamW + warmup/decay + clipping written out by hand, on the same batches, gives the same losses."""
    settings = TrainSettings(output_dir=tmp_path, progress_bar=False, seed=5, epochs=2, batch_size=8,
                             learning_rate=1e-3, warmup_steps=2, max_grad_norm=0.5, log_every_steps=1,
                             precision="fp32")  # the hand-written loop below is fp32
    train(tiny_classifier(), LabelledTokens(), collate_labelled, settings)

    model, data = tiny_classifier(), LabelledTokens()
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    total = 12
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: step / 2 if step < 2 else (total - step) / (total - 2))
    losses = []
    for epoch in range(2):
        for batch in epoch_batches(len(data), settings, epoch):
            loss = model(**collate_labelled([data[i] for i in batch]))["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    assert [r["loss"] for r in train_records(tmp_path)] == pytest.approx(losses, abs=1e-5)


@pytest.mark.parametrize("fit", [False, True])
def test_a_spent_budget_still_trains_the_minimum_steps(tmp_path, fit):
    settings = TrainSettings(output_dir=tmp_path, progress_bar=False, max_steps=50, batch_size=4, max_minutes=1e-6,
                             fit_schedule_to_budget=fit, min_steps=3, log_every_steps=1)
    result = train(tiny_pretraining_model(), MaskedTokens(), collate, settings)
    assert result.steps == 3  # the budget was spent after the first step
    assert result.stopped_by == ("steps" if fit else "max_minutes")


def test_a_resume_under_another_schedule_or_other_data_is_refused(tmp_path):
    # A state of the old run cannot continue a run that would train differently: it would end neither as the old
    # run nor as the new one, while the new settings are what the run's records say.
    from training.errors import UserFacingError
    from training.finetuning.task_data import Features

    data = LabelledTokens(size=16)
    items = Features(data[i] for i in range(len(data)))
    settings = dict(output_dir=tmp_path, progress_bar=False, seed=1, max_steps=4, batch_size=4, save_every_steps=2,
                    learning_rate=1e-3, num_threads=1)
    train(tiny_classifier(), items, collate_labelled, TrainSettings(**settings))
    with pytest.raises(UserFacingError, match=r"learning_rate 0\.001 -> 0\.002.*--resume never"):
        train(tiny_classifier(), items, collate_labelled, TrainSettings(**{**settings, "learning_rate": 2e-3}))
    relabelled = Features(items)
    relabelled[3] = (items[3][0], 1 - items[3][1])  # one label flipped: as many examples, other data
    with pytest.raises(UserFacingError, match=r"cannot resume .*: data "):
        train(tiny_classifier(), relabelled, collate_labelled, TrainSettings(**settings))
    again = train(tiny_classifier(), Features(items), collate_labelled, TrainSettings(**settings))
    assert again.steps == 4  # the same settings and data: resumed (at its end), nothing refused


def test_a_resume_path_that_is_no_training_state_is_one_line(tmp_path):
    from training.errors import UserFacingError

    with pytest.raises(UserFacingError, match="not a training state"):
        train(tiny_classifier(), LabelledTokens(size=8), collate_labelled,
              TrainSettings(output_dir=tmp_path / "out", progress_bar=False, max_steps=2, batch_size=4,
                            resume=str(tmp_path), num_threads=1))
