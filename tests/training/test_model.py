"""Our encoder against transformers' BertModel on the real checkpoint, number for number."""

from __future__ import annotations

import pytest
import torch

from tasks.runtime.batching import pad_batch
from tasks.runtime.tokenizer import encode
from training.bert.checkpoint import load_pretrained
from training.bert.config import BertConfig
from training.bert.model import BertModel

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Short.",
    "BERT was pre-trained on BooksCorpus and English Wikipedia, 3.3 billion words in all.",
]
PAIR = ("Who wrote Emma?", "Emma is a novel by Jane Austen, first published in December 1815.")


@pytest.fixture(scope="module")
def models(base_path):
    transformers = pytest.importorskip("transformers")
    ours, report = load_pretrained(BertModel, base_path)
    assert not report.fresh and not report.unused, str(report)
    reference = transformers.BertModel.from_pretrained(str(base_path)).eval()
    return ours, reference


@pytest.fixture(scope="module")
def batch(tokenizer):
    items = [encode(tokenizer, s) for s in SENTENCES] + [encode(tokenizer, *PAIR)]
    return {k: torch.tensor(v) for k, v in pad_batch(items).items()}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_encoder_matches_transformers(models, batch, attention):
    ours, reference = models
    ours.set_attention_implementation(attention)
    with torch.no_grad():
        got = ours(**batch)
        want = reference(**batch)
    real = batch["attention_mask"].bool()  # padded positions carry no meaning in either model
    assert batch["attention_mask"].sum(1).unique().numel() == len(SENTENCES) + 1  # lengths differ: padding is tested
    assert batch["token_type_ids"][-1].max() == 1  # the pair has a segment B
    torch.testing.assert_close(got["last_hidden_state"][real], want.last_hidden_state[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(got["pooler_output"], want.pooler_output, atol=1e-5, rtol=0)
    ours.set_attention_implementation("sdpa")


def test_padding_does_not_change_results(models, tokenizer):
    ours, _ = models
    item = encode(tokenizer, SENTENCES[0])
    alone = {k: torch.tensor(v) for k, v in pad_batch([item]).items()}
    padded = {k: torch.tensor(v) for k, v in pad_batch([item], pad_to=len(item) + 17).items()}
    with torch.no_grad():
        a = ours(**alone)["last_hidden_state"]
        b = ours(**padded)["last_hidden_state"][:, : len(item)]
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_config_round_trip_and_presets(tmp_path, base_path):
    config = BertConfig.from_json_file(base_path / "config.json")
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (6, 384, 12)
    config.to_json_file(tmp_path / "config.json", architecture="BertModel")
    again = BertConfig.from_json_file(tmp_path / "config.json")
    assert again.to_dict() == config.to_dict()
    mini = BertConfig.preset("mini", vocab_size=1000)
    assert (mini.num_hidden_layers, mini.hidden_size, mini.num_attention_heads,
            mini.intermediate_size) == (4, 256, 4, 1024)
    with pytest.raises(ValueError, match="multiple"):
        BertConfig(hidden_size=100, num_attention_heads=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_training_attention_skips_cudnn_and_matches_transformers(models, batch):
    """On CUDA, cuDNN's attention builds an execution graph per new sequence length (length-grouped batches
    give nearly every step one); ours must run the other kernels, at two lengths, with the same numbers."""
    from torch.profiler import ProfilerActivity, profile

    ours, reference = (m.to("cuda") for m in models)
    try:
        ours.set_attention_implementation("sdpa")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for width in (batch["input_ids"].shape[1], batch["input_ids"].shape[1] - 3):
                inputs = {k: v[:, :width].cuda() for k, v in batch.items()}
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    ours(**inputs)["last_hidden_state"].float().sum().backward()
        assert not [e.key for e in prof.key_averages() if "cudnn_attention" in e.key]
        with torch.no_grad():
            inputs = {k: v.cuda() for k, v in batch.items()}
            expected = reference(**inputs).last_hidden_state
            got = ours(**inputs)["last_hidden_state"]
        real = inputs["attention_mask"].bool()
        torch.testing.assert_close(got[real], expected[real], atol=1e-4, rtol=1e-4)
    finally:
        ours.to("cpu"), reference.to("cpu")
