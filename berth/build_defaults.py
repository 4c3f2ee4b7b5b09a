"""`berth build-defaults`: fine-tune and export the five default bundles that `make run` serves, and
export the embedded base itself as the `embeddings` bundle (seconds, no training).

Each default is the embedded base (all-MiniLM-L6-v2) fine-tuned on a small shipped sample
(data/samples, permissively licensed) and exported to an ONNX bundle: int8 for the CPU, fp16 when
a CUDA device is present (fp32 when that export fails its parity gate). The sample recipes are
budgeted in minutes (`max_minutes`, the plan fitted to the measured speed) with a floor in steps
(`min_steps`): a faster CPU trains on more of each sample, a slow or busy one the minimum, later;
the record says per model how much it saw and why (`training_sizing`).
Each recipe has a dev-metric floor: a model under it trains on for a second, bounded round, and
if it is still under, its bundle says so (`quality.below_floor`) and the service lists it as
`below_quality_floor`. `--data-dir DIR` trains on the full research sets instead
(SST-2, MRPC with the best of three seeds, STS-B, CoNLL-2003, SQuAD v1.1, and SQuAD v2.0 from the
v1.1 model on a split of the v2.0 dev set, training/finetuning/squad_v2_split.py). A recipe with seeds is a
one-cell `berth sweep` (berth/sweep/run.py) in work/<name>-seeds; its record, sweep.json, is copied
into work/<name> with the winner's model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import resource
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tasks.runtime.progress import Progress
from tasks.shipped_samples import SAMPLES

EXAMPLES = SAMPLES / "examples.json"  # model name -> example inputs written into its bundle (the playground's)
RECORD_FILE = "build_record.json"  # in --work: per-model minutes (wall and CPU), dev metrics, floors, machine
FIRST_STAGE_FOLDER = "first-stage-embeddings"  # in --work: the embedded base exported for the rerank guard
NOT_SHIPPED_SUFFIX = "-not-shipped.json"  # in --work: a model its guard refused, with the verdict; not retrained
log = logging.getLogger("berth.build_defaults")


def say(line: str) -> None:
    """A status line: to stderr (stdout carries the command's result only)."""
    print(line, file=sys.stderr, flush=True)


class BuildDefaultsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    out: Path = Field(Path("models"), description="model repository folder the bundles go to")
    work: Path = Field(Path("runs/defaults"), description="where the fine-tuned model folders and the build "
                       "record go")
    data_dir: Path | None = Field(None, description="train on the full research sets in this folder (laid out as "
                                  "docs/data.md says) instead of the shipped samples")
    only: list[str] | None = Field(None, description="build only these bundles, by name")
    force: bool = Field(False, description="rebuild bundles that exist")
    precision: Literal["auto", "fp32", "fp16", "int8"] = Field(
        "auto", description="auto: fp16 with CUDA, else int8 (fp32 when that fails its parity gate)")
    threads: int | None = Field(None, gt=0, description="CPU threads for training (default: every usable core)")
    minutes_per_model: float | None = Field(
        None, gt=0, description="training budget of every recipe, in minutes: epochs cut to fit, warmup and decay "
        "kept whole (e.g. 10 to check the --data-dir recipes quickly; a recipe with seeds gets it per seed)")
    recipes: Path | None = Field(None, description="recipe file (YAML or JSON) to build from instead of the shipped "
                                 "ones (berth/recipes/samples.yaml; research.yaml with data_dir)")


@dataclass(frozen=True)
class Recipe:
    name: str  # the bundle (and model) name
    task: str
    train: str  # relative to the data folder
    dev: str
    options: dict = field(default_factory=dict)
    floor: tuple[str, float] | None = None  # (dev metric, its minimum for the model to ship unmarked)
    more: dict = field(default_factory=dict)  # the second round's options when the first is under the floor
    minutes: float = 5.0  # expected minutes (training, evaluation, export) on 2 idle cores: the ETA's basis
    seeds: tuple[int, ...] = ()  # restarts (the paper's, for small sets): one run per seed, the best dev `select` kept
    select: str | None = None  # the dev metric that picks among the seeds' runs
    start_from: str | None = None  # another recipe whose fine-tuned model is this one's base (built before it)
    prepare: str | None = None  # a derived data set (DERIVED_DATA) made in work/<name>-data; train/dev name its files
    beat_embeddings: bool = False  # the rerank guard: dev MRR@10 above the embeddings model's, else the fallbacks
    fallbacks: tuple[dict, ...] = ()  # the next recipes when the guard fails: field overrides, options merged


RECIPES = Path(__file__).resolve().parent / "recipes"  # the default recipes, as data: samples.yaml, research.yaml


def load_recipes(path: Path) -> list[Recipe]:
    """The recipes of a YAML (or JSON) file: `recipes:`, a list of Recipe fields (see berth/recipes/samples.yaml).

    Checked before anything trains: unknown recipe fields and options that are not FinetuneSettings
    fields are refused (ConfigError, one line)."""
    from berth.config_files import ConfigError, read_config
    from training.finetuning.settings import FinetuneSettings

    entries = read_config(path).get("recipes")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"recipe file {path}: `recipes:` must be a non-empty list")
    known = {f.name for f in dataclasses.fields(Recipe)}
    recipes = []
    for number, entry in enumerate(entries, 1):
        where = f"recipe file {path}, recipe {number} ({entry.get('name', '?') if isinstance(entry, dict) else '?'})"
        if not isinstance(entry, dict) or not {"name", "task", "train", "dev"} <= set(entry):
            raise ConfigError(f"{where}: needs name, task, train and dev")
        if unknown := sorted(set(entry) - known):
            raise ConfigError(f"{where}: unknown field(s) {', '.join(unknown)}")
        fallbacks = entry.get("fallbacks") or []
        if not isinstance(fallbacks, list) or not all(isinstance(f, dict) for f in fallbacks):
            raise ConfigError(f"{where}: fallbacks must be a list of recipe field overrides")
        for fallback in fallbacks:
            if unknown := sorted((set(fallback) - known) | (set(fallback) & {"name", "fallbacks"})):
                raise ConfigError(f"{where}: a fallback overrides no recipe field {', '.join(unknown)}")
        for key, options in [("options", entry.get("options")), ("more", entry.get("more"))] + [
                ("fallbacks options", f.get("options")) for f in fallbacks]:
            if bad := sorted(set(options or {}) - set(FinetuneSettings.model_fields)):
                raise ConfigError(f"{where}: {key} names no setting {', '.join(bad)}")
        values = {**entry, "floor": tuple(entry["floor"]) if entry.get("floor") else None,
                  "seeds": tuple(entry.get("seeds") or ()), "fallbacks": tuple(fallbacks)}
        recipes.append(Recipe(**values))
    return recipes


