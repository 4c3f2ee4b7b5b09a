"""Contrast pairs made by rule from shipped sentences: a sentence and a copy that shares nearly every
word but means something else, with a low similarity score. They teach the similarity model that shared
words are not shared meaning, which the permissively licensed STS-B genres teach too rarely.

Four rules, each changing one thing and keeping the rest of the sentence:
- negation: "A man is riding a horse." -> "A man is not riding a horse."
- antonym: one word swapped for its opposite (ANTONYMS): "A small dog ..." -> "A large dog ..."
- swapped roles: who does what to whom reversed: "A dog is chasing a cat." -> "A cat is chasing a dog."
- changed number: "Two dogs ..." -> "Three dogs ...", "in 1998" -> "in 2011"

Scores follow the STS annotation scale (5 equivalent, 3 roughly equivalent with important information
different, 2 not equivalent but sharing some details, 1 same topic only): a reversed meaning (negation,
antonym, swapped roles) is 1.5, a changed number 2.0, where the STS-B `images` genre itself scores its
one-word contrasts (a dog swimming / running 2.6, in a yard / in a stream 2.0, laughing / a kiss 1.2).
"""

from __future__ import annotations

import random
import re

SCORES = {"negation": 1.5, "antonym": 1.5, "swapped roles": 1.5, "changed number": 2.0}

_PAIRS = """white black, man woman, men women, boy girl, boys girls, standing sitting, stands sits, up down,
small large, big little, young old, inside outside, open closed, empty full, day night, wet dry, top bottom,
over under, above below, left right, happy sad, long short, hot cold, light dark, fast slow, asleep awake,
entering leaving, enters leaves, pushing pulling, pushes pulls, giving taking, buying selling, smiling frowning,
laughing crying, won lost, wins loses, before after, first last, increased decreased, rose fell, north south,
east west, most least, always never, accepted rejected, allowed banned, larger smaller, largest smallest,
higher lower, highest lowest, early late, earlier later, ancient modern, public private, rich poor,
strong weak, win lose, lower upper, more fewer"""
ANTONYMS = {a: b for pair in _PAIRS.replace("\n", " ").split(",") for a, b in [pair.split()]}
ANTONYMS.update({b: a for a, b in list(ANTONYMS.items())})

