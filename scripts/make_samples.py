"""Rebuild the small, permissively licensed training samples shipped in data/samples/.

They are what `berth build-defaults` fine-tunes the default bundles on, so a fresh clone can serve
real models without the research-only data sets. Sources and licenses: data/samples/SOURCES.md.

    python scripts/make_samples.py ../shared/data
"""

from __future__ import annotations

import csv
import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "data" / "samples"

# Topic of each SQuAD article: questions are labelled with their article's topic. Training
# questions come from SQuAD v1.1 train articles, dev questions from the (disjoint) dev articles.
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
SQUAD_TRAIN_ARTICLES = ["University_of_Notre_Dame", "Antibiotics", "IPod", "Solar_energy", "Montana",
                        "Genocide", "Dog", "Symbiosis"]
SQUAD_DEV_ARTICLES = ["Normans", "Packet_switching"]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def topic_questions(shared: Path, rng: random.Random) -> None:
    out = OUT / "topic_questions"
    out.mkdir(parents=True, exist_ok=True)
    for split, file, per_topic in (("train", "train-v1.1-subset-44articles.json", 500),
                                   ("dev", "dev-v1.1.json", 120)):
        articles = json.loads((shared / "squad" / "v1.1" / file).read_text(encoding="utf-8"))["data"]
        by_topic: dict[str, list[str]] = {t: [] for t in TOPICS}
        for article in articles:
            topic = TOPIC_OF.get(article["title"])
            if topic:
                by_topic[topic] += [qa["question"].strip() for p in article["paragraphs"] for qa in p["qas"]]
        rows = []
        for topic, questions in by_topic.items():
            rows += [{"text": q, "label": topic} for q in rng.sample(questions, min(per_topic, len(questions)))]
        rng.shuffle(rows)
        _write_jsonl(out / f"{split}.jsonl", rows)


def stsb_images(shared: Path) -> None:
    """STS-B pairs of the `images` genre: PASCAL VOC-2008 captions (CC BY-SA), scores CC BY-SA 4.0."""
    out = OUT / "stsb_images"
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev"):
        with open(shared / "stsb" / f"{split}.tsv", encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
        keep = [{"text": r["sentence1"], "text_pair": r["sentence2"], "label": float(r["score"])}
                for r in rows if r["filename"] == "images"]
        _write_jsonl(out / f"{split}.jsonl", keep)


def wnut17(shared: Path) -> None:
    out = OUT / "wnut17"
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.conll").write_bytes((shared / "wnut17" / "wnut17train.conll").read_bytes())
    (out / "dev.conll").write_bytes((shared / "wnut17" / "emerging.dev.conll").read_bytes())


def squad(shared: Path) -> None:
    out = OUT / "squad"
    out.mkdir(parents=True, exist_ok=True)
    for split, file, titles in (("train", "train-v1.1-subset-44articles.json", SQUAD_TRAIN_ARTICLES),
                                ("dev", "dev-v1.1.json", SQUAD_DEV_ARTICLES)):
        articles = json.loads((shared / "squad" / "v1.1" / file).read_text(encoding="utf-8"))["data"]
        keep = [a for a in articles if a["title"] in titles]
        (out / f"{split}.json").write_text(json.dumps({"version": "1.1", "data": keep}, ensure_ascii=False),
                                           encoding="utf-8")


def main() -> None:
    shared = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data")
    rng = random.Random(0)
    topic_questions(shared, rng)
    stsb_images(shared)
    wnut17(shared)
    squad(shared)
    for path in sorted(OUT.rglob("*.*")):
        print(f"{path.relative_to(OUT)}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