SAMPLE_RECIPES = load_recipes(RECIPES / "samples.yaml")  # data/samples: what `make run` serves
SHARED_RECIPES = load_recipes(RECIPES / "research.yaml")  # --data-dir: the full research sets


def _squad_v2_split(root: Path, out: Path) -> None:
    from training.finetuning.squad_v2_split import split_squad_v2

    split_squad_v2(root / "squad/v2.0/dev-v2.0.derived.json", out, train_articles=18,
                   unanswerable_from=root / "squad/v1.1/train-v1.1-subset-44articles.json", unanswerable=1000)


# Derived data sets a recipe can train on: name -> (data folder, its output folder) -> None.
DERIVED_DATA = {"squad-v2-split": _squad_v2_split}


def build_defaults(out: Path, work: Path, data_dir: Path | None = None, only: list[str] | None = None,
                   force: bool = False, precision: str = "auto", threads: int | None = None,
                   minutes_per_model: float | None = None, recipes_file: Path | None = None) -> list[Path]:
    """Build each missing bundle into `out/<name>`; fine-tuned model folders go to `work/<name>`.

    `minutes_per_model` replaces every recipe's training budget; the schedule is fitted to it.
    `recipes_file` replaces the shipped recipes (berth/recipes/).
    """
    recipes = load_recipes(recipes_file) if recipes_file else SHARED_RECIPES if data_dir else SAMPLE_RECIPES
    root = Path(data_dir) if data_dir else SAMPLES
    if only:
        recipes = [r for r in recipes if r.name in only]
    if minutes_per_model is not None:
        recipes = [scaled_recipe(r, minutes_per_model) for r in recipes]
    automatic = precision == "auto"
    if automatic:
        precision = _default_precision()
    refused = {r.name: work / f"{r.name}{NOT_SHIPPED_SUFFIX}" for r in recipes}
    todo = [r for r in recipes
            if force or not ((out / r.name / "bundle.json").is_file() or refused[r.name].is_file())]
    for recipe in recipes:
        if recipe in todo:
            continue
        if (out / recipe.name / "bundle.json").is_file():
            say(f"{recipe.name}: bundle exists, skipped ({out / recipe.name})")
        else:
            say(f"{recipe.name}: not shipped by an earlier build (its guard: {refused[recipe.name]}), skipped; "
                f"--force trains it again")
    eta = Eta([r.minutes for r in todo])
    built_at = time.time()
    record = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "precision": precision,
              "machine": _machine(), "models": []}
    built = []
    examples = default_examples()
    for number, recipe in enumerate(todo, 1):
        tag = f"[{number}/{len(todo)}] {recipe.name}"
        say(f"{tag}: fine-tuning {recipe.task} on {_data_folder(recipe, root, work) / recipe.train} "
            f"(expected ~{recipe.minutes:g} min on 2 idle cores; {eta.remaining_text()})")
        started, cpu_started = time.time(), _cpu_seconds()
        model_folder, metrics, quality = _train_guarded(recipe, root, out, work, threads, tag)
        bundle = out / recipe.name
        if model_folder is not None:
            refused[recipe.name].unlink(missing_ok=True)
            _export(model_folder, bundle, precision, automatic, tag, examples.get(recipe.name))
            _record_quality(bundle, quality)
        else:
            shutil.rmtree(bundle, ignore_errors=True)  # an earlier build's model is not left to be served either
            # Kept so that the next `make run` does not train it again for nothing (--force does).
            refused[recipe.name].write_text(json.dumps(quality["guard"], indent=2) + "\n", encoding="utf-8")
            log.warning("%s: NOT SHIPPED: no recipe's reranker beat the embeddings model on its dev set (%s)",
                        recipe.name, quality["guard"]["tries"])
        eta.done(time.time() - started)
        # CPU time says what the wall clock would have been on idle cores: on a shared machine it is the
        # figure to compare with the recipe's expected minutes.
        wall, cpu = (time.time() - started) / 60, (_cpu_seconds() - cpu_started) / 60
        if model_folder is None:
            say(f"{tag}: not shipped, after {wall:.1f} min (CPU {cpu:.1f} min) ({eta.remaining_text()})")
            record["models"].append({"name": recipe.name, "task": recipe.task, "shipped": False,
                                     "dev_metrics": metrics, "quality": quality, "wall_minutes": round(wall, 2),
                                     "cpu_minutes": round(cpu, 2), "expected_minutes": recipe.minutes})
        else:
            say(f"{tag}: done in {wall:.1f} min (CPU {cpu:.1f} min) -> {bundle} ({eta.remaining_text()})")
            record["models"].append(_model_record(recipe, model_folder, bundle, metrics, quality, wall, cpu))
            say(f"{tag}: trained on {record['models'][-1]['sizing']['why']}")
        # Rewritten after each model, so an interrupted build keeps the record of what it finished.
        record.update(total_minutes=round((time.time() - built_at) / 60, 2), load_average_end=_load_average())
        (work / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        if model_folder is not None:
            built.append(bundle)
    if todo:
        say(f"built {len(todo)} bundle(s) in {record['total_minutes']:.1f} min; record: {work / RECORD_FILE}")
    return built


EMBEDDINGS_BUNDLE = "embeddings"


def build_embeddings_bundle(out: Path, force: bool = False, threads: int | None = None) -> Path | None:
    """The embedded base as it is (a sentence-transformers model: mean pooling, normalized) as the
    `embeddings` bundle: export only, no training. fp32, so it answers as sentence-transformers does."""
    from export.bundle_builder import export_bundle
    from export.settings import ExportSettings
    from training.bert.checkpoint import default_base_path

    bundle = out / EMBEDDINGS_BUNDLE
    if (bundle / "bundle.json").is_file() and not force:
        say(f"[embeddings] bundle exists, skipped ({bundle})")
        return None
    started = time.time()
    with Progress("[embeddings] exporting"):  # a line at least every 30 s while it works
        export_bundle(ExportSettings(model_folder=default_base_path(), out=bundle, precision="fp32", task="embedding",
                                     optimize="never", parity_examples=64, threads=threads),
                      example_inputs=default_examples().get(EMBEDDINGS_BUNDLE))
    say(f"[embeddings] exported the base model in {time.time() - started:.0f} s -> {bundle}")
    return bundle


def default_examples() -> dict[str, list]:
    """Model name -> the example inputs its bundle carries (data/samples/examples.json)."""
    return json.loads(EXAMPLES.read_text(encoding="utf-8"))


def _model_record(recipe: Recipe, model_folder: Path, bundle: Path, metrics: dict[str, float], quality: dict,
                  wall: float, cpu: float) -> dict:
    from tasks.bundle_checks import load_bundle

    run = json.loads((model_folder / "finetune_run.json").read_text())
    return {"name": recipe.name, "task": recipe.task, "train": recipe.train, "dev": recipe.dev,
            "options": recipe.options, "train_examples": run["train_examples"], "dev_examples": run["dev_examples"],
            "sizing": training_sizing(run), "dev_metrics": metrics, "quality": quality,
            "precision": load_bundle(bundle).precision, "wall_minutes": round(wall, 2), "cpu_minutes": round(cpu, 2),
            "expected_minutes": recipe.minutes}


def training_sizing(run: dict) -> dict:
    """How much of its data a run trained on, and why: the measured speed against the time budget
    (`max_minutes`), or the whole plan (every example, every epoch) when it fitted. From finetune_run.json."""
    settings, result, schedule = run["settings"], run["train_result"], run["schedule"]
    shipped, epochs = run["train_examples"], float(result["epochs"])
    budget = settings.get("max_minutes")
    speed = run["speed"]["examples_per_s"]
    passes = round(epochs * shipped)
    record = {"budget_minutes": budget, "train_minutes": run["train_minutes"], "examples_per_s": round(speed, 2),
              "precision": run["precision"], "threads": run["speed"]["threads"], "shipped_examples": shipped,
              "epochs": round(epochs, 3), "examples_seen": passes, "distinct_examples": min(shipped, passes)}
    planned, least = schedule["planned_steps"], settings.get("min_steps") or 0
    pace = f"{speed:.1f} examples/s ({run['precision']}, {run['speed']['threads']} threads)"
    if least and budget and schedule["steps"] == least < planned and run["train_minutes"] > budget:
        record["why"] = (f"the minimum of {least} steps ({passes:,} examples, {epochs:.2f} epochs of {shipped:,}): "
                         f"at {pace} the {budget:g}-minute budget fits fewer, so it trained "
                         f"{run['train_minutes']:g} min")
    elif schedule["fitted_to_budget"] or schedule["stopped_by"] == "max_minutes":
        record["why"] = (f"the {budget:g}-minute budget at {pace} fits {schedule['steps']} of the {planned} planned "
                         f"steps: {passes:,} examples seen, {epochs:.2f} epochs of {shipped:,}")
    else:
        within = f" within the {budget:g}-minute budget" if budget else ""
        record["why"] = (f"every example, {epochs:g} epoch(s) of {shipped:,}, trained in {run['train_minutes']:g} "
                         f"min{within} at {pace}")
    return record


def _load_average() -> list[float]:
    import os

    return [round(x, 2) for x in os.getloadavg()]


def _machine() -> dict:
    """The machine a build ran on: cores, torch threads, CPU model and flags, load, git revision, torch."""
    import os

    import torch

    from training.provenance import cpu_model_and_flags, git_revision

    processor, flags = cpu_model_and_flags()

    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "processor": processor, "cpu_flags": flags,
            "load_average_start": _load_average(),
            "git_revision": git_revision(), "torch": torch.__version__}


