"""NER features and decoding with the real tokenizer: alignment, round trips on real CoNLL-2003
dev data, windows over long texts, character offsets, aggregation strategies."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.ner import (
    IGNORE_INDEX,
    align_labels,
    decode_entities,
    encode_words,
    entities_to_word_tags,
    merge_window_logits,
    ner_label_list,
    ner_windows,
    word_spans,
)
from tasks.ner_metrics import conlleval, iob_chunks

CONLL_LABELS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]
STRATEGIES = ("simple", "first", "average", "max")


@pytest.fixture(scope="module")
def conll_dev(shared_data):
    from tasks.readers import read_conll

    return read_conll(shared_data / "conll2003" / "iob2" / "valid.txt")


def one_hot(label_ids: np.ndarray, num_labels: int, rng: np.random.Generator) -> np.ndarray:
    """Confident logits for the given labels; positions with IGNORE_INDEX get random logits."""
    logits = rng.normal(0.0, 1.0, (len(label_ids), num_labels)).astype(np.float32)
    known = label_ids != IGNORE_INDEX
    logits[known] = 0.0
    logits[np.flatnonzero(known), label_ids[known]] = 10.0
    return logits


def gold_entities(words: list[str], tags: list[str], spans: list[tuple[int, int]]) -> list[tuple]:
    return [(t, spans[s][0], spans[e - 1][1], " ".join(words[s:e])) for t, s, e in iob_chunks(tags)]


def as_tuples(entities: list[dict]) -> list[tuple]:
    return [(e["entity"], e["start"], e["end"], e["text"]) for e in entities]


def test_label_list():
    assert ner_label_list([["O", "B-PER", "I-PER"], ["B-LOC", "O", "B-ORG", "I-ORG"], ["B-MISC"]]) == CONLL_LABELS
    with pytest.raises(ValueError, match="PER"):
        ner_label_list([["PER"]])


def test_align_labels_by_character_offsets(tokenizer):
    words = ["West", "Indian", "all-rounder", "Phil", "Simmons", "."]
    tags = ["B-MISC", "I-MISC", "O", "B-PER", "I-PER", "O"]
    encoded = encode_words(tokenizer, words)
    assert encoded.text == "West Indian all-rounder Phil Simmons ."
    assert encoded.word_spans[2] == (12, 23)
    # BERT splits "all-rounder" into all / - / round / ##er: four tokens of one CoNLL word.
    assert encoded.token_words.tolist() == [-1, 0, 1, 2, 2, 2, 2, 3, 4, 5, -1]
    assert encoded.first_tokens.tolist() == [1, 2, 3, 7, 8, 9]
    ids = [CONLL_LABELS.index(t) for t in tags]
    assert align_labels(encoded, ids) == [-100, 3, 4, 0, -100, -100, -100, 7, 8, 0, -100]
    assert (align_labels(encoded, tags, labels=CONLL_LABELS) == align_labels(encoded, np.array(ids))
            == align_labels(encoded, ids))
    all_tokens = align_labels(encoded, ids, label_all_tokens=True)
    assert all_tokens == [-100, 3, 4, 0, 0, 0, 0, 7, 8, 0, -100]


def test_label_all_tokens_turns_b_into_i(tokenizer):
    encoded = encode_words(tokenizer, ["Nadella", "won"])  # nad ##ella won
    labels = align_labels(encoded, ["B-PER", "O"], label_all_tokens=True, labels=CONLL_LABELS)
    assert labels == [-100, 7, 8, 0, -100]
    with pytest.raises(ValueError, match="2 words"):
        align_labels(encoded, [0])
    with pytest.raises(ValueError, match="need `labels`"):
        align_labels(encoded, ["B-ORG", "O"])


def test_served_entities_become_word_tags_over_the_words_they_cover():
    text, spans = word_spans(["Peter", "Blackburn", "visited", "New", "York-based", "U.N.", "staff"])
    assert text == "Peter Blackburn visited New York-based U.N. staff" and spans[1] == (6, 15)
    entities = [{"entity": "PER", "start": 0, "end": 15}, {"entity": "LOC", "start": 24, "end": 32},  # "New York"
                {"entity": "ORG", "start": 39, "end": 43}, {"entity": "ORG", "start": 41, "end": 43}]  # "U.N.", "N."
    assert entities_to_word_tags(entities, spans) == ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "B-ORG", "O"]


def test_word_level_round_trip_on_real_conll_dev(tokenizer, conll_dev):
    rng = np.random.default_rng(0)
    sentences = conll_dev[:400]
    predicted = []
    for example in sentences:
        encoded = encode_words(tokenizer, example.tokens, max_length=None)
        label_ids = np.array(align_labels(encoded, example.tags, labels=CONLL_LABELS))
        logits = one_hot(label_ids, len(CONLL_LABELS), rng)  # noise on every non-first sub-token
        predicted.append([CONLL_LABELS[i] for i in logits[encoded.first_tokens].argmax(axis=-1)])
    assert predicted == [e.tags for e in sentences]
    assert conlleval([e.tags for e in sentences], predicted)["f1"] == 1.0


def test_entity_offsets_round_trip_on_real_conll_dev(tokenizer, conll_dev):
    """Aligned gold labels -> per-token logits -> entities whose offsets slice the joined text
    to exactly the gold entity words, with every word-level strategy."""
    rng = np.random.default_rng(1)
    checked = 0
    for example in conll_dev[:300]:
        encoded = encode_words(tokenizer, example.tokens, max_length=None)
        token_labels = np.array(align_labels(encoded, example.tags, label_all_tokens=True, labels=CONLL_LABELS))
        windows = ner_windows(tokenizer, encoded.text, max_seq_length=512)
        assert len(windows) == 1 and windows[0].input_ids == encoded.encoded.input_ids
        logits = one_hot(token_labels, len(CONLL_LABELS), rng)
        expected = gold_entities(example.tokens, example.tags, encoded.word_spans)
        for strategy in STRATEGIES:
            found = decode_entities(encoded.text, windows, [logits], CONLL_LABELS, aggregation=strategy)
            assert as_tuples(found) == expected, (strategy, example.tokens)
        checked += len(expected)
    assert checked > 400


@pytest.mark.parametrize(("max_seq_length", "stride"), [(128, 32), (24, 8)])
def test_long_document_round_trip_across_windows(tokenizer, conll_dev, max_seq_length, stride):
    """A 60-sentence stretch of CoNLL dev as one text, many windows; each window's logits are
    wrong near its inner edges, so only the max-context merge gets every entity right."""
    rng = np.random.default_rng(2)
    words = [w for e in conll_dev[:60] for w in e.tokens]
    tags = [t for e in conll_dev[:60] for t in e.tags]
    encoded = encode_words(tokenizer, words, max_length=None)
    token_labels = np.array(align_labels(encoded, tags, label_all_tokens=True, labels=CONLL_LABELS))[1:-1]
    windows = ner_windows(tokenizer, encoded.text, max_seq_length=max_seq_length, stride=stride)
    assert windows.num_tokens == len(token_labels) > 5 * max_seq_length
    margin = (stride - 1) // 2
    per_window = []
    for item, start in zip(windows, windows.starts.tolist()):
        length = len(item) - 2
        labels = token_labels[start : start + length].copy()
        if start > 0:
            labels[:margin] = (labels[:margin] + 1) % len(CONLL_LABELS)  # wrong at the inner edges
        if start + length < windows.num_tokens:
            labels[length - margin :] = (labels[length - margin :] + 3) % len(CONLL_LABELS)
        per_window.append(one_hot(np.r_[IGNORE_INDEX, labels, IGNORE_INDEX], len(CONLL_LABELS), rng))
    expected = gold_entities(words, tags, encoded.word_spans)
    for strategy in STRATEGIES:
        found = decode_entities(encoded.text, windows, per_window, CONLL_LABELS, aggregation=strategy)
        assert as_tuples(found) == expected
    # The same per-window logits as one padded (K, T, C) batch.
    padded = np.zeros((len(windows), max_seq_length, len(CONLL_LABELS)), dtype=np.float32)
    for k, logits in enumerate(per_window):
        padded[k, : len(logits)] = logits
    assert as_tuples(decode_entities(encoded.text, windows, padded, CONLL_LABELS)) == expected


def test_windows_cover_every_token_with_the_requested_overlap(tokenizer):
    text = "The committee met again on Tuesday in Brussels. " * 120
    windows = ner_windows(tokenizer, text, max_seq_length=128, stride=32)
    n = windows.num_tokens
    assert n > 1000
    covered = np.zeros(n, dtype=int)
    for item, start in zip(windows, windows.starts.tolist()):
        assert len(item) <= 128 and not item.truncated
        assert (item.input_ids[0] == tokenizer.token_to_id("[CLS]")
                and item.input_ids[-1] == tokenizer.token_to_id("[SEP]"))
        covered[start : start + len(item) - 2] += 1
    assert (covered >= 1).all()
    ends = windows.starts + 126
    assert (ends[:-1] - windows.starts[1:] >= 32).all()  # consecutive windows share >= stride tokens
    assert windows.starts[-1] + 126 == n  # the last window ends at the last token
    short = ner_windows(tokenizer, "Hello Paris", max_seq_length=128)
    assert len(short) == 1 and short.num_tokens == 2
    empty = ner_windows(tokenizer, "   ")
    assert len(empty) == 1 and len(empty[0]) == 2
    assert decode_entities("   ", empty, [np.zeros((2, 9))], CONLL_LABELS) == []
    with pytest.raises(ValueError, match="stride"):
        ner_windows(tokenizer, text, max_seq_length=128, stride=126)


def test_merge_takes_each_token_from_its_most_central_window(tokenizer):
    text = " ".join(f"w{i}" for i in range(300))
    windows = ner_windows(tokenizer, text, max_seq_length=40, stride=12)
    per_window = [np.full((len(item), len(windows)), 0.0, dtype=np.float32) for item in windows]
    for k, logits in enumerate(per_window):
        logits[:, k] = 1.0  # window k votes for label k everywhere
    chosen = merge_window_logits(windows, per_window).argmax(axis=1)
    for token in range(windows.num_tokens):
        contexts = [
            min(token - s, s + len(item) - 3 - token) if s <= token < s + len(item) - 2 else -1
            for item, s in zip(windows, windows.starts.tolist())
        ]
        assert chosen[token] == int(np.argmax(contexts))  # argmax: the earlier window on ties
    with pytest.raises(ValueError, match="windows"):
        merge_window_logits(windows, per_window[:-1])


def logits_from_offsets(windows, text: str, marks: dict[str, str], labels: list[str]) -> list[np.ndarray]:
    """A stand-in model: each token's label is looked up from the text of the word it belongs to."""
    out = []
    for item in windows:
        logits = np.zeros((len(item), len(labels)), dtype=np.float32)
        for row, (start, _end) in enumerate(item.offsets):
            tag = "O"
            if item.sequence_ids[row] is not None:
                for word, word_tag in marks.items():
                    at = text.find(word)
                    while at >= 0:
                        if at <= start < at + len(word):
                            tag = word_tag if start == at else "I-" + word_tag[2:]
                        at = text.find(word, at + 1)
            logits[row, labels.index(tag)] = 8.0
        out.append(logits)
    return out


