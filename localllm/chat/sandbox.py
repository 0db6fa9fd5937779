"""The sandbox a chat template renders in (localllm/chat/templates.py renders through it).

A template in a downloaded file is untrusted input. The sandbox already refuses private attributes,
unsafe callables, mutation of the data, and `range()` over more than 100,000 items; on top of that the
renderer bounds what a hostile template can cost, so that any template fails within about 1 s of CPU
and a few tens of MB:
- every value built on the way, and the output, at MAX_OUTPUT_CHARS characters plus the room the caller
  gives (ChatTemplate: twice the size of the messages and tools, so very long conversations still
  render), measured *before* anything turns it into text: namespaces, dicts, dict views, lists and
  tuples count their items (their str() runs in C, past any check), operations that can multiply
  sizes (`*` repetition, `%` and `str.format` with widths from anywhere, join, replace, translate,
  indent, wordwrap, expandtabs, urlize, slice, tojson's and pprint's indentation) are estimated from
  their inputs; numeric arguments of filters and calls may not exceed the limit either; `lipsum` is
  removed;
- all values built during the render together (freed ones too: literals, slices, concatenations,
  block and macro output, printed values, filter and call results) at BUILD_FACTOR times that, so that
  no number of kept values (distinct names, recursion frames) adds up to more;
- `**` and integer `*` to small results;
- wall time at RENDER_SECONDS: a sys.settrace hook, installed for the render only (any previous
  tracer is restored after), checks the clock on executed template lines, so even loops that call
  nothing stop;
- recursion by Python's own limit (a RecursionError becomes a TemplateError).
Every failure (syntax, sandbox violation, undefined value, raise_exception, any exception inside
rendering, a limit) is a `localllm.errors.TemplateError` with a one-line message, and nothing else
reaches stderr.
"""

from __future__ import annotations

import contextvars
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from collections.abc import ItemsView, KeysView, ValuesView
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

import jinja2
import jinja2.compiler
import jinja2.nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError

MAX_OUTPUT_CHARS = 1 << 20  # beyond the conversation's own text; a template adds a few kB at most
MAX_SOURCE_CHARS = 1 << 20  # real templates are a few kB (the largest known are ~20 kB)
RENDER_SECONDS = 0.8  # wall time; normal renders take milliseconds; leaves room for compiling within 1 s
MAX_POWER_BITS = 4096  # `a ** b` may produce at most this many bits
_MAX_ERROR_CHARS = 300
BUILD_FACTOR = 16  # all values a render builds, together, may take this many times its size limit
_ITEM_CHARS = 16  # what one item of a container counts for: its pointer and object header, in characters
_REPR_INFLATION = 10  # repr() of a non-printable character takes up to 10 ('\U0001f600')
_TRACE_CHECK_EVERY = 256  # trace events between two clock reads

# A width or precision in a %-format or {}-format spec that is long enough to be a runaway (7+ digits).
_HUGE_FORMAT_WIDTH = re.compile(r"\d{7,}")


class _LimitExceeded(BaseException):
    """A hostile or runaway template hit one of the renderer's limits.

    A BaseException, so that no `except Exception` on the way (in jinja2 or in a template helper) can
    swallow it: Python also switches the deadline tracer off once it has raised."""


@dataclass
class _Budget:
    """What the render in progress may still build. `limit`: characters one value (and the output) may
    take; `build_limit`: characters all values built during the render may take together, counted as they
    are built (freed ones too), so that no template can hold more than about 4 bytes x build_limit."""

    limit: int
    build_limit: int
    built: int = 0


# The budget of the render in progress (a context variable: renders in other threads have their own);
# None while a template compiles (jinja2 folds constants then), when only `limit` applies.
_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


class _RaisedByTemplate(Exception):
    """raise_exception(message) called by the template itself."""


# -- the sandbox ---------------------------------------------------------------------------------------
#
# Size limits work on estimates made *before* an operation: once Python has built a 10 GB string (or
# str() of a namespace holding a thousand 1 MB strings) it is too late to refuse it. `_text_size`
# estimates how long a value's text is (a string's length; for containers, namespaces and dict views
# their items plus `_ITEM_CHARS` each), bounded work whatever the value. Every value a template builds
# is *charged* to the render's budget: the operations that can multiply sizes (repetition, string
# formatting, join, replace, translate, indent, wordwrap, expandtabs, urlize, tojson/pprint indentation,
# slice) are estimated from their inputs before they run; filters and calls that stringify a container
# have it measured first; list, tuple and dict literals, slices, `~`, `+`, block and macro output, every
# printed value, and the results of filters and calls are charged as built. One value may not exceed
# the limit, and all of them together not BUILD_FACTOR times it.


