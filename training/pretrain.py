"""BERT pretraining on raw text, and its held-out evaluation: the engine of `berth pretrain`.

corpus files -> a WordPiece vocabulary (trained on the corpus, or reused) -> instances, split by
documents into train and held-out (training.pretraining_data) -> `BertForPreTraining` (masked LM +
next-sentence prediction) or, with ``nsp=False``, `BertForMaskedLM` on single packed segments (the
paper's no-NSP ablation) -> the one training loop (training.trainer) -> a Hugging Face folder.

The held-out evaluation masks every held-out instance once, from a fixed seed (`eval_mask_seed`),
so every evaluation of every model on that split scores the same positions. Beside the model's MLM
accuracy and perplexity it reports two baselines on those very positions: the unigram argmax
(always predict the most frequent training token) and the unigram model's perplexity.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from training.corpus import corpus_files
from training.masking import IGNORE_INDEX, MaskingVocab
from training.pretraining_data import PretrainingDataset, PretrainingInstances, build_pretraining_instances
from training.settings import PretrainSettings

log = logging.getLogger("berth.pretrain")

REPO = Path(__file__).resolve().parents[1]
RUN_FILE = "pretrain_run.json"  # settings, seed, git revision, data and model facts, final evaluation
EVAL_FILE = "pretrain_eval.json"  # the latest held-out evaluation
CURVES = ("mlm_accuracy", "mlm_loss", "nsp_accuracy", "nsp_loss")  # logged at every evaluation during training


# --- data ---------------------------------------------------------------------------------------------


def prepare_tokenizer(settings: PretrainSettings) -> Tokenizer:
    """Load `settings.tokenizer`, else reuse the one already in `out` (when resuming), else train one
    on the corpus; in every case save it into `out`, where the checkpoint needs it."""
    from tasks.runtime.tokenizer import load_tokenizer, save_tokenizer, train_wordpiece

    out = Path(settings.out)
    if settings.tokenizer is not None:
        tokenizer = load_tokenizer(settings.tokenizer)
        log.info("tokenizer: %s (%d tokens)", settings.tokenizer, tokenizer.get_vocab_size())
    elif settings.resume != "never" and (out / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(out)
        log.info("tokenizer: reusing %s (%d tokens) to resume; pass resume='never' (--no-resume) to train "
                 "a new one", out / "tokenizer.json", tokenizer.get_vocab_size())
        return tokenizer
    else:
        files = corpus_files(settings.corpus)
        started = time.time()
        tokenizer = train_wordpiece(files, vocab_size=settings.vocab_size, lowercase=settings.lowercase,
                                    min_frequency=settings.min_frequency)
        log.info("tokenizer: trained %d WordPiece tokens on %d files in %.0f s",
                 tokenizer.get_vocab_size(), len(files), time.time() - started)
    save_tokenizer(tokenizer, out, lowercase=settings.lowercase)
    return tokenizer


def build_instances(
    settings: PretrainSettings, tokenizer: Tokenizer, heldout_fraction: float | None = None,
    corpus: list[Path] | None = None, seq_length: int | None = None,
) -> tuple[PretrainingInstances, PretrainingInstances | None]:
    """(train, held-out) instances of the corpus, cached as .npz under `out/cache`."""
    fraction = settings.heldout_fraction if heldout_fraction is None else heldout_fraction
    return build_pretraining_instances(
        corpus if corpus is not None else settings.corpus, tokenizer, format=settings.corpus_format,
        max_document_chars=settings.max_document_chars, max_seq_length=seq_length or settings.max_seq_length,
        short_seq_prob=settings.short_seq_prob, nsp=settings.nsp, dupe_factor=settings.dupe_factor,
        heldout_fraction=fraction, seed=settings.seed, cache_dir=Path(settings.out) / "cache",
    )


def heldout_dataset(instances: PretrainingInstances, tokenizer: Tokenizer,
                    settings: PretrainSettings) -> PretrainingDataset:
    """Held-out instances with static masks from the fixed `eval_mask_seed`."""
    return PretrainingDataset(instances, tokenizer, max_seq_length=settings.max_seq_length, masking=settings.masking(),
                              seed=settings.eval_mask_seed, dynamic_masking=False)


def unigram_counts(instances: PretrainingInstances, vocab: MaskingVocab, vocab_size: int) -> np.ndarray:
    """How often each token occurs in the instances, special tokens ([CLS] [SEP] [PAD] [MASK]) excluded."""
    counts = np.bincount(instances.input_ids.astype(np.int64), minlength=vocab_size)[:vocab_size].astype(np.int64)
    counts[vocab.never_mask_ids] = 0
    return counts


# --- evaluation ---------------------------------------------------------------------------------------


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

    from training.model import BertForPreTraining
    from training.pretraining_data import collate

    n = len(dataset) if max_instances is None else min(len(dataset), max_instances)
    device = device or next(model.parameters()).device
    wants_nsp = isinstance(model, BertForPreTraining)
    sums = {"mlm_loss": 0.0, "mlm_correct": 0.0, "masked": 0, "nsp_loss": 0.0, "nsp_correct": 0.0, "nsp_pairs": 0}
    labels_seen: list[np.ndarray] = []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                items = [dataset[i] for i in range(start, min(n, start + batch_size))]
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


# --- the run ------------------------------------------------------------------------------------------


def git_revision(repo: Path = REPO) -> str | None:
    """`git rev-parse HEAD` of the code, with "-dirty" when the working tree has changes; None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty else "")


