"""The sandbox a chat template renders in (localllm/chat/templates.py renders through it).

A template in a downloaded file is untrusted input. The sandbox already refuses private attributes,
unsafe callables, mutation of the data, and `range()` over more than 100,000 items; on top of that the
renderer bounds what a hostile template can cost, so that any template fails within about 1 s of CPU
and a few tens of MB:
- every value built on the way, and the output, at MAX_OUTPUT_CHARS characters plus the room the caller
  gives (ChatTemplate: twice the length of the messages' and tools' text, so very long conversations still
  render; the estimates and the budget are localllm/chat/limits.py), measured *before* anything turns it into text: namespaces, dicts, dict views, lists and
  tuples count their items (their str() runs in C, past any check), operations that can multiply
  sizes (`*` repetition, `%` and `str.format` with widths from anywhere, join, replace, translate,
  indent, wordwrap, expandtabs, urlize, slice, tojson's and pprint's indentation) are estimated from
  their inputs; numeric arguments of filters and calls may not exceed the limit either; `lipsum` is
  removed;
- all values built during the render together (freed ones too: literals, slices, concatenations,
  block and macro output, printed values, filter and call results) at BUILD_FACTOR times
  MAX_OUTPUT_CHARS plus ROOM_BUILD_FACTOR times the room, so that no number of kept values (distinct
  names, recursion frames, copies of a long conversation) adds up to more;
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

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

import jinja2
import jinja2.compiler
import jinja2.nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ..errors import TemplateError
from .limits import (  # noqa: F401 - MAX_OUTPUT_CHARS, BUILD_FACTOR, MAX_POWER_BITS: part of this module's interface
    BUDGET,
    BUILD_FACTOR,
    ROOM_BUILD_FACTOR,
    ITERATOR_CONSUMING_FILTERS,
    MAX_OUTPUT_CHARS,
    MAX_POWER_BITS,
    STRINGIFYING_TESTS,
    Budget,
    LimitExceeded,
    as_list,
    bounded_list,
    charge,
    charge_value,
    check_filter_inputs,
    check_format,
    check_number_argument,
    check_str_method,
    check_value,
    checked_add,
    checked_modulo,
    checked_power,
    checked_repeat,
    estimate_text,
    is_iterator,
)

# Real templates are a few kB (the largest known are ~20 kB). Compiling grows faster than the source:
# jinja's parser and Python's compiler took 14 s on a 189 kB template and over 200 s on 989 kB, so the cap
# is what bounds the compile (tests/chat/test_templates.py times the worst shape known at the cap).
MAX_SOURCE_CHARS = 64 << 10
RENDER_SECONDS = 0.8  # wall time; normal renders take milliseconds; leaves room for compiling within 1 s
_MAX_ERROR_CHARS = 300
_TRACE_CHECK_EVERY = 256  # trace events between two clock reads


class _RaisedByTemplate(Exception):
    """raise_exception(message) called by the template itself."""


# -- the sandbox ---------------------------------------------------------------------------------------


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
        "*": checked_repeat,
        "**": checked_power,
        "%": checked_modulo,
        "+": checked_add,
    }

    def call_binop(self, context, operator, left, right):
        return self._binops[operator](left, right)

    def checked_concat(self, parts) -> str:
        parts = tuple(parts)
        charge(sum(estimate_text(p)[0] for p in parts), "a ~ concatenation")
        return "".join(map(str, parts))

    def checked_literal(self, value):
        return charge_value(value, "a literal")

    def concat(self, pieces) -> str:
        """The output of a block set, macro, call or filter block, joined (jinja2's generated code calls
        environment.concat): its pieces passed no output check, so they are measured here."""
        pieces = pieces if isinstance(pieces, list) else list(pieces)
        charge(sum(map(len, pieces)), "a block's output")
        return "".join(pieces)

    def checked_slice(self, value):
        return charge_value(value, "a slice")

    def wrap_str_format(self, value):
        # jinja2 swaps `some_string.format` for its sandboxed formatter; estimate each call first.
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt = value.__self__

        def checked_format(*args, **kwargs):
            check_format(fmt, (*args, *kwargs.values()), "{", "str.format")
            return wrapped(*args, **kwargs)

        return checked_format

    def call(self, context, obj, /, *args, **kwargs):
        for value in (*args, *kwargs.values()):
            check_number_argument(value, "a call")
        if getattr(obj, "__name__", "") == "join" and args:
            args = (as_list(args[0], "join"), *args[1:])  # a generator's items counted first
        elif obj in (dict, jinja2.utils.Namespace) and args and is_iterator(args[0]):
            args = (bounded_list(args[0], "dict()"), *args[1:])  # pairs from a generator, counted
        check_str_method(obj, args)
        return charge_value(super().call(context, obj, *args, **kwargs), "a call's result")


def _size_checked_filter(name: str, function: Callable) -> Callable:
    """Wrap a filter so that its numeric options, its input, its estimated output and its result stay
    within the limit. Keeps jinja2's pass_context/pass_eval_ctx/pass_environment marker, which lives on
    the function."""

    # Positional arguments: [context/eval_ctx/environment when marked,] the filtered value, then options.
    value_index = 1 if hasattr(function, "jinja_pass_arg") else 0

    def checked(*args, **kwargs):
        value, options = (args[value_index], args[value_index + 1 :]) if len(args) > value_index else (None, ())
        if name == "join" or (name in ITERATOR_CONSUMING_FILTERS and is_iterator(value)):
            value = as_list(value, f"filter '{name}'")  # a generator (e.g. from map) counted before use
            args = (*args[:value_index], value, *options)
        for number in (*options, *kwargs.values()):
            check_number_argument(number, f"filter '{name}'")
        check_filter_inputs(name, value, options, kwargs)
        return charge_value(function(*args, **kwargs), f"filter '{name}'")

    checked.__name__ = getattr(function, "__name__", name)
    checked.__doc__ = function.__doc__
    if hasattr(function, "jinja_pass_arg"):
        checked.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return checked


def _text_checked_test(name: str, function: Callable) -> Callable:
    """Wrap a jinja test that calls str() on its value (`is lower`): the value is measured first."""

    def checked(value, *args, **kwargs):
        if not isinstance(value, str):
            check_value(value, f"test '{name}'")
        return function(value, *args, **kwargs)

    checked.__name__ = getattr(function, "__name__", name)
    return checked


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before str(): charged (also inside a block set or macro, whose
    output is not the render's), and containers must not print to more than the limit."""
    charge(len(value) if isinstance(value, str) else estimate_text(value)[0], "an output value")
    return value


