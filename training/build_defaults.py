"""`berth build-defaults`: fine-tune and export the four default bundles that `make run` serves.

Each default is the embedded base (all-MiniLM-L6-v2) fine-tuned on a small shipped sample
(data/samples, permissively licensed) within a time budget, then exported to an ONNX bundle:
int8 for the CPU, fp16 when a CUDA device is present. `--data-dir ../shared/data` trains on the
full research sets instead (STS-B, MRPC, SST-2, CoNLL-2003, SQuAD v1.1; issue 11 recipes).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"


@dataclass(frozen=True)
class Recipe:
    name: str  # the bundle (and model) name
    task: str
    train: str  # relative to the data folder
    dev: str
    options: dict = field(default_factory=dict)


SAMPLE_RECIPES = [
    Recipe("topics", "classification", "topic_questions/train.jsonl", "topic_questions/dev.jsonl",
           {"epochs": 2, "max_minutes": 2.5, "max_seq_length": 64}),
    Recipe("similarity", "pair", "stsb_images/train.jsonl", "stsb_images/dev.jsonl",
           {"epochs": 3, "max_minutes": 2, "regression": True, "max_seq_length": 64}),
    Recipe("entities", "ner", "wnut17/train.conll", "wnut17/dev.conll",
           {"epochs": 2, "max_minutes": 2.5, "max_seq_length": 128, "learning_rate": 1e-4}),
    Recipe("squad", "qa", "squad/train.json", "squad/dev.json",
           {"epochs": 1, "max_minutes": 5, "max_seq_length": 256, "doc_stride": 64, "learning_rate": 1e-4}),
]
# The research recipes (issue 11): one run at a time with every core, at most 45 minutes of training
# each; the budget fits the schedule (epochs are shortened, warmup and decay kept whole).
SHARED_RECIPES = [
    Recipe("stsb", "pair", "stsb/train.tsv", "stsb/dev.tsv",
           {"epochs": 4, "max_minutes": 45, "regression": True, "max_seq_length": 128, "batch_size": 32}),
    Recipe("mrpc", "pair", "mrpc/train.tsv", "mrpc/dev.tsv",
           {"epochs": 4, "max_minutes": 45, "learning_rate": 5e-5, "max_seq_length": 128}),
    Recipe("sst2", "classification", "sst2/train.tsv", "sst2/dev.tsv",
           {"epochs": 2, "max_minutes": 45, "max_seq_length": 64, "learning_rate": 5e-5}),
    Recipe("conll03", "ner", "conll2003/iob2/train.txt", "conll2003/iob2/valid.txt",
           {"epochs": 3, "max_minutes": 45, "learning_rate": 1e-4, "max_seq_length": 128}),
    Recipe("squad", "qa", "squad/v1.1/train-v1.1-subset-44articles.json", "squad/v1.1/dev-v1.1.json",
           {"epochs": 2, "max_minutes": 45, "max_seq_length": 256, "doc_stride": 64, "learning_rate": 1e-4}),
]


def build_defaults(out: Path, work: Path, data_dir: Path | None = None, only: list[str] | None = None,
                   force: bool = False, precision: str = "auto", threads: int | None = None,
                   minutes_per_model: float | None = None) -> list[Path]:
    """Build each missing bundle into `out/<name>`; fine-tuned checkpoints go to `work/<name>`.

    `minutes_per_model` replaces every recipe's training budget; the schedule is fitted to it.
    """
    from export.bundle_builder import export_bundle
    from export.parity import ParityError
    from training.finetune import FinetuneSettings, run_finetune

    recipes = SHARED_RECIPES if data_dir else SAMPLE_RECIPES
    root = Path(data_dir) if data_dir else SAMPLES
    if only:
        recipes = [r for r in recipes if r.name in only]
    if minutes_per_model is not None:
        recipes = [scaled_recipe(r, minutes_per_model) for r in recipes]
    automatic = precision == "auto"
    if automatic:
        precision = _default_precision()
    built = []
    for number, recipe in enumerate(recipes, 1):
        bundle = out / recipe.name
        if (bundle / "bundle.json").is_file() and not force:
            print(f"[{number}/{len(recipes)}] {recipe.name}: bundle exists, skipped ({bundle})", flush=True)
            continue
        started = time.time()
        print(f"[{number}/{len(recipes)}] {recipe.name}: fine-tuning {recipe.task} on {root / recipe.train} "
              f"(budget {recipe.options.get('max_minutes')} min)", flush=True)
        checkpoint = work / recipe.name
        settings = FinetuneSettings(task=recipe.task, train_file=root / recipe.train, dev_file=root / recipe.dev,
                                    out=checkpoint, threads=threads, **recipe.options)
        metrics = run_finetune(settings)
        print(f"[{number}/{len(recipes)}] {recipe.name}: dev {_headline(metrics)}; exporting {precision}", flush=True)
        try:
            export_bundle(checkpoint, bundle, precision=precision)
        except ParityError as error:
            if not automatic or precision == "fp32":
                raise
            # A small demo model with near-tied logits can flip labels under int8/fp16; the bundle then
            # ships in fp32 (exact parity) rather than not at all. An explicit --precision still fails.
            print(f"[{number}/{len(recipes)}] {recipe.name}: {precision} failed its parity gate, "
                  f"exporting fp32 instead:\n{error}", flush=True)
            export_bundle(checkpoint, bundle, precision="fp32")
        print(f"[{number}/{len(recipes)}] {recipe.name}: done in {(time.time() - started) / 60:.1f} min -> {bundle}",
              flush=True)
        built.append(bundle)
    return built


def scaled_recipe(recipe: Recipe, minutes: float) -> Recipe:
    """The recipe with a training budget of `minutes`, fitted: epochs cut to what fits, schedule whole."""
    return Recipe(recipe.name, recipe.task, recipe.train, recipe.dev,
                  {**recipe.options, "max_minutes": minutes, "fit_to_budget": True})


def _default_precision() -> str:
    """fp16 on a CUDA machine, int8 (dynamic quantization, CPU only) otherwise."""
    try:
        import onnxruntime

        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            import torch

            if torch.cuda.is_available():
                return "fp16"
    except ImportError:
        pass
    return "int8"


def _headline(metrics: dict[str, float]) -> str:
    keys = ("accuracy", "f1", "exact", "pearson", "spearman")
    return ", ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics) or "(no dev metrics)"


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    build_defaults(args.out, args.work, args.data_dir, args.only, args.force, args.precision, args.threads,
                   args.minutes_per_model)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "build-defaults", help="fine-tune and export the default bundles (what `make run` serves)",
        description="Fine-tune the embedded base model for classification (topics), sentence pairs "
                    "(similarity), NER (entities) and SQuAD QA (squad) on the shipped samples in data/samples, "
                    "each within a few minutes, and export an ONNX bundle of each into --out. Existing bundles "
                    "are kept unless --force.")
    p.add_argument("--out", type=Path, default=Path("models"), help="model repository folder (default: %(default)s)")
    p.add_argument("--work", type=Path, default=Path("runs/defaults"),
                   help="where the fine-tuned checkpoints go (default: %(default)s)")
    p.add_argument("--data-dir", type=Path, help="train on the full sets in this folder (e.g. ../shared/data)")
    p.add_argument("--only", nargs="+", help="build only these bundles by name")
    p.add_argument("--force", action="store_true", help="rebuild bundles that exist")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "fp16", "int8"],
                   help="auto: fp16 with CUDA, else int8 (default: %(default)s)")
    p.add_argument("--threads", type=int, help="CPU threads for training (default: every usable core)")
    p.add_argument("--minutes-per-model", type=float,
                   help="training budget of every recipe, in minutes: epochs cut to fit, warmup and decay kept "
                        "whole (e.g. 10 to check the --data-dir recipes quickly)")
    p.set_defaults(func=run)