def test_entity_at_the_very_end_of_a_long_text(tokenizer):
    text = "The committee met again on Tuesday and talked for hours. " * 100 + "Then came Angela Merkel"
    windows = ner_windows(tokenizer, text, max_seq_length=128, stride=32)
    assert len(windows) > 10
    logits = logits_from_offsets(windows, text, {"Angela": "B-PER", "Merkel": "I-PER"}, CONLL_LABELS)
    for strategy in ("simple", "first", "max"):
        entities = decode_entities(text, windows, logits, CONLL_LABELS, aggregation=strategy)
        assert as_tuples(entities) == [("PER", len(text) - 13, len(text), "Angela Merkel")]
        assert entities[0]["score"] == pytest.approx(np.exp(8) / (np.exp(8) + 8), rel=1e-5)


def test_offsets_with_non_ascii_text_and_extra_whitespace(tokenizer):
    text = "  Zürich  und\tSão   Paulo liegen 😀 weit\u00a0weg,\n sagt  Ｔｏｋｙｏ-Kun über Straße "
    marks = {"Zürich": "B-LOC", "São": "B-LOC", "Paulo": "I-LOC", "Ｔｏｋｙｏ": "B-PER", "Straße": "B-LOC"}
    windows = ner_windows(tokenizer, text, max_seq_length=128)
    logits = logits_from_offsets(windows, text, marks, CONLL_LABELS)
    entities = decode_entities(text, windows, logits, CONLL_LABELS)
    assert [e["text"] for e in entities] == ["Zürich", "São   Paulo", "Ｔｏｋｙｏ", "Straße"]
    for e in entities:
        assert text[e["start"] : e["end"]] == e["text"]
    assert entities[0]["start"] == 2


