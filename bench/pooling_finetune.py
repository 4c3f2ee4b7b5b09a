"""CLS pooling with a trained pooler vs mean pooling, fine-tuned with the defaults on a user-sized file.

The measurement behind the pooling a saved classification head uses by default. A user's first file
is a few hundred rows: this makes one from the shipped topics sample (300 training rows, 4 labels of
uneven counts, 80 dev rows), fine-tunes the default base on it with the default schedule once per
pooling and seed, side by side in one process, and scores each saved folder on the dev rows three
ways: berth's own dev metric, transformers' `pipeline("text-classification")` on the same folder, and
how many dev labels the two agree on. A head that transformers cannot reproduce shows as a gap
between the first two.

    python -m bench.pooling_finetune [--seeds 42 1] [--epochs 3] [--poolings cls mean] [--output FILE]

Writes ``bench/results/pooling_finetune.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from bench.machine import machine_facts

REPO = Path(__file__).resolve().parents[1]
TOPICS = REPO / "data" / "samples" / "topics"
RESULTS = REPO / "bench" / "results" / "pooling_finetune.json"
TRAIN_COUNTS = {"science_tech": 140, "places": 80, "people": 50, "arts_media": 30}  # 300 rows, uneven
DEV_ROWS = 80


def user_file(folder: Path, seed: int = 0) -> tuple[Path, Path]:
    """train.csv and dev.csv as a user would bring them: an id, a text and a label column, uneven labels."""
    import csv

    rng = random.Random(seed)

    def rows(path: Path, counts: dict[str, int] | None, total: int | None) -> list[dict]:
        lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        lines = [r for r in lines if r["label"] in TRAIN_COUNTS]
        rng.shuffle(lines)
        if counts:
            return [r for label, n in counts.items() for r in [x for x in lines if x["label"] == label][:n]]
        return lines[:total]

    paths = []
    for name, chosen in (("train", rows(TOPICS / "train.jsonl", TRAIN_COUNTS, None)),
                         ("dev", rows(TOPICS / "dev.jsonl", None, DEV_ROWS))):
        path = folder / f"{name}.csv"
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=["ticket_id", "text", "label"])
            writer.writeheader()
            for i, row in enumerate(chosen):
                writer.writerow({"ticket_id": f"{name}-{i}", "text": row["text"], "label": row["label"]})
        paths.append(path)
    return paths[0], paths[1]


def pipeline_labels(folder: Path, texts: list[str], trust_remote_code: bool) -> list[str] | None:
    """transformers' text-classification pipeline on the folder; None where transformers refuses it."""
    from transformers import pipeline

    try:
        classify = pipeline("text-classification", model=str(folder), device="cpu",
                            trust_remote_code=trust_remote_code)
    except ValueError:  # an unrecognized model type: refused rather than loaded as another model
        return None
    return [r["label"] for r in classify(texts, batch_size=16, truncation=True, max_length=128)]


def berth_labels(folder: Path, texts: list[str]) -> list[str]:
    import torch

    from tasks import common
    from tasks.runtime.batching import pad_batch
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.checkpoint import load_pretrained
    from training.bert.model import BertForSequenceClassification

    model, _ = load_pretrained(BertForSequenceClassification, folder)
    tokenizer = load_tokenizer(folder)
    labels = []
    with torch.no_grad():
        for start in range(0, len(texts), 16):
            items = [common.encode_classification(tokenizer, t, None, max_length=128) for t in texts[start:start + 16]]
            feeds = {k: torch.from_numpy(v) for k, v in pad_batch(items).items()}
            logits = model(feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])["logits"]
            labels += [model.config.id2label[int(i)] for i in logits.argmax(-1)]
    return labels


def _accuracy(labels: list[str] | None, gold: list[str]) -> float | None:
    return None if labels is None else sum(a == b for a, b in zip(labels, gold)) / len(gold)


def _cell(value: float | None) -> str:
    return "refused" if value is None else f"{value:.3f}"


def write(output: Path, threads: int, runs: list[dict]) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps({"machine": machine_facts(threads), "train_counts": TRAIN_COUNTS,
                                  "dev_rows": DEV_ROWS, "runs": runs}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    import csv

    from training.finetuning.finetune import FinetuneSettings, run_finetune
    from training.loop.threads import default_threads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 1])
    parser.add_argument("--epochs", type=float, nargs="+", default=[3.0])
    parser.add_argument("--poolings", nargs="+", choices=("cls", "mean"), default=["cls", "mean"])
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    threads = default_threads()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        train, dev = user_file(Path(tmp))
        with dev.open(encoding="utf-8") as f:
            dev_rows = list(csv.DictReader(f))
        texts, gold = [r["text"] for r in dev_rows], [r["label"] for r in dev_rows]
        for epochs in args.epochs:
            for seed in args.seeds:
                for pooling in args.poolings:
                    out = Path(tmp) / f"{pooling}-{seed}-{epochs}"
                    started = time.time()
                    metrics = run_finetune(FinetuneSettings(
                        task="classification", train_file=train, dev_file=dev, out=out, pooling=pooling, seed=seed,
                        epochs=epochs, num_threads=threads, progress_bar=False))
                    seconds = time.time() - started
                    ours = berth_labels(out, texts)
                    plain = pipeline_labels(out, texts, trust_remote_code=False)
                    theirs = pipeline_labels(out, texts, trust_remote_code=True)
                    steps = json.loads((out / "finetune_run.json").read_text())["schedule"]["steps"]
                    run = {"pooling": pooling, "seed": seed, "epochs": epochs, "steps": steps,
                           "seconds": round(seconds, 1), "berth_dev_accuracy": metrics["accuracy"],
                           "plain_pipeline_dev_accuracy": _accuracy(plain, gold),
                           "transformers_pipeline_dev_accuracy": _accuracy(theirs, gold),
                           "labels_agreeing": _accuracy(theirs, ours)}
                    print(json.dumps(run), flush=True)
                    runs.append(run)
                    write(args.output, threads, runs)  # after every run: a long sweep keeps what it measured
    print(f"\n{'pooling':<8}{'seed':>6}{'epochs':>8}{'steps':>7}{'berth acc':>11}{'plain pipeline':>16}"
          f"{'trust_remote_code':>19}{'agree':>8}")
    for r in runs:
        print(f"{r['pooling']:<8}{r['seed']:>6}{r['epochs']:>8g}{r['steps']:>7}{r['berth_dev_accuracy']:>11.3f}"
              f"{_cell(r['plain_pipeline_dev_accuracy']):>16}{_cell(r['transformers_pipeline_dev_accuracy']):>19}"
              f"{_cell(r['labels_agreeing']):>8}")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
