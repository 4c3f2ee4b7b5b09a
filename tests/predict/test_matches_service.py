"""`berth predict` gives, row by row, what the HTTP route answers for the same input: real bundles, real data
(SST-2, STS-B, CoNLL-2003, SQuAD samples), a real `berth serve` as the reference, every field compared."""

from __future__ import annotations

import csv
import math

import pytest

from tasks.qa import read_squad
from tasks.readers import read_conll
from tests.predict.conftest import read_output, run_predict, write_jsonl

CHUNK = 32  # inputs per HTTP request (the test server takes at most 64)


def ask(http, route: str, model: str, inputs: list, **options) -> list:
    answers = []
    for at in range(0, len(inputs), CHUNK):
        response = http.post(route, json={"model": model, "inputs": inputs[at : at + CHUNK], **options})
        assert response.status_code == 200, response.text
        answers += response.json()["results"]
    return answers


def assert_same(got, expected, where: str = "", tol: float = 1e-4) -> None:
    """Equal, floats within `tol` (absolute or relative): other padding, other float sums."""
    if isinstance(expected, float) or isinstance(got, float):
        assert got is not None and math.isclose(got, expected, rel_tol=tol, abs_tol=tol), \
            f"{where}: {got} != {expected}"
    elif isinstance(expected, dict):
        assert isinstance(got, dict), f"{where}: {got!r} is not an object"
        for key, value in expected.items():
            assert_same(got.get(key), value, f"{where}.{key}", tol)
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), f"{where}: {got!r} != {expected!r}"
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same(a, b, f"{where}[{i}]", tol)
    else:
        assert got == expected, f"{where}: {got!r} != {expected!r}"


def sst2(shared_data, count: int, split: str = "dev") -> list[str]:
    with open(shared_data / "sst2" / f"{split}.tsv", encoding="utf-8") as f:
        return [line.split("\t")[0] for line in f.read().splitlines()[1 : count + 1]]


def test_classification_sst2_tsv_matches_classify(shared_data, http, bundle_repository, tmp_path):
    out = tmp_path / "sentiment.parquet"
    _, summary, _ = run_predict(str(bundle_repository / "sentiment"), str(shared_data / "sst2" / "dev.tsv"),
                                "--out", str(out), "--text-column", "sentence", "--window", "100")
    rows = read_output(out)
    assert summary["rows"] == summary["written"] == len(rows) == 872 and summary["errors"] == 0
    assert [r["row"] for r in rows] == list(range(872)) and [r["id"] for r in rows] == list(range(872))
    texts = sst2(shared_data, 200)
    expected = ask(http, "/v1/classify", "sentiment", texts)
    for i, (row, answer) in enumerate(zip(rows, expected)):
        assert set(answer) == {"label", "score", "truncated", "truncated_tokens"}
        assert_same({k: row[k] for k in answer}, answer, f"row {i}")


def test_classification_top_k_is_a_ranked_list(shared_data, http, bundle_repository, tmp_path):
    texts = sst2(shared_data, 40)
    source = write_jsonl(tmp_path / "in.jsonl", [{"id": f"s{i}", "text": t} for i, t in enumerate(texts)])
    out = tmp_path / "out.jsonl"
    run_predict(str(bundle_repository / "sentiment"), str(source), "--out", str(out), "--top-k", "2")
    rows = read_output(out)
    assert [r["id"] for r in rows] == [f"s{i}" for i in range(40)]
    for i, (row, answer) in enumerate(zip(rows, ask(http, "/v1/classify", "sentiment", texts, top_k=2))):
        assert_same(row["labels"], answer, f"row {i}")
        assert row["truncated"] == answer[0]["truncated"]


