"""Held-out evaluation of pretraining: masked-LM accuracy, loss and perplexity, NSP accuracy, and the unigram
baselines on the very same masked positions.

The held-out documents of a run are masked once, from a fixed seed (`eval_mask_seed`), so every evaluation of
every model on that split scores the same positions. Beside the model's MLM accuracy and perplexity it reports
two baselines on those positions: the unigram argmax (always predict the most frequent training token) and the
unigram model's perplexity.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from training.errors import UserFacingError
from training.pretraining.data import PretrainingDataset, collate
from training.pretraining.masking import IGNORE_INDEX, MaskingVocab
from training.pretraining.settings import PretrainSettings
from training.pretraining.stream import ShardedInstances

log = logging.getLogger("berth.pretrain")

CURVES = ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss")  # logged at every evaluation during training
RUN_FILE = "pretrain_run.json"  # settings, seed, git revision, data and model facts, final evaluation
EVAL_FILE = "pretrain_eval.json"  # the latest held-out evaluation


def heldout_dataset(instances: ShardedInstances, vocab: MaskingVocab, settings: PretrainSettings,
                    seq_length: int | None = None) -> PretrainingDataset:
    """Held-out instances with static masks from the fixed `eval_mask_seed`."""
    length = seq_length or settings.max_seq_length
    return PretrainingDataset(instances, vocab, max_seq_length=length, masking=settings.masking(length),
                              seed=settings.eval_mask_seed, dynamic_masking=False)


def training_unigram(instances: ShardedInstances, vocab: MaskingVocab) -> np.ndarray:
    """How often each token occurs in the training instances, special tokens ([CLS] [SEP] [PAD] [MASK]) excluded."""
    counts = instances.unigram_counts()
    counts[vocab.never_mask_ids] = 0
    return counts


# --- evaluation ---------------------------------------------------------------------------------------


def scored_indices(size: int, most: int | None) -> np.ndarray:
    """All of a held-out split, or `most` instances spread evenly over it (every shard, not the first ones)."""
    if most is None or most >= size:
        return np.arange(size)
    return np.unique(np.linspace(0, size - 1, most).round().astype(np.int64))


def evaluate_pretraining(
    model, dataset: PretrainingDataset, unigram: np.ndarray | None = None, batch_size: int = 64,
    max_instances: int | None = None, device: str | None = None,
) -> dict[str, float]:
    """MLM accuracy / loss / perplexity and NSP accuracy / loss of `model` on `dataset`, in eval mode.

    Totals are over all masked tokens (and all scored NSP pairs), not means of batch means. With
    `unigram` (training token counts) it adds the baselines on the same masked positions:
    `unigram_accuracy` (predict the most frequent training token everywhere) and `unigram_perplexity`
    (the add-one smoothed unigram distribution). NSP entries are absent when nothing is scored
    (single-segment instances, or a `BertForMaskedLM`).
    """
    import torch

    from training.bert.model import BertForPreTraining

    indices = scored_indices(len(dataset), max_instances)
    n = len(indices)
    device = device or next(model.parameters()).device
    wants_nsp = isinstance(model, BertForPreTraining)
    sums = {"mlm_loss": 0.0, "mlm_correct": 0.0, "masked": 0, "nsp_loss": 0.0, "nsp_correct": 0.0, "nsp_pairs": 0}
    labels_seen: list[np.ndarray] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                items = [dataset[int(i)] for i in indices[start:start + batch_size]]
                batch = collate(items)
                labels_seen.append(batch["labels"].numpy()[batch["labels"].numpy() != IGNORE_INDEX])
                if not wants_nsp:
                    batch.pop("next_sentence_label")
                nsp_scored = int((batch["next_sentence_label"] != IGNORE_INDEX).sum()) if wants_nsp else 0
                out = model(**{k: v.to(device) for k, v in batch.items()})
                masked = int(labels_seen[-1].size)
                sums["mlm_loss"] += float(out["mlm_loss"]) * masked
                sums["mlm_correct"] += float(out["mlm_accuracy"]) * masked
                sums["masked"] += masked
                if nsp_scored:
                    sums["nsp_loss"] += float(out["nsp_loss"]) * nsp_scored
                    sums["nsp_correct"] += float(out["nsp_accuracy"]) * nsp_scored
                    sums["nsp_pairs"] += nsp_scored
    finally:
        model.train(was_training)
    masked = max(1, sums["masked"])
    result: dict[str, float] = {
        "instances": n,
        "masked_tokens": sums["masked"],
        "mlm_accuracy": sums["mlm_correct"] / masked,
        "mlm_loss": sums["mlm_loss"] / masked,
        "mlm_perplexity": math.exp(min(sums["mlm_loss"] / masked, 50.0)),
    }
    if sums["nsp_pairs"]:
        result["nsp_pairs"] = sums["nsp_pairs"]
        result["nsp_accuracy"] = sums["nsp_correct"] / sums["nsp_pairs"]
        result["nsp_loss"] = sums["nsp_loss"] / sums["nsp_pairs"]
    if unigram is not None and labels_seen:
        targets = np.concatenate(labels_seen)
        top = int(np.argmax(unigram))
        probs = (unigram + 1.0) / (unigram.sum() + unigram.size)
        result["unigram_token_id"] = top
        result["unigram_accuracy"] = float(np.mean(targets == top)) if targets.size else 0.0
        result["unigram_perplexity"] = float(np.exp(-np.mean(np.log(probs[targets])))) if targets.size else 0.0
    return result


def with_token_name(metrics: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    if "unigram_token_id" not in metrics:
        return metrics
    return {**metrics, "unigram_token": tokenizer.id_to_token(int(metrics["unigram_token_id"]))}


def write_eval(out: Path, metrics: dict[str, float], data: str, name: str = EVAL_FILE) -> None:
    (out / name).write_text(json.dumps({"data": data, **metrics}, indent=2) + "\n", encoding="utf-8")


def load_run_record(folder: str | Path) -> dict[str, Any]:
    """The record of a `berth pretrain` folder (its pretrain_run.json)."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        raise UserFacingError(f"{path}: not found; is {folder} a finished `berth pretrain` output folder?")
    return json.loads(path.read_text(encoding="utf-8"))


