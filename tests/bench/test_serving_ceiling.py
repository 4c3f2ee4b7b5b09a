"""The ceiling benchmark's two pieces of its own: the do-nothing server (under real uvicorn on 127.0.0.1) and the
ceiling's arithmetic (figures worked out by hand)."""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.serving_ceiling import ceiling, null_server


def test_the_do_nothing_server_answers_posts_with_a_fixed_json() -> None:
    with tempfile.TemporaryDirectory() as work:
        port, context = null_server(Path(work))
        with context:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/classify", method="POST",
                                             data=json.dumps({"inputs": "a fine film"}).encode(),
                                             headers={"content-type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as response:
                assert response.status == 200 and json.loads(response.read()) == {"ok": True}
            with pytest.raises(urllib.error.HTTPError) as missing:  # berth's load tool reads /metrics: none here
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
            assert missing.value.code == 404


def test_the_ceiling_shares_the_cores_between_engine_and_http() -> None:
    engine = {"best_requests_per_s": 500.0, "batch1_p50_ms": 4.0}
    # 2 ms + 1/27,500 s of the machine a request: 1 / 0.0020364 s = 491.07 requests/s
    assert ceiling(engine, {"requests_per_s": 27_500.0}, 32)["requests_per_s"] == pytest.approx(491.07, abs=0.01)
    # one client: the engine's batch-1 time, then the HTTP round trip: 4.0 + 0.25 ms
    assert ceiling(engine, {"p50_ms": 0.25}, 1) == pytest.approx({"requests_per_s": 1000 / 4.25, "p50_ms": 4.25})
