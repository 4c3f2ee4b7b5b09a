"""`berth finetune` and `berth evaluate`."""

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
from training.finetuning.settings import FinetuneSettings

EXAMPLES = """examples:
  # $DATA: your data folder, laid out as docs/data.md says (where each public set comes from, its license)
  # SST-2 sentiment from the embedded default base, 15 minutes of training at most
  berth finetune --task classification --train $DATA/sst2/train.tsv \\
      --dev $DATA/sst2/dev.tsv --out runs/sst2 --max-minutes 15
  # MRPC paraphrase pairs
  berth finetune --task pair --train $DATA/mrpc/train.tsv --dev $DATA/mrpc/dev.tsv --out runs/mrpc
  # CoNLL-2003 NER (IOB1 or IOB2 column files)
  berth finetune --task ner --train $DATA/conll2003/iob2/train.txt \\
      --dev $DATA/conll2003/iob2/valid.txt --out runs/conll
  # the same, feature-based: a BiLSTM on the frozen encoder's last four layers (the paper's Table 7)
  berth finetune --task ner --feature-based --lr 1e-3 --epochs 4 --train $DATA/conll2003/iob2/train.txt \\
      --dev $DATA/conll2003/iob2/valid.txt --out runs/conll-features
  # SQuAD v1.1 from a Hugging Face BERT folder
  berth finetune --task qa --base path/to/bert-base-uncased --train train-v1.1.json --dev dev-v1.1.json --out runs/squad
  # multiple choice (SWAG's CSV, or JSON lines of {"context", "choices": [...], "label"})
  berth finetune --task multiple-choice --train swag/train.csv --dev swag/val.csv --out runs/swag
  # your own data: CSV / TSV / JSON lines with text[, text_pair], label columns
  berth finetune --task classification --train mine.csv --dev mine_dev.csv --out runs/mine
  # a recipe file (YAML or JSON, the settings' field names; flags override it); every run writes its
  # effective settings to OUT/config.yaml, so this runs runs/mine again into runs/mine-again
  berth finetune --config runs/mine/config.yaml --out runs/mine-again
  # evaluate on dev every 200 steps, keep the best checkpoint, stop after 5 evaluations without a better one,
  # curves to TensorBoard (OUT/tensorboard) and MLflow (./mlruns or $MLFLOW_TRACKING_URI); then plot them
  berth finetune --task classification --train $DATA/sst2/train.tsv --dev $DATA/sst2/dev.tsv \
      --out runs/sst2 --eval-every-steps 200 --early-stopping-patience 5 --report-to tensorboard,mlflow
  berth plot runs/sst2

The output folder is a Hugging Face model folder (config.json, model.safetensors, tokenizer.json) with
berth_task.json, finetune_run.json (with --eval-every-steps, a "best" record: the step kept, its metric and
value, every evaluation and what evaluating cost) and metrics.jsonl (the training and dev curves);
`berth export` turns it into a bundle. While training, its train_state/ holds the resumable training state
and the best weights so far (run the same command again to resume after a kill); it is deleted at the end.
"""

FLAG_NAMES = {  # the flags' short names; every other setting is --its-name
    **LOOP_FLAG_NAMES, "train_file": "--train", "dev_file": "--dev", "data_format": "--format",
    "version_2_with_negative": "--squad-v2", "fit_schedule_to_budget": "--cut-at-budget",
}
GROUPS = {
    "data": ["task", "train_file", "dev_file", "out", "data_format", "text_column", "text_pair_column",
             "label_column", "labels", "regression", "max_train_examples", "max_eval_examples", "bad_rows"],
    "model": ["base", "pooling", "max_seq_length", "doc_stride", "max_query_length", "version_2_with_negative",
              "label_all_tokens", "feature_based", "lstm_hidden_size", "lstm_layers", "negatives", "ranking_loss"],
    "training": ["epochs", "max_steps", "max_minutes", "fit_schedule_to_budget", "min_steps", "learning_rate",
                 "batch_size", "grad_accum_steps", "warmup_ratio", "warmup_steps", "weight_decay", "seed",
                 "group_by_length", "num_threads", "device", "precision"],
    "evaluation while training": ["eval_every_steps", "metric_for_best", "early_stopping_patience",
                                  "eval_sample_size", "report_to"],
}
OPTIONS = {
    "fit_schedule_to_budget": {"help": "with --max-minutes: keep the planned schedule and stop wherever the budget "
                                       "ends (default: shorten the schedule so that warmup and decay end at it)"},
}


