"""Size limits of the chat-template sandbox (localllm/chat/sandbox.py): what a value's text would cost,
estimated before an operation builds it, and the budget of the render in progress.

Once Python has built a 10 GB string (or str() of a namespace holding a thousand 1 MB strings, which runs
in C past every check) it is too late to refuse it. `estimate_text` tells how long a value's text is (a
string's length; for containers, namespaces and dict views their items plus ITEM_CHARS each), with work
bounded by the limit whatever the value. Every value a template builds is *charged* to the render's
Budget: operations that can multiply sizes (repetition, string formatting, join, replace, translate,
indent, wordwrap, expandtabs, urlize, slice, tojson/pprint indentation) are estimated from their inputs
before they run; filters, tests and calls that stringify a container have it measured first; iterators are
pulled item by item within the limit; the rest is charged as built. One value may not exceed the limit,
and all of them together not BUILD_FACTOR times it. A limit reached raises LimitExceeded.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any

import jinja2.utils

MAX_OUTPUT_CHARS = 1 << 20  # beyond the conversation's own text; a template adds a few kB at most
MAX_POWER_BITS = 4096  # `a ** b` and `a * b` on integers may produce at most this many bits
BUILD_FACTOR = 16  # all values a render builds, together, may take this many times MAX_OUTPUT_CHARS...
ROOM_BUILD_FACTOR = 4  # ...plus this many times the caller's room (the conversation's own size, twice)
ITEM_CHARS = 16  # what one item of a container counts for: its pointer and object header, in characters
_REPR_INFLATION = 10  # repr() of a non-printable character takes up to 10 ('\U0001f600')

# A width or precision in a %-format or {}-format spec that is long enough to be a runaway (7+ digits).
_HUGE_FORMAT_WIDTH = re.compile(r"\d{7,}")


class LimitExceeded(BaseException):
    """A hostile or runaway template hit one of the renderer's limits.

    A BaseException, so that no `except Exception` on the way (in jinja2 or in a template helper) can
    swallow it: Python also switches the deadline tracer off once it has raised."""


@dataclass
class Budget:
    """What the render in progress may still build. `limit`: characters one value (and the output) may
    take; `build_limit`: characters all values built during the render may take together, counted as they
    are built (freed ones too), so that no template can hold more than about 4 bytes x build_limit."""

    limit: int
    build_limit: int
    built: int = 0


# The budget of the render in progress (a context variable: renders in other threads have their own);
# None while a template compiles (jinja2 folds constants then), when only `limit` applies.
BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def size_limit() -> int:
    """The character limit of one value in the render in progress (MAX_OUTPUT_CHARS while compiling)."""
    budget = BUDGET.get()
    return MAX_OUTPUT_CHARS if budget is None else budget.limit


def _string_size(text: str | bytes | bytearray, quoted: bool) -> int:
    """Characters of `text` printed alone (quoted=False) or as repr() inside a container."""
    if not quoted:
        return len(text)
    printable = text.isprintable() if isinstance(text, str) else False
    return len(text) * (1 if printable else _REPR_INFLATION) + 3


def _namespace_attributes(value: Any) -> dict | None:
    """A jinja2 namespace()'s attribute dict (its repr prints them all), else None."""
    if isinstance(value, jinja2.utils.Namespace):
        return object.__getattribute__(value, "_Namespace__attrs")
    return None


def estimate_text(value: Any, limit: int | None = None, quoted_strings: bool = True) -> tuple[int, int]:
    """(estimated length of str(value), nesting depth), counting only until the length passes `limit`.
    Iterative, and each container adds its item count before its items are visited, so the work is
    bounded by `limit` whatever the value (also a list that contains itself many times over).
    quoted_strings=False counts the strings inside containers at their own length, not their repr's
    (an upper bound for what a template prints, for the caller's room: `sandbox.text_size`)."""
    limit = size_limit() if limit is None else limit
    total, deepest = 0, 0
    stack = [(value, 0)]
    while stack and total <= limit:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        attributes = _namespace_attributes(item)
        if attributes is not None:
            item = attributes
        if isinstance(item, (str, bytes, bytearray)):
            total += _string_size(item, quoted=quoted_strings and depth > 0)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() * 10 // 33 + 2  # decimal digits: log10(2) ~ 0.30
        elif isinstance(item, (list, tuple, set, frozenset, KeysView, ValuesView)):
            total += 16 + ITEM_CHARS * len(item)
            if total <= limit:  # else done: the stack never holds more than limit / ITEM_CHARS items
                stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, (Mapping, ItemsView)):
            pairs = item.items() if isinstance(item, Mapping) else item
            total += 16 + 2 * ITEM_CHARS * len(pairs)
            if total <= limit:
                stack.extend((x, depth + 1) for pair in pairs for x in pair)
        else:
            total += 24  # floats, undefined values, ranges, generators, jinja2 helpers: short reprs
    return total, deepest


