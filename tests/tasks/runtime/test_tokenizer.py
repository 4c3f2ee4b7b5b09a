"""The WordPiece tokenizer: same ids as the checkpoint's own, truncation, and training a vocabulary."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from tasks.runtime.tokenizer import (
    SPECIAL_TOKENS,
    encode,
    from_vocab,
    load_tokenizer,
    save_tokenizer,
    train_wordpiece,
)


def _sst2_sentences(shared_data, n=300):
    lines = (shared_data / "sst2" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0] for line in lines[:n]]


def test_same_ids_as_the_checkpoint_tokenizer(base_path, tokenizer, shared_data):
    reference = Tokenizer.from_file(str(base_path / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    built_from_vocab = from_vocab(base_path / "vocab.txt")
    texts = _sst2_sentences(shared_data) + ["Héllo, WORLD! naïve café — 3.14", "Who?", "  extra   spaces\t\tand tabs "]
    for text in texts:
        want = reference.encode(text)
        assert tokenizer.encode(text).ids == want.ids
        assert built_from_vocab.encode(text).ids == want.ids
        assert encode(tokenizer, text, max_length=None).input_ids == want.ids
    pair = reference.encode("Who wrote Emma?", "Jane Austen wrote it.")
    ours = encode(tokenizer, "Who wrote Emma?", "Jane Austen wrote it.")
    assert ours.input_ids == pair.ids and ours.token_type_ids == pair.type_ids


def test_offsets_slice_the_original_text(tokenizer):
    text = "  Zoë   visited São Paulo\u00a0in 2019. "
    item = encode(tokenizer, text)
    pieces = [text[s:e] for (s, e), seq in zip(item.offsets, item.sequence_ids) if seq == 0]
    assert pieces[0] == "Zoë" and "Paulo" in pieces and pieces[-1] == "."


def test_truncation_strategies(tokenizer):
    long_a = "alpha " * 50
    short_b = "beta gamma"
    both = encode(tokenizer, long_a, short_b, max_length=20)
    assert len(both) == 20 and both.truncated
    assert both.sequence_ids.count(1) == 2  # longest_first trims the long side only
    only_second = encode(tokenizer, "one two", "three " * 30, max_length=12, truncation="only_second")
    assert only_second.sequence_ids.count(0) == 2 and len(only_second) == 12
    whole = encode(tokenizer, "one two", max_length=12)
    assert not whole.truncated and len(whole) == 4
    with pytest.raises(ValueError, match="strategy"):
        encode(tokenizer, long_a, short_b, max_length=10, truncation="sideways")


def test_trained_vocabulary_round_trips(tmp_path, shared_data):
    corpus = shared_data / "pretraining" / "inaugural"
    files = sorted(corpus.glob("*.txt"))
    assert files, f"no text in {corpus}"
    tok = train_wordpiece(files, vocab_size=8000)
    vocab = tok.get_vocab()
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    save_tokenizer(tok, tmp_path / "tok")
    reloaded = load_tokenizer(tmp_path / "tok")
    from_txt = from_vocab(tmp_path / "tok" / "vocab.txt")

    # Held-out ASCII text from another part of the corpus: text -> ids -> text.
    held_out = (shared_data / "pretraining" / "state_union").glob("*.txt")
    lines = [ln.strip() for f in sorted(held_out)[:3] for ln in f.read_text(errors="replace").splitlines()]
    lines = [ln for ln in lines if ln and ln.isascii()][:300]
    unk = total = 0
    for line in lines:
        ids = reloaded.encode(line).ids
        assert from_txt.encode(line).ids == ids
        unk += ids.count(vocab["[UNK]"])
        total += len(ids)
        decoded = reloaded.decode(ids)
        assert decoded.replace(" ", "") == line.lower().replace(" ", "")
    assert unk / total < 0.002, f"[UNK] rate {unk / total:.4f}"