def scaled_recipe(recipe: Recipe, minutes: float) -> Recipe:
    """The recipe with a training budget of `minutes`, fitted: epochs cut to what fits, schedule whole."""
    return dataclasses.replace(recipe, options={**recipe.options, "max_minutes": minutes,
                                                "fit_schedule_to_budget": True})


class Eta:
    """Minutes left: the recipes' expected minutes, scaled by how fast the finished ones went here."""

    def __init__(self, expected: list[float]):
        self.expected = expected
        self.actual: list[float] = []  # minutes of each finished recipe

    def done(self, seconds: float) -> None:
        self.actual.append(seconds / 60)

    def remaining_text(self) -> str:
        finished = len(self.actual)
        left = sum(self.expected[finished:])
        if not left:
            return f"all built in {sum(self.actual):.1f} min"
        pace = sum(self.actual) / sum(self.expected[:finished]) if finished else 1.0
        return f"ETA for the rest ~{left * pace:.0f} min"


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _train_to_floor(recipe: Recipe, data_root: Path, work: Path, threads: int | None,
                    tag: str) -> tuple[Path, dict[str, float], dict]:
    """Fine-tune; under the floor, train on from that model for the recipe's second round (once)."""
    from training.finetuning.finetune import FinetuneSettings, run_finetune

    root = _data_folder(recipe, data_root, work)
    if recipe.prepare:
        DERIVED_DATA[recipe.prepare](data_root, root)
    base = {}
    if recipe.start_from:
        base_folder = work / recipe.start_from
        if not (base_folder / "config.json").is_file():
            raise SystemExit(f"{recipe.name} starts from the {recipe.start_from} model, and {base_folder} has none: "
                             f"build {recipe.start_from} first (--only {recipe.start_from} {recipe.name})")
        base = {"base": str(base_folder)}
    model_folder = work / recipe.name
    settings = FinetuneSettings(task=recipe.task, train_file=root / recipe.train, dev_file=root / recipe.dev,
                                out=model_folder, num_threads=threads, **base, **recipe.options)
    kept_seed = None
    if recipe.seeds:
        metrics, kept_seed = _best_of_seeds(recipe, settings, tag)
    else:
        metrics = run_finetune(settings)
    say(f"{tag}: dev {_headline(metrics)}{_against_floor(recipe, metrics)}")
    rounds = 1
    if _below_floor(recipe, metrics) and recipe.more:
        say(f"{tag}: under its floor; training on ({recipe.more})")
        model_folder = work / f"{recipe.name}-more"
        from tasks.runtime.spec import TaskSpec

        # From the first round's model, with its head as it is (a fine-tuned folder has no sentence-
        # transformers pooling file, so `auto` would switch a mean-pooled head to cls).
        pooling = TaskSpec.load(settings.out).pooling or "auto"
        more = settings.model_copy(update={"base": str(settings.out), "out": model_folder, "seed": settings.seed + 1,
                                           "pooling": pooling, **recipe.more})
        metrics = run_finetune(more)
        rounds = 2
        say(f"{tag}: dev after the second round {_headline(metrics)}{_against_floor(recipe, metrics)}")
    quality: dict = {"rounds": rounds}
    if kept_seed is not None:
        quality.update(seed=kept_seed, seeds=list(recipe.seeds), selected_by=recipe.select)
    if recipe.floor:
        metric, floor = recipe.floor
        quality.update({"metric": metric, "floor": floor, "value": metrics.get(metric),
                        "below_floor": _below_floor(recipe, metrics)})
        if quality["below_floor"]:
            log.warning("%s: dev %s %s is BELOW ITS QUALITY FLOOR %s after %d rounds; the bundle is served "
                        "marked below_quality_floor", recipe.name, metric, metrics.get(metric), floor, rounds)
    return model_folder, metrics, quality