def hand_built_logits(rows: list[tuple[str, float]], labels: list[str]) -> np.ndarray:
    """Logits whose softmax puts probability p on the named label and the rest evenly elsewhere."""
    probs = np.zeros((len(rows) + 2, len(labels)))
    probs[[0, -1]] = 1.0 / len(labels)  # [CLS], [SEP]
    for i, (tag, p) in enumerate(rows, start=1):
        probs[i] = (1 - p) / (len(labels) - 1)
        probs[i, labels.index(tag)] = p
    return np.log(probs).astype(np.float32)


@pytest.fixture
def satya(tokenizer):
    text = "Satya Nadella joined Microsoft in Redmond"
    labels = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
    windows = ner_windows(tokenizer, text)
    # tokens: sat ##ya | nad ##ella | joined | microsoft | in | red ##mond
    rows = [("B-PER", 0.7), ("I-ORG", 0.6), ("I-PER", 0.8), ("I-PER", 0.9), ("O", 0.9),
            ("B-ORG", 0.8), ("O", 0.9), ("B-LOC", 0.5), ("O", 0.95)]
    assert len(windows[0]) == len(rows) + 2
    return text, windows, [hand_built_logits(rows, labels)], labels


def scored(entities: list[dict]) -> list[tuple]:
    return [(e["entity"], e["text"], e["start"], e["end"], round(e["score"], 4)) for e in entities]


