"""One inference path: `training.bert.torch_runner` (PyTorch) and the service's batcher (ONNX Runtime behind its
queue) give each item the same rows, on the real fine-tuned test models (NER windows, QA windows)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from service.batcher import Batcher, BatchPolicy, clip_buckets
from service.metrics import Metrics
from service.models import OnnxEngine, load_bundle_tokenizer
from tasks import ner, qa
from tasks.bundle_checks import load_bundle
from tests.service.models_for_tests import filler
from training.bert.checkpoint import load_pretrained
from training.bert.model import BertForQuestionAnswering, BertForTokenClassification
from training.bert.torch_runner import predict, torch_runner

CASES = {"entities": (BertForTokenClassification, ("logits",)),
         "reader": (BertForQuestionAnswering, ("start_logits", "end_logits"))}


def _items(name: str, bundle, tokenizer) -> list:
    spec = bundle.spec()
    texts = [filler(words, seed) + " We flew to Paris." for seed, words in enumerate((3, 9, 20, 45, 90, 300))]
    if name == "entities":
        return [w for t in texts for w in ner.ner_windows(tokenizer, t, spec.max_seq_length, 16).items]
    return [w for t in texts for w in qa.make_windows(tokenizer, "When did they fly?", t, spec.max_seq_length,
                                                       spec.doc_stride, spec.max_query_length)]


def _through_batcher(runner, items, max_seq_length: int) -> list[dict[str, np.ndarray]]:
    async def scenario():
        policy = BatchPolicy(buckets=clip_buckets([16, 32, 64, 128, 256, 384, 512], max_seq_length),
                             max_batch_size=64, max_batch_tokens=64 * max_seq_length, pad_multiple=8)
        batcher = Batcher("m", runner, policy, Metrics(), per_token=True)
        batcher.start()
        futures = batcher.submit(items, time.monotonic() + 120)
        results = await asyncio.gather(*futures)
        await batcher.close(5)
        return [r.outputs for r in results]

    return asyncio.run(scenario())


@pytest.mark.parametrize("name", sorted(CASES))
def test_predict_and_the_batcher_give_each_item_the_same_rows(name, bundle_repository, checkpoints):
    head, outputs = CASES[name]
    bundle = load_bundle(bundle_repository / name)
    tokenizer = load_bundle_tokenizer(bundle)
    items = _items(name, bundle, tokenizer)
    assert len({len(x) for x in items}) > 3  # mixed lengths: padding is exercised
    model, _ = load_pretrained(head, checkpoints[name])
    offline = predict(model, items, outputs, per_token=True)

    # The same PyTorch model behind the queue: the very same passes, so the very same numbers.
    queued = _through_batcher(torch_runner(model, outputs), items, bundle.spec().max_seq_length)
    # The served engine (ONNX Runtime): the same rows within fp32 parity.
    served = _through_batcher(OnnxEngine(bundle, 2, prefer_gpu=False), items, bundle.spec().max_seq_length)
    for i, item in enumerate(items):
        for output in outputs:
            assert offline[output][i].shape == (len(item),)[:1] + offline[output][i].shape[1:]
            np.testing.assert_array_equal(queued[i][output], offline[output][i])
            np.testing.assert_allclose(served[i][output], offline[output][i], atol=1e-4)


def test_passes_that_ran_side_by_side_count_once_in_a_requests_inference_time():
    from service.inference import covered_seconds

    assert covered_seconds([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0  # 0-3 and 5-6
    assert covered_seconds([(1.0, 4.0), (2.0, 3.0)]) == 3.0  # one pass inside another
    assert covered_seconds([]) == 0.0
