"""`berth pretrain`: pretrain a BERT from raw text (MLM + NSP, or MLM only), and evaluate it on held-out text."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path

from berth.config_files import add_config_flag, fail, settings_from_args, write_config
from berth.flags import LOOP_FLAG_NAMES, add_settings_flags
from training.bert.config import PRESETS
from training.pretraining.settings import PretrainSettings

EXAMPLES = """examples:
  # $DATA: your data folder, laid out as docs/data.md says (where each public set comes from, its license)
  # continue masked-LM pretraining of the embedded all-MiniLM-L6-v2 on your domain's text (its own tokenizer and
  # shape; its missing MLM head is trained alone first), then fine-tune the result
  berth pretrain my_tweets/ --out runs/dapt --base default --max-minutes 30 --workers 2
  berth finetune --task ner --base runs/dapt --train $DATA/wnut17/wnut17train.conll --out runs/wnut

  # a large corpus: prepare the shards once with every core (a rerun keeps the shards already done), then train
  berth pretrain corpus/ --out runs/big --base default --workers 8 --prepare-only
  berth pretrain corpus/ --out runs/big --base default --max-steps 100000 --save-every-steps 1000

  # on several machines: the same command on each, OUT on a filesystem they share (docs/howto/pretrain-at-scale.md)
  torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -m berth.cli pretrain corpus/ --out /shared/runs/big --base default --max-steps 100000

  # from scratch, the CPU recipe of docs/PRETRAINING.md: a 30k vocabulary trained on the corpus, the mini model
  # (L4/H256/A4), 128-token sequences, 40 minutes at most
  berth pretrain $DATA/pretraining --out runs/pretrain-mini --preset mini --vocab-size 30522 \\
      --encoding utf-8-or-latin-1 --batch-size 32 --lr 5e-4 --max-steps 2000 --max-minutes 40 --threads 2

  # the paper's ablation on the same corpus: masked LM only, single segments, no NSP head
  berth pretrain $DATA/pretraining --out runs/pretrain-mini-nonsp --no-nsp --max-minutes 40

  # held-out MLM and NSP accuracy of a finished run (same masked positions every time)
  berth pretrain --eval-only --out runs/pretrain-mini

