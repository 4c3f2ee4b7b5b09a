"""The call-counting benchmark on a real bundle: the real app answers every request 200 and the count is the
profiler's own, in this process and in a process that imports berth from a code tree."""

from __future__ import annotations

from pathlib import Path

from bench.request_calls import count, in_tree, table
from bench.serving_ceiling import request_bodies
from tasks.runtime.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]


def test_calls_are_counted_per_answered_request_here_and_in_a_code_tree(bundle_repository, tmp_path):
    repository = tmp_path / "repository"
    repository.mkdir()
    (repository / "sentiment").symlink_to(bundle_repository / "sentiment")
    body = request_bodies(load_tokenizer(bundle_repository / "sentiment" / "tokenizer.json"))["classify-short"]
    here = count(repository, "/v1/classify", body, requests=20, warmup=5, clients=4)
    assert here["statuses"] == {"200": 25}  # the warm-up's and the counted ones, all answered
    assert here["loaded_statuses"] == {"200": 40}  # ten per client in flight, all answered
    assert here["loop_cpu_ms_per_request"] > 0
    # a request runs the fast path's endpoint, the tokenizer and the batcher: far more than a handful of calls
    assert here["calls_per_request"] > 100 and len(here["most_called"]) == 15
    other = in_tree(REPO, repository, "/v1/classify", body, requests=20, clients=2)
    assert other["statuses"] == {"200": 70} and other["calls_per_request"] > 100
    assert other["loaded_statuses"] == {"200": 20} and other["clients"] == 2
    printed = table({"bundle": "sentiment", "input": "classify-short", "trees": {"here": here, "tree": other}})
    assert printed.count("| sentiment | classify-short |") == 2
    assert f"| {other['loop_cpu_ms_per_request']:.3f} (2) |" in printed
