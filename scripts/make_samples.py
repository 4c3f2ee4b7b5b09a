"""Rebuild the small, permissively licensed training samples shipped in data/samples/.

They are what `berth build-defaults` fine-tunes the default bundles on, so a fresh clone can serve
real models without the research-only data sets. Sources and licenses: data/samples/SOURCES.md.
Deterministic (seeded): running it twice writes the same bytes.

    python scripts/make_samples.py ../shared/data
"""

from __future__ import annotations

import csv
import json
import random
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.contrast_pairs import contrast_pairs  # noqa: E402
from tasks.readers import read_conll  # noqa: E402  (the repository root is only on the path now)

OUT = REPO / "data" / "samples"

# The topic of each SQuAD article: its paragraphs and questions are labelled with it. Training
# texts come from the SQuAD v1.1 train articles, dev texts from the (disjoint) dev articles.
TOPICS = {
    "people": ["Beyoncé", "Frédéric_Chopin", "Kanye_West", "Alfred_North_Whitehead", "Arnold_Schwarzenegger",
               "Nikola_Tesla", "Martin_Luther", "Genghis_Khan"],
    "places": ["Montana", "New_York_City", "Tajikistan", "Portugal", "Saint_Barth%C3%A9lemy",
               "Republic_of_the_Congo", "Southern_Europe", "Plymouth", "Warsaw", "Southern_California",
               "Victoria_(Australia)", "Amazon_rainforest", "Fresno,_California", "Newcastle_upon_Tyne",
               "Jacksonville,_Florida", "Kenya", "Rhine"],
    "science_tech": ["Antibiotics", "IPod", "Solar_energy", "Dog", "Genome", "Wayback_Machine", "Symbiosis",
                     "Lighting", "Computational_complexity_theory", "Steam_engine", "Oxygen", "Apollo_program",
                     "Ctenophora", "Packet_switching", "Geology", "Pharmacy", "Immune_system", "Chloroplast",
                     "Prime_number", "Force"],
    "arts_media": ["The_Legend_of_Zelda:_Twilight_Princess", "Spectre_(2015_film)", "To_Kill_a_Mockingbird",
                   "American_Idol", "BBC_Television", "Sky_(United_Kingdom)", "American_Broadcasting_Company",
                   "Doctor_Who", "Victoria_and_Albert_Museum"],
    "society": ["University_of_Notre_Dame", "Genocide", "Sino-Tibetan_relations_during_the_Ming_dynasty",
                "Buddhism", "Financial_crisis_of_2007%E2%80%9308", "Comprehensive_school", "Prime_minister",
                "Institute_of_technology", "Dutch_Republic", "Canadian_Armed_Forces", "Cardinal_(Catholicism)",
                "Separation_of_powers_under_the_United_States_Constitution", "Human_Development_Index",
                "Normans", "Teacher", "Huguenot", "1973_oil_crisis", "European_Union_law", "Black_Death",
                "Civil_disobedience", "Private_school", "Harvard_University", "Economic_inequality",
                "University_of_Chicago", "Yuan_dynasty", "Scottish_Parliament", "Islamism", "Imperialism",
                "United_Methodist_Church", "French_and_Indian_War"],
}
TOPIC_OF = {title: topic for topic, titles in TOPICS.items() for title in titles}
SQUAD_TRAIN = "train-v1.1-subset-44articles.json"
# Dev articles for the QA model: four unseen articles of the official dev set (~600 questions) keep
# the build's evaluation to about a minute.
SQUAD_DEV_ARTICLES = ["Normans", "Packet_switching", "Black_Death", "Geology"]
NER_TYPES = ("PER", "LOC", "ORG")
NER_DEV_SHARE = 0.15  # of wikigold documents and of BTC tweets, held out whole
QA_CONTEXT_WORDS = 60  # training excerpts: short contexts, several times more questions per CPU-minute
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
# The contrast mix (weaknesses seen on hand-written inputs: organisations missed in company-heavy sentences,
# multi-word and hyphenated names cut; pairs that share most words but mean the opposite scored as similar).
# Drawn with its own generator so the main one's draws, and with them every other sample and both dev
# sets, stay byte for byte as they were.
MIX_SEED = "contrast-mix-1"
# similarity: training pairs that share most of their words (Jaccard of the lower-cased word sets) but are
# scored low are repeated, so word overlap alone stops predicting a high score.
STSB_CONTRAST = {"min_overlap": 0.5, "max_score": 2.5, "extra_copies": 2}
# similarity: contrast pairs made by rule (scripts/contrast_pairs.py), at most this many per rule from each
# source: the `images` captions and the short sentences (6-20 words) of the SQuAD v1.1 train articles.
RULE_PAIRS_PER_SOURCE = {"negation": 50, "antonym": 50, "swapped roles": 50, "changed number": 30}
RULE_PAIRS_SEED = "contrast-pairs-1"
# entities: training sentences with several organisations, a multi-word organisation or a hyphenated
# name are repeated once (every wikigold one, a seeded half of the BTC ones: wikigold's edited sentences
# are closer to what users send); a share of the training tweets without any entity is left out to pay
# for them, so the training tokens (what the trainer's cost follows) and the recipe's minutes hold.
NER_REPEAT_SHARE = {"wikigold": 1.0, "btc": 0.5}
NER_DROP_EMPTY_TWEETS = 0.6
WORD = re.compile(r"[a-z0-9']+")
# rerank: training questions (round-robin over the train articles; more than a 2-core budget reaches), the hard
# negatives mined for each (the embeddings model's most similar excerpts of its article without its answer; the
# trainer samples its `negatives` of them), and the candidates each dev question ranks (the embeddings model's
# top paragraphs of its article, as a reranker behind it would get them).
RERANK_TRAIN_QUESTIONS = 3000
RERANK_HARD_NEGATIVES = 5
RERANK_DEV_CANDIDATES = 5


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _squad(shared: Path, file: str) -> list[dict]:
    return json.loads((shared / "squad" / "v1.1" / file).read_text(encoding="utf-8"))["data"]