def test_pair_regression_stsb_matches_pair(shared_data, http, bundle_repository, tmp_path):
    with open(shared_data / "stsb" / "dev.tsv", encoding="utf-8") as f:
        lines = f.read().splitlines()[:151]
    source = tmp_path / "stsb.tsv"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    header = lines[0].split("\t")
    pairs = [dict(zip(header, line.split("\t"))) for line in lines[1:]]
    out = tmp_path / "pairs.parquet"
    run_predict(str(bundle_repository / "similarity"), str(source), "--out", str(out), "--text-column", "sentence1",
                "--pair-column", "sentence2", "--id-column", "index")
    rows = read_output(out)
    assert [r["id"] for r in rows] == [int(p["index"]) for p in pairs]  # a TSV column of integers stays integer
    expected = ask(http, "/v1/pair", "similarity",
                   [{"text": p["sentence1"], "text_pair": p["sentence2"]} for p in pairs])
    for i, (row, answer) in enumerate(zip(rows, expected)):
        assert "label" not in answer or answer["label"] is None
        assert row["label"] is None
        assert_same({k: row[k] for k in answer if k != "label"}, {k: v for k, v in answer.items() if k != "label"},
                    f"row {i}")


def conll_texts(shared_data, count: int) -> list[str]:
    sentences = [" ".join(e.tokens) for e in read_conll(shared_data / "conll2003" / "iob2" / "valid.txt")]
    sentences = [s for s in sentences if "DOCSTART" not in s]
    return sentences[:count] + [" ".join(sentences[count : count + 30])]  # and a long one: several windows


def test_ner_conll_csv_matches_ner(shared_data, http, bundle_repository, tmp_path):
    texts = conll_texts(shared_data, 120)
    source = tmp_path / "conll.csv"
    with open(source, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "doc"])
        writer.writerows([t, f"d{i}"] for i, t in enumerate(texts))
    for aggregation in ("simple", "none"):
        out = tmp_path / f"entities-{aggregation}.parquet"
        run_predict(str(bundle_repository / "entities"), str(source), "--out", str(out), "--id-column", "doc",
                    "--aggregation", aggregation, "--window", "50")
        rows = read_output(out)
        assert [r["id"] for r in rows] == [f"d{i}" for i in range(len(texts))]
        expected = ask(http, "/v1/ner", "entities", texts, aggregation=aggregation)
        assert sum(len(a) for a in expected) > 50  # real entities were found
        for i, (row, answer) in enumerate(zip(rows, expected)):
            assert_same(row["entities"], answer, f"{aggregation} row {i}")
            for entity in row["entities"]:
                assert texts[i][entity["start"] : entity["end"]] == entity["text"]


