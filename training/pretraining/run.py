"""`berth pretrain`: BERT pretraining on raw text, from scratch or continued from a released checkpoint.

corpus files -> a tokenizer (the base's, a given one, or a WordPiece vocabulary trained on the corpus) ->
prepared shards of instances, held-out documents apart (training.pretraining.prepared / shards) -> a model:
`BertForPreTraining` (masked LM + next-sentence prediction) or, without NSP, `BertForMaskedLM`, new or loaded
from the base (training.pretraining.base) -> a head-only warm-up when the base lacks a head -> the one training
loop (training.loop.trainer) reading the shards as they lie on disk (training.pretraining.stream) -> the paper's
optional second phase at a longer length -> a Hugging Face folder, its held-out evaluation and its run record.
"""

from __future__ import annotations

import json
import logging
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.errors import UserFacingError
from training.pretraining.base import Base, check_lengths, encoder_frozen, head_warmup_steps, load_base_model
from training.pretraining.evaluation import (
    CURVES,
    RUN_FILE,
    evaluate_pretraining,
    heldout_dataset,
    scored_indices,
    training_unigram,
    with_token_name,
    write_eval,
)
from training.pretraining.prepared import PreparedData, prepare_run_data, save_model_tokenizer
from training.pretraining.settings import PretrainSettings

log = logging.getLogger("berth.pretrain")

HEAD_WARMUP_DIR = "head_warmup"
PHASE2_DIR = "phase2"


def collate_without_nsp(items: list[dict]) -> dict:
    """`collate` for `BertForMaskedLM`, which takes no next_sentence_label (the --no-nsp ablation)."""
    from training.pretraining.data import collate

    batch = collate(items)
    del batch["next_sentence_label"]
    return batch


def build_model(settings: PretrainSettings, nsp: bool, vocab_size: int):
    """A freshly initialized `BertForPreTraining`, or `BertForMaskedLM` without NSP."""
    import torch

    from training.bert.model import BertForMaskedLM, BertForPreTraining

    torch.manual_seed(settings.seed)
    return (BertForPreTraining if nsp else BertForMaskedLM)(settings.bert_config(vocab_size))


@dataclass
class _Model:
    model: Any
    nsp: bool
    base: Base | None
    new_heads: list[str]


def _model(settings: PretrainSettings, base: Base | None, nsp: bool, vocab_size: int) -> _Model:
    if base is None:
        return _Model(build_model(settings, nsp, vocab_size), nsp, None, [])
    import torch

    torch.manual_seed(settings.seed)  # the heads the base lacks start from fresh weights: the seed's, as build_model's
    model, new_heads = load_base_model(base, nsp)
    if vocab_size > model.config.vocab_size:
        raise UserFacingError(f"--base {base.folder}: its tokenizer has {vocab_size} tokens, its embeddings "
                              f"{model.config.vocab_size}")
    return _Model(model, nsp, base, new_heads)


def _planned_steps(settings: PretrainSettings, examples: int, world_size: int) -> int:
    if settings.max_steps is not None:
        return settings.phase_steps()[0] or settings.max_steps
    per_step = settings.batch_size * settings.grad_accum_steps * world_size
    return math.ceil((settings.epochs or 1.0) * math.ceil(examples / per_step))


def run_pretrain(settings: PretrainSettings) -> dict[str, Any]:
    """Prepare, train, save the folder, evaluate on held-out text. Returns the run record (on rank 0 of a torchrun
    launch; {} on the others), or with `prepare_only` the prepared data's record. The output folder's
    lock (training/loop/output_lock.py) refuses a second run on a folder a live run writes; under torchrun rank 0
    holds it."""
    import os

    from training.loop.output_lock import output_lock

    if int(os.environ.get("RANK", "0")) != 0:
        return _run_pretrain(settings)
    with output_lock(settings.out, "berth pretrain"):
        return _run_pretrain(settings)