def topics(shared: Path, rng: random.Random) -> None:
    """Paragraph openings and questions of SQuAD articles, labelled with the article's topic."""
    out = OUT / "topics"
    out.mkdir(parents=True, exist_ok=True)
    for split, file, per_topic in (("train", SQUAD_TRAIN, 700), ("dev", "dev-v1.1.json", 150)):
        by_topic: dict[str, list[str]] = {t: [] for t in TOPICS}
        for article in _squad(shared, file):
            topic = TOPIC_OF.get(article["title"])
            if not topic:
                continue
            for paragraph in article["paragraphs"]:
                # The first two sentences: a short text like the ones users send, with the topic in it.
                by_topic[topic].append(" ".join(SENTENCE_END.split(paragraph["context"].strip())[:2]))
                by_topic[topic] += [qa["question"].strip() for qa in paragraph["qas"][:2]]
        rows = []
        for topic, texts in by_topic.items():
            rows += [{"text": t, "label": topic} for t in rng.sample(texts, min(per_topic, len(texts)))]
        rng.shuffle(rows)
        _write_jsonl(out / f"{split}.jsonl", rows)


def word_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' lower-cased word sets."""
    first, second = set(WORD.findall(a.lower())), set(WORD.findall(b.lower()))
    return len(first & second) / max(1, len(first | second))


def is_contrast_pair(row: dict) -> bool:
    """A pair that shares most of its words but is scored low (STSB_CONTRAST)."""
    return (row["label"] <= STSB_CONTRAST["max_score"]
            and word_overlap(row["text"], row["text_pair"]) >= STSB_CONTRAST["min_overlap"])


def stsb(shared: Path) -> dict:
    """STS-B pairs whose texts are permissively licensed: `images` (PASCAL VOC-2008 captions, CC BY-SA)
    for training (its train and dev pairs), `track5.en-en` (SNLI, CC BY-SA 4.0) held out as dev.

    Every `images` pair is already in training, so the high-overlap, low-score ones (is_contrast_pair)
    are added again, STSB_CONTRAST["extra_copies"] more times each. RTE's not_entailment pairs would
    fit too but are not shipped: RTE is research use only. Returns the mix for SOURCES.md."""
    out = OUT / "stsb"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for split in ("train", "dev"):
        with open(shared / "stsb" / f"{split}.tsv", encoding="utf-8") as f:
            rows += list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))

    def pairs(genre: str) -> list[dict]:
        return [{"text": r["sentence1"], "text_pair": r["sentence2"], "label": float(r["score"])}
                for r in rows if r["filename"] == genre]

    train = pairs("images")
    contrast = [row for row in train if is_contrast_pair(row)]
    extra = contrast * STSB_CONTRAST["extra_copies"]
    random.Random(MIX_SEED).shuffle(extra)
    rng = random.Random(RULE_PAIRS_SEED)
    captions = sorted({row[key] for row in train for key in ("text", "text_pair")})
    made = contrast_pairs(captions, RULE_PAIRS_PER_SOURCE, rng) + contrast_pairs(
        _short_sentences(shared), RULE_PAIRS_PER_SOURCE, rng)
    rng.shuffle(made)
    _write_jsonl(out / "train.jsonl", train + extra + made)
    _write_jsonl(out / "dev.jsonl", pairs("track5.en-en"))
    return {"images pairs": len(train), "contrast pairs (overlap >= {min_overlap}, score <= {max_score})".format(
        **STSB_CONTRAST): len(contrast), "rows added": len(extra),
        "pairs made by rule": dict(Counter(str(row["label"]) for row in made)),
        "train rows": len(train) + len(extra) + len(made),
        "dev rows (track5.en-en, unchanged)": len(pairs("track5.en-en"))}


