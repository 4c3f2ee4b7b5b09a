"""The task layer (tasks/) adapted to training: read a data file, build torch features, evaluate.

One adapter per task family; each task definition names its own (`training_adapter`). Each reads examples, fixes
the TaskSpec (labels and settings saved with the model) and turns examples into training features with the same
code the service uses.
Scoring a model on dev examples is the task definition's: the served prepare -> run -> decode steps,
then the official metric on the decoded results (so the dev metrics a bundle records are the served model's).
Reading and evaluating import no torch (`berth evaluate` of a bundle runs without it); collating does.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer

from tasks import classification, common, multiple_choice, ner, qa, readers, rerank
from tasks.registry import definition
from tasks.runtime.batching import pad_batch
from tasks.runtime.inference import ItemRunner
from tasks.runtime.spec import TaskSpec
from training.errors import UserFacingError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("berth.task_data")


@dataclass
class Feature:
    """One model input and its training targets (names as the model's forward takes them)."""

    input_ids: Any
    token_type_ids: Any
    targets: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.input_ids)


class Features(list):
    """The training features, with a digest of every id and target: a resumed run refuses data that changed
    (a relabelled row, another file of the same length) instead of training on from a state of the old data."""

    @functools.cached_property
    def fingerprint(self) -> str | None:
        """None where a feature holds something without a stable plain form (then no resume checks the data)."""
        digest = hashlib.sha256()
        try:
            for feature in self:
                digest.update(json.dumps(feature, sort_keys=True, default=_plain).encode("utf-8"))
        except TypeError as error:
            log.warning("the training data has no fingerprint (%s): a resume will not check it", error)
            return None
        return digest.hexdigest()