def _run_pretrain(settings: PretrainSettings) -> dict[str, Any]:
    import torch

    from training.loop.distributed import check_shared_folder, setup_distributed, teardown_distributed
    from training.loop.training_state import list_training_states
    from training.pretraining.base import resolve_base

    if settings.num_threads:
        torch.set_num_threads(settings.num_threads)
    out = Path(settings.out)
    base = resolve_base(settings.base) if settings.base is not None else None
    if base is not None:
        check_lengths(base, settings.max_seq_length, settings.phase2_seq_length)
    nsp = settings.nsp if settings.nsp is not None else (base.has_nsp_head if base is not None else True)
    ctx = setup_distributed(settings.device, settings.dist_timeout_minutes)  # the trainer joins this group
    try:
        check_shared_folder(ctx, out)
        tokenizer, data = prepare_run_data(settings, base, nsp, may_build=not ctx.enabled,
                                           has_training_state=bool(list_training_states(out)))
        if ctx.is_main:
            save_model_tokenizer(tokenizer, out, base, settings)
        if settings.prepare_only:
            return {"prepared": [d.record() for d in data], "nsp": nsp}
        return _train_and_save(settings, tokenizer, data, _model(settings, base, nsp, tokenizer.get_vocab_size()), ctx)
    finally:
        teardown_distributed(ctx)


