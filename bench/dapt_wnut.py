"""Domain-adaptive pretraining on tweets, judged by WNUT-17 NER: does continuing the base's masked LM on tweets help?

The tweets are the text only of the Broad Twitter Corpus (every `btc/*.conll`) and of the WNUT-17 train split
(never its dev or test split), one tweet per line. `berth pretrain --base default` continues masked-LM on them for a
fixed number of steps; then `berth finetune --task ner` on WNUT-17 (train: wnut17train.conll, dev:
emerging.dev.conll) starts once from that model and once from the base itself, with the same fine-tuning budget
and seeds. Every run is a real `berth` command in a child process of one thread: the base's fine-tunings run beside
the pretraining, then those of the pretrained model. A run whose record is already in --work is kept (rerun the
command after an interruption). Writes bench/results/pretrain/dapt_wnut.json (the commands, the pretraining's
record and each fine-tuning's dev metrics).

    python -m bench.dapt_wnut --pretrain-steps 40 --finetune-steps 80 --seeds 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.machine import machine_facts
from tasks.readers import read_conll

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
RESULTS = REPO / "bench" / "results" / "pretrain"


def write_tweets(data: Path, folder: Path) -> dict:
    """One text file per CoNLL file, one tweet (its tokens joined by spaces) per line; returns the counts."""
    sources = sorted((data / "btc").glob("*.conll")) + [data / "wnut17" / "wnut17train.conll"]
    folder.mkdir(parents=True, exist_ok=True)
    counts = {}
    for source in sources:
        tweets = [" ".join(example.tokens) for example in read_conll(source)]
        target = folder / f"{source.parent.name}-{source.stem}.txt"
        target.write_text("\n".join(tweets) + "\n", encoding="utf-8")
        counts[str(source.relative_to(data))] = len(tweets)
    return {"files": counts, "tweets": sum(counts.values()),
            "bytes": sum(p.stat().st_size for p in folder.glob("*.txt"))}


def berth(args: list[str], log: Path) -> float:
    """Run one `berth` command (this checkout's code) with its output in `log`; its wall seconds."""
    started = time.time()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "berth.cli", *args], stdout=out, stderr=subprocess.STDOUT,
                              cwd=REPO, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"berth {args[0]} failed ({done.returncode}), see {log}")
    return time.time() - started


def finetune_args(base: str, out: Path, seed: int, args: argparse.Namespace) -> list[str]:
    return ["finetune", "--task", "ner", "--base", base, "--train", str(DATA / "wnut17" / "wnut17train.conll"),
            "--dev", str(DATA / "wnut17" / "emerging.dev.conll"), "--out", str(out),
            "--max-steps", str(args.finetune_steps), "--lr", str(args.finetune_lr),
            "--batch-size", str(args.batch_size), "--max-seq-length", "64", "--seed", str(seed),
            "--threads", str(args.threads), "--no-progress-bar"]


def pretrain_args(tweets: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return ["pretrain", str(tweets), "--out", str(out), "--base", "default", "--max-steps", str(args.pretrain_steps),
            "--batch-size", str(args.batch_size), "--max-seq-length", "64", "--seed", "0",
            "--threads", str(args.threads), "--no-progress-bar"]


def summary(runs: list[dict]) -> dict:
    """Mean and spread of dev entity F1 per starting point."""
    out = {}
    for arm in ("base", "dapt"):
        f1 = [r["dev_metrics"]["f1"] for r in runs if r["arm"] == arm]
        if f1:
            out[arm] = {"f1": f1, "mean": statistics.fmean(f1), "min": min(f1), "max": max(f1),
                        "stdev": statistics.stdev(f1) if len(f1) > 1 else None}
    if "base" in out and "dapt" in out:
        out["dapt_minus_base"] = out["dapt"]["mean"] - out["base"]["mean"]
    return out


def collect(work: Path, args: argparse.Namespace) -> dict:
    """The record of the runs finished in `work`: the pretraining's and each fine-tuning's own records."""
    record = {"machine": machine_facts(threads=args.threads), "settings": {k: str(v) for k, v in vars(args).items()},
              "tweets": json.loads((work / "tweets.json").read_text()),
              "commands": {"pretrain": pretrain_args(work / "tweets", work / "dapt", args),
                           "finetune": finetune_args("BASE", work / "ner-ARM-seedSEED", 0, args)},
              "runs": []}
    pretrained = work / "dapt" / "pretrain_run.json"
    if pretrained.is_file():
        run = json.loads(pretrained.read_text())
        record["pretrain"] = {"head_warmup": run["head_warmup"], "heldout_eval": run["heldout_eval"],
                              "learning_rate": run["learning_rate"], "train_tokens": run["train_tokens"],
                              "data": run["data"], "train_result": run["train_result"]}
    for path in sorted(work.glob("ner-*-seed*/finetune_run.json")):
        arm, seed = path.parent.name.removeprefix("ner-").split("-seed")
        run = json.loads(path.read_text())
        record["runs"].append({"arm": arm, "seed": int(seed), "dev_metrics": run["dev_metrics"],
                               "steps": run["schedule"]["steps"], "train_minutes": run["train_minutes"]})
    record["summary"] = summary(record["runs"])
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrain-steps", type=int, default=40)
    parser.add_argument("--finetune-steps", type=int, default=80)
    parser.add_argument("--finetune-lr", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--threads", type=int, default=1, help="per process")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the runs (default: a temporary one); a run whose record is there is kept")
    parser.add_argument("--collect", action="store_true", help="run nothing: write the record of the runs in --work")
    parser.add_argument("--output", type=Path, default=RESULTS / "dapt_wnut.json")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="dapt-wnut-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.collect:
        tweets = work / "tweets"
        (work / "tweets.json").write_text(json.dumps(write_tweets(DATA, tweets)))

        def run(command: list[str], out: Path, record: str) -> None:
            if not (out / record).is_file():
                seconds = berth(command, out.with_suffix(".log"))
                print(f"{out.name}: {seconds:.0f} s", flush=True)

        def finetune(arm: str, base: str, seed: int) -> threading.Thread:
            out = work / f"ner-{arm}-seed{seed}"
            return threading.Thread(target=run, args=(finetune_args(base, out, seed, args), out, "finetune_run.json"))

        # the base's fine-tunings beside the pretraining, then those of the pretrained model: one process each
        first = [threading.Thread(target=run, args=(pretrain_args(tweets, work / "dapt", args), work / "dapt",
                                                    "pretrain_run.json"))]
        first += [finetune("base", "default", seed) for seed in args.seeds]
        for thread in first:
            thread.start()
        first[0].join()
        second = [finetune("dapt", str(work / "dapt"), seed) for seed in args.seeds]
        for thread in second:
            thread.start()
        for thread in first[1:] + second:
            thread.join()
    record = collect(work, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["summary"], indent=1))


if __name__ == "__main__":
    main()