def run_finetune_command(args: argparse.Namespace) -> int:
    from training.finetuning.finetune import FinetuneInputError, run_finetune
    from training.loop.output_lock import output_lock

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args, FinetuneSettings, "finetune")
    logging.getLogger("berth.finetune").info("settings: %s", settings.model_dump_json())
    with contextlib.ExitStack() as stack:
        if int(os.environ.get("RANK", "0")) == 0:  # before config.yaml: a second run must not overwrite the first's
            stack.enter_context(output_lock(settings.out, "berth finetune"))
        write_config(settings, settings.out, "finetune")  # `berth finetune --config OUT/config.yaml` runs it again
        try:
            metrics = run_finetune(settings)
        except FinetuneInputError as error:  # e.g. an unknown --metric-for-best: found before training starts
            fail("finetune", str(error))
    print(json.dumps({"dev_metrics": metrics, "out": str(settings.out)}, indent=2))
    return 0


def run_evaluate_command(args: argparse.Namespace) -> int:
    from training.finetuning.evaluate import evaluate_report, write_report
    from training.finetuning.evaluate_table import render_report

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    columns = {name: getattr(args, name) for name in ("text_column", "text_pair_column", "label_column", "id_column")
               if getattr(args, name) is not None}
    if args.out is not None:  # refused before the evaluation, not after it
        from training.errors import UserFacingError
        from training.loop.saving import file_in_the_way

        if args.out.is_dir():
            raise UserFacingError(f"--out {args.out} is a folder; name the report's JSON file")
        blocked = file_in_the_way(args.out.parent)
        if blocked is not None:
            raise UserFacingError(f"--out {args.out}: {blocked} is a file, not a folder")
    report, predictions = evaluate_report(args.model, args.data, data_format=args.data_format,
                                          limit=args.max_eval_examples, columns=columns)
    if args.out is not None:
        written = write_report(report, predictions, args.out)
        logging.getLogger("berth.evaluate").info("wrote the report to %s and one prediction per row to %s",
                                                 args.out, written)
    table = args.output_format == "table" or (args.output_format == "auto" and sys.stdout.isatty())
    print(render_report(report) if table else json.dumps(report, indent=2))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "finetune", help="fine-tune a BERT model folder into a task head",
        description="Fine-tune a BERT model folder (the embedded default, a Hugging Face folder or a berth "
                    "pretrained folder) for classification, sentence pairs, NER, SQuAD QA, multiple choice or "
                    "reranking, evaluate it on the dev file, and save a Hugging Face-compatible folder with "
                    "berth_task.json.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_settings_flags(p, FinetuneSettings, groups=GROUPS, names=FLAG_NAMES, options=OPTIONS,
                       rest_title="training loop (rarely changed)")
    add_config_flag(p)
    p.set_defaults(func=run_finetune_command)

    e = subparsers.add_parser(
        "evaluate", help="evaluate a fine-tuned model folder on a data file (official metrics)",
        description="Run a fine-tuned model folder over a data file of its task and print the official metrics "
                    "(accuracy/F1, conlleval entity F1, SQuAD EM/F1).")
    e.add_argument("model", type=Path, help="a `berth finetune` output folder")
    e.add_argument("data", type=Path, help="data file in a format of the model's task")
    e.add_argument("--format", dest="data_format", default="auto",
                   help=FinetuneSettings.model_fields["data_format"].description + " (default: %(default)s)")
    e.add_argument("--max-eval-examples", type=int, help="evaluate on at most this many examples (default: all)")
    for name, what in (("text_column", "text"), ("text_pair_column", "second text"), ("label_column", "label")):
        e.add_argument(f"--{name.replace('_', '-')}", help=f"table files: the column of the {what} (default: the "
                       "one the model was fine-tuned on, else " + FinetuneSettings.model_fields[name].default + ")")
    e.add_argument("--id-column", help="table files: the column of each row's id in the predictions file "
                   "(default: id; without it, the row number)")
    e.add_argument("--out", type=Path, help="write the report (metrics, per-label or per-type figures, confusion "
                   "matrix) as JSON here, and one prediction per row, with its id and gold answer, to "
                   "OUT_STEM.predictions.jsonl beside it")
    e.add_argument("--output-format", choices=("auto", "table", "json"), default="auto",
                   help="what goes to stdout: a table, or the report as JSON (default: a table on a terminal, "
                        "else JSON)")
    e.set_defaults(func=run_evaluate_command)