def load_run_settings(folder: str | Path) -> PretrainSettings:
    """The settings a `berth pretrain` folder was trained with."""
    return PretrainSettings.model_validate(load_run_record(folder)["settings"])


def evaluate_pretrained_folder(
    folder: str | Path, eval_text: list[Path] | None = None, data: str | Path | None = None,
    mask_seed: int | None = None, batch_size: int = 64, device: str = "auto", instances_from: str | Path | None = None,
) -> dict[str, float]:
    """Held-out MLM / NSP metrics of a saved pretraining folder.

    By default the held-out documents of its own run, read from its prepared data (`data` names the prepared
    folder if it has moved). With `eval_text`, every document of those files instead (prepared into a temporary
    folder with the run's settings). With `instances_from` (another run's folder, same vocabulary), that run's
    held-out instances and masked positions, so two runs (an ablation) are scored on the very same tokens. Writes
    pretrain_eval.json into the folder (pretrain_eval-on-<other>.json with `instances_from`).
    """
    import torch

    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.checkpoint import load_pretrained
    from training.bert.model import BertForMaskedLM, BertForPreTraining
    from training.pretraining.shards import prepare

    folder = Path(folder)
    source = Path(instances_from) if instances_from else folder
    record = load_run_record(source)
    settings = PretrainSettings.model_validate(record["settings"])
    if mask_seed is not None:
        settings = settings.model_copy(update={"eval_mask_seed": mask_seed})
    tokenizer = load_tokenizer(folder)
    if instances_from and load_tokenizer(source).get_vocab() != tokenizer.get_vocab():
        raise UserFacingError(f"{folder} and {source} have different vocabularies; their instances are not comparable")
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    prepared = Path(data) if data else Path(record["data"]["folder"])
    if not prepared.is_dir():
        raise UserFacingError(f"{prepared}: the run's prepared data is not there; name it with --data")
    train = ShardedInstances(prepared, "train")
    architectures = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    cls = BertForMaskedLM if "BertForMaskedLM" in architectures else BertForPreTraining
    with tempfile.TemporaryDirectory(prefix="berth-eval-text-") as scratch:
        if eval_text:
            wanted = {**settings.data_settings(record.get("nsp", cls is BertForPreTraining)), "heldout_fraction": 0.0}
            prepare(eval_text, tokenizer, scratch, wanted, settings.shard_mb, settings.workers)
            instances = ShardedInstances(scratch, "train")
            described = "all documents of " + ", ".join(map(str, eval_text))
        else:
            instances = ShardedInstances(prepared, "heldout")
            described = "held-out split of the training corpus" + (f" of the run in {source}" if instances_from else "")
        if len(instances) == 0:
            raise UserFacingError(f"{folder}: nothing to evaluate (the run held out no documents; pass --eval-text)")
        model, report = load_pretrained(cls, folder)
        log.info("loaded %s from %s: %s", cls.__name__, folder, report)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model.to(device)
        metrics = evaluate_pretraining(model, heldout_dataset(instances, vocab, settings),
                                       training_unigram(train, vocab), batch_size)
    metrics = with_token_name(metrics, tokenizer)
    write_eval(folder, metrics, described, f"pretrain_eval-on-{source.name}.json" if instances_from else EVAL_FILE)
    return metrics