def _size_limit() -> int:
    """The character limit of one value in the render in progress (MAX_OUTPUT_CHARS while compiling)."""
    budget = _BUDGET.get()
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


def _text_size(value: Any, limit: int | None = None) -> tuple[int, int]:
    """(estimated length of str(value), nesting depth), counting only until the length passes `limit`.
    Iterative, and each container adds its item count before its items are visited, so the work is
    bounded by `limit` whatever the value (also a list that contains itself many times over)."""
    limit = _size_limit() if limit is None else limit
    total, deepest = 0, 0
    stack = [(value, 0)]
    while stack and total <= limit:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        attributes = _namespace_attributes(item)
        if attributes is not None:
            item = attributes
        if isinstance(item, (str, bytes, bytearray)):
            total += _string_size(item, quoted=depth > 0)
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() * 10 // 33 + 2  # decimal digits: log10(2) ~ 0.30
        elif isinstance(item, (list, tuple, set, frozenset, KeysView, ValuesView)):
            total += 16 + _ITEM_CHARS * len(item)
            if total <= limit:  # else done: the stack never holds more than limit / _ITEM_CHARS items
                stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, (Mapping, ItemsView)):
            pairs = item.items() if isinstance(item, Mapping) else item
            total += 16 + 2 * _ITEM_CHARS * len(pairs)
            if total <= limit:
                stack.extend((x, depth + 1) for pair in pairs for x in pair)
        else:
            total += 24  # floats, undefined values, ranges, generators, jinja2 helpers: short reprs
    return total, deepest


def _check_estimate(size: int, what: str) -> None:
    """Refuse an operation whose result would be `size` characters, over the limit."""
    if size > _size_limit():
        raise _LimitExceeded(f"{what} would be about {size:,} characters long (the limit is {_size_limit():,})")


def _charge(size: int, what: str) -> None:
    """Count a value of `size` characters being built: refused over the limit, or when all values built
    during the render would pass the budget."""
    _check_estimate(size, what)
    budget = _BUDGET.get()
    if budget is not None:
        budget.built += size
        if budget.built > budget.build_limit:
            raise _LimitExceeded(f"the template built more than {budget.build_limit:,} characters of values")


def _check_value(value: Any, what: str) -> Any:
    """`value`, whose text size has been checked against the limit (not charged)."""
    _check_estimate(_text_size(value)[0], what)
    return value


def _charge_value(value: Any, what: str) -> Any:
    """`value`, charged at its text size."""
    _charge(_text_size(value)[0], what)
    return value