The output folder is a Hugging Face model folder (config.json, model.safetensors with the pretraining
heads, tokenizer.json, vocab.txt) plus pretrain_run.json (settings, seed, git revision, base and its
digest, data, final held-out metrics), pretrain_eval.json, metrics.jsonl, data/ (the prepared shards and
their manifest) and checkpoints/ (the resumable training states; run the same command again to resume,
`berth plot` to draw the curves). Delete data/ and checkpoints/ when done to keep only the model.
"""

FLAG_NAMES = {  # the flags' short names; every other setting is --its-name
    **LOOP_FLAG_NAMES, "corpus_format": "--format", "lowercase": "--cased", "num_layers": "--layers",
    "hidden_size": "--hidden", "num_heads": "--heads", "intermediate_size": "--intermediate", "nsp": "--no-nsp",
}
GROUPS = {
    "corpus": ["corpus", "out", "corpus_format", "max_document_chars", "heldout_fraction", "encoding", "bad_lines"],
    "preparation": ["workers", "shard_mb", "shuffle_window", "prepare_only"],
    "continued pretraining": ["base", "head_warmup_steps", "head_warmup_learning_rate"],
    "tokenizer (a new model)": ["tokenizer", "vocab_size", "lowercase", "min_frequency"],
    "model (a new model)": ["preset", "num_layers", "hidden_size", "num_heads", "intermediate_size"],
    "objective": ["nsp", "max_seq_length", "masked_lm_prob", "max_predictions_per_seq", "whole_word_mask",
                  "short_seq_prob", "dupe_factor", "phase2_seq_length", "phase2_fraction"],
    "training": ["batch_size", "grad_accum_steps", "epochs", "max_steps", "max_minutes", "learning_rate",
                 "warmup_ratio", "warmup_steps", "weight_decay", "seed", "num_threads", "device", "log_every_steps",
                 "eval_every_steps", "save_every_steps", "resume", "precision", "dist_timeout_minutes"],
    "evaluation": ["eval_mask_seed", "eval_batch_size", "eval_max_instances"],
}
OPTIONS = {
    "corpus": {"positional": True, "nargs": "*", "type": Path,
               "help": "text files or folders (every *.txt below them), or a folder an earlier run prepared; not "
                       "needed with --eval-only"},
    "preset": {"choices": list(PRESETS)},
    "lowercase": {"action": "store_const", "const": False,
                  "help": "keep case and accents (default: uncased, as bert-base-uncased)"},
    "nsp": {"action": "store_const", "const": False,
            "help": "masked LM only: single packed segments, no next-sentence prediction; saves a BertForMaskedLM "
                    "model folder (the paper's ablation; the default with a base that has no NSP head)"},
    # the spellings of finetune; the old ones still work
    "log_every_steps": {"aliases": ["--log-every"]}, "eval_every_steps": {"aliases": ["--eval-every"]},
    "save_every_steps": {"aliases": ["--save-every"]},
}


def _paths(value: str) -> list[Path]:
    return [Path(p) for p in value.split(",") if p]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "pretrain", help="pretrain a BERT from raw text (MLM + NSP), or evaluate one on held-out text",
        description="Pretrain a BERT from scratch on text files: train a WordPiece vocabulary (or reuse one),\n"
                    "build [CLS] A [SEP] B [SEP] instances with next-sentence labels, mask 15% of the tokens,\n"
                    "and train masked LM + next-sentence prediction (or masked LM only, --no-nsp). A few % of\n"
                    "the documents are held out: their MLM and NSP accuracy is reported at the end (and with\n"
                    "--eval-only), next to the unigram baseline on the same masked positions.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings_flags(p, PretrainSettings, groups=GROUPS, names=FLAG_NAMES, options=OPTIONS,
                       rest_title="training loop (rarely changed)")
    p.add_argument("--nsp", dest="nsp", action="store_const", const=True, default=argparse.SUPPRESS,
                   help="next-sentence prediction also with a base that has no trained NSP head (a new one is "
                        "trained)")
    p.add_argument("--no-resume", dest="resume", action="store_const", const="never", default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # the old spelling of --resume never
    add_config_flag(p)
    e = p.add_argument_group("evaluation only")
    e.add_argument("--eval-only", action="store_true",
                   help="do not train: evaluate the model folder in --out on its held-out documents "
                        "(MLM accuracy, loss, perplexity; NSP accuracy; the unigram baseline)")
    e.add_argument("--eval-text", type=_paths,
                   help="with --eval-only: evaluate on every document of these comma-separated files/folders instead")
    e.add_argument("--data", type=Path, metavar="FOLDER",
                   help="with --eval-only: the run's prepared data folder, if it has moved (default: the one its "
                        "record names)")
    e.add_argument("--eval-instances-from", type=Path, metavar="FOLDER",
                   help="with --eval-only: score on the held-out instances and masked positions of the run in FOLDER "
                        "(same vocabulary), e.g. an NSP run and its --no-nsp ablation on the very same tokens")
    p.set_defaults(func=run_command)
    return p


def _print_eval(metrics: dict) -> None:
    line = (f"held-out MLM accuracy {metrics['mlm_accuracy']:.4f} (unigram baseline "
            f"{metrics.get('unigram_accuracy', float('nan')):.4f}), MLM loss {metrics['mlm_loss']:.3f}, "
            f"perplexity {metrics['mlm_perplexity']:.1f} "
            f"(unigram {metrics.get('unigram_perplexity', float('nan')):.0f})")
    if "nsp_accuracy" in metrics:
        line += f", NSP accuracy {metrics['nsp_accuracy']:.4f} on {metrics['nsp_pairs']} pairs"
    print(line, file=sys.stderr)


def run_command(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.eval_only:
        import torch

        from training.pretraining.evaluation import evaluate_pretrained_folder

        s = settings_from_args(args, PretrainSettings, "pretrain")
        if s.num_threads:
            torch.set_num_threads(s.num_threads)
        metrics = evaluate_pretrained_folder(s.out, eval_text=args.eval_text, data=args.data,
                                             mask_seed=s.eval_mask_seed, batch_size=s.eval_batch_size,
                                             device=s.device, instances_from=args.eval_instances_from)
        _print_eval(metrics)
        print(json.dumps(metrics, indent=2))
        return 0
    settings = settings_from_args(args, PretrainSettings, "pretrain")
    if not settings.corpus:
        fail("pretrain", "give the corpus (text files or folders, or `corpus` in --config), or --eval-only")
    from training.pretraining.run import run_pretrain

    logging.getLogger("berth.pretrain").info("settings: %s", settings.model_dump_json())
    from training.loop.output_lock import output_lock

    main_rank = os.environ.get("RANK", "0") == "0"  # one writer under torchrun
    with output_lock(settings.out, "berth pretrain") if main_rank else contextlib.nullcontext():
        if main_rank:  # `berth pretrain --config OUT/config.yaml` runs it again (the training, after --prepare-only)
            write_config(settings.model_copy(update={"prepare_only": False}), settings.out, "pretrain")
        record = run_pretrain(settings)
    if settings.prepare_only:
        print(json.dumps(record, indent=2, default=str))
        return 0
    if not record:  # a rank other than 0 of a torchrun launch
        return 0
    if record["heldout_eval"]:
        _print_eval(record["heldout_eval"])
    print(f"saved {record['model_class']} to {settings.out}", file=sys.stderr)
    print(json.dumps({"out": str(settings.out), "model_class": record["model_class"],
                      "heldout_eval": record["heldout_eval"]}, indent=2, default=str))
    return 0