def _plain(value: Any) -> Any:
    """A feature's parts as JSON values: arrays as lists, objects as their fields (never a repr, which may hold
    a memory address)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    slots = getattr(type(value), "__slots__", None)
    if slots:
        return {name: getattr(value, name) for name in slots}
    if hasattr(value, "__dict__"):
        return vars(value)
    raise TypeError(f"a {type(value).__name__} in a feature")


def collate(features: Sequence[Feature]) -> dict[str, torch.Tensor]:
    """Pad to the longest feature; per-token targets are padded with -100 (ignored by the loss)."""
    import torch

    batch = {k: torch.from_numpy(v) for k, v in pad_batch(features).items()}
    width = batch["input_ids"].shape[1]
    for name, first in features[0].targets.items():
        if isinstance(first, list | np.ndarray):
            rows = [list(f.targets[name]) + [-100] * (width - len(f.targets[name])) for f in features]
            batch[name] = torch.tensor(rows, dtype=torch.long)
        else:
            dtype = torch.float32 if isinstance(first, float) else torch.long
            batch[name] = torch.tensor([f.targets[name] for f in features], dtype=dtype)
    return batch


def _subsample(items: list, limit: int | None, seed: int | None) -> list:
    """At most `limit` items: a seeded random sample, or the first `limit` when seed is None (dev sets)."""
    if limit is None or limit >= len(items):
        return items
    if seed is None:
        return items[:limit]
    picked = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in picked]


class TaskAdapter:
    """What every adapter shares: reading with the bad-rows choice, and evaluation running the task definition's
    served steps on the model."""

    tokenizer: Tokenizer
    settings: Any

    def read(self, path: Path, limit: int | None, seed: int | None) -> list:
        """The examples of `path` (at most `limit`: a seeded sample, the first ones when seed is None). A file that
        cannot be read, and a bad row under bad_rows "stop", raise UserFacingError naming the file and line; under
        "skip" a bad row is left out and kept in `self.bad_rows`."""
        path = Path(path)
        found = readers.BadRows(getattr(self.settings, "bad_rows", "stop"))
        try:
            examples = self._read(path, found)
        except UnicodeDecodeError:  # a reader that decodes the whole file: say the line, not the byte offset
            raise UserFacingError(readers.first_undecodable_line(path)) from None
        except ValueError as error:  # readers.DataError, and a reader's other complaints about the file
            message = str(error)
            raise UserFacingError(message if message.startswith(str(path)) else f"{path}: {message}") from None
        except OSError as error:
            raise UserFacingError(f"{path}: cannot read: {error.strerror or error}") from None
        self.bad_rows = [*getattr(self, "bad_rows", []), *found.found]
        if not examples:
            why = (f"all {len(found.found)} rows are bad, the first {found.found[0]}" if found.found
                   else "the file is empty")
            raise UserFacingError(f"{path}: no examples: {why}")
        if found.found:
            log.warning("%s: %d bad rows skipped, the first %s", path, len(found.found), found.found[0])
        return _subsample(examples, limit, seed)

    def _read(self, path: Path, bad: readers.BadRows) -> list:
        raise NotImplementedError

    def evaluate(self, run: ItemRunner, examples: Sequence[Any], spec: TaskSpec) -> tuple[dict[str, float], dict]:
        """Dev metrics of the model `run` runs (training/torch_runner.torch_item_runner of a PyTorch head,
        tasks/runtime/onnx_session.onnx_item_runner of a bundle's session) and spec updates (e.g. the QA v2 threshold),
        measured on what the service would answer: the task definition's prepare -> run -> decode, then its
        metric against gold."""
        return definition(spec.task).evaluate(self.tokenizer, spec, examples, run)


def _sniff_format(path: Path, requested: str, task: str) -> str:
    if requested != "auto":
        return requested
    name = path.name.lower()
    if definition(task).data_format:
        return definition(task).data_format
    if name.endswith(".tsv"):
        header = path.open(encoding="utf-8-sig").readline().rstrip("\n").split("\t")
        if header[:2] == ["sentence", "label"]:
            return "sst2"
        if header and header[0] == "Quality":
            return "mrpc"
        if "sentence1" in header and "score" in header:
            return "stsb"
    return "table"


class ClassificationAdapter(TaskAdapter):
    """Single texts (classification) and sentence pairs (pair); labels or a regression score."""

    def __init__(self, settings, tokenizer: Tokenizer):
        self.settings = settings
        self.tokenizer = tokenizer
        self.regression = settings.regression
        self.pairs = "text_pair" in definition(settings.task).input_fields  # an input is two texts

    def _read(self, path: Path, bad: readers.BadRows) -> list[readers.TextExample]:
        s = self.settings
        fmt = _sniff_format(path, s.data_format, s.task)
        if fmt in ("sst2", "mrpc", "stsb", "rte"):
            self.regression = self.regression or fmt == "stsb"
            examples = readers.read_glue(path, fmt, bad_rows=bad, label_required=True)
        else:
            examples = readers.read_table(path, s.text_column, s.text_pair_column if self.pairs else None,
                                          s.label_column, regression=self.regression, bad_rows=bad,
                                          label_required=True)
        if self.pairs and any(e.text_pair is None for e in examples):
            raise ValueError(f"{path}: the {s.task} task needs a second text in every example "
                             f"(the {s.text_pair_column!r} column)")
        return examples

    def spec(self, train: list[readers.TextExample]) -> TaskSpec:
        s = self.settings
        if self.regression:
            return TaskSpec(task=s.task, labels=[], problem_type="regression",
                            max_seq_length=s.effective_max_seq_length())
        labels = s.labels or list(common.LabelSet.from_data(e.label for e in train))
        unknown = sorted({str(e.label) for e in train} - set(labels))
        if unknown:  # found here, before training, rather than at the first batch that holds one
            raise UserFacingError(f"{s.train_file}: labels {unknown} are not among --labels {labels}")
        if len(labels) < 2:  # a one-label head learns nothing and cannot be exported (no margin between labels)
            raise UserFacingError(f"{s.train_file}: every example has the label {', '.join(map(repr, labels))}; a "
                                  "classifier needs examples of at least two labels (--labels names them all)")
        return TaskSpec(task=s.task, labels=labels, problem_type="single_label_classification",
                        max_seq_length=s.effective_max_seq_length())

    def _encode(self, example, spec: TaskSpec):
        return common.encode_classification(self.tokenizer, example.text, example.text_pair,
                                                    max_length=spec.max_seq_length)

    def features(self, examples, spec: TaskSpec) -> list[Feature]:
        label_set = None if self.regression else common.LabelSet(spec.labels)
        out = []
        for ex in examples:
            enc = self._encode(ex, spec)
            target = float(ex.label) if self.regression else label_set.id(str(ex.label))
            out.append(Feature(enc.input_ids, enc.token_type_ids, {"labels": target}))
        return out

class NERAdapter(TaskAdapter):
    """A tag per word (CoNLL-2003 IOB1/IOB2, WNUT-17); evaluated at entity level as conlleval does."""

    def __init__(self, settings, tokenizer: Tokenizer):
        self.settings = settings
        self.tokenizer = tokenizer

    def _read(self, path: Path, bad: readers.BadRows) -> list[readers.NERExample]:
        return readers.read_conll(path, bad_rows=bad)

    def spec(self, train: list[readers.NERExample]) -> TaskSpec:
        s = self.settings
        labels = s.labels or ner.ner_label_list(e.tags for e in train)
        if len(labels) < 2:
            raise UserFacingError(f"{s.train_file}: every word is tagged {', '.join(map(repr, labels)) or 'O'}; a "
                                  "tagger needs examples of at least one entity type")
        return TaskSpec(task=s.task, labels=labels, max_seq_length=s.effective_max_seq_length(),
                        doc_stride=s.effective_doc_stride())

    def features(self, examples, spec: TaskSpec) -> list[Feature]:
        label_set = common.LabelSet(spec.labels)
        out = []
        for ex in examples:
            words = ner.encode_words(self.tokenizer, ex.tokens, max_length=spec.max_seq_length)
            tags = [t if t in label_set else "O" for t in ex.tags]  # a dev-only type cannot be learned
            labels = ner.align_labels(words, tags, label_all_tokens=self.settings.label_all_tokens, labels=label_set)
            out.append(Feature(words.encoded.input_ids, words.encoded.token_type_ids, {"labels": labels}))
        return out

class QAAdapter(TaskAdapter):
    """SQuAD v1.1 / v2.0 spans over doc-stride windows; official EM/F1 (and the v2 best threshold)."""

    def __init__(self, settings, tokenizer: Tokenizer):
        self.settings = settings
        self.tokenizer = tokenizer
        self.has_impossible = False

    def read(self, path: Path, limit: int | None, seed: int | None) -> list[qa.QAExample]:
        examples = super().read(path, limit, seed)
        self.has_impossible = self.has_impossible or any(e.is_impossible for e in examples)
        return examples

    def _read(self, path: Path, bad: readers.BadRows) -> list[qa.QAExample]:
        return qa.read_squad(path, bad_rows=bad)

    def spec(self, train: list[qa.QAExample]) -> TaskSpec:
        s = self.settings
        v2 = s.version_2_with_negative if s.version_2_with_negative is not None else any(e.is_impossible for e in train)
        return TaskSpec(task=s.task, max_seq_length=s.effective_max_seq_length(), doc_stride=s.effective_doc_stride(),
                        max_query_length=s.max_query_length, version_2_with_negative=v2)

    def _windows(self, ex: qa.QAExample, spec: TaskSpec) -> list[qa.QAWindow]:
        return qa.make_windows(self.tokenizer, ex.question, ex.context, spec.max_seq_length, spec.doc_stride,
                               spec.max_query_length)

    def features(self, examples, spec: TaskSpec) -> list[Feature]:
        out = []
        for ex in examples:
            text, start = ex.answers[0] if ex.answers else (None, None)
            for window in self._windows(ex, spec):
                # A window without the answer points at [CLS], as in BERT's and Hugging Face's recipes.
                s, e = qa.label_window(window, start, text)
                out.append(Feature(window.input_ids, window.token_type_ids,
                                   {"start_positions": s, "end_positions": e}))
        return out

class MultipleChoiceAdapter(TaskAdapter):
    """SWAG CSV or {context, choices, label} JSON lines; accuracy. Training batches are (B, C, T)."""

    def __init__(self, settings, tokenizer: Tokenizer):
        self.settings = settings
        self.tokenizer = tokenizer

    def _read(self, path: Path, bad: readers.BadRows) -> list[multiple_choice.ChoiceExample]:
        examples = multiple_choice.read_choices(path)  # a bad row stops the reading, whatever bad_rows says
        if any(e.label is None for e in examples):
            raise ValueError(f"{path}: every example needs a label (the index of the right choice)")
        return examples

    def spec(self, train: list[multiple_choice.ChoiceExample]) -> TaskSpec:
        counts = sorted({len(e.choices) for e in train})
        if len(counts) != 1:
            first = next(e for e in train if len(e.choices) != len(train[0].choices))
            raise UserFacingError(f"{self.settings.train_file}: examples have {counts} choices (example "
                                  f"{train[0].id!r} {len(train[0].choices)}, {first.id!r} {len(first.choices)}); a "
                                  "training set needs one count")
        return TaskSpec(task=self.settings.task, max_seq_length=self.settings.effective_max_seq_length(),
                        extra={"num_choices": counts[0]})

    def _encode(self, example, spec: TaskSpec) -> list:
        return multiple_choice.encode_choices(self.tokenizer, example.context, example.choices, spec.max_seq_length)

    def features(self, examples, spec: TaskSpec) -> list[Feature]:
        return [ChoiceFeature(self._encode(ex, spec), {"labels": ex.label}) for ex in examples]

    @staticmethod
    def collate(features: Sequence[ChoiceFeature]) -> dict[str, torch.Tensor]:
        flat = [choice for f in features for choice in f.choices]
        import torch

        batch = {k: torch.from_numpy(v).view(len(features), -1, v.shape[1]) for k, v in pad_batch(flat).items()}
        batch["labels"] = torch.tensor([f.targets["labels"] for f in features], dtype=torch.long)
        return batch

class RerankAdapter(TaskAdapter):
    """SQuAD-format questions. Training: each question's paragraph against `negatives` other paragraphs of its
    article without its answer, as one (1 + negatives, T) group. Dev: every paragraph of the article ranked."""

    collate = staticmethod(MultipleChoiceAdapter.collate)

    def __init__(self, settings, tokenizer: Tokenizer):
        self.settings = settings
        self.tokenizer = tokenizer

    def _read(self, path: Path, bad: readers.BadRows) -> list[rerank.RerankExample]:
        return rerank.read_article_questions(path)  # a bad question stops the reading, whatever bad_rows says

    def spec(self, train: list[rerank.RerankExample]) -> TaskSpec:
        s = self.settings
        pointwise = s.ranking_loss == "pointwise"
        return TaskSpec(task=s.task, max_seq_length=s.effective_max_seq_length(), doc_stride=s.effective_doc_stride(),
                        problem_type=classification.MULTI_LABEL if pointwise else None,
                        extra={"ranking_loss": s.ranking_loss, "negatives": s.negatives})

    def features(self, examples, spec: TaskSpec) -> list[ChoiceFeature]:
        rng, k = random.Random(self.settings.seed), self.settings.negatives
        usable = [ex for ex in examples if len(ex.negatives) >= k]
        if len(usable) < len(examples):
            log.info("rerank: %d of %d questions have fewer than %d negatives in their article; left out",
                     len(examples) - len(usable), len(examples), k)
        out = []
        for ex in usable:
            documents = [ex.documents[ex.relevant[0]]] + [ex.documents[i] for i in rng.sample(ex.negatives, k)]
            encoded = common.encode_classification_many(self.tokenizer, [ex.query] * len(documents), documents,
                                                        max_length=spec.max_seq_length)
            out.append(ChoiceFeature(encoded, {"labels": 0}))  # the relevant one first
        return out


@dataclass
class ChoiceFeature:
    """The encoded choices of one multiple-choice example and its label."""

    choices: list
    targets: dict[str, Any]

    def __len__(self) -> int:
        return max(len(c) for c in self.choices) * len(self.choices)


def has_adapter(task: str) -> bool:
    """Can training read data for `task` (the task definition names an adapter of this module)?"""
    return definition(task).training_adapter is not None


def adapter_for(settings, tokenizer: Tokenizer) -> TaskAdapter:
    """The adapter the task definition of `settings.task` names, set up with these settings."""
    name = definition(settings.task).training_adapter
    if name is None:
        raise ValueError(f"task {settings.task!r} has no training data adapter")
    return globals()[name](settings, tokenizer)
