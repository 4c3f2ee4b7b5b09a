"""The list path (one `encode_batch` per request list) gives the items of encoding each input alone.

Expectations come from outside berth's encoder: `tokenizers` encoding each text alone with its own
[CLS]/[SEP] template and truncation, and transformers' BertTokenizerFast on the same vocabulary.
"""

from __future__ import annotations

import pytest

from tasks.common import InputFailed, InputTooLong
from tasks.fill_mask import NoMask
from tasks.readers import TextExample
from tasks.registry import definition
from tasks.runtime.spec import TaskSpec
from tasks.runtime.tokenizer import encode_many, plain_tokenizer

MAX_LENGTH = 32
LONG = "An astonishingly long-winded review that rambles on about the plot, the actors and the music " * 4
TEXTS = [
    "A charming film.",
    LONG,
    "Café crème, naïve façade — déjà vu! 東京タワーは高い。",
    "Emoji 👩‍👩‍👧 and combining e\u0301 marks, Straße, İstanbul.",
    "short",
    LONG + " and then some more",
    "Ωμέγα καὶ ἄλφα; Привет, мир!",
]


def reference(tokenizer, text: str, pair: str | None = None, max_length: int | None = MAX_LENGTH):
    """`tokenizers` alone: its own template and longest-first truncation, one text at a time."""
    tok = plain_tokenizer(tokenizer)
    if max_length is not None:
        tok.enable_truncation(max_length, strategy="longest_first")
    encoding = tok.encode(text, pair)
    untruncated = plain_tokenizer(tokenizer).encode(text, pair)
    return (encoding.ids, encoding.type_ids, [tuple(o) for o in encoding.offsets],
            len(untruncated.ids) > len(encoding.ids))


def as_tuple(item):
    return item.input_ids, item.token_type_ids, [tuple(o) for o in item.offsets], item.truncated


def ids_of(reference_tuple):
    """A reference without its offsets: what an item encoded without spans is compared on."""
    ids, types, _offsets, truncated = reference_tuple
    return ids, types, truncated


def as_ids(item):
    return item.input_ids, item.token_type_ids, item.truncated


# The tasks that read only token ids encode without character spans (`encode_many(spans=False)`).
WITHOUT_SPANS = ("classification", "pair", "multiple-choice", "embedding")


def test_encode_many_matches_tokenizers_one_text_at_a_time(tokenizer):
    items = encode_many(tokenizer, TEXTS, max_length=MAX_LENGTH)
    assert [as_tuple(item) for item in items] == [reference(tokenizer, text) for text in TEXTS]
    assert [item.truncated for item in items] == [False, True, False, False, False, True, False]


def test_encode_many_pairs_match_tokenizers_and_transformers(tokenizer, base_path):
    from transformers import BertTokenizerFast

    # A long text with a short one: where both are long and the budget is odd, berth's longest-first gives the
    # extra token to the first text and tokenizers to the second (berth's rule predates this change).
    firsts, seconds = TEXTS, [TEXTS[4], TEXTS[0], TEXTS[3], TEXTS[2], LONG, TEXTS[6], "why?"]
    items = encode_many(tokenizer, firsts, seconds, max_length=MAX_LENGTH)
    assert [as_tuple(item) for item in items] == [reference(tokenizer, a, b) for a, b in zip(firsts, seconds)]
    hf = BertTokenizerFast.from_pretrained(str(base_path))
    expected = hf(list(firsts), list(seconds), truncation="longest_first", max_length=MAX_LENGTH)
    assert [item.input_ids for item in items] == expected["input_ids"]
    assert [item.token_type_ids for item in items] == expected["token_type_ids"]


def spec_for(task: str, max_seq_length: int = MAX_LENGTH) -> TaskSpec:
    return TaskSpec(task=task, labels=["0", "1"] if task in ("classification", "pair") else [],
                    max_seq_length=max_seq_length)


def same_items(prepared, expected) -> None:
    assert len(prepared) == len(expected)
    for got, want in zip(prepared, expected):
        compare = as_tuple if got.items[0].offsets is not None else as_ids
        assert [compare(i) for i in got.items] == [compare(i) for i in want.items]
        assert got.truncated == want.truncated


@pytest.mark.parametrize("task, inputs", [
    ("classification", TEXTS),
    ("embedding", TEXTS),
    ("pair", [TextExample(a, b) for a, b in zip(TEXTS, [TEXTS[4], TEXTS[0], TEXTS[3], TEXTS[2], LONG, TEXTS[6], "?"])]),
    ("fill-mask", [t[:60] + " [MASK] " + t[-20:] for t in TEXTS[:5]]),
])
def test_prepare_many_gives_each_input_its_own_items(tokenizer, task, inputs):
    task_definition = definition(task)
    spec = spec_for(task, 512 if task == "fill-mask" else MAX_LENGTH)  # a masked text is never cut
    options = task_definition.options()
    prepared = task_definition.prepare_many(tokenizer, spec, inputs, options)
    same_items(prepared, [task_definition.prepare(tokenizer, spec, raw, options) for raw in inputs])
    texts = [(raw, None) if isinstance(raw, str) else (raw.text, raw.text_pair) for raw in inputs]
    expected = [reference(tokenizer, a, b, None if task == "fill-mask" else spec.max_seq_length) for a, b in texts]
    if task in WITHOUT_SPANS:
        assert all(p.items[0].offsets is None and p.items[0].word_ids is None for p in prepared)
        assert [as_ids(p.items[0]) for p in prepared] == [ids_of(e) for e in expected]
    else:
        assert [as_tuple(p.items[0]) for p in prepared] == expected