def _bounded_text(value: Any) -> str:
    """str(value) for the helpers below, measured first."""
    return value if isinstance(value, str) else str(check_value(value, "an argument"))


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
    env.tests.update({name: _text_checked_test(name, env.tests[name]) for name in STRINGIFYING_TESTS})
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
            raise LimitExceeded(f"rendering took longer than {RENDER_SECONDS:g} s")
        return trace

    return trace


def _render_bounded(template: jinja2.Template, variables: dict, room: int) -> str:
    """The output, each value and the output at most MAX_OUTPUT_CHARS + room characters; all values built
    together BUILD_FACTOR * MAX_OUTPUT_CHARS + ROOM_BUILD_FACTOR * room (a template that keeps many copies of
    a long conversation is refused at a few times its size, not sixteen)."""
    limit = MAX_OUTPUT_CHARS + room
    pieces: list[str] = []
    total = 0
    budget_token = BUDGET.set(Budget(limit=limit, build_limit=BUILD_FACTOR * MAX_OUTPUT_CHARS + ROOM_BUILD_FACTOR * room))
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
                raise LimitExceeded(f"the output exceeds {limit:,} characters")
            pieces.append(piece)
    finally:
        sys.settrace(previous_tracer)
        _close_quietly(generator)
        BUDGET.reset(budget_token)
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
    if isinstance(exc, LimitExceeded):
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
    except (Exception, LimitExceeded) as exc:  # noqa: BLE001 - syntax errors, and anything a hostile source makes the compiler raise
        raise TemplateError(f"chat template '{name}': {_describe(exc)}") from None


# -- the module's interface ------------------------------------------------------------------------------


def text_size(value: Any) -> int:
    """How many characters `value`'s text takes (a string's length; for containers their items, at their
    own lengths, plus punctuation): what a caller adds to MAX_OUTPUT_CHARS as room for its own data."""
    return estimate_text(value, limit=1 << 62, quoted_strings=False)[0]


def render(template: jinja2.Template, name: str, variables: dict, room: int = 0) -> str:
    """The template rendered with `variables`, within the limits above, its output allowed
    MAX_OUTPUT_CHARS + room characters; any failure is a TemplateError naming the template `name`."""
    try:
        return _render_bounded(template, variables, room)
    except (Exception, LimitExceeded) as exc:  # noqa: BLE001 - any failure inside a template is the template's
        message = f"chat template '{name}': {_describe(exc)}"
    # Raised outside the except block, so the error holds no traceback into the template's frames.
    raise TemplateError(message)
