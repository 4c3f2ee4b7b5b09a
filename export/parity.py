"""The parity gate: the ONNX model must answer as the PyTorch model does, on real inputs of its task.

Both run on the same padded batches of a real dev slice (mixed lengths, so padding; pairs for
`pair`; several windows of long SQuAD contexts and long CoNLL documents), and are compared twice:
- numerically: max |Δ| over every output at real (unpadded) positions;
- by task: the decoded answer of each example (label, entity spans, answer span, masked-token
  prediction) must be the same.
fp32 must stay within `FP32_MAX_ABS_DIFF`. fp16 and int8 move logits by design; what matters is
whether they change answers that mattered, so they are gated twice:
- agreement where the reference is confident: among the examples whose reference answer leads its
  runner-up by at least `CONFIDENT_MARGIN` in probability, at least `MIN_AGREEMENT` must get the
  same task answer (a flip on an example both engines score ~50/50 is not a regression). With fewer
  than `MIN_CONFIDENT` confident examples (an untrained head) and no metric check, every example counts;
- the task metric (`metric_gate`): on a dev slice with gold answers (the model's own dev file), the
  headline metric must not fall more than `MAX_METRIC_DROP` points below the reference's.
Figures go into the manifest.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from tasks import classification, ner, qa, readers
from tasks.inference import iter_batches, offline_shape
from tasks.spec import OUTPUT_NAMES, TaskSpec
from tasks.tokenizer import MASK, encode

log = logging.getLogger(__name__)

FP32_MAX_ABS_DIFF = 1e-4
MIN_AGREEMENT = 0.99
CONFIDENT_MARGIN = 0.2  # top-1 minus runner-up probability of the reference answer
MIN_CONFIDENT = 20
MAX_METRIC_DROP = 0.5  # points (of a metric in %)
# Dev examples scored by the metric gate: with paired answers, one changed answer moves the metric by
# 100 / n points, so 0.5 point is a handful of net changes on these sizes, not one.
DEFAULT_METRIC_EXAMPLES = {"classification": 1000, "pair": 1000, "ner": 1000, "qa": 1000}
# Examples in the default dev slice: enough that 99% agreement tolerates an odd flip (1 in 100+),
# few enough that the gate takes well under a minute on 2 CPU cores (QA windows are 384 tokens).
DEFAULT_EXAMPLES = {"classification": 256, "pair": 256, "fill-mask": 128, "ner": 128, "qa": 100, "embedding": 256,
                    "multiple-choice": 256}
EMBEDDING_MIN_COSINE = 0.99  # fp16/int8 embeddings agree when their cosine with PyTorch's is at least this
REGRESSION_TOLERANCE = 0.01  # a regression score agrees within 1% of the slice's score range (at least 0.01)

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"

# Used when neither ../shared/data nor the shipped samples are there (e.g. an installed wheel).
BUILTIN_SENTENCES = [
    "The film is a charming and often affecting journey.",
    "Unflinchingly bleak and desperate.",
    "It's slow -- very, very slow.",
    "A sometimes tedious film, but the acting, costumes, music and cinematography are all astounding.",
    "Emma is a novel by Jane Austen, first published in December 1815.",
    "The European Commission said on Thursday it disagreed with German advice to consumers to shun British lamb.",
    "Peter Blackburn met officials of the World Health Organization in Geneva on Monday.",
    "Who wrote the theory of relativity, and when was it published?",
]
BUILTIN_CONTEXT = (
    "The Normans (Norman: Nourmands; French: Normands; Latin: Normanni) were the people who in the 10th and "
    "11th centuries gave their name to Normandy, a region in France. They were descended from Norse raiders and "
    "pirates from Denmark, Iceland and Norway who, under their leader Rollo, agreed to swear fealty to King "
    "Charles III of West Francia. Through generations of assimilation and mixing with the native Frankish and "
    "Roman-Gaulish populations, their descendants would gradually merge with the Carolingian-based cultures of "
    "West Francia. The distinct cultural and ethnic identity of the Normans emerged initially in the first half "
    "of the 10th century, and it continued to evolve over the succeeding centuries. "
) * 3
BUILTIN_QUESTIONS = ["In what country is Normandy located?", "Who was the Norse leader?",
                     "When were the Normans in Normandy?", "From which countries did the Norse originate?"]


class ParityError(RuntimeError):
    """The ONNX model disagrees with PyTorch beyond the precision's threshold; `report` has the figures."""

    def __init__(self, report: dict[str, Any]):
        self.report = report
        super().__init__(format_report(report))