def _check_number_argument(value: Any, what: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > _size_limit():
        raise _LimitExceeded(f"{what} got the number {value:.6g}, larger than the limit {_size_limit():,}")


def _widest_insertion(fmt: str, arguments) -> int:
    """The most characters one format marker can insert: the text of any argument (a name or index can
    pick any), an integer argument used as a width (`%*d`, `{:{}}`), or a width or precision in `fmt`."""
    values = []
    for argument in arguments:
        values.extend(argument.values() if isinstance(argument, Mapping) else (argument,))  # format_map
    widths = [abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]
    literals = [int(digits) for digits in re.findall(r"\d+", fmt)]
    return max([0, *widths, *literals, *(_text_size(v)[0] for v in values)])


def _check_format(fmt: Any, arguments, marker: str, what: str) -> None:
    """`fmt % arguments` / `fmt.format(...)`: each marker may insert the widest argument, and a width of
    7+ digits pads by itself."""
    if isinstance(fmt, (bytes, bytearray)):
        fmt = fmt.decode("latin-1")
    if not isinstance(fmt, str):
        return
    if _HUGE_FORMAT_WIDTH.search(fmt):
        raise _LimitExceeded(f"{what}: a format width of 7 or more digits")
    _charge(len(fmt) + fmt.count(marker) * _widest_insertion(fmt, arguments), what)


def _check_replace(text: Any, old: Any, new: Any, what: str) -> None:
    strings = (str, bytes, bytearray)
    if isinstance(text, strings) and isinstance(old, strings) and isinstance(new, strings):
        occurrences = len(text) + 1 if len(old) == 0 else text.count(old)
        _check_estimate(len(text) + occurrences * len(new), what)


def _bounded_list(items: Any, what: str) -> list:
    """list(items) for an iterator (a generator from map, batch, select...), refused as soon as the
    items' text passes the limit: list() would build all of them first."""
    collected, size, limit = [], 16, _size_limit()
    for item in items:
        size += _ITEM_CHARS + _text_size(item, limit)[0]
        if size > limit:
            raise _LimitExceeded(f"{what}: its input would be more than {limit:,} characters")
        collected.append(item)
    return collected


def _is_iterator(value: Any) -> bool:
    """An iterable with no size (a generator, map, an iterator), whose items only exist once pulled."""
    sized = (str, bytes, bytearray, list, tuple, set, frozenset, Mapping, KeysView, ValuesView, ItemsView, range)
    return not isinstance(value, sized) and hasattr(value, "__iter__")


def _as_list(value: Any, what: str) -> Any:
    """What str.join or the join filter would iterate, in a form that can be measured first: an
    iterator's items (pulled within the limit), a dict's keys; strings and sequences unchanged."""
    if isinstance(value, (str, bytes, bytearray, list, tuple)) or not hasattr(value, "__iter__"):
        return value
    return _bounded_list(value, what) if _is_iterator(value) else list(value)


def _check_join(items: Any, separator: Any, what: str) -> None:
    separator_size = len(separator) if isinstance(separator, (str, bytes, bytearray)) else 24
    if isinstance(items, (str, bytes, bytearray)):  # joins the characters
        _check_estimate(len(items) * (1 + separator_size), what)
    elif isinstance(items, (list, tuple)):
        _check_estimate(_text_size(items)[0] + len(items) * separator_size, what)


def _checked_repeat(left: Any, right: Any) -> Any:
    """`*`: estimate a repetition, or an integer product, before building it."""
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(count, int):
            _charge(_text_size(sequence)[0] * max(count, 0), "a repetition")
    if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_POWER_BITS:
        raise _LimitExceeded(f"an integer product of more than {MAX_POWER_BITS} bits")
    return left * right


def _checked_power(left: Any, right: Any) -> Any:
    """`**`: integer powers are exact and unbounded in Python, so bound the result's size up front."""
    integers = isinstance(left, int) and isinstance(right, int)
    if integers and right > 0 and abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
        raise _LimitExceeded(f"{left} ** {right} is too large")
    return left**right


def _checked_modulo(left: Any, right: Any) -> Any:
    if isinstance(left, (str, bytes, bytearray)):
        arguments = right.values() if isinstance(right, Mapping) else right if isinstance(right, tuple) else (right,)
        _check_format(left, arguments, "%", "% formatting")
    return left % right


def _checked_add(left: Any, right: Any) -> Any:
    sequences = (str, bytes, list, tuple)
    if isinstance(left, sequences) and isinstance(right, sequences):
        _charge(_text_size(left)[0] + _text_size(right)[0], "a concatenation")
    return left + right


# Filters that never turn their input into text (so a large input needs no measuring first), and those
# whose own estimate below covers it.
_NON_STRINGIFYING_FILTERS = frozenset(
    "abs attr batch count d default dictsort first float groupby int items last length list map max min "
    "random reject rejectattr reverse round select selectattr slice sort sum unique".split()
    + "join replace format indent wordwrap tojson pprint urlize".split()
)


# Filters that pull every item of an iterator into a list (or a sum) in C: their input is pulled here
# first, item by item within the limit.
_ITERATOR_CONSUMING_FILTERS = frozenset("list sort unique reverse sum min max groupby dictsort join".split())

# Jinja tests that call str() on their value.
_STRINGIFYING_TESTS = frozenset({"lower", "upper"})


def _check_filter_inputs(name: str, value: Any, options: tuple, kwargs: dict) -> None:
    """Estimates for the filters whose output can be much larger than their inputs; a container that
    a filter stringifies is measured before it is."""

    def option(index: int, key: str, default=None):
        return options[index] if len(options) > index else kwargs.get(key, default)

    if name not in _NON_STRINGIFYING_FILTERS and not isinstance(value, (str, int, float)):
        _check_value(value, f"filter '{name}'")
    if name == "join":
        _check_join(value, option(0, "d", ""), "filter 'join'")
    elif name == "replace":
        _check_replace(value, option(0, "old"), option(1, "new"), "filter 'replace'")
    elif name == "format":
        _check_format(value, (*options, *kwargs.values()), "%", "filter 'format'")
    elif name == "indent" and isinstance(value, str):
        width = option(0, "width", 4)
        pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        _check_estimate(len(value) + (value.count("\n") + 1) * pad, "filter 'indent'")
    elif name == "wordwrap" and isinstance(value, str):
        width, wrapstring = option(0, "width", 79), option(3, "wrapstring", "\n")
        lines = len(value) // max(width if isinstance(width, int) else 1, 1) + 1
        _check_estimate(len(value) + lines * len(wrapstring or "\n"), "filter 'wordwrap'")
    elif name == "urlize" and isinstance(value, str):
        # Every word may become <a href="word" rel=".." target="..">word</a>.
        extras = sum(len(v) for v in (*options, *kwargs.values()) if isinstance(v, str))
        _check_estimate(3 * len(value) + (len(value) // 2 + 1) * (64 + extras), "filter 'urlize'")
    elif name == "slice":
        count = option(0, "slices", 1)
        _check_estimate(_text_size(value)[0] + (count if isinstance(count, int) else 0) * _ITEM_CHARS, "filter 'slice'")
    elif name in ("tojson", "pprint"):
        size, depth = _text_size(value)
        indent = option(1, "indent") if name == "tojson" else 1
        step = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        _check_estimate(size * (1 + depth * step), f"filter '{name}'")


def _check_str_method(method: Any, args: tuple) -> None:
    """Estimates for str and bytes methods whose output can be much larger than their inputs."""
    text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(text, (str, bytes, bytearray)):
        return
    if name == "replace" and len(args) >= 2:
        _check_replace(text, args[0], args[1], f"{type(text).__name__}.replace")
    elif name == "join" and args:
        _check_join(args[0], text, f"{type(text).__name__}.join")
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        _check_estimate(len(text) + text.count(b"\t" if isinstance(text, (bytes, bytearray)) else "\t") * size, "expandtabs")
    elif name == "translate" and args and isinstance(args[0], Mapping):
        widest = max((_text_size(v)[0] for v in args[0].values()), default=1)
        _check_estimate(len(text) * max(widest, 1), "str.translate")


class _SandboxCodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiles `a ~ b` through the environment's size-checked join (jinja2 otherwise inlines a plain
    str join that no sandbox hook sees), and slices and list, tuple and dict literals through a size
    check (else `{% set ns.x = [ns.x, ns.x] %}` in a loop builds a value whose text doubles each time
    for free, and `{% set a1 = s[1:] %}{% set a2 = s[2:] %}...` keeps copies uncounted)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame) -> None:
        self.write("environment.checked_concat((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")

    def _visit_literal(self, visit, node, frame) -> None:
        if getattr(node, "ctx", "load") != "load":  # an assignment target: `{% for a, b in ... %}`
            visit(self, node, frame)
            return
        self.write("environment.checked_literal(")
        visit(self, node, frame)
        self.write(")")

    def visit_Getitem(self, node: jinja2.nodes.Getitem, frame) -> None:
        # jinja2 writes `value[a:b]` inline (not through environment.getitem): a slice is a new value.
        if not isinstance(node.arg, jinja2.nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.checked_slice(")
        super().visit_Getitem(node, frame)
        self.write(")")

    def visit_List(self, node, frame) -> None:
        self._visit_literal(jinja2.compiler.CodeGenerator.visit_List, node, frame)

    def visit_Tuple(self, node, frame) -> None:
        self._visit_literal(jinja2.compiler.CodeGenerator.visit_Tuple, node, frame)

    def visit_Dict(self, node, frame) -> None:
        self._visit_literal(jinja2.compiler.CodeGenerator.visit_Dict, node, frame)


class _GenerationBlock(Extension):
    """HF's `{% generation %}...{% endgeneration %}` marks assistant text for training masks; for
    rendering it is transparent."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Sandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _SandboxCodeGenerator
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    _binops: ClassVar[dict[str, Callable[[Any, Any], Any]]] = {
        "*": _checked_repeat,
        "**": _checked_power,
        "%": _checked_modulo,
        "+": _checked_add,
    }

    def call_binop(self, context, operator, left, right):
        return self._binops[operator](left, right)

    def checked_concat(self, parts) -> str:
        parts = tuple(parts)
        _charge(sum(_text_size(p)[0] for p in parts), "a ~ concatenation")
        return "".join(map(str, parts))

    def checked_literal(self, value):
        return _charge_value(value, "a literal")

    def concat(self, pieces) -> str:
        """The output of a block set, macro, call or filter block, joined (jinja2's generated code calls
        environment.concat): its pieces passed no output check, so they are measured here."""
        pieces = pieces if isinstance(pieces, list) else list(pieces)
        _charge(sum(map(len, pieces)), "a block's output")
        return "".join(pieces)

    def checked_slice(self, value):
        return _charge_value(value, "a slice")

    def wrap_str_format(self, value):
        # jinja2 swaps `some_string.format` for its sandboxed formatter; estimate each call first.
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked_format(*args, **kwargs):
            _check_format(fmt, (*args, *kwargs.values()), "{", "str.format")
            return wrapped(*args, **kwargs)

        return checked_format

    def call(self, context, obj, /, *args, **kwargs):
        for value in (*args, *kwargs.values()):
            _check_number_argument(value, "a call")
        if getattr(obj, "__name__", "") == "join" and args:
            args = (_as_list(args[0], "join"), *args[1:])  # a generator's items counted first
        elif obj in (dict, jinja2.utils.Namespace) and args and _is_iterator(args[0]):
            args = (_bounded_list(args[0], "dict()"), *args[1:])  # pairs from a generator, counted
        _check_str_method(obj, args)
        return _charge_value(super().call(context, obj, *args, **kwargs), "a call's result")


def _size_checked_filter(name: str, function: Callable) -> Callable:
    """Wrap a filter so that its numeric options, its input, its estimated output and its result stay
    within the limit. Keeps jinja2's pass_context/pass_eval_ctx/pass_environment marker, which lives on
    the function."""

    # Positional arguments: [context/eval_ctx/environment when marked,] the filtered value, then options.
    value_index = 1 if hasattr(function, "jinja_pass_arg") else 0

    def checked(*args, **kwargs):
        value, options = (args[value_index], args[value_index + 1 :]) if len(args) > value_index else (None, ())
        if name == "join" or (name in _ITERATOR_CONSUMING_FILTERS and _is_iterator(value)):
            value = _as_list(value, f"filter '{name}'")  # a generator (e.g. from map) counted before use
            args = (*args[:value_index], value, *options)
        for number in (*options, *kwargs.values()):
            _check_number_argument(number, f"filter '{name}'")
        _check_filter_inputs(name, value, options, kwargs)
        return _charge_value(function(*args, **kwargs), f"filter '{name}'")

    checked.__name__ = getattr(function, "__name__", name)
    checked.__doc__ = function.__doc__
    if hasattr(function, "jinja_pass_arg"):
        checked.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return checked


def _text_checked_test(name: str, function: Callable) -> Callable:
    """Wrap a jinja test that calls str() on its value (`is lower`): the value is measured first."""

    def checked(value, *args, **kwargs):
        if not isinstance(value, str):
            _check_value(value, f"test '{name}'")
        return function(value, *args, **kwargs)

    checked.__name__ = getattr(function, "__name__", name)
    return checked


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before str(): charged (also inside a block set or macro, whose
    output is not the render's), and containers must not print to more than the limit."""
    _charge(len(value) if isinstance(value, str) else _text_size(value)[0], "an output value")
    return value


def _bounded_text(value: Any) -> str:
    """str(value) for the helpers below, measured first."""
    return value if isinstance(value, str) else str(_check_value(value, "an argument"))


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF transformers' tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message) -> None:
    raise _RaisedByTemplate(_bounded_text(message))


def _strftime_now(fmt) -> str:
    return datetime.now().strftime(_bounded_text(fmt))


def _make_environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationBlock],
        finalize=_finalize,
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _size_checked_filter(name, f) for name, f in env.filters.items()}
    env.tests.update({name: _text_checked_test(name, env.tests[name]) for name in _STRINGIFYING_TESTS})
    del env.globals["lipsum"]  # lorem ipsum of n paragraphs: no template needs it, a hostile one could
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENVIRONMENT = _make_environment()


# -- rendering under a time limit -------------------------------------------------------------------------


def _deadline_tracer(deadline: float):
    """A sys.settrace function that aborts the traced code once the clock passes `deadline`. It sees
    every executed line of the compiled template, so even loops that call nothing are stopped."""
    events = 0

    def trace(frame, event, arg):
        nonlocal events
        events += 1
        if events % _TRACE_CHECK_EVERY == 0 and time.monotonic() > deadline:
            raise _LimitExceeded(f"rendering took longer than {RENDER_SECONDS:g} s")
        return trace

    return trace


def _render_bounded(template: jinja2.Template, variables: dict, limit: int) -> str:
    pieces: list[str] = []
    total = 0
    budget_token = _BUDGET.set(_Budget(limit=limit, build_limit=BUILD_FACTOR * limit))
    previous_tracer = sys.gettrace()
    # The generator is held in a local and closed below, after the tracer is gone: a `for` loop would
    # drop it while the exception unwinds, closing it (and running its cleanup) under a tracer whose
    # deadline has passed, which raises again into "Exception ignored in: <generator ...>" on stderr.
    generator = template.generate(variables)
    sys.settrace(_deadline_tracer(time.monotonic() + RENDER_SECONDS))
    try:
        while (piece := next(generator, None)) is not None:
            total += len(piece)
            if total > limit:
                raise _LimitExceeded(f"the output exceeds {limit:,} characters")
            pieces.append(piece)
    finally:
        sys.settrace(previous_tracer)
        _close_quietly(generator)
        _BUDGET.reset(budget_token)
    return "".join(pieces)


def _close_quietly(generator) -> None:
    """Close a render's generator; what its cleanup raises (the render has failed already, or finished)
    is not worth a second report."""
    try:
        generator.close()
    except BaseException:  # noqa: BLE001, S110 - see the docstring
        pass


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_ERROR_CHARS else text[: _MAX_ERROR_CHARS - 1] + "…"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _RaisedByTemplate):
        return f"the template raised an error: {_one_line(exc)}"
    if isinstance(exc, _LimitExceeded):
        return f"the template exceeded a limit: {_one_line(exc)}"
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"syntax error on line {exc.lineno}: {_one_line(exc.message or exc)}"
    if isinstance(exc, jinja2.exceptions.SecurityError):
        return f"the template tried something the sandbox forbids: {_one_line(exc)}"
    if isinstance(exc, jinja2.UndefinedError):
        return f"the template used an undefined value: {_one_line(exc)}"
    if isinstance(exc, RecursionError):
        return "the template recursed too deeply"
    if isinstance(exc, MemoryError):
        return "the template ran out of memory"
    return f"rendering failed: {type(exc).__name__}: {_one_line(exc)}"


