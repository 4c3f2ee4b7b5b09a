"""Pretraining data on the real corpus (../shared/data/pretraining) with the real bert-base-uncased vocab."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from tasks.runtime.tokenizer import CLS, MASK, PAD, SEP
from training.pretraining.corpus import (
    Document,
    read_documents,
    split_documents,
    split_paragraphs,
    split_sentences,
)
from training.pretraining.data import PretrainingDataset, collate
from training.pretraining.instances import (
    NOT_SCORED,
    build_pretraining_instances,
    create_instances,
    tokenize_documents,
    truncated_lengths,
)
from training.pretraining.masking import IGNORE_INDEX, MaskingSettings, MaskingVocab, mask_tokens

MAX_LEN = 128


# --------------------------------------------------------------------------- sentences and documents


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "Mr. Smith met Dr. Jones at St. Paul's. They talked with Mrs. Brown.",
            ["Mr. Smith met Dr. Jones at St. Paul's.", "They talked with Mrs. Brown."],
        ),
        (
            "Harry S. Truman spoke to the U.S. Congress. It cost $3.5 billion, i.e. a lot. Growth was 4.2 percent.",
            [
                "Harry S. Truman spoke to the U.S. Congress.",
                "It cost $3.5 billion, i.e. a lot.",
                "Growth was 4.2 percent.",
            ],
        ),
        (
            '"Stop!" he said. "Why?" She asked. He said, "Go home." Then he left.',
            ['"Stop!" he said.', '"Why?"', "She asked.", 'He said, "Go home."', "Then he left."],
        ),
        (
            "(This was odd.) Really? Yes! 1945 was a year. It was 5 p.m. and the\nsun   set. G. K. Chesterton wrote",
            [
                "(This was odd.)",
                "Really?",
                "Yes!",
                "1945 was a year.",
                "It was 5 p.m. and the sun set.",
                "G. K. Chesterton wrote",
            ],
        ),
        (
            "See No. 5 and p. 12 of Vol. 3. He said no. Then so am I. But Harry S. Truman agreed.",
            ["See No. 5 and p. 12 of Vol. 3.", "He said no.", "Then so am I.", "But Harry S. Truman agreed."],
        ),
        ("", []),
    ],
)
def test_split_sentences_on_tricky_text(text, expected):
    assert split_sentences(text) == expected


def test_split_paragraphs_joins_wrapped_lines_or_takes_long_lines_whole():
    wrapped = "A short line that\nwraps here.\n\nA second\nparagraph.\n\n\n"
    assert split_paragraphs(wrapped) == ["A short line that wraps here.", "A second paragraph."]
    long_line = "x" * 150
    unwrapped = f"Title\n{long_line}\nMr. Speaker:\nAnother paragraph.\n"
    assert split_paragraphs(unwrapped) == ["Title", long_line, "Mr. Speaker:", "Another paragraph."]


def test_real_corpus_reads_into_sensible_documents(shared_data):
    root = shared_data / "pretraining"
    documents = read_documents(root, encoding="utf-8-or-latin-1")
    files = sorted(root.rglob("*.txt"))
    sources = {d.source.split("#")[0] for d in documents}
    assert sources == {str(f) for f in files}  # every text file is read, the READMEs are not
    assert all(d.sentences and all(s and "\n" not in s for s in d.sentences) for d in documents)

    emma = [d for d in documents if d.source.startswith(str(root / "gutenberg" / "austen-emma.txt"))]
    assert len(emma) > 20  # a novel is cut into chapter-sized documents
    assert (
        emma[0].sentences[3].startswith("Emma Woodhouse, handsome, clever, and rich, with a comfortable home")
    )
    assert emma[0].sentences[3].endswith("with very little to distress or vex her.")
    whole = read_documents(root / "gutenberg" / "austen-emma.txt", max_document_chars=None)
    assert len(whole) == 1 and whole[0].sentences == [s for d in emma for s in d.sentences]
    # Pieces stay under the size limit unless a single paragraph is longer.
    sizes = [sum(len(s) + 1 for s in d.sentences) for d in emma]
    assert max(sizes) <= 20_000

    truman = next(d for d in documents if d.source == str(root / "state_union" / "1945-Truman.txt"))
    assert "Mr. Speaker, Mr. President, Members of the Congress:" in truman.sentences  # a line is a paragraph
    assert (
        "Only yesterday, we laid to rest the mortal remains of our beloved President, "
        "Franklin Delano Roosevelt." in truman.sentences
    )


def test_bert_format_has_a_sentence_per_line_and_blank_lines_between_documents(tmp_path):
    (tmp_path / "a.txt").write_text("First sentence.\nSecond one\n\n\nOther doc.\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("A new file starts a new document.\n", encoding="utf-8")
    (tmp_path / "notes.md").write_text("not a corpus file\n", encoding="utf-8")
    documents = read_documents(tmp_path, format="bert")
    assert [d.sentences for d in documents] == [
        ["First sentence.", "Second one"],
        ["Other doc."],
        ["A new file starts a new document."],
    ]


def test_split_documents_is_a_seeded_partition():
    documents = [Document([f"Sentence {i}."], f"doc{i}") for i in range(50)]
    train, heldout = split_documents(documents, 0.1, seed=7)
    assert len(heldout) == 5 and len(train) == 45
    assert {d.source for d in train}.isdisjoint(d.source for d in heldout)
    assert split_documents(documents, 0.1, seed=7) == (train, heldout)
    assert split_documents(documents, 0.1, seed=8)[1] != heldout
    assert split_documents(documents, 0.0) == (documents, [])
    assert len(split_documents(documents[:5], 0.01, min_heldout=2)[1]) == 2


# --------------------------------------------------------------------------- instances


@pytest.fixture(scope="module")
def special(tokenizer) -> dict[str, int]:
    return {t: tokenizer.token_to_id(t) for t in (PAD, CLS, SEP, MASK)}


@pytest.fixture(scope="module")
def corpus(shared_data, tokenizer):
    """The inaugural and State of the Union addresses, about 3 MB of text."""
    root = shared_data / "pretraining"
    documents = read_documents([root / "inaugural", root / "state_union"], encoding="utf-8-or-latin-1")
    return tokenize_documents(documents, tokenizer)


@pytest.fixture(scope="module")
def instances(corpus, special):
    return create_instances(corpus, special[CLS], special[SEP], MAX_LEN, seed=1)


def _document_tokens(corpus, doc: int) -> np.ndarray:
    first, end = corpus.document_offsets[doc], corpus.document_offsets[doc + 1]
    return corpus.token_ids[corpus.sentence_offsets[first] : corpus.sentence_offsets[end]]


def _find(haystack: np.ndarray, needle: np.ndarray) -> list[int]:
    """Every start position of `needle` in `haystack`."""
    starts = np.flatnonzero(haystack[: len(haystack) - len(needle) + 1] == needle[0])
    return [int(s) for s in starts if np.array_equal(haystack[s : s + len(needle)], needle)]


def test_truncated_lengths_match_googles_token_by_token_loop():
    for len_a in range(0, 40, 3):
        for len_b in range(0, 40, 2):
            for budget in (1, 7, 20, 33):
                a, b = len_a, len_b
                while a + b > budget:  # truncate_seq_pair: the longer loses a token (B on ties)
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                assert truncated_lengths(len_a, len_b, budget) == (a, b)


def test_nsp_instances_have_the_bert_layout(instances, special):
    assert len(instances) > 4000
    for i in range(len(instances)):
        ids, types = instances.sequence(i)
        a_len = instances.segment_a_lengths[i]
        assert len(ids) <= MAX_LEN
        assert ids[0] == special[CLS] and ids[a_len - 1] == special[SEP] and ids[-1] == special[SEP]
        assert np.count_nonzero(ids == special[SEP]) == 2 and np.count_nonzero(ids == special[CLS]) == 1
        assert 3 <= a_len <= len(ids) - 2  # A and B both hold at least one token
        assert (types[:a_len] == 0).all() and (types[a_len:] == 1).all()
    lengths = instances.lengths
    assert np.mean(lengths >= MAX_LEN - 8) > 0.5  # most instances fill the sequence
    assert 0.02 < np.mean(lengths < MAX_LEN // 2) < 0.2  # short_seq_prob makes some short ones


def test_next_sentence_labels_are_balanced_and_true(instances, corpus):
    labels = instances.next_sentence_labels
    assert set(np.unique(labels)) == {0, 1}
    assert abs(np.mean(labels == 0) - 0.5) <= 0.03
    not_next = labels == 1
    assert (instances.document_a[not_next] != instances.document_b[not_next]).all()
    assert (instances.document_a[~not_next] == instances.document_b[~not_next]).all()
    # NotNext segments come from another *file*, not another 20,000-character piece of the same speech.
    sources = corpus.document_sources
    assert sources is not None and len(sources) == corpus.num_documents
    assert (sources[instances.document_a[not_next]] != sources[instances.document_b[not_next]]).all()

    # Check the recorded documents against the text itself, on a sample.
    for i in np.random.default_rng(0).choice(len(instances), 300, replace=False):
        ids, _ = instances.sequence(i)
        a_len = instances.segment_a_lengths[i]
        a, b = ids[1 : a_len - 1], ids[a_len:-1]
        doc_a = _document_tokens(corpus, instances.document_a[i])
        doc_b = _document_tokens(corpus, instances.document_b[i])
        a_at, b_at = _find(doc_a, a), _find(doc_b, b)
        assert a_at and b_at, "A comes from document_a and B from document_b"
        if labels[i] == 0:  # IsNext: B follows A in the same document
            assert max(b_at) >= min(a_at) + len(a)


def test_instances_are_seeded_and_dupe_factor_repeats_the_pass(corpus, special, instances):
    again = create_instances(corpus, special[CLS], special[SEP], MAX_LEN, seed=1)
    assert np.array_equal(again.input_ids, instances.input_ids)
    other = create_instances(corpus, special[CLS], special[SEP], MAX_LEN, seed=2)
    assert not np.array_equal(other.offsets, instances.offsets)
    twice = create_instances(corpus, special[CLS], special[SEP], MAX_LEN, dupe_factor=2, seed=1)
    assert 1.9 < len(twice) / len(instances) < 2.1


def test_no_nsp_instances_are_single_segments_covering_every_token(corpus, special):
    single = create_instances(corpus, special[CLS], special[SEP], MAX_LEN, nsp=False, seed=3)
    assert (single.next_sentence_labels == NOT_SCORED).all()
    assert (single.document_b == -1).all()
    assert (single.segment_a_lengths == single.lengths).all()  # all token type 0
    assert single.lengths.max() <= MAX_LEN
    assert int((single.lengths - 2).sum()) == len(corpus.token_ids)  # nothing lost, nothing repeated
    for i in range(0, len(single), 97):
        ids, types = single.sequence(i)
        assert ids[0] == special[CLS] and ids[-1] == special[SEP] and (types == 0).all()
        assert _find(_document_tokens(corpus, single.document_a[i]), ids[1:-1])


def test_one_document_cannot_make_nsp_pairs(special, tokenizer):
    one = tokenize_documents([Document(["One sentence.", "Two sentences."], "x")], tokenizer)
    with pytest.raises(ValueError, match="two documents"):
        create_instances(one, special[CLS], special[SEP])
    assert len(create_instances(one, special[CLS], special[SEP], nsp=False)) == 1


# --------------------------------------------------------------------------- masking


def _masked_items(dataset: PretrainingDataset) -> list[dict]:
    return [dataset[i] for i in range(len(dataset))]


def test_masking_is_15_percent_split_80_10_10(instances, tokenizer, special):
    dataset = PretrainingDataset(instances, tokenizer, MAX_LEN, seed=3)
    vocab = dataset.vocab
    n_candidates = n_chosen = n_mask = n_kept = n_random = 0
    for i, item in enumerate(_masked_items(dataset)):
        original, _ = instances.sequence(i)
        chosen = item["labels"] != IGNORE_INDEX
        candidates = ~np.isin(original, [special[CLS], special[SEP], special[PAD]])
        assert not (chosen & ~candidates).any(), "[CLS]/[SEP] are never chosen"
        assert chosen.sum() == min(20, max(1, round(candidates.sum() * 0.15)))
        assert (item["labels"][chosen] == original[chosen]).all()
        assert (item["input_ids"][~chosen] == original[~chosen]).all()
        got = item["input_ids"][chosen]
        is_mask, is_kept = got == special[MASK], got == original[chosen]
        assert np.isin(got[~is_mask & ~is_kept], vocab.replacement_ids).all()
        n_candidates += candidates.sum()
        n_chosen += chosen.sum()
        n_mask += is_mask.sum()
        n_kept += is_kept.sum()
        n_random += (~is_mask & ~is_kept).sum()
    assert n_candidates > 20_000
    assert abs(n_chosen / n_candidates - 0.15) <= 0.01
    assert abs(n_mask / n_chosen - 0.8) <= 0.02
    assert abs(n_kept / n_chosen - 0.1) <= 0.02
    assert abs(n_random / n_chosen - 0.1) <= 0.02


def test_random_replacements_are_never_special_tokens(tokenizer):
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    replacements = {tokenizer.id_to_token(int(i)) for i in vocab.replacement_ids}
    assert not replacements & {PAD, "[UNK]", CLS, SEP, MASK, "[unused0]", "[unused993]"}
    assert {"the", "##s", "!"} <= replacements
    assert len(replacements) > 28_000


def test_padding_and_special_tokens_are_never_chosen(tokenizer, special):
    vocab = MaskingVocab.from_tokenizer(tokenizer)
    words = tokenizer.encode("the quick brown fox jumps over the lazy dog", add_special_tokens=False).ids
    ids = np.array([special[CLS], *words, special[SEP], *words, special[SEP]] + [special[PAD]] * 30)
    settings = MaskingSettings(masked_lm_prob=0.9, max_predictions_per_seq=100)
    for seed in range(20):
        _, labels = mask_tokens(ids, vocab, settings, np.random.default_rng(seed))
        chosen = labels != IGNORE_INDEX
        assert chosen.sum() == round(2 * len(words) * 0.9)
        assert not np.isin(ids[chosen], list(special.values())).any()


def test_whole_word_masking_masks_whole_words(instances, tokenizer):
    dataset = PretrainingDataset(instances, tokenizer, MAX_LEN, MaskingSettings(whole_word=True), seed=4)
    continuation = dataset.vocab.is_continuation
    n_candidates = n_chosen = multi_piece_words = 0
    for i, item in enumerate(_masked_items(dataset)):
        original, _ = instances.sequence(i)
        chosen = item["labels"] != IGNORE_INDEX
        # A piece and the (non-special) token before it are one word: chosen together or not at all.
        joined = continuation[original[1:]] & ~np.isin(original[:-1], dataset.vocab.never_mask_ids)
        assert (chosen[1:][joined] == chosen[:-1][joined]).all()
        multi_piece_words += int((chosen[1:] & joined).sum())
        n_candidates += len(original) - 3
        n_chosen += chosen.sum()
        assert chosen.sum() <= 20
    assert multi_piece_words > 500
    assert abs(n_chosen / n_candidates - 0.15) <= 0.01


def test_dynamic_masks_are_deterministic_per_seed_epoch_and_index(instances, tokenizer):
    first = PretrainingDataset(instances, tokenizer, MAX_LEN, seed=5)
    second = PretrainingDataset(instances, tokenizer, MAX_LEN, seed=5)
    sample = range(0, len(instances), 50)
    epoch0 = [first[i]["input_ids"] for i in sample]
    assert all(np.array_equal(a, second[i]["input_ids"]) for a, i in zip(epoch0, sample))
    first.set_epoch(1)
    changed = [not np.array_equal(a, first[i]["input_ids"]) for a, i in zip(epoch0, sample)]
    assert np.mean(changed) > 0.95
    first.set_epoch(0)
    assert all(np.array_equal(a, first[i]["input_ids"]) for a, i in zip(epoch0, sample))

    static = PretrainingDataset(instances, tokenizer, MAX_LEN, seed=5, dynamic_masking=False)
    static.set_epoch(3)
    assert all(np.array_equal(a, static[i]["input_ids"]) for a, i in zip(epoch0, sample))
    other_seed = PretrainingDataset(instances, tokenizer, MAX_LEN, seed=6)
    assert np.mean([not np.array_equal(a, other_seed[i]["input_ids"]) for a, i in zip(epoch0, sample)]) > 0.95


def test_dataset_rejects_instances_longer_than_max_seq_length(instances, tokenizer):
    with pytest.raises(ValueError, match="max_seq_length"):
        PretrainingDataset(instances, tokenizer, max_seq_length=64)


# --------------------------------------------------------------------------- batches


def test_collate_pads_and_feeds_bert_for_pretraining(instances, corpus, tokenizer, special):
    torch = pytest.importorskip("torch")
    from training.bert.config import BertConfig
    from training.bert.model import BertForPreTraining

    torch.set_num_threads(1)
    dataset = PretrainingDataset(instances, tokenizer, MAX_LEN, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=6, shuffle=True, collate_fn=collate)
    batch = next(iter(loader))
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "next_sentence_label"}
    assert all(t.dtype == torch.long for t in batch.values())
    lengths = batch["attention_mask"].sum(1)
    assert batch["input_ids"].shape == (6, int(lengths.max()))
    padding = batch["attention_mask"] == 0
    assert (batch["input_ids"][padding] == special[PAD]).all()
    assert (batch["labels"][padding] == IGNORE_INDEX).all() and (batch["token_type_ids"][padding] == 0).all()
    assert batch["next_sentence_label"].shape == (6,)

    fixed = collate([dataset[0], dataset[1]], pad_to=MAX_LEN)
    assert fixed["input_ids"].shape == (2, MAX_LEN)
    with pytest.raises(ValueError, match="shorter"):
        collate([dataset[0]], pad_to=2)

    torch.manual_seed(0)
    config = BertConfig.preset("tiny", vocab_size=tokenizer.get_vocab_size())
    model = BertForPreTraining(config).eval()
    with torch.no_grad():
        out = model(**batch)
    assert {"loss", "mlm_loss", "nsp_loss"} <= set(out)
    assert torch.isfinite(out["loss"]) and out["loss"] > 0

    single = create_instances(corpus, special[CLS], special[SEP], MAX_LEN, nsp=False, seed=3)
    no_nsp = functools.partial(collate, pad_to=MAX_LEN)(
        [PretrainingDataset(single, tokenizer)[i] for i in range(4)]
    )
    assert (no_nsp["next_sentence_label"] == NOT_SCORED).all()
    with torch.no_grad():
        out = model(**no_nsp)
    assert "nsp_loss" not in out and torch.equal(out["loss"], out["mlm_loss"])


def test_build_pretraining_instances_splits_by_document(shared_data, tokenizer, tmp_path):
    documents = read_documents(shared_data / "pretraining" / "inaugural", encoding="utf-8-or-latin-1")
    train, heldout = build_pretraining_instances(documents, tokenizer, heldout_fraction=0.1, seed=9)
    assert heldout is not None and 0 < len(heldout) < len(train) / 4
    again_train, again_heldout = build_pretraining_instances(documents, tokenizer, heldout_fraction=0.1, seed=9)
    assert np.array_equal(again_train.input_ids, train.input_ids)
    assert np.array_equal(again_heldout.offsets, heldout.offsets)

    heldout.save(tmp_path / "heldout.npz")
    reloaded = type(heldout).load(tmp_path / "heldout.npz")
    assert all(
        np.array_equal(getattr(reloaded, k), getattr(heldout, k)) for k in heldout.__dataclass_fields__
    )

    train_docs, heldout_docs = split_documents(documents, 0.1, seed=9)
    assert {d.source for d in train_docs}.isdisjoint(d.source for d in heldout_docs)
    assert heldout.document_a.max() < len(heldout_docs)  # held-out instances come from held-out documents only


def test_not_next_comes_from_another_file_even_when_one_file_is_most_of_the_corpus(tmp_path, tokenizer, special):
    # A long "book" cut into many pieces and two short files: uniform over other *documents* would
    # draw a piece of the same book most of the time; over documents of other files, never.
    book = "\n\n".join(f"Chapter text number {i} goes on. It has a second sentence here. And a third one." * 20
                         for i in range(40))
    (tmp_path / "book.txt").write_text(book, encoding="utf-8")
    (tmp_path / "speech-a.txt").write_text("Fellow citizens, we gather today. The work goes on. " * 30,
                                           encoding="utf-8")
    (tmp_path / "speech-b.txt").write_text("My friends, the hour is late. We must act now. " * 30, encoding="utf-8")
    documents = read_documents(tmp_path, max_document_chars=2000)
    corpus = tokenize_documents(documents, tokenizer)
    files = [d.source.split("#")[0] for d in documents]
    assert files.count(str(tmp_path / "book.txt")) > 10  # the book is many documents
    instances = create_instances(corpus, special[CLS], special[SEP], 64, seed=3)
    not_next = instances.next_sentence_labels == 1
    assert not_next.sum() > 20
    for a, b in zip(instances.document_a[not_next], instances.document_b[not_next]):
        assert files[a] != files[b]


def test_bert_format_documents_of_one_file_are_each_their_own_source(tmp_path, tokenizer, special):
    (tmp_path / "docs.txt").write_text("One here.\nTwo here.\n\nThree here.\nFour.\n\nFive.\nSix.\n", encoding="utf-8")
    corpus = tokenize_documents(read_documents(tmp_path, format="bert"), tokenizer)
    assert list(corpus.document_sources) == [0, 1, 2]