def test_multiple_choice_list_keeps_each_inputs_choices(tokenizer):
    from tasks.multiple_choice import ChoiceExample

    inputs = [ChoiceExample("a", TEXTS[0], TEXTS[1:4]), ChoiceExample("b", LONG, [TEXTS[4], TEXTS[2]]),
              ChoiceExample("c", TEXTS[3], [TEXTS[3], TEXTS[6], TEXTS[0]])]
    task_definition = definition("multiple-choice")
    spec = spec_for("multiple-choice")
    prepared = task_definition.prepare_many(tokenizer, spec, inputs, task_definition.options())
    assert [len(p.items) for p in prepared] == [3, 2, 3]
    for p, raw in zip(prepared, inputs):
        assert [as_ids(i) for i in p.items] == [ids_of(reference(tokenizer, raw.context, c)) for c in raw.choices]
        assert p.truncated == any(reference(tokenizer, raw.context, c)[3] for c in raw.choices)


def tokens_alone(tokenizer, text: str) -> int:
    return len(plain_tokenizer(tokenizer).encode(text).ids)


@pytest.mark.parametrize("task", ["classification", "embedding"])
def test_an_over_long_input_in_the_middle_names_its_index(tokenizer, task):
    task_definition = definition(task)
    inputs = [TEXTS[0], TEXTS[2], LONG, TEXTS[3], LONG + " again"]
    options = task_definition.options(truncate=False)
    with pytest.raises(InputFailed) as failed:
        task_definition.prepare_many(tokenizer, spec_for(task), inputs, options)
    assert failed.value.index == 2 and isinstance(failed.value.error, InputTooLong)
    assert failed.value.error.num_tokens == tokens_alone(tokenizer, LONG)
    with pytest.raises(InputTooLong):  # one input: the task's own error, as before
        task_definition.prepare(tokenizer, spec_for(task), LONG, options)


def test_multiple_choice_names_the_input_not_the_choice(tokenizer):
    from tasks.multiple_choice import ChoiceExample

    task_definition = definition("multiple-choice")
    inputs = [ChoiceExample("a", "ctx", ["x", "y"]), ChoiceExample("b", "ctx", ["fine", "fine too"]),
              ChoiceExample("c", "ctx", ["short", LONG])]
    with pytest.raises(InputFailed) as failed:
        task_definition.prepare_many(tokenizer, spec_for("multiple-choice"), inputs,
                                     task_definition.options(truncate=False))
    assert failed.value.index == 2


def test_fill_mask_reports_the_first_refused_input(tokenizer):
    task_definition = definition("fill-mask")
    spec = spec_for("fill-mask")
    inputs = ["Paris is the [MASK].", "no mask here", LONG + " [MASK]"]
    with pytest.raises(InputFailed) as failed:
        task_definition.prepare_many(tokenizer, spec, inputs, task_definition.options())
    assert failed.value.index == 1 and isinstance(failed.value.error, NoMask)
    with pytest.raises(InputFailed) as failed:
        task_definition.prepare_many(tokenizer, spec, [inputs[0], inputs[2], inputs[1]], task_definition.options())
    assert failed.value.index == 1 and isinstance(failed.value.error, InputTooLong)


def test_a_multiple_choice_context_is_tokenized_once(tokenizer):
    calls = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tokenizer, name)

        def encode_batch(self, texts, **kwargs):
            calls.append(list(texts))
            return tokenizer.encode_batch(texts, **kwargs)

    items = encode_many(Counting(), ["context"] * 3, ["a", "b", "c"], max_length=MAX_LENGTH)
    assert calls == [["context", "a", "b", "c"]]
    assert [as_tuple(i) for i in items] == [reference(tokenizer, "context", c) for c in "abc"]


def test_token_vectors_keep_their_spans(tokenizer):
    task_definition = definition("embedding")
    options = task_definition.options(output="tokens")
    prepared = task_definition.prepare_many(tokenizer, spec_for("embedding"), TEXTS, options)
    assert [as_tuple(p.items[0]) for p in prepared] == [reference(tokenizer, text) for text in TEXTS]


@pytest.mark.parametrize("max_length", [128, 24])
def test_without_spans_real_pairs_match_transformers(tokenizer, base_path, shared_data, max_length):
    """SST-2 sentences and MRPC sentence pairs (their dev sets), encoded without spans and with them, against
    transformers' BertTokenizerFast on the checkpoint's vocabulary; at 24 tokens most are cut."""
    from transformers import BertTokenizerFast

    from tasks.readers import read_mrpc, read_sst2

    hf = BertTokenizerFast.from_pretrained(str(base_path))
    singles = [e.text for e in read_sst2(shared_data / "sst2" / "dev.tsv")]
    pairs = read_mrpc(shared_data / "mrpc" / "dev.tsv")
    firsts, seconds = [e.text for e in pairs], [e.text_pair for e in pairs]
    for texts, text_pairs in ((singles, None), (firsts, seconds)):
        fast = encode_many(tokenizer, texts, text_pairs, max_length=max_length, spans=False)
        full = encode_many(tokenizer, texts, text_pairs, max_length=max_length)
        expected = hf(texts, text_pairs, truncation="longest_first", max_length=max_length)
        assert len(fast) == len(texts) > 400
        assert [item.input_ids for item in fast] == [item.input_ids for item in full]
        assert [item.token_type_ids for item in fast] == [item.token_type_ids for item in full]
        assert [(item.truncated, item.dropped) for item in fast] == [(item.truncated, item.dropped) for item in full]
        if text_pairs is None or max_length == 128:  # (both long and an odd budget: see the pair test above)
            assert [item.input_ids for item in fast] == expected["input_ids"]
        assert any(item.truncated for item in fast) == (max_length == 24)