def compile_template(source: Any, name: str) -> jinja2.Template:
    """`source` compiled in the sandbox; a TemplateError naming the template `name` if it is not a
    string, too long, or does not compile."""
    if not isinstance(source, str):
        raise TemplateError(f"chat template '{name}': expected a string, got {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise TemplateError(f"chat template '{name}': {len(source):,} characters is more than the {MAX_SOURCE_CHARS:,} allowed")
    try:
        return _ENVIRONMENT.from_string(source)
    except (Exception, _LimitExceeded) as exc:  # noqa: BLE001 - syntax errors, and anything a hostile source makes the compiler raise
        raise TemplateError(f"chat template '{name}': {_describe(exc)}") from None


# -- the module's interface ------------------------------------------------------------------------------


def text_size(value: Any) -> int:
    """How many characters `value`'s text takes (a string's length; for containers their items plus
    punctuation): what a caller adds to MAX_OUTPUT_CHARS as room for its own data."""
    return _text_size(value, limit=1 << 62)[0]


def render(template: jinja2.Template, name: str, variables: dict, room: int = 0) -> str:
    """The template rendered with `variables`, within the limits above, its output allowed
    MAX_OUTPUT_CHARS + room characters; any failure is a TemplateError naming the template `name`."""
    try:
        return _render_bounded(template, variables, MAX_OUTPUT_CHARS + room)
    except (Exception, _LimitExceeded) as exc:  # noqa: BLE001 - any failure inside a template is the template's
        message = f"chat template '{name}': {_describe(exc)}"
    # Raised outside the except block, so the error holds no traceback into the template's frames.
    raise TemplateError(message)
