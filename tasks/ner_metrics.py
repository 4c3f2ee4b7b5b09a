"""Entity-level NER metrics exactly as conlleval.pl computes them, and the IOB tag-scheme helpers.

conlleval reads a tag as `PREFIX-TYPE` (split at the first hyphen, so types may hold hyphens) and
decides where chunks start and end from the previous and the current tag alone (`startOfChunk`,
`endOfChunk` below, transcribed from the script). The same rules read IOB1 and IOB2: a chunk may
start with I- (after O, at a sentence start or after another type), B- always starts a new chunk
(two adjacent entities of the same type), and a change of type ends a chunk. A predicted entity
counts as correct only if it starts and ends where a gold one does, with the same type.

Sentences are scored as if separated by conlleval's boundary line: every chunk ends at a sentence end.
Figures are fractions in [0, 1] (conlleval prints percentages).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

OUTSIDE = "O"


def split_tag(tag: str) -> tuple[str, str]:
    """`B-PER` -> ("B", "PER"); `O` -> ("O", ""); a tag without hyphen -> (tag, "") as conlleval."""
    prefix, sep, entity_type = tag.partition("-")
    return (prefix, entity_type) if sep else (tag, "")


def _end_of_chunk(prev_tag: str, tag: str, prev_type: str, entity_type: str) -> bool:
    if prev_tag in ("B", "I") and tag in ("B", "O"):
        return True
    if prev_tag == "E" and tag in ("E", "I", "O"):
        return True
    if prev_tag not in ("O", ".") and prev_type != entity_type:
        return True
    return prev_tag in ("[", "]")


def _start_of_chunk(prev_tag: str, tag: str, prev_type: str, entity_type: str) -> bool:
    if tag == "B" and prev_tag in ("B", "I", "O"):
        return True
    if prev_tag == "O" and tag in ("I", "E"):
        return True
    if prev_tag == "E" and tag in ("E", "I"):
        return True
    if tag not in ("O", ".") and prev_type != entity_type:
        return True
    return tag in ("[", "]")


def iob_chunks(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one sentence as (type, start, end) with `end` exclusive, by conlleval's rules."""
    chunks: list[tuple[str, int, int]] = []
    prev_tag, prev_type, begin, begin_type = OUTSIDE, "", -1, ""
    for i, raw in enumerate([*tags, OUTSIDE]):  # the trailing O is the sentence boundary
        tag, entity_type = split_tag(raw)
        starts = i < len(tags) and _start_of_chunk(prev_tag, tag, prev_type, entity_type)
        if begin >= 0 and (starts or _end_of_chunk(prev_tag, tag, prev_type, entity_type)):
            chunks.append((begin_type, begin, i))
            begin = -1
        if starts:
            begin, begin_type = i, entity_type
        prev_tag, prev_type = tag, entity_type
    return chunks


def starts_chunk_with_inside(tags: Sequence[str]) -> list[int]:
    """Positions where an I- tag starts a chunk: the normal case in IOB1, an error in IOB2."""
    positions = []
    prev_prefix, prev_type = OUTSIDE, ""
    for i, raw in enumerate(tags):
        prefix, entity_type = split_tag(raw)
        if prefix == "I" and (prev_prefix == OUTSIDE or prev_type != entity_type):
            positions.append(i)
        prev_prefix, prev_type = prefix, entity_type
    return positions


def iob1_to_iob2(tags: Sequence[str]) -> list[str]:
    """Rewrite IOB1 tags as IOB2: an I- that starts a chunk becomes B-. The identity on valid IOB2."""
    out = list(tags)
    for i in starts_chunk_with_inside(tags):
        out[i] = "B-" + split_tag(tags[i])[1]
    return out


def _prf(correct: int, guessed: int, gold: int) -> dict[str, float]:
    precision = correct / guessed if guessed else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def conlleval(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict:
    """Entity-level precision / recall / F1 (micro over all types, and per type) plus token accuracy.

    `gold` and `predicted` are tag sequences, one per sentence, of equal lengths. Returns
    `{"precision", "recall", "f1", "accuracy", "n_gold", "n_predicted", "n_correct",
    "per_type": {type: {"precision", "recall", "f1", "n_gold", "n_predicted", "n_correct"}}}`,
    the types sorted by name as conlleval prints them.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted ones")
    found_gold: Counter[str] = Counter()
    found_guessed: Counter[str] = Counter()
    correct_chunks: Counter[str] = Counter()
    correct_tags = tokens = 0
    for n, (gold_tags, guessed_tags) in enumerate(zip(gold, predicted)):
        if len(gold_tags) != len(guessed_tags):
            raise ValueError(f"sentence {n}: {len(gold_tags)} gold tags but {len(guessed_tags)} predicted")
        in_correct = False
        last_c, last_ct, last_g, last_gt = OUTSIDE, "", OUTSIDE, ""
        # The state machine of conlleval.pl, one sentence followed by its boundary line (O, O).
        for i in range(len(gold_tags) + 1):
            boundary = i == len(gold_tags)
            c, ct = split_tag(gold_tags[i]) if not boundary else (OUTSIDE, "")
            g, gt = split_tag(guessed_tags[i]) if not boundary else (OUTSIDE, "")
            end_c = _end_of_chunk(last_c, c, last_ct, ct)
            end_g = _end_of_chunk(last_g, g, last_gt, gt)
            if in_correct:
                if end_c and end_g and last_gt == last_ct:
                    in_correct = False
                    correct_chunks[last_ct] += 1
                elif end_c != end_g or gt != ct:
                    in_correct = False
            start_c = _start_of_chunk(last_c, c, last_ct, ct)
            start_g = _start_of_chunk(last_g, g, last_gt, gt)
            if start_c and start_g and gt == ct:
                in_correct = True
            if start_c:
                found_gold[ct] += 1
            if start_g:
                found_guessed[gt] += 1
            if not boundary:
                correct_tags += c == g and ct == gt
                tokens += 1
            last_c, last_ct, last_g, last_gt = c, ct, g, gt
        if in_correct:  # unreachable after a boundary line, kept as in the script
            correct_chunks[last_ct] += 1

    n_correct, n_guessed, n_gold = (sum(x.values()) for x in (correct_chunks, found_guessed, found_gold))
    result: dict = _prf(n_correct, n_guessed, n_gold)
    result.update(
        accuracy=correct_tags / tokens if tokens else 0.0,
        n_gold=n_gold,
        n_predicted=n_guessed,
        n_correct=n_correct,
    )
    result["per_type"] = {
        t: {
            **_prf(correct_chunks[t], found_guessed[t], found_gold[t]),
            "n_gold": found_gold[t],
            "n_predicted": found_guessed[t],
            "n_correct": correct_chunks[t],
        }
        for t in sorted(set(found_gold) | set(found_guessed))
    }
    return result