def _train_guarded(recipe: Recipe, data_root: Path, out: Path, work: Path, threads: int | None,
                   tag: str) -> tuple[Path | None, dict[str, float], dict]:
    """_train_to_floor; for a recipe with the rerank guard (`beat_embeddings`), its check too, recorded as
    `quality["guard"]`: a reranker whose dev MRR@10 is not above the embeddings model's on the same questions
    is replaced by the recipe's fallbacks in turn. No model folder (None) when none of them beats it."""
    model_folder, metrics, quality = _train_to_floor(recipe, data_root, work, threads, tag)
    if not recipe.beat_embeddings:
        return model_folder, metrics, quality
    from berth.rerank_guard import embeddings_dev_figures, verdict, verdict_line

    first_stage: dict[Path, dict] = {}  # dev file -> the embeddings model's figures on it
    tries = []
    for number, fallback in enumerate((None, *recipe.fallbacks)):
        current = recipe
        if fallback is not None:
            current = dataclasses.replace(recipe, **{**fallback, "options": {**recipe.options,
                                                                              **fallback.get("options", {})}})
            say(f"{tag}: fallback {number} of {len(recipe.fallbacks)}: {fallback}")
            model_folder, metrics, quality = _train_to_floor(current, data_root, work, threads, tag)
        dev = _data_folder(current, data_root, work) / current.dev
        if dev not in first_stage:
            first_stage[dev] = embeddings_dev_figures(dev, _first_stage_bundle(out, work, threads), threads)
        check = verdict(metrics, first_stage[dev])
        say(f"{tag}: guard: {verdict_line(check)}")
        tries.append({**check, "recipe": "main" if fallback is None else fallback})
        if check["passed"]:
            return model_folder, metrics, {**quality, "guard": {**check, "tries": tries}}
    return None, metrics, {**quality, "guard": {**check, "tries": tries}}


