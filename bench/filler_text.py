"""Filler text for long inputs (the abuse benchmark, and the service tests, which import it from here): plain
sentences of common words, without digits or names, so a location or year probe has nothing to fire on."""

from __future__ import annotations

import random

WORDS = ("the a river house garden morning light quiet people walked slowly along road old market evening "
         "stories children played near water village bread warm window small boat harbour wind trees green "
         "field song long letter friend table kitchen coffee rain cold winter summer bright mountain path "
         "forest stone bridge tower bell clock door street corner shop music teacher student book paper").split()


def filler(words: int, seed: int) -> str:
    """At least `words` words of plain sentences (8 to 15 words each), the same for the same `seed`."""
    rng = random.Random(seed)
    sentences, count = [], 0
    while count < words:
        n = rng.randint(8, 15)
        sentence = " ".join(rng.choice(WORDS) for _ in range(n))
        sentences.append(sentence[0].upper() + sentence[1:] + ".")
        count += n
    return " ".join(sentences)
