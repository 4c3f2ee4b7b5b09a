"""The rerank recipe's dev set (data/samples/rerank/dev.json: each question ranks the embeddings model's top 5
paragraphs of its article): the embeddings model against trained rerank model folders, with standard errors.

Per model folder: its dev MRR@10 and top-1 with the standard error of MRR@10, and its MRR@10 minus the
embeddings model's with the paired standard error (same questions), and the same against the first folder
given, from the folder's own dev evaluation (`dev_outputs.npz`, reused when it holds these weights' outputs on
these inputs, else computed and kept there), and what it trained on (examples seen, examples/s, minutes,
threads, precision; finetune_run.json). The embeddings model is the build's first stage, exported from the
embedded base. Usage, from the repository root:

    .venv/bin/python -m bench.rerank_dev runs/e54/before runs/e54/hard --out bench/results/rerank_dev.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench.machine import machine_facts
from tasks.first_stage import embedding_rankings
from tasks.rerank import RerankOptions, mrr_standard_error, ranking_metrics, read_article_questions

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "data" / "samples" / "rerank" / "dev.json"
RESULTS = Path(__file__).resolve().parent / "results"


def reranker_rankings(folder: Path, examples: list) -> list[list[int]]:
    """Each question's candidates as the model folder ranks them, through the served steps."""
    from export.onnx_export import load_finetuned
    from tasks.registry import definition
    from tasks.runtime.tokenizer import load_tokenizer
    from training.bert.torch_runner import torch_item_runner
    from training.finetuning import output_cache

    model, spec, _ = load_finetuned(folder)
    model.eval()
    cache = folder / output_cache.CACHE_FILE
    run = output_cache.Reusing(torch_item_runner(model, f"{folder.name}: dev"), model, cache)
    recorded = output_cache.Recorder(run)
    task = definition("rerank")
    results = task.predict(load_tokenizer(folder), spec, [task.served_input(e) for e in examples], recorded,
                           RerankOptions())
    if not run.reused:  # kept, so that the next comparison of this folder on these questions reuses them
        recorded.save(cache, model)
    return [[entry["index"] for entry in ranked] for ranked in results]


def training_facts(folder: Path) -> dict[str, Any]:
    run = json.loads((folder / "finetune_run.json").read_text(encoding="utf-8"))
    settings = run["settings"]
    return {"train_file": settings["train_file"], "base": settings["base"], "budget_minutes": settings["max_minutes"],
            "min_steps": settings["min_steps"], "steps": run["schedule"]["steps"],
            "examples_seen": round(float(run["train_result"]["epochs"]) * run["train_examples"]),
            "examples_per_s": round(run["speed"]["examples_per_s"], 2), "train_minutes": run["train_minutes"],
            "threads": run["speed"]["threads"], "precision": run["precision"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", type=Path, nargs="+", help="fine-tuned rerank model folders")
    parser.add_argument("--dev", type=Path, default=DEV)
    parser.add_argument("--questions", type=int, default=0, help="the first n questions (round-robin over the "
                        "articles, as a fine-tuning run's --max-eval-examples takes them); 0: all")
    parser.add_argument("--embeddings", type=Path, help="an embeddings bundle of the base (default: exported here)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "rerank_dev.json")
    args = parser.parse_args(argv)

    from berth.build_defaults import build_embeddings_bundle

    examples = read_article_questions(args.dev)
    examples = examples[: args.questions] if args.questions else examples
    relevant = [e.relevant for e in examples]
    with tempfile.TemporaryDirectory() as folder:
        bundle = args.embeddings or build_embeddings_bundle(Path(folder), threads=args.threads or None)
        first_stage, _ = embedding_rankings(bundle, examples, args.threads or None)
    rows = {"embeddings (bi-encoder)": {**ranking_metrics(first_stage, relevant),
                                        "mrr_at_10_se": mrr_standard_error(first_stage, relevant)}}
    first_model: tuple[str, list, float] | None = None  # the first folder's name, rankings and MRR@10
    for folder in args.models:
        rankings = reranker_rankings(folder, examples)
        metrics = ranking_metrics(rankings, relevant)
        rows[folder.name] = {**metrics, "mrr_at_10_se": mrr_standard_error(rankings, relevant),
                             "minus_embeddings": metrics["mrr_at_10"] - rows["embeddings (bi-encoder)"]["mrr_at_10"],
                             "minus_embeddings_se": mrr_standard_error(rankings, relevant, first_stage),
                             **training_facts(folder)}
        if first_model is None:
            first_model = (folder.name, rankings, metrics["mrr_at_10"])
        else:
            rows[folder.name].update({"against": first_model[0], "minus_against": metrics["mrr_at_10"] - first_model[2],
                                      "minus_against_se": mrr_standard_error(rankings, relevant, first_model[1])})
    result = {"dev": str(args.dev), "questions": len(examples), "rankers": rows, "machine": machine_facts(
        args.threads or None)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(markdown(result))
    return result


def markdown(result: dict[str, Any]) -> str:
    lines = [f"{result['questions']} questions, 5 candidates each ({result['dev']})", "",
             "| ranker | trained on | examples seen (examples/s, threads) | MRR@10 (± s.e.) | minus the embeddings "
             "model's (± paired s.e.) | minus the first model's (± paired s.e.) | top-1 |",
             "|---|---|---|---|---|---|---|"]
    for name, row in result["rankers"].items():
        data = Path(row["train_file"]) if "train_file" in row else Path()
        trained = (f"`{data.parent.name}/{data.name}` from {'the base' if row['base'] == 'default' else row['base']}"
                   if "train_file" in row else "—")
        seen = (f"{row['examples_seen']:,} ({row['examples_per_s']:g}/s, {row['threads']})" if "train_file" in row
                else "—")
        gain = (f"{row['minus_embeddings']:+.3f} (± {row['minus_embeddings_se']:.3f})" if "minus_embeddings" in row
                else "")
        against = (f"{row['minus_against']:+.3f} (± {row['minus_against_se']:.3f}) against {row['against']}"
                   if "against" in row else "")
        lines.append(f"| {name} | {trained} | {seen} | {row['mrr_at_10']:.3f} (± {row['mrr_at_10_se']:.3f}) | {gain} "
                     f"| {against} | {row['top1']:.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
