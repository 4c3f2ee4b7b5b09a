"""`berth finetune` and `berth evaluate`."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

EXAMPLES = """examples:
  # SST-2 sentiment from the embedded default base, 15 minutes of training at most
  berth finetune --task classification --train ../shared/data/sst2/train.tsv \\
      --dev ../shared/data/sst2/dev.tsv --out runs/sst2 --max-minutes 15
  # MRPC paraphrase pairs
  berth finetune --task pair --train ../shared/data/mrpc/train.tsv --dev ../shared/data/mrpc/dev.tsv --out runs/mrpc
  # CoNLL-2003 NER (IOB1 or IOB2 column files)
  berth finetune --task ner --train ../shared/data/conll2003/iob2/train.txt \\
      --dev ../shared/data/conll2003/iob2/valid.txt --out runs/conll
  # the same, feature-based: a BiLSTM on the frozen encoder's last four layers (the paper's Table 7)
  berth finetune --task ner --feature-based --lr 1e-3 --epochs 4 --train ../shared/data/conll2003/iob2/train.txt \\
      --dev ../shared/data/conll2003/iob2/valid.txt --out runs/conll-features
  # SQuAD v1.1 from a Hugging Face BERT folder
  berth finetune --task qa --base path/to/bert-base-uncased --train train-v1.1.json --dev dev-v1.1.json --out runs/squad
  # multiple choice (SWAG's CSV, or JSON lines of {"context", "choices": [...], "label"})
  berth finetune --task multiple-choice --train swag/train.csv --dev swag/val.csv --out runs/swag
  # your own data: CSV / TSV / JSON lines with text[, text_pair], label columns
  berth finetune --task classification --train mine.csv --dev mine_dev.csv --out runs/mine
"""


def _add_settings_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--task", required=True, choices=["classification", "pair", "ner", "qa", "multiple-choice"],
                   help="classification: one text -> label; pair: two texts -> label or score; "
                        "ner: a tag per word; qa: SQuAD answer span; multiple-choice: the right choice for a "
                        "context (SWAG CSV or {context, choices, label} JSON lines)")
    g.add_argument("--train", dest="train_file", required=True, type=Path, help="training data file")
    g.add_argument("--dev", dest="dev_file", type=Path, help="dev data file: evaluated after training")
    g.add_argument("--format", dest="data_format", default="auto",
                   help="auto (from the file), sst2, mrpc, table (csv/tsv/jsonl), conll, squad")
    g.add_argument("--text-column", default="text")
    g.add_argument("--text-pair-column", default="text_pair")
    g.add_argument("--label-column", default="label")
    g.add_argument("--labels", type=lambda s: s.split(","), help="comma-separated label order (default: sorted as found)")
    g.add_argument("--regression", action="store_true", help="pair/classification: a numeric score (num_labels=1)")
    g.add_argument("--max-train-examples", type=int, help="use at most this many training examples")
    g.add_argument("--max-eval-examples", type=int, help="evaluate on at most this many dev examples")
    m = p.add_argument_group("model")
    m.add_argument("--base", default="default",
                   help="base checkpoint: a Hugging Face BERT folder, a `berth pretrain` output, or "
                        "'default' (the embedded all-MiniLM-L6-v2, L6/H384) (default: %(default)s)")
    m.add_argument("--pooling", choices=["auto", "cls", "mean"], default="auto",
                   help="classification/pair: cls (the tanh pooler over [CLS], BERT's recipe) or mean (average of "
                        "the token states); auto: mean for a sentence-transformers base trained with it (the "
                        "default all-MiniLM-L6-v2), else cls (default: %(default)s)")
    m.add_argument("--feature-based", action="store_true", default=None,
                   help="ner: the paper's feature-based approach (Table 7): the encoder stays frozen, its last four "
                        "hidden layers are concatenated per token, computed once and cached, and only a BiLSTM + "
                        "linear tag layer is trained (give it a head's learning rate, e.g. --lr 1e-3)")
    m.add_argument("--lstm-hidden-size", type=int, help="feature-based: BiLSTM units per direction (default 256)")
    m.add_argument("--lstm-layers", type=int,
                   help="feature-based: stacked BiLSTM layers (default 1; the paper used 2 of 768 per direction)")
    m.add_argument("--max-seq-length", type=int, help="tokens per sequence (default: 384 for qa, 128 otherwise)")
    m.add_argument("--doc-stride", type=int,
                   help="qa: context tokens shared by consecutive windows (default 128); ner: overlap of the "
                        "windows over long texts when served (default max-seq-length / 4)")
    m.add_argument("--max-query-length", type=int, default=64, help="qa: question tokens kept")
    m.add_argument("--squad-v2", dest="version_2_with_negative", action="store_true", default=None,
                   help="qa: train for unanswerable questions (default: when the data has any)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=float, default=3.0)
    t.add_argument("--lr", dest="learning_rate", type=float, default=5e-5)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--grad-accum", dest="grad_accum_steps", type=int, default=1)
    t.add_argument("--warmup-ratio", type=float, default=0.1)
    t.add_argument("--max-minutes", type=float,
                   help="training-time budget: the step speed is measured and the schedule (epochs, warmup, "
                        "decay) shortened to end at it; data preparation and evaluation are not counted")
    t.add_argument("--cut-at-budget", dest="fit_to_budget", action="store_false", default=None,
                   help="with --max-minutes: keep the planned schedule and stop wherever the budget ends")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--no-group-by-length", dest="group_by_length", action="store_false", default=None,
                   help="draw batches in plain random order (default: batches of similar lengths, less padding)")
    t.add_argument("--threads", type=int, help="CPU threads for torch")
    t.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:1 …")


def run_finetune_command(args: argparse.Namespace) -> int:
    from training.finetune import FinetuneSettings, run_finetune

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fields = FinetuneSettings.model_fields
    settings = FinetuneSettings(**{k: v for k, v in vars(args).items() if k in fields and v is not None})
    print("settings:", settings.model_dump_json(indent=2))
    metrics = run_finetune(settings)
    print(json.dumps({"dev_metrics": metrics, "out": str(settings.out)}, indent=2))
    return 0


def run_evaluate_command(args: argparse.Namespace) -> int:
    from training.evaluate import evaluate_folder

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    metrics = evaluate_folder(args.model, args.data, data_format=args.data_format, limit=args.max_eval_examples,
                              out=args.out)
    print(json.dumps(metrics, indent=2))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune", help="fine-tune a BERT checkpoint into a task head",
        description="Fine-tune a BERT checkpoint (the embedded default, a Hugging Face folder or a berth "
                    "pretrained folder) for classification, sentence pairs, NER or SQuAD QA, evaluate it on "
                    "the dev file, and save a Hugging Face-compatible folder with berth_task.json.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_settings_args(p)
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.set_defaults(func=run_finetune_command)

    e = subparsers.add_parser(
        "evaluate", help="evaluate a fine-tuned folder on a data file (official metrics)",
        description="Run a fine-tuned folder over a data file of its task and print the official metrics "
                    "(accuracy/F1, conlleval entity F1, SQuAD EM/F1).")
    e.add_argument("model", type=Path, help="a `berth finetune` output folder")
    e.add_argument("data", type=Path, help="data file in a format of the model's task")
    e.add_argument("--format", dest="data_format", default="auto")
    e.add_argument("--max-eval-examples", type=int)
    e.add_argument("--out", type=Path, help="write the metrics (and predictions) as JSON here")
    e.set_defaults(func=run_evaluate_command)
