"""`berth predict BUNDLE INPUT --out OUTPUT`: bulk inference over a file, with the HTTP routes' result fields.

Input: JSON lines, CSV/TSV or Parquet, read as a stream. Output: Parquet or JSON lines, one row per input
row (its id and row number, then the route's fields), written in resumable parts: run the same command
again after a crash and the finished parts are kept. Rows the task refuses go to OUTPUT.errors.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# request options of the routes, by flag: given ones go to the task's options (an option the task lacks is an error)
TASK_OPTIONS = ("top_k", "aggregation", "truncate", "normalize", "max_answer_length", "handle_impossible", "output",
                "layers", "top_n", "return_documents", "max_tokens_per_doc")


def run(args: argparse.Namespace) -> int:
    try:
        import pyarrow  # noqa: F401 - the output schema and Parquet files
    except ImportError:
        print("berth predict: needs pyarrow; install it with `pip install 'berth[serve,predict]'`", file=sys.stderr)
        return 2
    from predict.parts import ResumeRefused
    from predict.run import Columns, Job, predict
    from tasks.runtime.bundle import BundleError

    predict_on_ray = None
    if args.ray is not None:
        try:
            from predict.on_ray import predict_on_ray
        except ImportError as error:
            print(f"berth predict --ray: needs ray ({error}); install it with "
                  "`pip install 'berth[predict,ray]'`", file=sys.stderr)
            return 2
    options = {name: getattr(args, name) for name in TASK_OPTIONS if getattr(args, name) is not None}
    columns = Columns(text=args.text_column, pair=args.pair_column, question=args.question_column,
                      context=args.context_column, choices=args.choices_column, query=args.query_column,
                      documents=args.documents_column, id=args.id_column or "id")
    job = Job(bundle=args.bundle, input=args.input, output=args.out, options=options, columns=columns,
              input_format=args.input_format, output_format=args.format, window=args.window, threads=args.threads,
              lanes=args.lanes, max_batch_size=args.max_batch_size, pass_tokens=args.pass_tokens, restart=args.restart,
              keep_parts=args.keep_parts, progress=args.progress,
              id_column_given=args.id_column is not None)
    try:
        summary = predict(job) if predict_on_ray is None else predict_on_ray(job, args.ray, args.ray_actors)
    except (BundleError, ResumeRefused, ValueError, FileNotFoundError, ConnectionError) as error:
        print(f"berth predict: {error}", file=sys.stderr)
        return 2
    print(f"berth predict: {summary['rows']:,} rows in {summary['seconds']:.1f} s: {summary['written']:,} results in "
          f"{summary['output']}, {summary['errors']:,} bad rows in {summary['errors_file']}", file=sys.stderr)
    print(json.dumps(summary))
    return 0


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def layers(value: str) -> list[int]:
    return [int(x) for x in value.split(",") if x.strip()]


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "predict", help="bulk inference over a file (JSON lines, CSV/TSV, Parquet) with a bundle",
        description="Run BUNDLE over every row of INPUT and write one row per input row to OUTPUT (Parquet or JSON "
        "lines): the id column (or the row number), the row number, and the fields the task's HTTP route returns. "
        "The input is streamed a window of rows at a time; the output is written in parts beside OUTPUT "
        "(OUTPUT.parts), so the same command run again after a crash resumes where it stopped. Rows the task "
        "refuses (missing or empty column, too long without truncation, no [MASK]...) go to OUTPUT.errors.jsonl.",
    )
    p.add_argument("bundle", type=Path, metavar="BUNDLE",
                   help="a bundle folder (model.onnx, tokenizer.json, bundle.json)")
    p.add_argument("input", type=Path, metavar="INPUT", help="the input file (.jsonl, .csv, .tsv or .parquet)")
    p.add_argument("--out", type=Path, required=True, metavar="OUTPUT", help="the output file (.parquet or .jsonl)")
    files = p.add_argument_group("files and columns")
    files.add_argument("--input-format", choices=["jsonl", "csv", "tsv", "parquet"],
                       help="default: by INPUT's extension")
    files.add_argument("--format", choices=["parquet", "jsonl"], help="output format; default: by OUTPUT's extension")
    files.add_argument("--text-column", default="text", help="the text (classification, pair, ner, embedding, "
                                                             "fill-mask) (default: text)")
    files.add_argument("--pair-column", default="text_pair", help="pair: the second text (default: text_pair)")
    files.add_argument("--question-column", default="question", help="qa: the question (default: question)")
    files.add_argument("--context-column", default="context", help="qa and multiple-choice: the context "
                                                                   "(default: context)")
    files.add_argument("--choices-column", default="choices", help="multiple-choice: a list of texts (in CSV/TSV a "
                                                                   "JSON list) (default: choices)")
    files.add_argument("--query-column", default="query", help="rerank: the query (default: query)")
    files.add_argument("--documents-column", default="documents", help="rerank: a list of texts to rank (in CSV/TSV "
                                                                       "a JSON list) (default: documents)")
    files.add_argument("--id-column", help="copied to the output's id column (default: id; when the file has no "
                                           "id column, the row number is the id; a column named here must exist)")
    task = p.add_argument_group("task options (as the HTTP route's; default: the route's)")
    task.add_argument("--top-k", type=positive, help="classification, pair, qa, fill-mask: results per input")
    task.add_argument("--aggregation", choices=["simple", "first", "average", "max", "none"], help="ner")
    task.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=None,
                      help="classification, pair, embedding, multiple-choice: cut inputs longer than the model "
                           "takes (default) or, with --no-truncate, report them as bad rows")
    task.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                      help="embedding: L2-normalize sentence vectors (default: as the model)")
    task.add_argument("--output", choices=["sentence", "tokens"], help="embedding: one vector per text or per token")
    task.add_argument("--layers", type=layers, help="embedding with --output tokens: comma-separated hidden layers")
    task.add_argument("--top-n", type=positive, help="rerank: the n most relevant documents per query")
    task.add_argument("--return-documents", action=argparse.BooleanOptionalAction, default=None,
                      help="rerank: each result carries its document's text")
    task.add_argument("--max-tokens-per-doc", type=positive, help="rerank: cut every document to this many "
                                                                  "tokens first (flagged truncated)")
    task.add_argument("--max-answer-length", type=positive, help="qa: longest answer, in tokens")
    task.add_argument("--handle-impossible", action=argparse.BooleanOptionalAction, default=None,
                      help="qa: allow the empty answer (default: as the model was trained)")
    running = p.add_argument_group("running")
    running.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (default 0: the usable cores)")
    running.add_argument("--lanes", type=int, default=0,
                         help="forward passes side by side, each on threads / lanes threads (default 0: one a "
                              "thread on the CPU, one on CUDA)")
    running.add_argument("--window", type=positive, default=4096,
                         help="rows read, sorted by length and written as one part at a time (default: 4096)")
    running.add_argument("--max-batch-size", type=positive, default=64, help="most items in one forward pass "
                                                                             "(default: 64)")
    running.add_argument("--pass-tokens", type=positive, default=1024,
                         help="padded tokens of one forward pass on the CPU, as the service's cpu_pass_tokens "
                              "(default: 1024)")
    running.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                         help="run on a Ray cluster (pip install 'berth[predict,ray]'): ADDRESS as ray.init "
                              "takes it (host:6379, ray://host:10001; without one: RAY_ADDRESS or the cluster "
                              "this node is in). The bundle goes to the workers through Ray; INPUT is read and "
                              "OUTPUT written on this machine; the output is the file a local run writes")
    running.add_argument("--ray-actors", type=positive, default=0,
                         help="with --ray: actors holding the model (default: one per node with the CPUs "
                              "--threads asks, at least 1)")
    running.add_argument("--restart", action="store_true", help="discard the parts of an earlier run and start over")
    running.add_argument("--keep-parts", action="store_true", help="keep OUTPUT.parts after writing OUTPUT")
    running.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                         help="a progress line on stderr (default: on)")
    p.set_defaults(func=run)
    return p