def _train_and_save(settings: PretrainSettings, tokenizer, data: list[PreparedData], built: _Model, ctx) -> dict:
    import torch

    from training.bert.checkpoint import save_pretrained
    from training.loop.trainer import train
    from training.pretraining.data import ShardedPretrainingDataset, collate
    from training.pretraining.masking import MaskingVocab
    from training.pretraining.stream import ShardedInstances

    out, model = Path(settings.out), built.model
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    train_instances = ShardedInstances(data[0].folder, "train")
    if len(train_instances) == 0:
        raise UserFacingError(f"{data[0].folder}: the corpus gave no training instances (too little text?)")
    heldout_instances = ShardedInstances(data[0].folder, "heldout", check=False)
    dataset = ShardedPretrainingDataset(train_instances, vocab, max_seq_length=settings.max_seq_length,
                                        masking=settings.masking(), seed=settings.seed,
                                        shuffle_window=settings.shuffle_window)
    counts = training_unigram(train_instances, vocab)
    heldout = heldout_dataset(heldout_instances, vocab, settings) if len(heldout_instances) else None
    params = sum(p.numel() for p in model.parameters())
    shape = {k: getattr(model.config, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")}
    log.info("model: %s %s, %.1fM parameters%s", type(model).__name__, shape, params / 1e6,
             f", continued from {built.base.folder}" if built.base else "")

    latest: dict[str, float] = {}  # the last full evaluation the loop asked for (it asks at the end)

    def evaluate(m) -> dict[str, float]:
        metrics = evaluate_pretraining(m, heldout, counts, settings.eval_batch_size, settings.eval_max_instances)
        latest.clear()
        latest.update(metrics)
        return {k: v for k, v in metrics.items() if k in CURVES}  # named as training metrics: `berth plot` draws both

    phase1_steps, phase2_steps = settings.phase_steps()
    loop = settings.loop_settings(out, max_steps=phase1_steps or settings.max_steps)
    collate_fn = collate if built.nsp else collate_without_nsp
    warmup = _head_warmup(settings, built, dataset, collate_fn, loop, ctx.world_size)
    result = train(model, dataset, collate_fn, loop, evaluate=evaluate if heldout is not None else None)
    phase2 = None
    if phase2_steps:
        phase2 = _train_phase2(settings, model, vocab, collate_fn, loop, phase2_steps, data[1])
    if not ctx.is_main:
        return {}
    final: dict[str, float] = {}
    if heldout is not None:
        counted = len(heldout)
        same = len(scored_indices(counted, settings.eval_max_instances)) == \
            len(scored_indices(counted, settings.final_eval_max_instances))  # the last evaluation scored these
        final = dict(latest) if latest and same else evaluate_pretraining(
            model, heldout, counts, settings.eval_batch_size, settings.final_eval_max_instances)
        final = with_token_name(final, tokenizer)
        write_eval(out, final, "held-out split of the training corpus")
    model.cpu()
    save_pretrained(model, out)
    record = {
        "settings": json.loads(settings.model_dump_json()),
        "seed": settings.seed,
        "learning_rate": settings.effective_learning_rate(),
        "git_revision": _git_revision(),
        "nsp": built.nsp,
        "base": built.base.record() if built.base else None,
        "new_heads": built.new_heads,
        "head_warmup": warmup,
        "data": data[0].record(),
        "train_instances": len(train_instances),
        "train_tokens": data[0].manifest["totals"]["train"]["tokens"],
        "heldout_instances": len(heldout_instances),
        "model_class": type(model).__name__,
        "model_config": model.config.to_dict(),
        "parameters": params,
        "train_result": result.to_dict(),
        "precision": result.precision,
        "phase2": phase2,
        "heldout_eval": final,
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    }
    tmp = out / (RUN_FILE + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(out / RUN_FILE)
    return record


def _git_revision() -> str | None:
    from training.provenance import git_revision

    return git_revision()


def _head_warmup(settings: PretrainSettings, built: _Model, dataset, collate_fn, loop, world_size: int):
    """Train only the heads the base lacks, the encoder frozen, for the warm-up steps (its own training state in
    OUT/head_warmup, so a killed run resumes it too). None when there is no warm-up."""
    from training.loop.trainer import train

    if built.base is None:
        return None
    steps = head_warmup_steps(settings.head_warmup_steps, built.new_heads,
                              _planned_steps(settings, len(dataset), world_size))
    if not steps:
        return None
    log.info("head warm-up: %d steps of %s alone at lr %g, the encoder frozen", steps,
             ", ".join(sorted({n.rsplit(".", 2)[0] for n in built.new_heads})) or "the heads",
             settings.head_warmup_learning_rate)
    warm = loop.model_copy(update={
        "output_dir": Path(settings.out) / HEAD_WARMUP_DIR, "max_steps": steps, "epochs": None,
        "learning_rate": settings.head_warmup_learning_rate, "warmup_steps": 0, "eval_every_steps": None,
        "max_minutes": None,
        "fit_schedule_to_budget": False, "min_steps": None, "save_every_steps": loop.save_every_steps})
    with encoder_frozen(built.model):
        result = train(built.model, dataset, collate_fn, warm)
    return {"steps": steps, "learning_rate": settings.head_warmup_learning_rate, "final_loss": result.final_loss}


def _train_phase2(settings: PretrainSettings, model, vocab, collate_fn, phase1, steps: int,
                  data: PreparedData) -> dict[str, Any]:
    """The paper's second phase: `steps` more steps on phase2_seq_length-token instances, from the phase-1
    weights, with its own warmup and decay (as google-research/bert's second run_pretraining invocation),
    so that the position embeddings past max_seq_length are trained. Its state lives in out/phase2."""
    from training.loop.trainer import train
    from training.pretraining.data import ShardedPretrainingDataset
    from training.pretraining.stream import ShardedInstances

    length = settings.phase2_seq_length
    instances = ShardedInstances(data.folder, "train")
    masking = settings.masking(length)
    dataset = ShardedPretrainingDataset(instances, vocab, max_seq_length=length, masking=masking,
                                        seed=settings.seed + 1, shuffle_window=settings.shuffle_window)
    phase_settings = phase1.model_copy(update={"output_dir": Path(settings.out) / PHASE2_DIR, "max_steps": steps,
                                               "epochs": None, "eval_every_steps": None})
    log.info("phase 2: %d steps at %d tokens (max %d predictions per sequence)", steps, length,
             masking.max_predictions_per_seq)
    result = train(model, dataset, collate_fn, phase_settings)
    return {"seq_length": length, "steps": steps, "instances": len(instances),
            "max_predictions_per_seq": masking.max_predictions_per_seq, "train_result": result.to_dict()}
