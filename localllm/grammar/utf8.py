"""Sets of code points as UTF-8 byte patterns, so that grammars can be matched a byte at a time.

Tokens are byte strings, and a token may end inside a character (byte-level BPE does this all the time):
matching bytes, not characters, makes such tokens need no special case. A set of code points becomes a
few alternatives, each a sequence of byte ranges: e.g. U+0080..U+07FF is [C2-DF][80-BF]. Surrogates
(U+D800..U+DFFF) are never matched: they have no valid UTF-8 encoding.
"""

from __future__ import annotations

MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_LENGTH_LIMITS = (0x7F, 0x7FF, 0xFFFF)  # the last code point of each UTF-8 length


def normalized(ranges, negated: bool) -> list:
    """Sorted, merged, disjoint (low, high) ranges of the set (its complement in Unicode when `negated`),
    surrogates removed."""
    merged: list = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    if negated:
        complement, start = [], 0
        for low, high in merged:
            if low > start:
                complement.append((start, low - 1))
            start = max(start, high + 1)
        if start <= MAX_CODE_POINT:
            complement.append((start, MAX_CODE_POINT))
        merged = complement
    out = []
    for low, high in merged:
        if low <= _SURROGATES[1] and high >= _SURROGATES[0]:
            if low < _SURROGATES[0]:
                out.append((low, _SURROGATES[0] - 1))
            if high > _SURROGATES[1]:
                out.append((_SURROGATES[1] + 1, high))
        else:
            out.append((low, high))
    return out


def byte_sequences(low: int, high: int) -> list:
    """UTF-8 encodings of the code points low..high as a list of patterns, each a tuple of inclusive
    (first byte, last byte) ranges, one per byte; together they match exactly those encodings."""
    for limit in _LENGTH_LIMITS:  # one encoded length per pattern
        if low <= limit < high:
            return byte_sequences(low, limit) + byte_sequences(limit + 1, high)
    if high < 0x80:
        return [((low, high),)]
    length = len(chr(low).encode("utf-8"))
    for trailing in range(1, length):
        # split where a leading byte changes while the trailing bytes do not cover their whole range
        mask = (1 << (6 * trailing)) - 1
        if low & ~mask != high & ~mask:
            if low & mask != 0:
                return byte_sequences(low, low | mask) + byte_sequences((low | mask) + 1, high)
            if high & mask != mask:
                return byte_sequences(low, (high & ~mask) - 1) + byte_sequences(high & ~mask, high)
    first, last = chr(low).encode("utf-8"), chr(high).encode("utf-8")
    return [tuple((first[i], last[i]) for i in range(length))]


def code_point_patterns(ranges, negated: bool) -> list:
    """Byte patterns (as byte_sequences) of a character class."""
    return [pattern for low, high in normalized(ranges, negated) for pattern in byte_sequences(low, high)]
