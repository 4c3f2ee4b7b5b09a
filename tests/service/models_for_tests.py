"""Fine-tuned folders for the service tests, made from the real all-MiniLM-L6-v2 checkpoint in seconds.

The encoder is the real pretrained one; only the heads are new. Classification and pair heads are
seeded random. The NER, QA and rerank heads are fitted in closed loops of a few hundred steps on frozen
encoder states of a handful of synthetic sentences (city names are locations; the year is the answer
to "when"; a document naming the city a query asks about is relevant to it), so the long-text tests
have something real to find: a city at the very end of a long text, a year near the end of a
5,000-word context, the one relevant sentence at the end of a long document.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from bench.filler_text import filler
from tasks import qa, rerank
from tasks.runtime.spec import TaskSpec
from tasks.runtime.tokenizer import CLS, SEP, encode, load_tokenizer
from training.bert.checkpoint import default_base_path, load_pretrained, save_pretrained
from training.bert.model import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

CITIES = ["Paris", "London", "Berlin", "Madrid", "Tokyo", "Lisbon", "Vienna", "Prague", "Oslo", "Dublin", "Cairo",
          "Rome", "Zurich", "Toronto", "Chicago", "Sydney"]
CITY_TEMPLATES = ["We flew to {} last week.", "{} is lovely in the spring.", "She was born in {} and moved away.",
                  "The train from {} was late again.", "Prices in {} keep rising.", "They opened an office in {}.",
                  "After the meeting we drove back to {}.", "The museum in {} was closed."]
THINGS = ["museum", "library", "company", "school", "orchestra", "hospital", "club", "newspaper", "bank", "theatre"]
NER_LABELS = ["O", "B-LOC", "I-LOC"]
RANK_QUERIES = ["What is it like in {}?", "Tell me about {}.", "Which stories mention {}?"]
RANKER_SPEC = TaskSpec(task="rerank", max_seq_length=64, doc_stride=16, pooling="mean")


def _fit_linear(features: torch.Tensor, targets: torch.Tensor, layer: nn.Linear, steps: int = 200,
                group: torch.Tensor | None = None) -> None:
    """Fit `layer` on frozen features: per-row cross-entropy, or (QA) softmax over the rows of each group."""
    torch.manual_seed(0)
    fitted = nn.Linear(layer.in_features, layer.out_features)
    optimizer = torch.optim.Adam(fitted.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        logits = fitted(features)
        if group is None:
            loss = nn.functional.cross_entropy(logits, targets)
        else:  # features (W*T, H) of W windows, targets (W, 2) start/end positions
            per_window = logits.view(group.shape[0], -1, 2).masked_fill(~group[:, :, None], -1e4)
            loss = (nn.functional.cross_entropy(per_window[:, :, 0], targets[:, 0])
                    + nn.functional.cross_entropy(per_window[:, :, 1], targets[:, 1]))
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        layer.weight.copy_(fitted.weight)
        layer.bias.copy_(fitted.bias)


@torch.no_grad()
def _hidden(model, encoded_items) -> tuple[torch.Tensor, torch.Tensor]:
    from tasks.runtime.batching import pad_batch

    feeds = {k: torch.from_numpy(v) for k, v in pad_batch(encoded_items).items()}
    out = model.bert(feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])
    return out["last_hidden_state"], feeds["attention_mask"].bool()


def _fit_logit(features: torch.Tensor, targets: torch.Tensor, layer: nn.Linear, steps: int = 300) -> None:
    """Fit a one-output `layer` on frozen features: binary cross-entropy of its logit against 0/1 targets."""
    torch.manual_seed(0)
    fitted = nn.Linear(layer.in_features, 1)
    optimizer = torch.optim.Adam(fitted.parameters(), lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(fitted(features)[:, 0], targets)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        layer.weight.copy_(fitted.weight)
        layer.bias.copy_(fitted.bias)


def _rerank_windows(tokenizer: Tokenizer) -> tuple[list, list[float]]:
    """Model items made as the service makes them (`tasks.rerank.document_windows`) and their relevance: a query
    asks about a city (RANK_QUERIES); a window naming that city is relevant (1.0), one naming another city or
    none is not (0.0). The documents are single sentences, and plain sentences ending with one that names a
    city or not, long enough to make several windows: the windows of a long document, the city in one or none."""
    cls_id, sep_id = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    rng = random.Random(2)
    items, labels = [], []
    for i, city in enumerate(CITIES):
        others = [c for c in CITIES if c != city]
        city_ids = ids(city)
        for q, query in enumerate(template.format(city) for template in RANK_QUERIES):
            seed = 300 + 10 * i + q
            documents = [CITY_TEMPLATES[(i + q + 3 * k) % len(CITY_TEMPLATES)].format(city) for k in range(2)]
            documents += [rng.choice(CITY_TEMPLATES).format(rng.choice(others)) for _ in range(2)]
            documents += [f"{filler(rng.randint(8, 100), seed + 1000 * k)} {rng.choice(CITY_TEMPLATES).format(named)}"
                          for k, named in enumerate((city, rng.choice(others)))]
            documents.append(filler(rng.randint(8, 100), seed + 5000))
            query_ids = ids(query)
            for document in documents:
                for window in rerank.document_windows(query_ids, ids(document), 0, cls_id, sep_id,
                                                      RANKER_SPEC.max_seq_length, RANKER_SPEC.doc_stride):
                    text = window.input_ids[len(query_ids) + 2 : -1].tolist()  # the document's tokens
                    names = any(text[at : at + len(city_ids)] == city_ids for at in range(len(text)))
                    items.append(window)
                    labels.append(float(names))
    return items, labels


def _ner_examples(tokenizer: Tokenizer) -> tuple[list, list[list[int]]]:
    items, labels = [], []
    for i, city in enumerate(CITIES):
        for template in CITY_TEMPLATES[i % 3 :: 3]:
            text = template.format(city)
            start = text.index(city)
            encoded = encode(tokenizer, text)
            tags, inside = [], False
            for (s, e), seq in zip(encoded.offsets, encoded.sequence_ids):
                in_city = seq is not None and s >= start and e <= start + len(city)
                tags.append((2 if inside else 1) if in_city else 0)
                inside = in_city
            items.append(encoded)
            labels.append(tags)
    for seed in range(12):
        encoded = encode(tokenizer, filler(25, seed))
        items.append(encoded)
        labels.append([0] * len(encoded))
    return items, labels


def _qa_windows(tokenizer: Tokenizer, spec: TaskSpec) -> tuple[list, list[tuple[int, int]]]:
    windows, targets = [], []
    rng = random.Random(1)
    for i in range(32):
        thing, year = THINGS[i % len(THINGS)], rng.randint(1800, 2019)
        fact = f"The {thing} was founded in {year}."
        context = f"{filler(12, 100 + i)} {fact} {filler(8, 200 + i)}"
        answer_start = context.index(str(year))
        question = f"When was the {thing} founded?"
        for window in qa.make_windows(tokenizer, question, context, spec.max_seq_length, spec.doc_stride,
                                      spec.max_query_length):
            windows.append(window)
            targets.append(qa.label_window(window, answer_start, str(year)))
    return windows, targets


def build_checkpoints(root: Path) -> dict[str, Path]:
    """Fine-tuned folders (HF checkpoint + berth_task.json) named by the bundle each becomes."""
    torch.manual_seed(0)
    base = default_base_path()
    tokenizer = load_tokenizer(base)
    folders = {}

    model, _ = load_pretrained(BertForSequenceClassification, base, id2label={0: "negative", 1: "positive"})
    nn.init.normal_(model.classifier.weight, std=0.5)
    folders["sentiment"] = _save(model, root / "sentiment",
                                 TaskSpec(task="classification", labels=["negative", "positive"], max_seq_length=64))

    model, _ = load_pretrained(BertForSequenceClassification, base, num_labels=1, problem_type="regression")
    nn.init.normal_(model.classifier.weight, std=0.5)
    folders["similarity"] = _save(model, root / "similarity", TaskSpec(task="pair", problem_type="regression",
                                                                       max_seq_length=64))

    model, _ = load_pretrained(BertForTokenClassification, base, id2label=dict(enumerate(NER_LABELS)))
    items, labels = _ner_examples(tokenizer)
    hidden, mask = _hidden(model, items)
    targets = torch.full(mask.shape, -100, dtype=torch.long)
    for row, tags in enumerate(labels):
        targets[row, : len(tags)] = torch.tensor(tags)
    _fit_linear(hidden[mask], targets[mask], model.classifier)
    folders["entities"] = _save(model, root / "entities", TaskSpec(task="ner", labels=NER_LABELS, max_seq_length=64,
                                                                   doc_stride=16))

    qa_spec = TaskSpec(task="qa", max_seq_length=128, doc_stride=32, max_query_length=32)
    model, _ = load_pretrained(BertForQuestionAnswering, base)
    windows, spans = _qa_windows(tokenizer, qa_spec)
    hidden, mask = _hidden(model, windows)
    context_mask = torch.zeros_like(mask)
    for row, window in enumerate(windows):
        context_mask[row, 0] = True  # [CLS]: the target of windows without the answer
        context_mask[row, window.context_start : window.context_end] = True
    _fit_linear(hidden.flatten(0, 1), torch.tensor(spans), model.qa_outputs, group=context_mask)
    folders["reader"] = _save(model, root / "reader", qa_spec)

    # The base has no MLM head weights: the real encoder and word embeddings (the decoder is tied to
    # them) with a seeded transform and bias; a plain Hugging Face BertForMaskedLM folder (no berth_task.json).
    model, _ = load_pretrained(BertForMaskedLM, base)
    model.eval()
    folders["masker"] = save_pretrained(model, root / "masker", tokenizer_from=base)

    model, _ = load_pretrained(BertForMultipleChoice, base)
    nn.init.normal_(model.classifier.weight, std=0.5)
    folders["chooser"] = _save(model, root / "chooser", TaskSpec(task="multiple-choice", max_seq_length=64))

    folders["ranker"] = _ranker(tokenizer, root / "ranker")
    return folders


def _ranker(tokenizer: Tokenizer, folder: Path) -> Path:
    """The cross-encoder: [CLS] query [SEP] document [SEP], mean-pooled, one relevance logit."""
    model, _ = load_pretrained(BertForSequenceClassification, default_base_path(), num_labels=1,
                               classifier_pooling="mean")
    items, relevance = _rerank_windows(tokenizer)
    hidden, mask = _hidden(model, items)
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    _fit_logit(pooled, torch.tensor(relevance), model.classifier)
    return _save(model, folder, RANKER_SPEC)


# Bundles exported from folders without berth_task.json: the task to name (and the embedded base itself).
EXPORT_TASKS = {"masker": "fill-mask", "embeddings": "embedding"}
# Every bundle of the test repository: a reused repository (BERTH_TEST_REPOSITORY) missing one is rebuilt.
BUNDLE_NAMES = ("sentiment", "similarity", "entities", "reader", "masker", "chooser", "ranker", "embeddings")


def _save(model, folder: Path, spec: TaskSpec) -> Path:
    model.eval()
    save_pretrained(model, folder, tokenizer_from=default_base_path())
    spec.save(folder)
    return folder