def test_qa_squad_parquet_matches_qa(http, bundle_repository, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.conftest import REPO

    examples = read_squad(REPO / "data" / "samples" / "squad" / "dev.json")[:80]
    source = tmp_path / "squad.parquet"
    pq.write_table(pa.table({"id": [e.id for e in examples], "question": [e.question for e in examples],
                             "context": [e.context for e in examples]}), source, row_group_size=16)
    inputs = [{"question": e.question, "context": e.context} for e in examples]
    for top_k in (1, 3):
        out = tmp_path / f"answers-{top_k}.jsonl"
        run_predict(str(bundle_repository / "reader"), str(source), "--out", str(out), "--top-k", str(top_k))
        rows = read_output(out)
        assert [r["id"] for r in rows] == [e.id for e in examples]
        for i, (row, answer) in enumerate(zip(rows, ask(http, "/v1/qa", "reader", inputs, top_k=top_k))):
            assert_same(row if top_k == 1 else row["answers"], answer, f"top_k {top_k} row {i}")
            for a in [answer] if top_k == 1 else answer:
                assert examples[i].context[a["start"] : a["end"]] == a["answer"]


def test_embeddings_match_embed_as_float32(shared_data, http, bundle_repository, tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = sst2(shared_data, 150)
    texts[3] = " ".join(texts[3:40])  # longer than the model takes: cut, and said so
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "vectors.parquet"
    run_predict(str(bundle_repository / "embeddings"), str(source), "--out", str(out))
    assert pq.read_schema(out).field("embedding").type == pa.list_(pa.float32())
    rows = read_output(out)
    expected = ask(http, "/v1/embed", "embeddings", texts)
    assert expected[3]["truncated"] and expected[3]["truncated_tokens"] > 0
    for i, (row, answer) in enumerate(zip(rows, expected)):
        assert (row["truncated"], row["truncated_tokens"]) == (answer["truncated"], answer["truncated_tokens"])
        got, want = np.array(row["embedding"]), np.array(answer["embedding"])
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-4, f"row {i}"


def masked(texts: list[str]) -> list[str]:
    """Real sentences with their middle word (and, for every third, also their first word) masked."""
    out = []
    for i, text in enumerate(texts):
        words = text.split()
        if len(words) < 4:
            continue
        words[len(words) // 2] = "[MASK]"
        if i % 3 == 0:
            words[0] = "[MASK]"
        out.append(" ".join(words))
    return out


def test_fill_mask_matches_fill_mask(shared_data, http, bundle_repository, tmp_path):
    texts = masked(sst2(shared_data, 80))
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in texts])
    out = tmp_path / "filled.parquet"
    run_predict(str(bundle_repository / "masker"), str(source), "--out", str(out), "--top-k", "3")
    rows = read_output(out)
    expected = ask(http, "/v1/fill-mask", "masker", texts, top_k=3)
    assert any(isinstance(a[0], list) for a in expected) and any(isinstance(a[0], dict) for a in expected)
    for i, (row, answer) in enumerate(zip(rows, expected)):
        per_mask = answer if isinstance(answer[0], list) else [answer]  # the column: always a list per [MASK]
        assert_same(row["candidates"], per_mask, f"row {i}")


def test_multiple_choice_matches_choice(shared_data, http, bundle_repository, tmp_path):
    sentences = sst2(shared_data, 120)
    inputs = [{"context": sentences[i], "choices": sentences[i + 1 : i + 4]} for i in range(0, 120, 4)]
    source = write_jsonl(tmp_path / "in.jsonl", inputs)
    out = tmp_path / "ranked.jsonl"
    run_predict(str(bundle_repository / "chooser"), str(source), "--out", str(out))
    rows = read_output(out)
    for i, (row, answer) in enumerate(zip(rows, ask(http, "/v1/choice", "chooser", inputs))):
        assert_same(row["choices"], answer, f"row {i}")


@pytest.mark.parametrize("flag", [["--aggregation", "first"], ["--normalize"]])
def test_an_option_the_task_does_not_take_is_refused(bundle_repository, tmp_path, flag):
    source = write_jsonl(tmp_path / "in.jsonl", [{"text": "fine"}])
    code, _, stderr = run_predict(str(bundle_repository / "sentiment"), str(source), "--out",
                                  str(tmp_path / "o.jsonl"), *flag, check=False)
    assert code == 2 and "the classification task takes no --" in stderr, stderr


def test_rerank_matches_rerank(http, bundle_repository, tmp_path):
    """SQuAD dev questions, each with the excerpts of its article (CSV: the documents a JSON list in a cell)."""
    import json

    from tests.conftest import REPO

    examples = read_squad(REPO / "data" / "samples" / "squad" / "dev.json")[:16]
    contexts = list(dict.fromkeys(e.context for e in examples))
    rows = [{"id": e.id, "query": e.question, "documents": json.dumps(contexts[:6] + [e.context])} for e in examples]
    source = tmp_path / "queries.csv"
    with open(source, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "query", "documents"])
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "ranked.parquet"
    run_predict(str(bundle_repository / "ranker"), str(source), "--out", str(out), "--top-n", "3",
                "--return-documents")
    got = read_output(out)
    assert [r["id"] for r in got] == [e.id for e in examples]
    for i, (row, source_row) in enumerate(zip(got, rows)):
        documents = json.loads(source_row["documents"])
        response = http.post("/v1/rerank", json={"model": "ranker", "query": source_row["query"],
                                                 "documents": documents, "top_n": 3, "return_documents": True})
        assert response.status_code == 200, response.text
        expected = [{k: r[k] for k in ("index", "relevance_score", "truncated", "document")}
                    for r in response.json()["results"]]
        assert_same(row["results"], expected, f"row {i}")
