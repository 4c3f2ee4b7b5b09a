"""SQuAD task layer: reading files, windows with a doc stride, training labels, and decoding answers.

Hand-built logits check the decoding rules; the real SQuAD dev sets check the whole round trip
(windows -> gold labels -> one-hot logits -> decoded answer text) with the checkpoint's tokenizer.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tasks.qa import (
    QAWindow,
    decode_answers,
    label_window,
    make_windows,
    read_squad,
    window_spans,
)
from tasks.qa_metrics import evaluate_squad
from tasks.runtime.batching import pad_batch

COUNTING = "one two three four five six seven eight nine ten"  # one token per word


def _counting_windows(tokenizer, max_seq_length=11, doc_stride=3) -> list[QAWindow]:
    # "what?" is 2 tokens, so room = 11 - 2 - 3 = 6 context tokens, overlap 3: ctx [0,6) [3,9) [6,10)
    return make_windows(tokenizer, "what?", COUNTING, max_seq_length, doc_stride, max_query_length=4)


def _position(window: QAWindow, word: str) -> int:
    """The window position of the context token that starts at `word` in the context."""
    char = window.context.index(word)
    (hits,) = np.nonzero(window.is_context & (window.offsets[:, 0] == char))
    assert len(hits) == 1, f"{word!r} is not a context token of window {window.window_index}"
    return int(hits[0])


def _logits(windows, fill=-10.0):
    width = max(len(w) for w in windows)
    return np.full((len(windows), width), fill), np.full((len(windows), width), fill)


# ---------------------------------------------------------------------------------------------
# read_squad


def test_read_squad_v1_and_v2_dev(shared_data):
    v1 = read_squad(shared_data / "squad" / "v1.1" / "dev-v1.1.json")
    assert len(v1) == 10570 and not any(ex.is_impossible for ex in v1)
    first = v1[0]
    assert first.id == "56be4db0acb8001400a502ec" and first.title == "Super_Bowl_50"
    assert first.question == "Which NFL team represented the AFC at Super Bowl 50?"
    assert first.answers[0] == ("Denver Broncos", 177)
    assert first.context[177 : 177 + len("Denver Broncos")] == "Denver Broncos"
    v2 = read_squad(shared_data / "squad" / "v2.0" / "dev-v2.0.derived.json")
    assert len(v2) == 11873
    impossible = [ex for ex in v2 if ex.is_impossible]
    assert len(impossible) == 5945 and all(ex.answers == [] for ex in impossible)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", r"bad\.json:1: invalid JSON: Expecting property name"),
        ('{"version": "1.1"}', "expected a JSON object with a 'data' list"),
        ('{"data": [{"title": "t"}]}', r"data\[0\]: expected an object with a 'paragraphs' list"),
        ('{"data": [{"paragraphs": [{"qas": []}]}]}', r"data\[0\]\.paragraphs\[0\]: .*'context' string"),
        (
            {"id": "q1", "question": "?", "answers": [{"text": "abc", "answer_start": 3}]},
            r"qas\[0\]: question 'q1': answers\[0\] spans characters 3\.\.6, outside its context of 4",
        ),
        ({"id": "q1", "question": "?", "answers": [{"text": "ab"}]}, "'answer_start' integer"),
        ({"id": "q1", "answers": []}, "'question' must be a string"),
        ({"question": "?", "answers": []}, "'id' must be a non-empty string"),
        ({"id": "q1", "question": "?", "answers": []}, "no answers and not marked is_impossible"),
        (
            {
                "id": "q1",
                "question": "?",
                "is_impossible": True,
                "answers": [{"text": "a", "answer_start": 0}],
            },
            "marked is_impossible but has answers",
        ),
    ],
)
def test_read_squad_names_the_file_and_the_fault(tmp_path, content, message):
    if isinstance(content, dict):
        content = json.dumps(
            {"data": [{"title": "t", "paragraphs": [{"context": "abcd", "qas": [content]}]}]}
        )
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message) as error:
        read_squad(path)
    assert str(path) in str(error.value)


def test_read_squad_rejects_duplicate_ids(tmp_path):
    qa = {"id": "q1", "question": "?", "answers": [{"text": "a", "answer_start": 0}]}
    data = {"data": [{"title": "t", "paragraphs": [{"context": "abcd", "qas": [qa, qa]}]}]}
    path = tmp_path / "dup.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"qas\[1\]: duplicate question id 'q1'"):
        read_squad(path)


# ---------------------------------------------------------------------------------------------
# windows


def test_window_spans_overlap_by_doc_stride_capped_at_half_a_window():
    assert window_spans(0, 6, 3) == [(0, 0)]
    assert window_spans(6, 6, 3) == [(0, 6)]
    assert window_spans(7, 6, 3) == [(0, 6), (3, 7)]
    assert window_spans(10, 6, 3) == [(0, 6), (3, 9), (6, 10)]
    assert window_spans(10, 6, 0) == [(0, 6), (6, 10)]
    assert window_spans(10, 6, 5) == window_spans(10, 6, 3)  # overlap capped at room // 2 = 3
    assert window_spans(3, 1, 1) == [(0, 1), (1, 2), (2, 3)]
    with pytest.raises(ValueError, match="room"):
        window_spans(5, 0, 0)
    with pytest.raises(ValueError, match="doc_stride"):
        window_spans(5, 4, -1)


def test_windows_layout_tokens_types_and_offsets(tokenizer):
    windows = _counting_windows(tokenizer)
    layout = [(w.first_context_token, w.context_end - w.context_start) for w in windows]
    assert layout == [(0, 6), (3, 6), (6, 4)]
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    question_ids = tokenizer.encode("what?", add_special_tokens=False).ids
    words = COUNTING.split()
    for w in windows:
        assert len(w) <= 11 and w.window_index == windows.index(w) and not w.question_truncated
        assert w.input_ids.tolist() == [cls_id, *question_ids, sep_id, *w.input_ids[4:-1].tolist(), sep_id]
        assert w.token_type_ids.tolist() == [0] * 4 + [1] * (len(w) - 4)
        assert (w.context_start, w.context_end) == (4, len(w) - 1)
        texts = [COUNTING[s:e] for s, e in w.offsets[w.context_start : w.context_end].tolist()]
        assert texts == words[w.first_context_token : w.first_context_token + len(texts)]
        assert not w.offsets[~w.is_context].any()
    # consecutive windows share exactly doc_stride context tokens
    assert windows[0].input_ids[-4:-1].tolist() == windows[1].input_ids[4:7].tolist()
    batch = pad_batch(windows)
    assert batch["input_ids"].shape == (3, 11)
    assert batch["attention_mask"][2].tolist() == [1] * 9 + [0] * 2


def test_long_question_is_cut_to_max_query_length(tokenizer):
    question = "why " * 50
    windows = make_windows(tokenizer, question, COUNTING, max_seq_length=20, doc_stride=2, max_query_length=8)
    assert all(w.question_truncated and w.context_start == 10 for w in windows)
    assert all(len(w) <= 20 for w in windows)
    with pytest.raises(ValueError, match="leaves no room for context"):
        make_windows(tokenizer, "why?", COUNTING, max_seq_length=10, max_query_length=8)


def test_empty_context_gives_one_window_without_context_and_a_null_answer(tokenizer):
    for context in ("", "   \n "):
        (window,) = make_windows(tokenizer, "what is it?", context)
        assert window.context_start == window.context_end == len(window) - 1
        assert not window.is_context.any()
        assert label_window(window, 0, "it") == (0, 0)
        start, end = _logits([window], fill=5.0)
        (answer,) = decode_answers([window], start, end, top_k=3)
        assert (answer.answer, answer.start, answer.end, answer.is_impossible) == ("", 0, 0, True)
        assert answer.score == 1.0 and answer.null_score_diff == float("inf")


def test_windows_equal_hugging_face_overflowing_tokens(tokenizer, base_path, shared_data):
    transformers = pytest.importorskip("transformers", reason="transformers (test extra) is the reference")
    reference = transformers.BertTokenizerFast.from_pretrained(str(base_path))
    examples = read_squad(shared_data / "squad" / "v1.1" / "dev-v1.1.json")[:1500:10]
    for ex in examples:
        windows = make_windows(tokenizer, ex.question, ex.context, max_seq_length=128, doc_stride=32)
        want = reference(
            ex.question, ex.context, truncation="only_second", max_length=128, stride=32,
            return_overflowing_tokens=True, return_offsets_mapping=True,
        )  # fmt: skip
        assert [w.input_ids.tolist() for w in windows] == want["input_ids"], ex.id
        assert [w.token_type_ids.tolist() for w in windows] == want["token_type_ids"], ex.id
        for i, w in enumerate(windows):
            sequence_ids = want.sequence_ids(i)
            expected = [
                list(o) if s == 1 else [0, 0] for o, s in zip(want["offset_mapping"][i], sequence_ids)
            ]
            assert w.offsets.tolist() == expected, ex.id


# ---------------------------------------------------------------------------------------------
# training labels


def test_label_window_in_across_and_outside_windows(tokenizer):
    windows = _counting_windows(tokenizer)
    start_char = COUNTING.index("five six seven")
    labels = [label_window(w, start_char, "five six seven") for w in windows]
    # ctx tokens 4..6: window 0 holds 0..5 (cut), window 1 holds 3..8, window 2 holds 6..9 (cut)
    assert labels[0] == (0, 0) and labels[2] == (0, 0)
    assert labels[1] == (_position(windows[1], "five"), _position(windows[1], "seven"))
    assert labels[1] == (4 + 1, 4 + 3)
    # surrounding whitespace in the gold text is ignored; None / empty mean unanswerable
    assert label_window(windows[1], start_char - 1, " five six seven ") == labels[1]
    assert label_window(windows[1], None, None) == (0, 0) and label_window(windows[1], 3, "") == (0, 0)


def test_label_window_covers_whole_tokens_of_a_mid_token_answer(tokenizer):
    context = "They spoke Japanese in the 1990s."
    (window,) = make_windows(tokenizer, "which language?", context)
    start, end = label_window(window, context.index("Japan"), "Japan")
    assert start == end and tuple(window.offsets[start]) == (11, 19)  # the token "japanese"


# ---------------------------------------------------------------------------------------------
# decoding


def test_decode_takes_the_best_window_for_a_span_in_an_overlap_and_dedupes(tokenizer):
    windows = _counting_windows(tokenizer)
    start, end = _logits(windows)
    for w, score in ((0, 2.0), (1, 3.0)):  # "five six" lies in windows 0 and 1
        start[w, _position(windows[w], "five")] = score
        end[w, _position(windows[w], "six")] = score
    start[:, 0] = end[:, 0] = 0.0  # [CLS]: null score 0 in every window
    answers = decode_answers(windows, start, end, top_k=5)
    best = answers[0]
    assert (best.answer, best.start, best.end) == ("five six", 19, 27)
    assert COUNTING[best.start : best.end] == best.answer
    assert best.null_score_diff == pytest.approx(0.0 - 6.0)  # best over windows: 3 + 3
    spans = [(a.start, a.end) for a in answers]
    assert len(spans) == len(set(spans)) == 5


def test_decode_never_uses_question_special_or_padding_tokens(tokenizer):
    windows = _counting_windows(tokenizer)
    start, end = _logits(windows, fill=100.0)  # [CLS], question, [SEP] and padding
    start = np.pad(start, ((0, 0), (0, 3)), constant_values=100.0)
    end = np.pad(end, ((0, 0), (0, 3)), constant_values=100.0)
    for w, window in enumerate(windows):
        start[w, : len(window)][window.is_context] = -10.0
        end[w, : len(window)][window.is_context] = -10.0
    start[1, _position(windows[1], "eight")] = 1.0  # a high end BEFORE a high start: never a span
    end[1, _position(windows[1], "four")] = 1.0
    answers = decode_answers(windows, start, end, top_k=50, n_best_size=50)
    assert answers and not any(a.is_impossible for a in answers)
    for a in answers:
        assert a.start < a.end and COUNTING[a.start : a.end] == a.answer
        assert a.answer.split()[0] in COUNTING.split() and a.answer.split()[-1] in COUNTING.split()
    # best: -10 + 1 = -9, a span starting at "eight" or ending at "four"; "eight .. four" is no span
    best = answers[0]
    assert best.start == COUNTING.index("eight") or best.end == COUNTING.index("four") + len("four")


def test_decode_respects_max_answer_length(tokenizer):
    windows = _counting_windows(tokenizer, max_seq_length=20)  # one window with all 10 tokens
    assert len(windows) == 1
    start, end = _logits(windows)
    start[0, _position(windows[0], "two")] = 5.0
    end[0, _position(windows[0], "five")] = 5.0
    end[0, _position(windows[0], "four")] = 4.0
    assert decode_answers(windows, start, end, max_answer_length=4)[0].answer == "two three four five"
    short = decode_answers(windows, start, end, max_answer_length=3, top_k=40, n_best_size=40)
    assert short[0].answer == "two three four"  # 9, the best span of at most 3 tokens
    assert max(len(a.answer.split()) for a in short) == 3 and len(short) == 10 + 9 + 8


def test_scores_are_a_softmax_over_candidate_spans_and_null(tokenizer):
    (window,) = make_windows(tokenizer, "what?", "one two")
    one, two = _position(window, "one"), _position(window, "two")
    start, end = _logits([window], fill=-50.0)
    start[0, [0, one, two]] = [0.0, 1.0, 0.0]
    end[0, [0, one, two]] = [0.0, 0.0, 2.0]
    # spans: "one two" 1+2=3, "two" 0+2=2, "one" 1+0=1; null 0+0=0
    answers = decode_answers([window], start, end, top_k=4, handle_impossible=True)
    assert [a.answer for a in answers] == ["one two", "two", "one", ""] and answers[-1].is_impossible
    expected = np.exp([3.0, 2.0, 1.0, 0.0]) / np.exp([3.0, 2.0, 1.0, 0.0]).sum()
    assert [a.score for a in answers] == pytest.approx(expected.tolist())
    assert all(a.null_score_diff == pytest.approx(-3.0) for a in answers)
    without_null = decode_answers([window], start, end, top_k=4)
    assert [a.answer for a in without_null] == ["one two", "two", "one"]
    expected = np.exp([3.0, 2.0, 1.0]) / np.exp([3.0, 2.0, 1.0]).sum()
    assert [a.score for a in without_null] == pytest.approx(expected.tolist())
    assert decode_answers([window], start, end, n_best_size=1, top_k=3)[0].score == 1.0


def test_null_answer_uses_the_min_cls_score_over_windows_and_the_threshold(tokenizer):
    windows = _counting_windows(tokenizer)
    start, end = _logits(windows)
    start[:, 0], end[:, 0] = [4.0, 2.0, 5.0], [1.0, 0.5, 1.0]  # null score = min(5, 2.5, 6) = 2.5
    start[1, _position(windows[1], "four")] = 1.5
    end[1, _position(windows[1], "five")] = 1.5  # best span "four five" = 3
    answers = decode_answers(windows, start, end, top_k=2, handle_impossible=True)
    assert answers[0].answer == "four five" and answers[0].null_score_diff == pytest.approx(-0.5)
    null = answers[1]
    assert null.is_impossible and (null.answer, null.start, null.end) == ("", 0, 0)
    nulled = decode_answers(windows, start, end, handle_impossible=True, null_score_diff_threshold=-1.0)
    assert nulled[0].is_impossible and nulled[0].answer == ""
    ranked = decode_answers(
        windows, start, end, top_k=2, handle_impossible=True, null_score_diff_threshold=-1.0
    )
    assert ranked[1].answer == "four five"
    # without handle_impossible the null answer is never returned, but the diff still is
    plain = decode_answers(windows, start, end, null_score_diff_threshold=-1.0)
    assert plain[0].answer == "four five" and plain[0].null_score_diff == pytest.approx(-0.5)
    # a higher threshold keeps the span first even though null beats it on score
    start[:, 0] = 4.0  # null score = min(5, 4.5, 5) = 4.5 > 3: diff 1.5
    kept = decode_answers(windows, start, end, top_k=2, handle_impossible=True, null_score_diff_threshold=2.0)
    assert kept[0].answer == "four five" and kept[1].is_impossible and kept[0].score < kept[1].score


def test_decode_rejects_mismatched_inputs(tokenizer):
    windows = _counting_windows(tokenizer)
    start, end = _logits(windows)
    with pytest.raises(ValueError, match="2 rows for 3 windows"):
        decode_answers(windows, start[:2], end[:2])
    with pytest.raises(ValueError, match="at least 11 logits"):
        decode_answers(windows, start[:, :5], end[:, :5])
    other = make_windows(tokenizer, "what?", "a different context")
    with pytest.raises(ValueError, match="same context"):
        decode_answers(windows[:1] + other, start[:2], end[:2])
    with pytest.raises(ValueError, match="at least one window"):
        decode_answers([], start, end)
    with pytest.raises(ValueError, match=">= 1"):
        decode_answers(windows, start, end, top_k=0)


# ---------------------------------------------------------------------------------------------
# the round trip on the real dev sets


def _one_hot_round_trip(tokenizer, example, handle_impossible=False, **window_args):
    """Windows, gold labels (first gold answer) and one-hot logits at them, decoded back."""
    windows = make_windows(tokenizer, example.question, example.context, **window_args)
    text, start_char = example.answers[0] if example.answers else (None, None)
    labels = [label_window(w, start_char, text) for w in windows]
    start, end = _logits(windows, fill=0.0)
    for row, (s, e) in enumerate(labels):
        start[row, s] = end[row, e] = 1.0
    answers = decode_answers(windows, start, end, max_answer_length=128, handle_impossible=handle_impossible)
    return windows, labels, answers[0]


def test_round_trip_on_squad_v1_dev_gives_back_the_gold_text(tokenizer, shared_data):
    """Gold labels decode to the gold text, except where the gold span starts or ends inside a
    WordPiece token (e.g. gold "Japan" in "Japanese", "20,980" in "£20,980"): labels cover whole
    tokens, so the decoded text is the gold text grown to its token boundaries, within its word.

    The sample is every 10th question (all 48 articles, 3 such cases in 1,057) plus the 50 longest
    contexts (6-12 windows each). The first 300 questions alone would be a biased sample: the
    Super Bowl 50 article has 10 gold spans inside number tokens ("8" in "20–18", "5" in "50").
    On the whole dev set it is 30 of 10,570 (0.3%), with max_answer_length large enough.
    """
    examples = read_squad(shared_data / "squad" / "v1.1" / "dev-v1.1.json")
    longest = sorted(examples, key=lambda ex: len(ex.context), reverse=True)[:50]
    sample = list({ex.id: ex for ex in examples[::10] + longest}.values())
    predictions, grown, later_window, not_in_any_window = {}, [], 0, 0
    for ex in sample:
        windows, labels, answer = _one_hot_round_trip(tokenizer, ex, max_seq_length=128, doc_stride=32)
        assert all(len(w) <= 128 for w in windows)
        if all(label == (0, 0) for label in labels):  # longer than a window's room: cannot be labelled
            not_in_any_window += 1
            continue
        later_window += labels[0] == (0, 0)
        gold_text, gold_start = ex.answers[0]
        gold_end = gold_start + len(gold_text)
        assert ex.context[answer.start : answer.end] == answer.answer
        predictions[ex.id] = answer.answer
        if (answer.start, answer.end) != (gold_start, gold_end):
            grown.append(ex.id)
            assert answer.start <= gold_start and answer.end >= gold_end, ex.id
            grown_by = ex.context[answer.start : gold_start] + ex.context[gold_end : answer.end]
            assert not any(ch.isspace() for ch in grown_by), ex.id
    longest_contexts = {ex.id for ex in longest}
    assert not_in_any_window <= 3
    assert later_window >= 150  # many answers only fit in a second or later window
    assert min(len(make_windows(tokenizer, ex.question, ex.context, 128, 32)) for ex in longest) >= 4
    assert len(grown) <= 0.01 * len(predictions), grown
    scored = [ex for ex in sample if ex.id in predictions]
    result = evaluate_squad(scored, predictions)
    assert result["exact"] >= 99.0 and result["total"] == len(scored) == len(sample) - not_in_any_window
    assert longest_contexts & set(predictions)


def test_round_trip_on_squad_v2_dev_with_unanswerable_questions(tokenizer, shared_data):
    examples = read_squad(shared_data / "squad" / "v2.0" / "dev-v2.0.derived.json")[:300]
    predictions, na_scores = {}, {}
    for ex in examples:
        _, labels, answer = _one_hot_round_trip(
            tokenizer, ex, handle_impossible=True, max_seq_length=128, doc_stride=32
        )
        predictions[ex.id] = answer.answer
        na_scores[ex.id] = answer.null_score_diff
        if ex.is_impossible:
            assert answer.is_impossible and answer.null_score_diff == pytest.approx(2.0)
    result = evaluate_squad(examples, predictions, na_scores=na_scores, na_prob_thresh=0.0)
    assert result["NoAns_total"] > 100 and result["HasAns_total"] > 100
    assert result["NoAns_exact"] == 100.0
    assert result["HasAns_exact"] >= 98.0
    assert result["best_exact"] >= result["exact"]