def test_aggregation_none(satya):
    text, windows, logits, labels = satya
    assert scored(decode_entities(text, windows, logits, labels, aggregation="none")) == [
        ("B-PER", "Sat", 0, 3, 0.7), ("I-ORG", "ya", 3, 5, 0.6), ("I-PER", "Nad", 6, 9, 0.8),
        ("I-PER", "ella", 9, 13, 0.9), ("B-ORG", "Microsoft", 21, 30, 0.8), ("B-LOC", "Red", 34, 37, 0.5),
    ]


def test_aggregation_simple_groups_tokens_and_never_splits_a_word(satya):
    text, windows, logits, labels = satya
    # ##ya (I-ORG 0.6) continues Satya's B-PER, scored by its PER probability 2 x 0.4/6; ##mond (O 0.95)
    # continues Redmond's B-LOC, scored 2 x 0.05/6. The pipeline's simple gave Sat | ya (ORG) | Nadella | Red.
    assert scored(decode_entities(text, windows, logits, labels, aggregation="simple")) == [
        ("PER", "Satya Nadella", 0, 13, round((0.7 + 0.8 / 6 + 0.8 + 0.9) / 4, 4)),
        ("ORG", "Microsoft", 21, 30, 0.8), ("LOC", "Redmond", 34, 41, round((0.5 + 0.1 / 6) / 2, 4)),
    ]


