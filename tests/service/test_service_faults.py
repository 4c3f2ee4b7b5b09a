"""Isolated faults against a real server: a forward pass that ONNX Runtime fails is retried by halves down
to the one input that fails it; the others of the batch are answered. The input is at fault, not the model:
sent alone, again and again, it fails each time, but a canary pass confirms the model works, so the model
stays ready (a model whose canary fails too goes not ready: tests/service/test_readiness.py).

The poison is real: a copy of the sentiment bundle whose tokenizer knows one word more than the model's
embedding table has rows, so that word's id makes ONNX Runtime's Gather fail ("indices element out of
data bounds"), exactly like a tokenizer/model mismatch in production would.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from export.bundle_writing import write_manifest
from tasks.runtime.bundle import MANIFEST_FILE
from tests.service import reference
from tests.service.conftest import ServerProcess
from tests.service.test_service_overload import metric_value

POISON = "zzpoisonzz"
TEXTS = ["A charming and often affecting journey.", "Unflinchingly bleak and desperate.",
         "It's slow -- very, very slow.", "The acting and music are astounding."]


@pytest.fixture(scope="module")
def poisoned_repository(bundle_repository, tmp_path_factory) -> Path:
    repository = tmp_path_factory.mktemp("poisoned") / "repository"
    bundle = repository / "sentiment"
    shutil.copytree(bundle_repository / "sentiment", bundle)
    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()
    tokenizer.add_tokens([POISON])
    assert tokenizer.token_to_id(POISON) == vocab_size  # one past the embedding table's last row
    tokenizer.save(str(bundle / "tokenizer.json"))
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    write_manifest(bundle, manifest)  # new hashes: the bundle is valid, only its tokenizer is too big
    return repository


def test_a_poisoned_input_fails_alone_and_cannot_take_the_model_out(poisoned_repository, checkpoints, tmp_path):
    proc = ServerProcess(poisoned_repository, tmp_path / "poison.log", env={"BERTH_MAX_CONSECUTIVE_FAILURES": "3"})
    try:
        proc.wait_ready()
        blocker = {"inputs": [" ".join(["long text about a film"] * 12)] * 64}  # keeps the engine busy meanwhile

        async def one_batch():
            async with httpx.AsyncClient(base_url=proc.url, timeout=120) as c:
                busy = asyncio.ensure_future(c.post("/v1/classify", json=blocker))
                await asyncio.sleep(0.05)
                clients = [c.post("/v1/classify", json={"inputs": t}) for t in TEXTS[:2]]
                clients.append(c.post("/v1/classify", json={"inputs": f"{TEXTS[2]} {POISON}"}))
                clients += [c.post("/v1/classify", json={"inputs": t}) for t in TEXTS[2:]]
                responses = await asyncio.gather(*clients)
                return await busy, responses

        busy, responses = asyncio.run(one_batch())
        assert busy.status_code == 200
        statuses = [r.status_code for r in responses]
        assert statuses == [200, 200, 500, 200, 200], statuses
        assert responses[2].json()["error_type"] == "internal"
        expected = reference.classify(checkpoints["sentiment"], TEXTS)
        good = [r.json()["results"][0]["label"] for i, r in enumerate(responses) if i != 2]
        assert good == [e["label"] for e in expected]
        assert metric_value(proc.url, "berth_items_failed_total", model="sentiment") == 1
        # the poisoned item shared a pass with others: that pass and the halves holding it failed
        assert metric_value(proc.url, "berth_inference_failures_total", model="sentiment") >= 2
        assert httpx.get(proc.url + "/readyz").status_code == 200

        for _ in range(4):  # more than max_consecutive_failures alone in a row, nothing succeeding in between
            assert httpx.post(proc.url + "/v1/classify", json={"inputs": POISON}, timeout=30).status_code == 500
        ready = httpx.get(proc.url + "/readyz")  # each time a canary pass showed the model works
        assert ready.status_code == 200
        assert ready.json()["models"] == {"sentiment": {"ready": True, "required": True, "reason": None}}
        assert metric_value(proc.url, "berth_canary_passes_total", model="sentiment", kind="confirm",
                            outcome="passed") >= 4
        assert metric_value(proc.url, "berth_model_failures_total", model="sentiment") == 0
        assert metric_value(proc.url, "berth_model_ready", model="sentiment") == 1

        assert httpx.post(proc.url + "/v1/classify", json={"inputs": TEXTS[0]}, timeout=30).status_code == 200
        assert proc.process.poll() is None
    finally:
        proc.stop()