def _first_stage_bundle(out: Path, work: Path, threads: int | None) -> Path:
    """The embeddings bundle a reranker is held to: the build's own (out/embeddings), else the embedded base
    exported into work/FIRST_STAGE_FOLDER (once)."""
    bundle = out / EMBEDDINGS_BUNDLE
    if not (bundle / "bundle.json").is_file():
        bundle = work / FIRST_STAGE_FOLDER / EMBEDDINGS_BUNDLE
        if not (bundle / "bundle.json").is_file():
            build_embeddings_bundle(bundle.parent, force=True, threads=threads)
    return bundle


def _data_folder(recipe: Recipe, data_root: Path, work: Path) -> Path:
    """Where the recipe's train/dev files are: the data folder, or work/<name>-data for a derived set."""
    return work / f"{recipe.name}-data" if recipe.prepare else data_root


def _best_of_seeds(recipe: Recipe, settings, tag: str) -> tuple[dict[str, float], int]:
    """The paper's restarts as a one-cell sweep (berth.sweep.run.best_of_seeds) in work/<name>-seeds: one trial
    per seed (trials/c00-seed<N>), the best on the dev `select` metric kept (the first seed of a tie). Its model
    is copied to `settings.out` (work/<name>, the folder later recipes and the export read) with the sweep's
    record, sweep.json. Returns its dev metrics and seed.

    A folder holding an unfinished sweep of the same recipe continues it (a killed build re-run); any other
    (finished, or another recipe's settings) is replaced, so a rebuild trains again."""
    import shutil

    from berth.sweep.run import BEST_DIR, RECORD_FILE, best_of_seeds

    folder = settings.out.with_name(f"{recipe.name}-seeds")
    if not _unfinished_sweep(folder, settings, recipe):
        shutil.rmtree(folder, ignore_errors=True)
    record = best_of_seeds(settings, list(recipe.seeds), folder, metric=recipe.select)
    for trial in record["trials"]:
        outcome = (f"dev {_headline(trial['dev_metrics'])}" if trial["status"] == "ok"
                   else f"{trial['status']}: {trial.get('error', '')}")
        say(f"{tag}: seed {trial['seed']}: {outcome}")
    winner = record["winner"]
    if winner is None:
        raise SystemExit(f"{recipe.name}: no seed of {list(recipe.seeds)} finished with a dev {recipe.select} "
                         f"(see {folder / RECORD_FILE})")
    tied = f"; tied with {', '.join(winner['ties'])}" if winner["ties"] else ""
    say(f"{tag}: kept seed {winner['seed']} (best dev {recipe.select} of seeds {list(recipe.seeds)}{tied}; "
        f"record {folder / RECORD_FILE})")
    shutil.rmtree(settings.out, ignore_errors=True)
    shutil.copytree(folder / BEST_DIR, settings.out, ignore=shutil.ignore_patterns("train_state", "sweep_trial.json"))
    shutil.copy2(folder / RECORD_FILE, settings.out / RECORD_FILE)
    return winner["dev_metrics"], winner["seed"]