def _short_sentences(shared: Path) -> list[str]:
    """The sentences of 6-20 words (ending in a full stop) of the SQuAD v1.1 train articles' paragraphs."""
    sentences = {sentence for article in _squad(shared, SQUAD_TRAIN) for paragraph in article["paragraphs"]
                 for sentence in SENTENCE_END.split(paragraph["context"].strip())
                 if 6 <= len(sentence.split()) <= 20 and sentence.endswith(".")}
    return sorted(sentences)


def _write_conll(path: Path, sentences: list[tuple[list[str], list[str]]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for tokens, tags in sentences:
            f.writelines(f"{token}\t{tag}\n" for token, tag in zip(tokens, tags))
            f.write("\n")


def _keep_types(tags: list[str], types: tuple[str, ...]) -> list[str]:
    return [tag if tag == "O" or tag[2:] in types else "O" for tag in tags]


def entity_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first token, end token) of each entity of an IOB2 tag sequence."""
    spans: list[list] = []
    for number, tag in enumerate(tags):
        if tag.startswith("B-") or (tag.startswith("I-") and not (spans and spans[-1][2] == number
                                                                   and spans[-1][0] == tag[2:])):
            spans.append([tag[2:], number, number + 1])
        elif tag.startswith("I-"):
            spans[-1][2] = number + 1
    return [tuple(span) for span in spans]


def is_contrast_sentence(tokens: list[str], tags: list[str]) -> bool:
    """Several organisations, a multi-word organisation, or a hyphenated person or organisation name."""
    spans = entity_spans(tags)
    organisations = [span for span in spans if span[0] == "ORG"]
    return (len(organisations) >= 2 or any(end - start > 1 for _, start, end in organisations)
            or any(kind in ("PER", "ORG") and any("-" in tokens[k].strip("-") for k in range(start, end))
                   for kind, start, end in spans))


def _entity_counts(sentences: list[tuple[list[str], list[str]]]) -> dict:
    counts = {kind: 0 for kind in NER_TYPES}
    for _tokens, tags in sentences:
        for kind, _start, _end in entity_spans(tags):
            counts[kind] = counts.get(kind, 0) + 1
    return {"sentences": len(sentences), "tokens": sum(len(tokens) for tokens, _ in sentences), **counts}


def entities(shared: Path, rng: random.Random, types: tuple[str, ...] = NER_TYPES) -> dict:
    """wikigold (IOB1, PER/LOC/ORG/MISC) and BTC (IOB2, PER/LOC/ORG) as one IOB2 set of `types`.

    Dev is held out by document: whole wikigold articles and whole tweets (a BTC document is a tweet).
    Training then repeats the sentences of is_contrast_sentence once (NER_REPEAT_SHARE of them) and leaves
    out NER_DROP_EMPTY_TWEETS of the tweets without an entity (MIX_SEED), dev untouched. Returns the
    mix (sentences, tokens and entities per source) for SOURCES.md.
    """
    out = OUT / "entities"
    out.mkdir(parents=True, exist_ok=True)
    wikigold = shared / "wikigold" / "wikigold.conll.txt"
    doc_starts = [n for n, line in enumerate(wikigold.read_text(encoding="utf-8").splitlines(), 1)
                  if line.startswith("-DOCSTART-")]
    documents: list[list] = [[] for _ in doc_starts]
    for sentence in read_conll(wikigold, iob1=True):
        documents[sum(1 for start in doc_starts if start < sentence.line) - 1].append(sentence)
    dev_docs = set(rng.sample(range(len(documents)), round(NER_DEV_SHARE * len(documents))))
    train, dev = [], []
    for number, document in enumerate(documents):
        (dev if number in dev_docs else train).extend((s.tokens, _keep_types(s.tags, types)) for s in document)
    wikigold_train = {id(sentence) for sentence in train}
    for section in "abefgh":
        tweets = [(s.tokens, _keep_types(s.tags, types)) for s in read_conll(shared / "btc" / f"{section}.conll")]
        held = set(rng.sample(range(len(tweets)), round(NER_DEV_SHARE * len(tweets))))
        train += [t for n, t in enumerate(tweets) if n not in held]
        dev += [t for n, t in enumerate(tweets) if n in held]
    rng.shuffle(train)  # as before the mix: the main generator's draws are unchanged

    mix_rng = random.Random(MIX_SEED)
    source = {id(sentence): "wikigold" if id(sentence) in wikigold_train else "btc" for sentence in train}
    kept, dropped, repeated = [], [], []
    for sentence in train:
        if source[id(sentence)] == "btc" and not entity_spans(sentence[1]) and mix_rng.random() < NER_DROP_EMPTY_TWEETS:
            dropped.append(sentence)
            continue
        kept.append(sentence)
        if is_contrast_sentence(*sentence) and mix_rng.random() < NER_REPEAT_SHARE[source[id(sentence)]]:
            repeated.append(sentence)
    mixed = kept + repeated
    mix_rng.shuffle(mixed)
    _write_conll(out / "train.conll", mixed)
    _write_conll(out / "dev.conll", dev)

    def by_source(sentences: list) -> dict:
        return {name: _entity_counts([s for s in sentences if source[id(s)] == name]) for name in ("wikigold", "btc")}

    return {"train before the mix": by_source(train), "left out: btc tweets without an entity": len(dropped),
            "repeated": by_source(repeated), "train": by_source(mixed), "train total": _entity_counts(mixed),
            "dev (unchanged)": _entity_counts(dev)}


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    spans, position = [], 0
    for sentence in SENTENCE_END.split(text):
        start = text.index(sentence, position)
        spans.append((start, start + len(sentence)))
        position = start + len(sentence)
    return spans


def _around_answer(context: str, start: int, end: int, rng: random.Random) -> tuple[str, int] | None:
    """The sentence holding [start, end) grown by whole neighbouring sentences (a seeded side at a time)
    while the excerpt stays within QA_CONTEXT_WORDS words; returns (excerpt, its offset in context)."""
    spans = _sentence_spans(context)
    first = last = next((k for k, (s, e) in enumerate(spans) if s <= start < e), None)
    if first is None or end > spans[first][1]:
        return None  # an answer across sentences: keep the excerpt rule simple, skip the question
    while True:
        sides = [side for side, ok in ((-1, first > 0), (1, last < len(spans) - 1)) if ok]
        if not sides:
            break
        side = rng.choice(sides)
        grown = (first - 1, last) if side < 0 else (first, last + 1)
        if len(context[spans[grown[0]][0]:spans[grown[1]][1]].split()) > QA_CONTEXT_WORDS:
            break
        first, last = grown
    if end > spans[last][1]:
        return None
    offset = spans[first][0]
    return context[offset:spans[last][1]], offset


def squad(shared: Path, rng: random.Random) -> None:
    """Train: every question of the 44-article SQuAD v1.1 train subset, over the sentences around its
    answer (at most QA_CONTEXT_WORDS words) rather than the whole paragraph. Dev: SQUAD_DEV_ARTICLES
    of the official dev set, whole paragraphs."""
    out = OUT / "squad"
    out.mkdir(parents=True, exist_ok=True)
    articles = []
    for article in _squad(shared, SQUAD_TRAIN):
        paragraphs = []
        for paragraph in article["paragraphs"]:
            for question in paragraph["qas"]:
                answer = question["answers"][0]
                start = answer["answer_start"]
                excerpt = _around_answer(paragraph["context"], start, start + len(answer["text"]), rng)
                if excerpt is None:
                    continue
                text, offset = excerpt
                paragraphs.append({"context": text, "qas": [{
                    "id": question["id"], "question": question["question"],
                    "answers": [{"text": answer["text"], "answer_start": start - offset}]}]})
        articles.append({"title": article["title"], "paragraphs": paragraphs})
    (out / "train.json").write_text(json.dumps({"version": "1.1", "data": articles}, ensure_ascii=False),
                                    encoding="utf-8")
    keep = [a for a in _squad(shared, "dev-v1.1.json") if a["title"] in SQUAD_DEV_ARTICLES]
    (out / "dev.json").write_text(json.dumps({"version": "1.1", "data": keep}, ensure_ascii=False), encoding="utf-8")


def rerank(embeddings: Path) -> dict:
    """data/samples/rerank from the squad sample just written, mined with the embeddings bundle `embeddings`.

    train.json: RERANK_TRAIN_QUESTIONS questions of squad/train.json, each article's excerpts of them stored
    once, each question with `hard_negatives`. dev.json: squad/dev.json's questions whose own paragraph is among
    the embeddings model's top RERANK_DEV_CANDIDATES of its article, with those `candidates` (paragraph order);
    the others (the first stage missed them: no reranker can help) are left out and counted."""
    from tasks.first_stage import embed_texts
    from tasks.rerank import read_article_questions

    out = OUT / "rerank"
    out.mkdir(parents=True, exist_ok=True)
    chosen = read_article_questions(OUT / "squad" / "train.json")[:RERANK_TRAIN_QUESTIONS]
    qa_of = {q["id"]: q for a in _squad_file(OUT / "squad" / "train.json") for p in a["paragraphs"] for q in p["qas"]}
    by_article: dict[int, list] = {}
    for example in chosen:
        by_article.setdefault(id(example.documents), []).append(example)
    excerpts = list(dict.fromkeys(e.documents[e.relevant[0]] for e in chosen))
    vectors, _ = embed_texts(embeddings, excerpts + [e.query for e in chosen])
    vector_of = dict(zip(excerpts, vectors[: len(excerpts)]))
    query_vector = dict(zip((e.id for e in chosen), vectors[len(excerpts):]))
    articles = []
    for examples in by_article.values():
        own = [e.documents[e.relevant[0]] for e in examples]
        paragraphs = list(dict.fromkeys(own))
        qas: dict[str, list] = {text: [] for text in paragraphs}
        similarity = np.stack([vector_of[p] for p in paragraphs]) @ np.stack([query_vector[e.id] for e in examples]).T
        for column, (example, text) in enumerate(zip(examples, own)):
            answer = qa_of[example.id]["answers"][0]["text"].lower()
            ranked = np.argsort(-similarity[:, column], kind="stable").tolist()
            hard = [i for i in ranked if paragraphs[i] != text and answer not in paragraphs[i].lower()]
            qas[text].append({**qa_of[example.id], "hard_negatives": hard[:RERANK_HARD_NEGATIVES]})
        articles.append({"paragraphs": [{"context": p, "qas": qas[p]} for p in paragraphs]})
    (out / "train.json").write_text(json.dumps({"version": "1.1", "data": articles}, ensure_ascii=False),
                                    encoding="utf-8")

    dev = _squad_file(OUT / "squad" / "dev.json")
    kept = missed = 0
    for article in dev:
        contexts = [p["context"] for p in article["paragraphs"]]
        questions = [q for p in article["paragraphs"] for q in p["qas"]]
        vectors, _ = embed_texts(embeddings, contexts + [q["question"] for q in questions])
        scores = vectors[len(contexts):] @ vectors[: len(contexts)].T
        top = {q["id"]: sorted(np.argsort(-row, kind="stable")[:RERANK_DEV_CANDIDATES].tolist())
               for q, row in zip(questions, scores)}
        for number, paragraph in enumerate(article["paragraphs"]):
            held = [q for q in paragraph["qas"] if number in top[q["id"]]]
            missed += len(paragraph["qas"]) - len(held)
            kept += len(held)
            paragraph["qas"] = [{**q, "candidates": top[q["id"]]} for q in held]
    (out / "dev.json").write_text(json.dumps({"version": "1.1", "data": dev}, ensure_ascii=False), encoding="utf-8")
    return {"train questions": len(chosen), "train excerpts": len(excerpts), "dev questions": kept,
            f"dev questions left out (own paragraph not in the embeddings model's top {RERANK_DEV_CANDIDATES})":
            missed}


def _squad_file(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["data"]


def main() -> None:
    shared = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data")
    rng = random.Random(0)
    topics(shared, rng)
    mix = {"stsb": stsb(shared), "entities": entities(shared, rng)}
    squad(shared, rng)
    with tempfile.TemporaryDirectory() as folder:
        from berth.build_defaults import build_embeddings_bundle

        mix["rerank"] = rerank(build_embeddings_bundle(Path(folder)))
    for path in sorted(OUT.rglob("*.*")):
        print(f"{path.relative_to(OUT)}: {path.stat().st_size:,} bytes")
    print(json.dumps(mix, indent=1))  # the mix SOURCES.md reports


if __name__ == "__main__":
    main()