def check_estimate(size: int, what: str) -> None:
    """Refuse an operation whose result would be `size` characters, over the limit."""
    if size > size_limit():
        raise LimitExceeded(f"{what} would be about {size:,} characters long (the limit is {size_limit():,})")


def charge(size: int, what: str) -> None:
    """Count a value of `size` characters being built: refused over the limit, or when all values built
    during the render would pass the budget."""
    check_estimate(size, what)
    budget = BUDGET.get()
    if budget is not None:
        budget.built += size
        if budget.built > budget.build_limit:
            raise LimitExceeded(f"the template built more than {budget.build_limit:,} characters of values")


def check_value(value: Any, what: str) -> Any:
    """`value`, whose text size has been checked against the limit (not charged)."""
    check_estimate(estimate_text(value)[0], what)
    return value


def charge_value(value: Any, what: str) -> Any:
    """`value`, charged at its text size."""
    charge(estimate_text(value)[0], what)
    return value


def check_number_argument(value: Any, what: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > size_limit():
        raise LimitExceeded(f"{what} got the number {value:.6g}, larger than the limit {size_limit():,}")


def _widest_insertion(fmt: str, arguments) -> int:
    """The most characters one format marker can insert: the text of any argument (a name or index can
    pick any), an integer argument used as a width (`%*d`, `{:{}}`), or a width or precision in `fmt`."""
    values = []
    for argument in arguments:
        values.extend(argument.values() if isinstance(argument, Mapping) else (argument,))  # format_map
    widths = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    literals = [int(digits) for digits in re.findall(r"\d+", fmt)]
    return max([0, *widths, *literals, *(estimate_text(v)[0] for v in values)])


def check_format(fmt: Any, arguments, marker: str, what: str) -> None:
    """`fmt % arguments` / `fmt.format(...)`: each marker may insert the widest argument, and a width of
    7+ digits pads by itself."""
    if isinstance(fmt, (bytes, bytearray)):
        fmt = fmt.decode("latin-1")
    if not isinstance(fmt, str):
        return
    if _HUGE_FORMAT_WIDTH.search(fmt):
        raise LimitExceeded(f"{what}: a format width of 7 or more digits")
    charge(len(fmt) + fmt.count(marker) * _widest_insertion(fmt, arguments), what)


def check_replace(text: Any, old: Any, new: Any, what: str) -> None:
    strings = (str, bytes, bytearray)
    if isinstance(text, strings) and isinstance(old, strings) and isinstance(new, strings):
        occurrences = len(text) + 1 if len(old) == 0 else text.count(old)
        check_estimate(len(text) + occurrences * len(new), what)


def bounded_list(items: Any, what: str) -> list:
    """list(items) for an iterator (a generator from map, batch, select...), refused as soon as the
    items' text passes the limit: list() would build all of them first."""
    collected, size, limit = [], 16, size_limit()
    for item in items:
        size += ITEM_CHARS + estimate_text(item, limit)[0]
        if size > limit:
            raise LimitExceeded(f"{what}: its input would be more than {limit:,} characters")
        collected.append(item)
    return collected


def is_iterator(value: Any) -> bool:
    """An iterable with no size (a generator, map, an iterator), whose items only exist once pulled."""
    sized = (str, bytes, bytearray, list, tuple, set, frozenset, Mapping, KeysView, ValuesView, ItemsView, range)
    return not isinstance(value, sized) and hasattr(value, "__iter__")


def as_list(value: Any, what: str) -> Any:
    """What str.join or the join filter would iterate, in a form that can be measured first: an
    iterator's items (pulled within the limit), a dict's keys; strings and sequences unchanged."""
    if isinstance(value, (str, bytes, bytearray, list, tuple)) or not hasattr(value, "__iter__"):
        return value
    return bounded_list(value, what) if is_iterator(value) else list(value)


def check_join(items: Any, separator: Any, what: str) -> None:
    separator_size = len(separator) if isinstance(separator, (str, bytes, bytearray)) else 24
    if isinstance(items, (str, bytes, bytearray)):  # joins the characters
        check_estimate(len(items) * (1 + separator_size), what)
    elif isinstance(items, (list, tuple)):
        check_estimate(estimate_text(items)[0] + len(items) * separator_size, what)


def checked_repeat(left: Any, right: Any) -> Any:
    """`*`: estimate a repetition, or an integer product, before building it."""
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(count, int):
            charge(estimate_text(sequence)[0] * max(count, 0), "a repetition")
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_POWER_BITS:
        raise LimitExceeded(f"an integer product of more than {MAX_POWER_BITS} bits")
    return left * right


def checked_power(left: Any, right: Any) -> Any:
    """`**`: integer powers are exact and unbounded in Python, so bound the result's size up front."""
    integers = isinstance(left, int) and isinstance(right, int)
    if integers and right > 0 and abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
        raise LimitExceeded(f"{left} ** {right} is too large")
    return left**right


def checked_modulo(left: Any, right: Any) -> Any:
    if isinstance(left, (str, bytes, bytearray)):
        arguments = right.values() if isinstance(right, Mapping) else right if isinstance(right, tuple) else (right,)
        check_format(left, arguments, "%", "% formatting")
    return left % right


def checked_add(left: Any, right: Any) -> Any:
    sequences = (str, bytes, list, tuple)
    if isinstance(left, sequences) and isinstance(right, sequences):
        charge(estimate_text(left)[0] + estimate_text(right)[0], "a concatenation")
    return left + right


# Filters that never turn their input into text (so a large input needs no measuring first), and those
# whose own estimate below covers it.
NON_STRINGIFYING_FILTERS = frozenset(
    "abs attr batch count d default dictsort first float groupby int items last length list map max min "
    "random reject rejectattr reverse round select selectattr slice sort sum unique".split()
    + "join replace format indent wordwrap tojson pprint urlize".split()
)


# Filters that pull every item of an iterator into a list (or a sum) in C: their input is pulled here
# first, item by item within the limit.
ITERATOR_CONSUMING_FILTERS = frozenset("list sort unique reverse sum min max groupby dictsort join".split())

# Jinja tests that call str() on their value.
STRINGIFYING_TESTS = frozenset({"lower", "upper"})


def check_filter_inputs(name: str, value: Any, options: tuple, kwargs: dict) -> None:
    """Estimates for the filters whose output can be much larger than their inputs; a container that
    a filter stringifies is measured before it is."""

    def option(index: int, key: str, default=None):
        return options[index] if len(options) > index else kwargs.get(key, default)

    if name not in NON_STRINGIFYING_FILTERS and not isinstance(value, (str, int, float)):
        check_value(value, f"filter '{name}'")
    if name == "join":
        check_join(value, option(0, "d", ""), "filter 'join'")
    elif name == "replace":
        check_replace(value, option(0, "old"), option(1, "new"), "filter 'replace'")
    elif name == "format":
        check_format(value, (*options, *kwargs.values()), "%", "filter 'format'")
    elif name == "indent" and isinstance(value, str):
        width = option(0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        check_estimate(len(value) + (value.count("\n") + 1) * pad, "filter 'indent'")
    elif name == "wordwrap" and isinstance(value, str):
        width, wrapstring = option(0, "width", 79), option(3, "wrapstring", "\n")
        lines = len(value) // max(width if isinstance(width, int) else 1, 1) + 1
        check_estimate(len(value) + lines * len(wrapstring or "\n"), "filter 'wordwrap'")
    elif name == "urlize" and isinstance(value, str):
        # Every word may become <a href="word" rel=".." target="..">word</a>.
        extras = sum(len(v) for v in (*options, *kwargs.values()) if isinstance(v, str))
        check_estimate(3 * len(value) + (len(value) // 2 + 1) * (64 + extras), "filter 'urlize'")
    elif name == "slice":
        count = option(0, "slices", 1)
        check_estimate(estimate_text(value)[0] + (count if isinstance(count, int) else 0) * ITEM_CHARS, "filter 'slice'")
    elif name in ("tojson", "pprint"):
        size, depth = estimate_text(value)
        indent = option(1, "indent") if name == "tojson" else 1
        step = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        check_estimate(size * (1 + depth * step), f"filter '{name}'")


def check_str_method(method: Any, args: tuple) -> None:
    """Estimates for str and bytes methods whose output can be much larger than their inputs."""
    text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(text, (str, bytes, bytearray)):
        return
    if name == "replace" and len(args) >= 2:
        check_replace(text, args[0], args[1], f"{type(text).__name__}.replace")
    elif name == "join" and args:
        check_join(args[0], text, f"{type(text).__name__}.join")
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        check_estimate(len(text) + text.count(b"\t" if isinstance(text, (bytes, bytearray)) else "\t") * size, "expandtabs")
    elif name == "translate" and args and isinstance(args[0], Mapping):
        widest = max((estimate_text(v)[0] for v in args[0].values()), default=1)
        check_estimate(len(text) * max(widest, 1), "str.translate")