def _unfinished_sweep(folder: Path, settings, recipe: Recipe) -> bool:
    """Whether `folder` holds this recipe's sweep with trials still to run."""
    from berth.sweep.run import PLAN_FILE, RECORD_FILE, seeds_plan

    plan_file, record_file = folder / PLAN_FILE, folder / RECORD_FILE
    if not plan_file.is_file():
        return False
    plan = seeds_plan(settings, list(recipe.seeds), folder, metric=recipe.select)
    try:
        stored = json.loads(plan_file.read_text(encoding="utf-8"))
        finished = record_file.is_file() and json.loads(record_file.read_text(encoding="utf-8"))["counts"][
            "not_run"] == 0
    except (OSError, ValueError, KeyError):
        return False
    return stored.get("identity") == plan.identity() and not finished


def _below_floor(recipe: Recipe, metrics: dict[str, float]) -> bool:
    if not recipe.floor:
        return False
    metric, floor = recipe.floor
    return not metrics.get(metric, float("-inf")) >= floor  # a missing or NaN metric is under


def _against_floor(recipe: Recipe, metrics: dict[str, float]) -> str:
    if not recipe.floor:
        return ""
    metric, floor = recipe.floor
    return f" (floor {metric} {floor:g}: {'UNDER' if _below_floor(recipe, metrics) else 'met'})"