@dataclass
class ParityExample:
    """One dev example: its model inputs (one or more windows) and what decoding it needs."""

    id: str
    features: list[Any]  # EncodedInput / QAWindow: has input_ids, token_type_ids, len()
    text: str = ""
    windows: Any = None  # ner.NERWindows or list[qa.QAWindow]
    mask_positions: list[int] = field(default_factory=list)  # fill-mask: where [MASK] is


Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


def default_data_dir() -> Path | None:
    """$BERTH_SHARED_DATA, else ../shared/data beside the repository, if it exists."""
    path = Path(os.environ.get("BERTH_SHARED_DATA", REPO.parent / "shared" / "data"))
    return path if path.is_dir() else None


# -- the dev slice -----------------------------------------------------------------------------------


def parity_slice(spec: TaskSpec, tokenizer: Tokenizer, data_dir: Path | None, size: int) -> tuple[list[ParityExample], str]:
    """`size` real examples of the task, encoded with the spec's settings, and where they came from."""
    builders = {"classification": _text_slice, "pair": _pair_slice, "ner": _ner_slice, "qa": _qa_slice,
                "fill-mask": _fill_mask_slice, "embedding": _text_slice, "multiple-choice": _pair_slice}
    return builders[spec.task](spec, tokenizer, data_dir, size)


def _first_file(data_dir: Path | None, shared: str, sample: str | None) -> Path | None:
    for path in ((data_dir / shared) if data_dir else None, (SAMPLES / sample) if sample else None):
        if path is not None and path.is_file():
            return path
    return None


def _sentences(data_dir: Path | None, size: int) -> tuple[list[str], str]:
    path = _first_file(data_dir, "sst2/dev.tsv", "topics/dev.jsonl")
    if path is None:
        return BUILTIN_SENTENCES[:size], "built-in sentences"
    examples = readers.read_sst2(path) if path.suffix == ".tsv" else readers.read_table(path)
    return [e.text for e in examples[:size]], str(path)


def _text_slice(spec, tokenizer, data_dir, size):
    texts, source = _sentences(data_dir, size)
    examples = [ParityExample(f"text-{i}", [encode(tokenizer, t, max_length=spec.max_seq_length)], t)
                for i, t in enumerate(texts)]
    return examples, source


def _pair_slice(spec, tokenizer, data_dir, size):
    path = _first_file(data_dir, "mrpc/dev.tsv", "stsb/dev.jsonl")
    if path is None:
        pairs = list(zip(BUILTIN_SENTENCES[0::2], BUILTIN_SENTENCES[1::2]))[:size]
        source = "built-in sentence pairs"
    else:
        rows = readers.read_mrpc(path) if path.suffix == ".tsv" else readers.read_table(path, regression=True)
        pairs = [(e.text, e.text_pair) for e in rows[:size]]
        source = str(path)
    examples = [ParityExample(f"pair-{i}", [encode(tokenizer, a, b, max_length=spec.max_seq_length)], a)
                for i, (a, b) in enumerate(pairs)]
    return examples, source


