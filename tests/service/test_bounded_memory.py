"""Black-box: what valid requests (within every documented limit) cost a real server in memory, and what it
refuses before computing. RSS is read from the server's processes themselves (/proc/PID/status; with --workers N,
the sum over them).

Before items kept only what their route needs, four concurrent /v1/embed requests of 128 texts of ~1,100
characters raised a server's RSS by over a gigabyte (every layer's hidden states of every token, held as views
of whole batches until each request finished); fill-mask held 30,522 logits per token."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import REPO, ServerProcess

GROWTH_LIMIT_BYTES = 200 * 2**20
# The service's defaults for what a request may hold (the test fixture's BASE_ENV keeps them small).
DEFAULT_LIMITS = {"BERTH_MAX_INPUTS_PER_REQUEST": "256", "BERTH_LENGTH_BUCKETS": "16,32,64,128,256,384,512",
                  "BERTH_MAX_BATCH_TOKENS": "8192", "BERTH_MAX_BATCH_SIZE": "32",
                  "BERTH_REQUEST_TIMEOUT_S": "300"}  # memory is measured, not speed: a busy machine must not 504


def rss_bytes(server: ServerProcess) -> int:
    """The RSS of the server's processes together."""
    return sum(int(line.split()[1]) * 1024 for pid in server.pids()
               for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmRSS:"))


def long_texts(count: int, chars: int, shift: int) -> list[str]:
    """`count` different real English texts of about `chars` characters (SQuAD paragraphs, joined and cut at a word)."""
    data = json.loads((REPO / "data" / "samples" / "squad" / "dev.json").read_text(encoding="utf-8"))
    paragraphs = [p["context"] for article in data["data"] for p in article["paragraphs"]]
    texts = []
    for i in range(count):
        k = (i + shift) % len(paragraphs)
        joined = " ".join(paragraphs[(k + j) % len(paragraphs)] for j in range(3))
        texts.append(joined[:chars].rsplit(" ", 1)[0])
    return texts


@pytest.fixture(scope="module")
def lean_server(bundle_repository, tmp_path_factory):
    proc = ServerProcess(bundle_repository, tmp_path_factory.mktemp("logs") / "memory.log",
                         env={**DEFAULT_LIMITS, "BERTH_MODEL_NAMES": "embeddings,masker"})
    try:
        yield proc.wait_ready()
    finally:
        proc.stop()


async def _post_all(url: str, route: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        return await asyncio.gather(*(client.post(route, json=body) for body in bodies))


def answered_at_once(server: ServerProcess, route: str, bodies: list[dict]) -> tuple[list[dict], int]:
    """Every body's answer (all 200), sent at once after the route's shapes were seen once, and how many bytes
    the server's RSS grew meanwhile."""
    warm = httpx.post(server.url + route, json={**bodies[0], "inputs": bodies[0]["inputs"][:4]}, timeout=120)
    assert warm.status_code == 200, warm.text
    before = rss_bytes(server)
    responses = asyncio.run(_post_all(server.url, route, bodies))
    grown = rss_bytes(server) - before
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text[:200] for r in responses]
    return [r.json() for r in responses], grown


def test_four_concurrent_heavy_embedding_requests_grow_rss_by_less_than_200_mb(lean_server):
    bodies = [{"model": "embeddings", "inputs": long_texts(128, 1100, shift=40 * n)} for n in range(4)]
    answers, grown = answered_at_once(lean_server, "/v1/embed", bodies)
    results = answers[0]["results"]
    assert len(results) == 128 and len(results[0]["embedding"]) == 384
    assert grown < GROWTH_LIMIT_BYTES, f"RSS grew {grown / 2**20:.0f} MiB"


def test_four_concurrent_fill_mask_requests_of_long_texts_grow_rss_by_less_than_200_mb(lean_server):
    bodies = [{"model": "masker",
               "inputs": [t[:300].rsplit(" ", 1)[0] + " [MASK]." for t in long_texts(64, 400, 9 * n)]}
              for n in range(4)]
    answers, grown = answered_at_once(lean_server, "/v1/fill-mask", bodies)
    first = answers[0]["results"][0]
    assert len(first) == 5 and first[0]["score"] >= first[-1]["score"]
    # 64 texts of ~70 tokens with 30,522 float32 logits per token held ~550 MB per request before
    assert grown < GROWTH_LIMIT_BYTES, f"RSS grew {grown / 2**20:.0f} MiB"


def test_a_token_output_too_large_to_answer_is_refused_before_inference_naming_the_figure_and_the_limit(lean_server):
    # 16 inputs (the token-output limit) x ~250 tokens x 4 layers x 384 floats: ~1.5M floats, ~150 MB of JSON
    body = {"model": "embeddings", "inputs": long_texts(16, 1100, shift=3), "output": "tokens",
            "layers": [-1, -2, -3, -4]}
    response = httpx.post(lean_server.url + "/v1/embed", json=body, timeout=120)
    assert response.status_code == 413, response.text
    error = response.json()
    assert error["error_type"] == "too_large" and "max_response_bytes" in error["error"] and "MiB" in error["error"]


def test_an_input_with_more_masks_than_the_limit_is_refused_naming_it(lean_server):
    many = "The " + " and ".join(["[MASK]"] * 17) + "."
    response = httpx.post(lean_server.url + "/v1/fill-mask", json={"model": "masker", "inputs": many}, timeout=60)
    assert response.status_code == 413 and "max_masks_per_input" in response.json()["error"], response.text


def test_a_fill_mask_pass_returns_at_most_its_output_byte_budget(bundle_repository):
    """The session's own output shape says what a token costs (30,522 float32 logits for the masker); the batch
    shape the server runs with keeps a pass within max_pass_output_bytes (64 MiB: 4 items of 128 tokens)."""
    from service.metrics import Metrics
    from service.models import load_model
    from service.settings import ServiceSettings
    from tasks.bundle_checks import load_bundle

    settings = ServiceSettings(warmup=False, device="cpu", intra_op_threads=1)
    model = load_model(load_bundle(bundle_repository / "masker"), settings, Metrics())
    vocabulary = model.tokenizer.get_vocab_size()
    assert model.engine.bytes_per_token() == 4 * vocabulary
    budget_tokens = settings.max_pass_output_bytes // (4 * vocabulary)
    for width in (16, 64, 128):
        assert model.batcher.policy.batch_size_for(width) == min(settings.max_batch_size, budget_tokens // width)