NUMBER_WORDS = ["two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
# Verbs whose subject and object cannot trade places without changing what happened.
ROLE_VERBS = ("chasing|chases|chased|biting|bites|bit|following|follows|followed|pushing|pushes|pushed|pulling|"
              "pulls|pulled|carrying|carries|carried|kissing|kisses|kissed|hugging|hugs|hugged|feeding|feeds|fed|"
              "watching|watches|watched|attacking|attacks|attacked|licking|licks|licked|jumping over|jumps over|"
              "defeated|beat|succeeded|replaced|acquired|bought|invaded|conquered|hired|fired|paid|taught|"
              "helped|visited|sued|trained|led|ruled|overthrew|captured|killed")
# A noun phrase: a determiner and up to three words that are not function words or verbs, or a name.
_FUNCTION = (r"(?:is|are|was|were|on|in|at|of|with|a|an|the|to|by|and|down|up|into|through|its|his|her|while"
             r"|[a-z]+ing)\b")
_WORD_NP = rf"(?:[Aa]n?|[Tt]he|[Hh]is|[Hh]er) (?:(?!{_FUNCTION})[a-z]+ ){{0,2}}(?!{_FUNCTION})[a-z]+"
_NAME_NP = r"(?:[A-Z][\w'-]+ ){0,2}[A-Z][\w'-]+"
_NP = rf"(?:{_WORD_NP}|{_NAME_NP})"
_AFTER_OBJECT = r"[.,;]|$| (?:in|on|at|with|through|across|into|down|up|along|from|to|over|near|by|home|as|for|while)\b"
SWAP = re.compile(
    rf"^(?P<a>{_NP}) (?P<verb>(?:is |was )?(?:{ROLE_VERBS})) (?P<b>{_NP})(?P<rest>(?:{_AFTER_OBJECT}).*)$")
AUXILIARY = re.compile(r"\b(is|are|was|were|can|will|could|would|should|must)\b(?! not\b)")
WORD = re.compile(r"[A-Za-z]+")
# A year, or a count (a number before a word that is not a function word: "30 people", not "April 26 the").
YEAR_OR_COUNT = re.compile(r"\b(?:1[5-9]\d\d|20[01]\d)\b"
                           r"|\b(?:[2-9]|[1-9]\d)(?= (?!(?:the|of|and|in|on|at|to|a|an)\b)[a-z])")


def negation(sentence: str, rng: random.Random) -> str | None:
    """"not" after the first auxiliary verb ("is", "was", "can", ...), or None."""
    match = AUXILIARY.search(sentence)
    return sentence[: match.end()] + " not" + sentence[match.end():] if match else None


def antonym(sentence: str, rng: random.Random) -> str | None:
    """One word (chosen by `rng` among those that have one) swapped for its opposite, or None."""
    words = [m for m in WORD.finditer(sentence) if m.group().lower() in ANTONYMS]
    if not words:
        return None
    word = rng.choice(words)
    opposite = ANTONYMS[word.group().lower()]
    if word.group()[0].isupper():
        opposite = opposite.capitalize()
    return sentence[: word.start()] + opposite + sentence[word.end():]


def swapped_roles(sentence: str, rng: random.Random) -> str | None:
    """Subject and object of a role verb traded ("A dog is chasing a cat." -> "A cat is chasing a dog.")."""
    match = SWAP.match(sentence)
    if not match:
        return None
    a, b = match["a"], match["b"]
    if a.lower() == b.lower():
        return None
    return f"{_as_subject(b)} {match['verb']} {_as_object(a)}{match['rest']}"


DETERMINERS = ("a", "an", "the", "his", "her")


def _as_subject(phrase: str) -> str:
    return phrase[0].upper() + phrase[1:]


def _as_object(phrase: str) -> str:
    """A determiner loses the capital it had at the start of the sentence; a name keeps its own."""
    first, _, rest = phrase.partition(" ")
    return f"{first.lower()} {rest}" if first.lower() in DETERMINERS else phrase


def changed_number(sentence: str, rng: random.Random) -> str | None:
    """One number changed: a number word for another, a year moved by 3-40 years, a count by 1-5."""
    words = [m for m in WORD.finditer(sentence) if m.group().lower() in NUMBER_WORDS]
    digits = list(YEAR_OR_COUNT.finditer(sentence))
    if not words and not digits:
        return None
    found = rng.choice(words + digits)
    text = found.group()
    if text.isdigit():
        value = int(text)
        step = rng.randint(3, 40) if value >= 1500 else rng.randint(1, 5)
        new = str(value - step if value - step >= 2 and (value >= 1980 or rng.random() < 0.5) else value + step)
    else:
        new = rng.choice([w for w in NUMBER_WORDS if w != text.lower()])
        new = new.capitalize() if text[0].isupper() else new
    return sentence[: found.start()] + new + sentence[found.end():]


RULES = {"negation": negation, "antonym": antonym, "swapped roles": swapped_roles, "changed number": changed_number}


def contrast_pairs(sentences: list[str], per_rule: dict[str, int], rng: random.Random) -> list[dict]:
    """Up to `per_rule[rule]` pairs per rule (a rule it does not name makes none), each from a different sentence
    drawn by `rng`, as STS rows ({"text", "text_pair", "label"}); the changed sentence is the first or the
    second text at random."""
    rows = []
    for name, rule in RULES.items():
        if not per_rule.get(name):
            continue
        made = []
        for sentence in rng.sample(sentences, len(sentences)):
            changed = rule(sentence, rng)
            if changed and changed != sentence:
                made.append((sentence, changed))
            if len(made) == per_rule.get(name, 0):
                break
        for sentence, changed in made:
            first, second = (sentence, changed) if rng.random() < 0.5 else (changed, sentence)
            rows.append({"text": first, "text_pair": second, "label": SCORES[name]})
    rng.shuffle(rows)
    return rows