def _ner_slice(spec, tokenizer, data_dir, size):
    path = _first_file(data_dir, "conll2003/iob2/valid.txt", "entities/dev.conll")
    if path is None:
        texts, source = BUILTIN_SENTENCES[:size], "built-in sentences"
    else:
        sentences = [" ".join(e.tokens) for e in readers.read_conll(path)]
        # Mostly single sentences, and one long document (several windows) from the sentences after them.
        texts = sentences[: max(1, size - 1)]
        if size > 1:
            texts.append(" ".join(sentences[size : size + 40]))
        source = str(path)
    window = spec.max_seq_length - 2
    stride = min(spec.doc_stride, window // 2)
    examples = []
    for i, text in enumerate(texts):
        windows = ner.ner_windows(tokenizer, text, spec.max_seq_length, stride)
        examples.append(ParityExample(f"ner-{i}", list(windows), text, windows))
    return examples, source


def _qa_slice(spec, tokenizer, data_dir, size):
    path = _first_file(data_dir, "squad/v1.1/dev-v1.1.json", "squad/dev.json")
    if path is None:
        pairs = [(f"builtin-{i}", q, BUILTIN_CONTEXT) for i, q in enumerate(BUILTIN_QUESTIONS)][:size]
        source = "built-in question and context"
    else:
        seen: set[str] = set()
        candidates = []  # one question per paragraph, in file order
        for example in qa.read_squad(path):
            if example.context not in seen:
                seen.add(example.context)
                candidates.append(example)
        # A quarter from the longest contexts (several full windows each), the rest in file order.
        longest = sorted(candidates, key=lambda e: -len(e.context))[: max(1, size // 4)]
        chosen_ids = {e.id for e in longest}
        in_order = [e for e in candidates if e.id not in chosen_ids][: size - len(longest)]
        picked = [e for pair in zip(longest, in_order) for e in pair] + longest[len(in_order):] + in_order[len(longest):]
        pairs = [(e.id, e.question, e.context) for e in picked[:size]]
        source = str(path)
    examples = []
    for qid, question, context in pairs:
        windows = qa.make_windows(tokenizer, question, context, spec.max_seq_length, spec.doc_stride,
                                  spec.max_query_length)
        examples.append(ParityExample(f"qa-{qid}", list(windows), question, windows))
    return examples, source


def _fill_mask_slice(spec, tokenizer, data_dir, size):
    texts, source = _sentences(data_dir, size)
    mask_id = tokenizer.token_to_id(MASK)
    examples = []
    for i, text in enumerate(texts):
        encoded = encode(tokenizer, text, max_length=spec.max_seq_length)
        position = max(1, (len(encoded) - 1) // 2)  # a middle token (never [CLS] / the last [SEP])
        encoded.input_ids = list(encoded.input_ids)
        encoded.input_ids[position] = mask_id
        examples.append(ParityExample(f"mask-{i}", [encoded], text, mask_positions=[position]))
    return examples, source


# -- running both engines ------------------------------------------------------------------------------


def torch_runner(model: Any, output_names: Sequence[str]) -> Runner:
    import torch

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            out = model(**{name: torch.from_numpy(array) for name, array in feeds.items()})
        return {name: out[name].float().numpy() for name in output_names}

    return run


def onnx_runner(session: Any, output_names: Sequence[str]) -> Runner:
    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(output_names, session.run(list(output_names), feeds)))

    return run


def _per_token(task: str, output: str = "") -> bool:
    return task in ("ner", "qa", "fill-mask") or output == "hidden_states"


def run_pair(
    examples: list[ParityExample], task: str, reference: Runner, candidate: Runner, batch_size: int = 8
) -> tuple[dict[str, Any], list[dict[str, list[np.ndarray]]], list[dict[str, list[np.ndarray]]]]:
    """Run both engines on the same padded batches; return the numeric diffs and, per example and
    output, the per-feature arrays decoding needs (trimmed to the feature's real length)."""
    task_outputs = OUTPUT_NAMES[task]
    flat = [(i, feature) for i, example in enumerate(examples) for feature in example.features]
    kept = [[{name: [] for name in task_outputs} for _ in examples] for _ in range(2)]
    max_diff = {name: 0.0 for name in task_outputs}
    sum_diff, count = 0.0, 0
    lengths, batch_sizes = [], []
    features = [feature for _, feature in flat]
    per_token = {name for name in task_outputs if _per_token(task, name)}
    by_feature: list[list[dict[str, np.ndarray]]] = [[{} for _ in flat] for _ in range(2)]

    def run_both(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ref, cand = reference(feeds), candidate(feeds)
        return {**{f"reference/{n}": ref[n] for n in task_outputs}, **{f"candidate/{n}": cand[n] for n in task_outputs}}

    # The service's path (tasks/inference.py): sorted by length, padded to the batch's longest rounded to 8.
    trimmed = {f"{side}/{name}" for side in ("reference", "candidate") for name in per_token}
    for batch, rows in iter_batches(run_both, features, trimmed, offline_shape(features, batch_size)):
        lengths += [len(features[i]) for i in batch.members]
        batch_sizes.append(len(batch.members))
        for i, row in zip(batch.members, rows):
            example_index = flat[i][0]
            example = examples[example_index]
            for name in task_outputs:
                ref, cand = row[f"reference/{name}"], row[f"candidate/{name}"]  # real positions only
                diff = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
                max_diff[name] = max(max_diff[name], float(diff.max()) if diff.size else 0.0)
                sum_diff += float(diff.sum())
                count += diff.size
                for side, array in enumerate((ref, cand)):
                    if task == "fill-mask":
                        array = array[example.mask_positions]  # (M, V): the vocabulary is large
                    by_feature[side][i][name] = np.array(array)
    for side in range(2):  # each example's windows in their own order
        for i, (example_index, _) in enumerate(flat):
            for name in task_outputs:
                kept[side][example_index][name].append(by_feature[side][i][name])
    figures = {
        "max_abs_diff": max(max_diff.values()),
        "max_abs_diff_by_output": max_diff,
        "mean_abs_diff": sum_diff / max(count, 1),
        "features": len(flat),
        "sequence_lengths": [min(lengths), max(lengths)] if lengths else [],
        "batch_sizes": sorted(set(batch_sizes)),
        "padded_batches": True,
    }
    return figures, kept[0], kept[1]


# -- task-level answers ---------------------------------------------------------------------------------


def task_answer(spec: TaskSpec, example: ParityExample, outputs: dict[str, list[np.ndarray]]) -> Hashable:
    """What the service would answer for this example, reduced to what must not change."""
    if spec.task == "embedding":
        return tuple(float(x) for x in outputs["sentence_embedding"][0])
    if spec.task in ("classification", "pair", "multiple-choice"):
        logits = outputs["logits"][0]  # (C,)
        kind = classification.resolve_problem_type(spec.problem_type, logits.shape[-1])
        if kind == classification.REGRESSION:
            return float(logits[0])
        if kind == classification.MULTI_LABEL:
            return tuple(bool(x) for x in logits > 0)
        return int(np.argmax(logits))
    if spec.task == "ner":
        entities = ner.decode_entities(example.text, example.windows, outputs["logits"], spec.labels, "simple")
        return tuple((e["entity"], e["start"], e["end"]) for e in entities)
    if spec.task == "qa":
        best = qa.decode_answers(example.windows, outputs["start_logits"], outputs["end_logits"],
                                 handle_impossible=spec.version_2_with_negative,
                                 null_score_diff_threshold=spec.null_score_diff_threshold)[0]
        return (best.start, best.end, best.is_impossible)
    if spec.task == "fill-mask":
        return tuple(int(i) for i in np.argmax(outputs["logits"][0], axis=-1))
    raise ValueError(f"unknown task {spec.task!r}")


def confidence(spec: TaskSpec, example: ParityExample, outputs: dict[str, list[np.ndarray]]) -> float:
    """How clearly the reference prefers its answer: top-1 minus runner-up probability (1.0 for regression).

    Classification: over the labels (per label for multi-label: distance of the sigmoid from 0.5,
    doubled). NER: the least clear real token of the text. QA: the best span over the n-best spans
    of all windows. Fill-mask: the least clear [MASK] position. Multiple choice: one score per choice item,
    compared as a regression (1.0).
    Embedding: 1.0 (no discrete answer; its agreement is a cosine).
    """
    def margin(logits: np.ndarray) -> np.ndarray:  # (..., C) -> (...)
        probs = classification.softmax(np.asarray(logits, dtype=np.float64))
        top = np.sort(probs, axis=-1)
        return top[..., -1] - top[..., -2]

    if spec.task in ("classification", "pair", "multiple-choice"):  # a choice is one item with one score
        logits = outputs["logits"][0]
        kind = classification.resolve_problem_type(spec.problem_type, logits.shape[-1])
        if kind == classification.REGRESSION:
            return 1.0
        if kind == classification.MULTI_LABEL:
            return float(np.min(np.abs(classification.sigmoid(logits) - 0.5)) * 2)
        return float(margin(logits))
    if spec.task == "embedding":  # no discrete answer: every vector counts (agreement is by cosine)
        return 1.0
    if spec.task in ("ner", "fill-mask"):
        return float(min(margin(window).min() for window in outputs["logits"]))
    if spec.task == "qa":
        answers = qa.decode_answers(example.windows, outputs["start_logits"], outputs["end_logits"], top_k=2,
                                    handle_impossible=spec.version_2_with_negative,
                                    null_score_diff_threshold=spec.null_score_diff_threshold)
        return answers[0].score - (answers[1].score if len(answers) > 1 else 0.0)
    raise ValueError(f"unknown task {spec.task!r}")


def _agree(a: Hashable, b: Hashable, tolerance: float | None) -> bool:
    if isinstance(a, tuple) and a and isinstance(a[0], float):  # an embedding
        u, v = np.asarray(a), np.asarray(b)
        return float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-12)) >= EMBEDDING_MIN_COSINE
    if tolerance is not None:
        return abs(float(a) - float(b)) <= tolerance
    return a == b


def check_parity(
    spec: TaskSpec,
    examples: list[ParityExample],
    reference: Runner,
    candidate: Runner,
    precision: str,
    provider: str,
    source: str = "",
    batch_size: int = 8,
    raise_on_failure: bool = True,
    min_agreement: float = MIN_AGREEMENT,
    metric_checked: bool = False,
) -> dict[str, Any]:
    """Compare `candidate` (ONNX) with `reference` (PyTorch) on `examples`; the report for the manifest.

    Raises `ParityError` (its message is the report) when the precision's threshold is not met:
    max |Δ| <= FP32_MAX_ABS_DIFF for fp32; for fp16 and int8, task agreement >= `min_agreement`
    among the examples where the reference is confident (see the module docstring).
    """
    figures, ref_outputs, cand_outputs = run_pair(examples, spec.task, reference, candidate, batch_size)
    ref_answers = [task_answer(spec, e, o) for e, o in zip(examples, ref_outputs)]
    cand_answers = [task_answer(spec, e, o) for e, o in zip(examples, cand_outputs)]
    tolerance = None
    if ref_answers and isinstance(ref_answers[0], float):
        spread = max(ref_answers) - min(ref_answers)
        tolerance = max(0.01, REGRESSION_TOLERANCE * spread)
    agreed = [_agree(a, b, tolerance) for a, b in zip(ref_answers, cand_answers)]
    agreement = sum(agreed) / max(len(agreed), 1)
    margins = [confidence(spec, e, o) for e, o in zip(examples, ref_outputs)]
    confident = [ok for ok, m in zip(agreed, margins) if m >= CONFIDENT_MARGIN]
    # Too few confident examples (a barely trained head): every example counts, unless the task metric
    # on gold answers is checked too (`metric_checked`), which then decides for the unconfident ones.
    fallback = len(confident) < MIN_CONFIDENT and not metric_checked
    confident_counted = agreed if fallback else confident
    # No confident example at all (with a metric check): nothing here can be a regression; the metric decides.
    confident_agreement = sum(confident_counted) / len(confident_counted) if confident_counted else 1.0
    if precision == "fp32":
        threshold = {"max_abs_diff": FP32_MAX_ABS_DIFF}
        passed = figures["max_abs_diff"] <= FP32_MAX_ABS_DIFF
    else:
        threshold = {"confident_agreement": min_agreement}
        passed = confident_agreement >= min_agreement
    report = {
        "precision": precision,
        "provider": provider,
        "passed": bool(passed),
        "threshold": threshold,
        "max_abs_diff": figures["max_abs_diff"],
        "mean_abs_diff": figures["mean_abs_diff"],
        "agreement": agreement,
        "confident_agreement": confident_agreement,
        "confident_examples": len(confident_counted),
        "confident_fallback_all_examples": fallback,
        "confident_margin": CONFIDENT_MARGIN,
        "agreement_measure": _agreement_measure(spec, tolerance),
        "examples": len(examples),
        **{k: v for k, v in figures.items() if k not in ("max_abs_diff", "mean_abs_diff")},
        "data": source,
        "disagreements": [
            {"id": e.id, "reference_margin": round(m, 4), **_first_difference(a, b)}
            for e, a, b, ok, m in zip(examples, ref_answers, cand_answers, agreed, margins) if not ok
        ][:5],
    }
    if not passed and raise_on_failure:
        raise ParityError(report)
    return report


def _confident_phrase(report: dict[str, Any]) -> str:
    if report.get("confident_fallback_all_examples"):
        return f"counted over all of them (fewer than {MIN_CONFIDENT} where the reference is confident)"
    return (f"{report['confident_agreement']:.2%} of the {report['confident_examples']} where the reference is "
            f"confident (margin >= {report['confident_margin']:g})")


def _agreement_measure(spec: TaskSpec, tolerance: float | None) -> str:
    if spec.task == "ner":
        return "same entity spans (type, start, end), simple aggregation, per text"
    if spec.task == "qa":
        return "same best answer span (start, end, no-answer) over all windows, per question"
    if spec.task == "fill-mask":
        return "same top-1 token at the [MASK] position"
    if spec.task == "embedding":
        return f"sentence embedding cosine with PyTorch's >= {EMBEDDING_MIN_COSINE}"
    if tolerance is not None:
        return f"regression score within {tolerance:.4g}"
    return "same predicted label(s)"


def _first_difference(a: Hashable, b: Hashable, context: int = 2) -> dict[str, Any]:
    """The two answers, cut to a few items around where they first differ when they are long lists."""
    if isinstance(a, tuple) and isinstance(b, tuple) and a and isinstance(a[0], tuple) and max(len(a), len(b)) > 2 * context:
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        lo = max(0, at - context)
        return {"from_item": lo, "pytorch": _jsonable(a[lo : at + context]), "onnx": _jsonable(b[lo : at + context]),
                "items": [len(a), len(b)]}
    return {"pytorch": _jsonable(a), "onnx": _jsonable(b)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def format_report(report: dict[str, Any]) -> str:
    """One paragraph a person can act on: what was compared, the figures, the verdict."""
    verdict = "passed" if report["passed"] else "FAILED"
    limit = ", ".join(f"{k} {'>=' if k == 'confident_agreement' else '<='} {v:g}" for k, v in report["threshold"].items())
    lines = [
        f"parity {verdict} for {report['precision']} on {report['provider']} (required: {limit}):",
        f"  max |Δ| {report['max_abs_diff']:.3g} (by output: "
        + ", ".join(f"{k} {v:.3g}" for k, v in report["max_abs_diff_by_output"].items())
        + f"), mean |Δ| {report['mean_abs_diff']:.3g}",
        f"  task agreement {report['agreement']:.2%} of {report['examples']} examples, " + _confident_phrase(report)
        + f" ({report['agreement_measure']}); {report['features']} model inputs of "
        f"{report['sequence_lengths'][0]}-{report['sequence_lengths'][1]} tokens; data: {report['data']}",
    ]
    for item in report["disagreements"]:
        where = f" (items {item['from_item']}.. of {item['items'][0]} vs {item['items'][1]})" if "items" in item else ""
        lines.append(f"  differs: {item['id']}{where} (reference margin {item['reference_margin']:.2f}): "
                     f"pytorch {item['pytorch']} vs onnx {item['onnx']}")
    if report.get("metric"):
        lines.append(f"  {format_metric(report['metric'])}")
    return "\n".join(lines)


# -- the task metric on the model's own dev set ------------------------------------------------------------


def onnx_torch_module(session: Any, output_names: Sequence[str]) -> Any:
    """A torch.nn.Module whose forward runs an ONNX Runtime session, so the training evaluation code
    (the task layer's encoding and decoding, the official metrics) scores the ONNX model as it does PyTorch."""
    import torch

    class OnnxModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # tells evaluation the device

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            feeds = {"input_ids": input_ids.cpu().numpy(), "attention_mask": attention_mask.cpu().numpy(),
                     "token_type_ids": token_type_ids.cpu().numpy()}
            outputs = session.run(list(output_names), feeds)
            return {name: torch.from_numpy(array) for name, array in zip(output_names, outputs)}

    return OnnxModel().eval()


def headline_metric(task: str, metrics: dict[str, float]) -> str:
    """Entity / answer F1 for NER and QA, Pearson for a regression score, else accuracy."""
    if task in ("ner", "qa"):
        return "f1"
    return "pearson" if "pearson" in metrics else "accuracy"


def metric_gate(
    spec: TaskSpec, tokenizer: Tokenizer, dev_file: Path, reference: Any, candidate: Any, limit: int | None = None,
    max_drop: float = MAX_METRIC_DROP,
) -> dict[str, Any]:
    """Score `reference` and `candidate` (torch modules) on the first `limit` examples of `dev_file` with the
    task's official metric; passed when the candidate's headline metric is at most `max_drop` points lower."""
    from export.calibration import adapter

    task = adapter(spec, tokenizer, dev_file)
    examples = task.read(dev_file, limit=limit or DEFAULT_METRIC_EXAMPLES[spec.task], seed=None)
    ref_metrics, _ = task.evaluate(reference, examples, spec)
    cand_metrics, _ = task.evaluate(candidate, examples, spec)
    name = headline_metric(spec.task, ref_metrics)
    scale = 1.0 if spec.task == "qa" else 100.0  # the SQuAD script reports percent, the others fractions
    ref_value, cand_value = ref_metrics[name] * scale, cand_metrics[name] * scale
    return {
        "name": name,
        "reference": round(ref_value, 3),
        "candidate": round(cand_value, 3),
        "delta_points": round(cand_value - ref_value, 3),
        "max_drop_points": max_drop,
        "passed": bool(cand_value >= ref_value - max_drop),
        "examples": len(examples),
        "data": str(dev_file),
        "reference_metrics": ref_metrics,
        "candidate_metrics": cand_metrics,
    }


def format_metric(figures: dict[str, Any]) -> str:
    verdict = "passed" if figures["passed"] else "FAILED"
    return (f"task metric {verdict}: {figures['name']} {figures['candidate']:.2f} vs reference {figures['reference']:.2f} "
            f"({figures['delta_points']:+.2f} points, at most -{figures['max_drop_points']:g} allowed) on "
            f"{figures['examples']} examples of {figures['data']}")
