"""Span ends that never split a character as people see it (a grapheme cluster).

WordPiece offsets may stop before a combining accent the normalizer stripped ("e" + U+0301), before a
variation selector (U+FE0F makes "❤" an emoji), before an emoji skin tone, or in the middle of a
zero-width-joiner sequence (👩‍💻 is three code points). `extend_end` moves an end forward over such
trailing code points, following the extension rules of Unicode's UAX #29 that matter here:
Extend (combining marks, variation selectors, skin-tone modifiers, tag characters), SpacingMark,
ZWJ + the code point it joins, and the second regional indicator of a flag.
"""

from __future__ import annotations

import unicodedata

ZWJ = "\u200d"


def _extends(ch: str) -> bool:
    """Does `ch` belong to the cluster of the code point before it?"""
    code = ord(ch)
    if unicodedata.category(ch) in ("Mn", "Me", "Mc"):  # combining marks (Extend / SpacingMark)
        return True
    return (0xFE00 <= code <= 0xFE0F or 0xE0100 <= code <= 0xE01EF  # variation selectors
            or 0x1F3FB <= code <= 0x1F3FF  # emoji skin-tone modifiers
            or 0xE0020 <= code <= 0xE007F  # tag characters (subdivision flags)
            or code == 0x200C)  # ZWNJ is Extend too


def _regional_indicator(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def extend_end(text: str, end: int) -> int:
    """The smallest end >= `end` that does not fall inside a grapheme cluster of `text`."""
    if end <= 0 or end >= len(text):
        return end
    if _regional_indicator(text[end - 1]) and _regional_indicator(text[end]):
        run = 0  # regional indicators pair up from the start of their run: an odd run splits a flag
        while end - 1 - run >= 0 and _regional_indicator(text[end - 1 - run]):
            run += 1
        if run % 2 == 1:
            end += 1
    if text[end - 1] == ZWJ:  # a joiner at the end joins the next code point
        end += 1
    while end < len(text):
        ch = text[end]
        if _extends(ch):
            end += 1
        elif ch == ZWJ:
            end += 2 if end + 1 < len(text) else 1  # the joiner and what it joins
        else:
            break
    return min(end, len(text))
