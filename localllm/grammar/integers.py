"""Integer bounds of a JSON schema as GBNF: exactly the integers between two bounds, as JSON writes them
(no leading zeros, no "-0"), built digit by digit as a regular-expression generator would build them."""

from __future__ import annotations

import math

from .gbnf import GrammarError

# Digits an integer (or a fraction, or an exponent) may have where no bound says otherwise, as llama.cpp.
MAX_DIGITS = 16


def integer_bounds(schema: dict, name: str) -> tuple:
    """(lowest, highest) allowed integer (None: unbounded), from minimum/maximum and their exclusive forms."""
    def number(key):
        value = schema.get(key)
        if value is None or isinstance(value, bool):
            return None
        if not isinstance(value, (int, float)):
            raise GrammarError(f"JSON schema at {name!r}: {key} must be a number (got {value!r})")
        return value

    low = number("minimum")
    high = number("maximum")
    exclusive_low, exclusive_high = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    low = math.ceil(low) if low is not None else None
    high = math.floor(high) if high is not None else None
    if exclusive_low is True and low is not None:  # draft 4: a flag on minimum
        low += 1 if low == schema.get("minimum") else 0
    elif number("exclusiveMinimum") is not None:
        value = number("exclusiveMinimum")
        strict = math.floor(value) + 1
        low = strict if low is None else max(low, strict)
    if exclusive_high is True and high is not None:
        high -= 1 if high == schema.get("maximum") else 0
    elif number("exclusiveMaximum") is not None:
        value = number("exclusiveMaximum")
        strict = math.ceil(value) - 1
        high = strict if high is None else min(high, strict)
    if low is not None and high is not None and low > high:
        raise GrammarError(f"JSON schema at {name!r}: no integer lies between the minimum and the maximum")
    return low, high


def integer_range(low, high) -> str:
    """A GBNF expression for the integers low..high written as JSON writes them (None: unbounded,
    i.e. up to MAX_DIGITS digits)."""
    widest = 10**MAX_DIGITS - 1
    low = -widest if low is None else low
    high = widest if high is None else high
    if low > widest or high < -widest:
        raise GrammarError(f"integer bounds beyond {MAX_DIGITS} digits are not supported")
    low, high = max(low, -widest), min(high, widest)
    alternatives = []
    if low < 0:
        alternatives.append('"-" ( ' + _natural_range(max(1, -min(high, -1)), -low) + " )")
    if high >= 0:
        alternatives.append(_natural_range(max(low, 0), high))
    return " | ".join(alternatives)


def _natural_range(low: int, high: int) -> str:
    """Integers low..high (both >= 0), without leading zeros."""
    parts = []
    for length in range(len(str(low)), len(str(high)) + 1):
        first = max(low, 10 ** (length - 1) if length > 1 else 0)
        last = min(high, 10**length - 1)
        if first <= last:
            parts.append(_fixed_range(str(first), str(last)))
    return " | ".join(f"( {p} )" if " | " in p else p for p in parts)


def _fixed_range(a: str, b: str) -> str:
    """Digit strings of len(a) == len(b) between a and b (leading zeros allowed inside)."""
    n = len(a)
    if n == 0:
        return ""
    if a == b:
        return f'"{a}"'
    if a[0] == b[0]:
        return f'"{a[0]}" ( {_fixed_range(a[1:], b[1:])} )'
    if a[1:] == "0" * (n - 1) and b[1:] == "9" * (n - 1):
        return f"[{a[0]}-{b[0]}]" + (f" [0-9]{{{n - 1}}}" if n > 1 else "")
    alternatives = [f'"{a[0]}" ( {_fixed_range(a[1:], "9" * (n - 1))} )' if n > 1 else f'"{a[0]}"']
    if int(b[0]) - int(a[0]) > 1:
        alternatives.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + (f" [0-9]{{{n - 1}}}" if n > 1 else ""))
    alternatives.append(f'"{b[0]}" ( {_fixed_range("0" * (n - 1), b[1:])} )' if n > 1 else f'"{b[0]}"')
    return " | ".join(alternatives)