def _export(model_folder: Path, bundle: Path, precision: str, automatic: bool, tag: str,
            examples: list | None) -> None:
    from export.bundle_builder import export_bundle
    from export.parity import ParityError
    from export.precision import INT8_RECIPE_CHAIN
    from export.settings import ExportSettings

    # Automatic int8 tries each recipe of the chain (less drift, less speed-up down the chain) before fp32.
    recipes = INT8_RECIPE_CHAIN if automatic and precision == "int8" else (None,)
    for recipe in recipes:
        say(f"{tag}: exporting {precision}" + (f" (int8 recipe {recipe})" if recipe else ""))
        try:
            with Progress(f"{tag}: exporting {precision}"):  # a line at least every 30 s while it works
                export_bundle(ExportSettings(model_folder=model_folder, out=bundle, precision=precision,
                                             int8_recipe=recipe), example_inputs=examples)
            return
        except ParityError as error:
            if not automatic or precision == "fp32":
                raise
            say(f"{tag}: {precision}{f' ({recipe})' if recipe else ''} failed its parity gate:\n{error}")
    # A small demo model with near-tied logits can flip labels under int8/fp16; the bundle then
    # ships in fp32 (exact parity) rather than not at all. An explicit --precision still fails.
    say(f"{tag}: exporting fp32 instead")
    with Progress(f"{tag}: exporting fp32"):
        export_bundle(ExportSettings(model_folder=model_folder, out=bundle, precision="fp32"), example_inputs=examples)


def _record_quality(bundle: Path, quality: dict) -> None:
    """Write the floor check into the bundle's manifest (`quality`), which the service lists."""
    from export.bundle_writing import write_manifest
    from tasks.runtime.bundle import MANIFEST_FILE

    manifest = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["quality"] = quality
    write_manifest(bundle, manifest)


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
    keys = ("accuracy", "f1", "exact", "pearson", "spearman", "mrr_at_10", "top1")
    return ", ".join(f"{k}={metrics[k]:.4g}" for k in keys if k in metrics) or "(no dev metrics)"