def collate_without_nsp(items: list[dict]) -> dict:
    """`collate` for `BertForMaskedLM`, which takes no next_sentence_label (the --no-nsp ablation)."""
    from training.pretraining_data import collate

    batch = collate(items)
    del batch["next_sentence_label"]
    return batch


def build_model(settings: PretrainSettings, vocab_size: int):
    """A freshly initialized `BertForPreTraining`, or `BertForMaskedLM` when `nsp` is off."""
    import torch

    from training.model import BertForMaskedLM, BertForPreTraining

    torch.manual_seed(settings.seed)
    config = settings.bert_config(vocab_size)
    return (BertForPreTraining if settings.nsp else BertForMaskedLM)(config)


def run_pretrain(settings: PretrainSettings) -> dict[str, Any]:
    """Tokenizer, data, model, train, save the folder, evaluate on held-out text. Returns the run record
    (empty on ranks other than 0 of a torchrun launch)."""
    import torch

    from tasks.runtime.tokenizer import load_tokenizer
    from training.checkpoint import save_pretrained
    from training.distributed import barrier, setup_distributed, teardown_distributed
    from training.pretraining_data import collate
    from training.trainer import train

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    out = Path(settings.out)
    files = corpus_files(settings.corpus)
    if not files:
        raise FileNotFoundError(f"no corpus files (*.txt) under {', '.join(map(str, settings.corpus))}")
    ctx = setup_distributed(settings.device)  # the trainer joins this process group, if any
    try:
        # Rank 0 trains the vocabulary and builds (and caches) the instances; the others then read them.
        if ctx.is_main:
            out.mkdir(parents=True, exist_ok=True)
            tokenizer = prepare_tokenizer(settings)
            started = time.time()
            train_instances, heldout_instances = build_instances(settings, tokenizer)
            log.info("instances: %d train, %d held out, built in %.0f s", len(train_instances),
                     len(heldout_instances) if heldout_instances is not None else 0, time.time() - started)
        barrier(ctx)
        if not ctx.is_main:
            tokenizer = load_tokenizer(out)
            train_instances, heldout_instances = build_instances(settings, tokenizer)
        vocab_size = tokenizer.get_vocab_size()
        vocab = MaskingVocab.from_tokenizer(tokenizer)
        dataset = PretrainingDataset(train_instances, vocab, max_seq_length=settings.max_seq_length,
                                     masking=settings.masking(), seed=settings.seed)
        counts = unigram_counts(train_instances, vocab, vocab_size)
        heldout = heldout_dataset(heldout_instances, tokenizer, settings) if heldout_instances is not None else None

        model = build_model(settings, vocab_size)
        params = sum(p.numel() for p in model.parameters())
        shape = {k: getattr(model.config, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")}
        log.info("model: %s %s, %.1fM parameters", type(model).__name__, shape, params / 1e6)

        latest: dict[str, float] = {}  # the last full evaluation the loop asked for (it asks at the end)

        def evaluate(m) -> dict[str, float]:
            metrics = evaluate_pretraining(m, heldout, counts, settings.eval_batch_size, settings.eval_max_instances)
            latest.clear()
            latest.update(metrics)
            # The curves only, named as the training metrics so that `berth plot` draws them together.
            return {k: v for k, v in metrics.items() if k in CURVES}

        phase1_steps, phase2_steps = settings.phase_steps()
        train_settings = settings.loop_settings(out, max_steps=phase1_steps or settings.max_steps)
        collate_fn = collate if settings.nsp else collate_without_nsp
        result = train(model, dataset, collate_fn, train_settings, evaluate=evaluate if heldout is not None else None)
        phase2 = None
        if phase2_steps:
            phase2 = _train_phase2(settings, model, tokenizer, vocab, collate_fn, train_settings, phase2_steps, ctx)
        if not ctx.is_main:
            return {}
        final: dict[str, float] = {}
        if heldout is not None:
            capped = settings.eval_max_instances is not None
            final = dict(latest) if latest and not capped else evaluate_pretraining(
                model, heldout, counts, settings.eval_batch_size)
            final = _with_token_name(final, tokenizer)
            _write_eval(out, final, "held-out split of the training corpus")
        model.cpu()
        save_pretrained(model, out, tokenizer_from=out)
        record = {
            "settings": json.loads(settings.model_dump_json()),
            "seed": settings.seed,
            "git_revision": git_revision(),
            "corpus_files": [{"path": str(f), "bytes": f.stat().st_size} for f in files],
            "train_instances": len(train_instances),
            "train_tokens": int(train_instances.lengths.sum()),
            "heldout_instances": len(heldout_instances) if heldout_instances is not None else 0,
            "model_class": type(model).__name__,
            "model_config": model.config.to_dict(),
            "parameters": params,
            "train_result": result.to_dict(),
            "precision": result.precision,
            "phase2": phase2,
            "heldout_eval": final,
            "versions": {"python": platform.python_version(), "torch": torch.__version__},
        }
        (out / RUN_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        return record
    finally:
        teardown_distributed(ctx)


def _train_phase2(settings: PretrainSettings, model, tokenizer: Tokenizer, vocab: MaskingVocab, collate_fn,
                  phase1: Any, steps: int, ctx) -> dict[str, Any]:
    """The paper's second phase: `steps` more steps on phase2_seq_length-token instances, from the phase-1
    weights, with its own warmup and decay (as google-research/bert's second run_pretraining invocation),
    so that the position embeddings past max_seq_length are trained. Its state lives in out/phase2."""
    from training.distributed import barrier
    from training.trainer import train

    length = settings.phase2_seq_length
    if ctx.is_main:
        instances, _ = build_instances(settings, tokenizer, seq_length=length)
    barrier(ctx)
    if not ctx.is_main:
        instances, _ = build_instances(settings, tokenizer, seq_length=length)
    masking = settings.masking(length)
    dataset = PretrainingDataset(instances, vocab, max_seq_length=length, masking=masking, seed=settings.seed + 1)
    phase_settings = phase1.model_copy(update={"output_dir": Path(settings.out) / "phase2", "max_steps": steps,
                                               "epochs": None, "eval_every_steps": None})
    log.info("phase 2: %d steps at %d tokens (max %d predictions per sequence)", steps, length,
             masking.max_predictions_per_seq)
    result = train(model, dataset, collate_fn, phase_settings)
    return {"seq_length": length, "steps": steps, "instances": len(instances),
            "max_predictions_per_seq": masking.max_predictions_per_seq, "train_result": result.to_dict()}


def _with_token_name(metrics: dict[str, Any], tokenizer: Tokenizer) -> dict[str, Any]:
    if "unigram_token_id" not in metrics:
        return metrics
    return {**metrics, "unigram_token": tokenizer.id_to_token(int(metrics["unigram_token_id"]))}


def _write_eval(out: Path, metrics: dict[str, float], data: str, name: str = EVAL_FILE) -> None:
    (out / name).write_text(json.dumps({"data": data, **metrics}, indent=2) + "\n", encoding="utf-8")


def load_run_settings(folder: str | Path) -> PretrainSettings:
    """The settings a `berth pretrain` folder was trained with (its pretrain_run.json)."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; is {folder} a `berth pretrain` output folder?")
    return PretrainSettings.model_validate(json.loads(path.read_text(encoding="utf-8"))["settings"])


def evaluate_pretrained_folder(
    folder: str | Path, eval_text: list[Path] | None = None, corpus: list[Path] | None = None,
    mask_seed: int | None = None, batch_size: int = 64, device: str = "auto", instances_from: str | Path | None = None,
) -> dict[str, float]:
    """Held-out MLM / NSP metrics of a saved pretraining folder.

    By default the held-out documents of its own run (the split is rebuilt from pretrain_run.json:
    same corpus, seed and fraction; `corpus` points at the corpus if it has moved). With `eval_text`,
    every document of those files instead. With `instances_from` (another run's folder, same vocabulary),
    that run's held-out instances and masked positions, so two runs (an ablation) are scored on the very
    same tokens. Writes pretrain_eval.json into the folder (pretrain_eval-on-<other>.json with
    `instances_from`).
    """
    import torch

    from tasks.runtime.tokenizer import load_tokenizer
    from training.checkpoint import load_pretrained
    from training.model import BertForMaskedLM, BertForPreTraining

    folder = Path(folder)
    source = Path(instances_from) if instances_from else folder
    settings = load_run_settings(source).model_copy(update={"out": source})
    if mask_seed is not None:
        settings = settings.model_copy(update={"eval_mask_seed": mask_seed})
    if corpus:
        settings = settings.model_copy(update={"corpus": list(corpus)})
    tokenizer = load_tokenizer(folder)
    if instances_from and load_tokenizer(source).get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"{folder} and {source} have different vocabularies; their instances are not comparable")
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    train_instances, heldout_instances = build_instances(settings, tokenizer)
    if eval_text:
        heldout_instances, _ = build_instances(settings, tokenizer, heldout_fraction=0.0, corpus=list(eval_text))
        data = "all documents of " + ", ".join(map(str, eval_text))
    else:
        data = "held-out split of the training corpus" + (f" of the run in {source}" if instances_from else "")
    if heldout_instances is None or len(heldout_instances) == 0:
        raise ValueError(f"{folder}: nothing to evaluate (the run held out no documents; pass eval_text)")
    architectures = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    cls = BertForMaskedLM if "BertForMaskedLM" in architectures else BertForPreTraining
    model, report = load_pretrained(cls, folder)
    log.info("loaded %s from %s: %s", cls.__name__, folder, report)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    counts = unigram_counts(train_instances, vocab, tokenizer.get_vocab_size())
    metrics = evaluate_pretraining(model, heldout_dataset(heldout_instances, tokenizer, settings), counts, batch_size)
    metrics = _with_token_name(metrics, tokenizer)
    _write_eval(folder, metrics, data, f"pretrain_eval-on-{source.name}.json" if instances_from else EVAL_FILE)
    return metrics
