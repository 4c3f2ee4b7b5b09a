"""The load benchmark's rerank request and its berth-against-Infinity table (no server: pure functions)."""

from __future__ import annotations

from types import SimpleNamespace

from bench.service_load import _cut_to_tokens, rerank_workload
from bench.service_load_report import infinity_markdown


def test_documents_are_cut_at_a_word_boundary_to_at_most_the_token_budget(tokenizer) -> None:
    text = "The Broncos defeated the Carolina Panthers in Super Bowl 50, earning their third title. " * 10
    cut = _cut_to_tokens(tokenizer, text, 30)
    assert text.startswith(cut) and text[len(cut)] == " "  # ends where a word ends
    assert 25 <= len(tokenizer.encode(cut, add_special_tokens=False).ids) <= 30


def test_rerank_request_is_one_question_and_twenty_long_paragraphs(tokenizer) -> None:
    paragraphs = ["short paragraph.", *(f"paragraph {i} " + "word " * 150 for i in range(25))]
    squad = [SimpleNamespace(question="Which team won?", context=p) for p in paragraphs]
    load = rerank_workload(tokenizer, squad)
    documents = load["body"]["documents"]
    assert load["body"]["query"] == "Which team won?" and len(documents) == 20
    assert "short paragraph." not in documents  # shorter than the budget: passed over
    assert all(95 <= len(tokenizer.encode(d, add_special_tokens=False).ids) <= 100 for d in documents)
    assert load["engine_inputs"] == [{"query": "Which team won?", "documents": documents}]
    assert load["own_levels"]  # 20 documents a request: measured at the --rerank-* levels, said by the workload


def test_infinity_table_puts_berth_against_each_engine() -> None:
    def levels(one: float, many: float) -> list[dict]:
        return [
            {"clients": 1, "requests_per_s": one, "p50_ms": 1000 / one},
            {"clients": 32, "requests_per_s": many, "p50_ms": 50.0, "p99_ms": 90.0},
        ]

    result = {
        "berth": {"embeddings": {"fp32": levels(100, 400)}},
        "infinity": {"embeddings": {"optimum": levels(80, 200), "torch": levels(50, 100)}},
        "infinity_version": {"infinity-emb": "0.0.78"},
    }
    table = "\n".join(infinity_markdown(result))
    assert "| embeddings | 400.0 (10.0) | 200.0 (12.5) | 100.0 (20.0) | 2.00× | 4.00× |" in table
    assert "infinity-emb 0.0.78" in table
    assert infinity_markdown({"berth": {}, "infinity": {}, "infinity_skipped": "no venv"}) == [
        "\nInfinity: not run (no venv)."
    ]