def test_aggregation_first_average_max_decide_per_word(satya):
    text, windows, logits, labels = satya
    first = decode_entities(text, windows, logits, labels, aggregation="first")
    assert scored(first) == [("PER", "Satya Nadella", 0, 13, 0.75), ("ORG", "Microsoft", 21, 30, 0.8),
                             ("LOC", "Redmond", 34, 41, 0.5)]
    # max: Satya from sat (0.7 > 0.6), Nadella from ##ella (0.9), Redmond from ##mond: O.
    assert scored(decode_entities(text, windows, logits, labels, aggregation="max")) == [
        ("PER", "Satya Nadella", 0, 13, 0.8), ("ORG", "Microsoft", 21, 30, 0.8)]
    # average: Satya B-PER (0.7 + 0.4/6) / 2, Nadella I-PER 0.85, Redmond O (0.5/6 + 0.95) / 2.
    satya_score = (0.7 + 0.4 / 6) / 2
    assert scored(decode_entities(text, windows, logits, labels, aggregation="average")) == [
        ("PER", "Satya Nadella", 0, 13, round((satya_score + 0.85) / 2, 4)), ("ORG", "Microsoft", 21, 30, 0.8)]


def test_ignore_labels_and_errors(satya):
    text, windows, logits, labels = satya
    without_org = decode_entities(text, windows, logits, labels, ignore_labels=("O", "ORG"))
    assert [e["entity"] for e in without_org] == ["PER", "LOC"]
    with pytest.raises(ValueError, match="aggregation"):
        decode_entities(text, windows, logits, labels, aggregation="longest")
    with pytest.raises(ValueError, match="different text"):
        decode_entities(text + " ", windows, logits, labels)
    with pytest.raises(ValueError, match="labels"):
        decode_entities(text, windows, logits, labels[:-1])


def pipeline_spans_trimmed(text: str, windows, reference: list[tuple]) -> list[tuple]:
    """The pipeline's entities with the edge rule of `decode_entities` applied: no hyphen, space, or character
    of an [UNK] that is not alphanumeric at either end (entities left empty are gone; the score is None
    where a span changed: the trimmed units no longer count in it)."""
    unknown = np.zeros(len(text), dtype=bool)
    for start, end in windows.offsets[windows.unknown].tolist():
        unknown[start:end] = True

    def cut(i: int) -> bool:
        return text[i].isspace() or text[i] in "-\u2010\u2011" or (unknown[i] and not text[i].isalnum())

    out = []
    for name, start, end, score in reference:
        s, e = start, end
        while s < e and cut(s):
            s += 1
        while e > s and cut(e - 1):
            e -= 1
        if s < e:
            out.append((name, s, e, score if (s, e) == (start, end) else None))
    return out


def test_strategies_match_transformers_pipeline(tokenizer, base_path):
    """Same logits, same answers as transformers' TokenClassificationPipeline (a seeded random head
    on the real checkpoint, sharpened so that tags vary from token to token), but for the documented
    edge rule (the pipeline may end an entity with the [UNK] of the emoji) and the word rule of `simple`:
    its spans are the pipeline's `first` spans (the pipeline's `simple` may cut a word in two)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = transformers.BertForTokenClassification.from_pretrained(
        base_path, num_labels=len(CONLL_LABELS), id2label=dict(enumerate(CONLL_LABELS)),
        label2id={n: i for i, n in enumerate(CONLL_LABELS)},
    ).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(base_path)
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=hf_tokenizer, device="cpu")
    texts = ["My name is Wolfgang and I live in Berlin, Zürich or São Paulo.",
             "  Angela  Merkel met\tEmmanuel Macron in Paris; the U.S. didn't attend. 北京 😀 naïve café"]
    for text in texts:
        windows = ner_windows(tokenizer, text)
        ids = torch.tensor([windows[0].input_ids])
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0].numpy()
        for strategy in ("none", *STRATEGIES):
            spans_of = "first" if strategy == "simple" else strategy
            reference = [(e.get("entity_group", e.get("entity")), int(e["start"]), int(e["end"]),
                          None if strategy == "simple" else float(e["score"]))
                         for e in pipe(text, aggregation_strategy=spans_of)]
            if strategy != "none":  # tokens as they are
                reference = pipeline_spans_trimmed(text, windows, reference)
            ours = [(e["entity"], e["start"], e["end"], e["score"])
                    for e in decode_entities(text, windows, [logits], CONLL_LABELS, aggregation=strategy)]
            assert len(ours) == len(reference) > 3, strategy
            for a, b in zip(ours, reference):
                assert a[:3] == b[:3] and (b[3] is None or a[3] == pytest.approx(b[3], abs=1e-5)), strategy
