"""The sandbox a chat template renders in (localllm/chat/templates.py renders through it).

A template in a downloaded file is untrusted input. The sandbox already refuses private attributes,
unsafe callables, mutation of the data, and `range()` over more than 100,000 items; on top of that the
renderer bounds what a hostile template can cost:
- the output, and every value built on the way, at MAX_OUTPUT_CHARS characters plus the room the caller
  gives (ChatTemplate: twice the size of the messages and tools, so very long conversations still
  render): operations that can multiply sizes (`*` repetition, `%` and `str.format`, join, replace,
  indent, wordwrap, expandtabs, tojson's indentation) are estimated from their inputs *before* they run, the rest (`~`, `+`, filter
  and call results, every printed value) checked on their results; numeric arguments of filters and
  calls may not exceed the limit either; `lipsum` is removed;
- `**` to small results;
- wall time at RENDER_SECONDS: a sys.settrace hook, installed for the render only (any previous
  tracer is restored after), checks the clock on executed template lines, so even loops that call
  nothing stop;
- recursion by Python's own limit (a RecursionError becomes a TemplateError).
Every failure (syntax, sandbox violation, undefined value, raise_exception, any exception inside
rendering, a limit) is a `localllm.errors.TemplateError` with a one-line message.
"""

from __future__ import annotations

import contextvars
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
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
RENDER_SECONDS = 1.0  # normal renders take milliseconds
MAX_POWER_BITS = 4096  # `a ** b` may produce at most this many bits
_MAX_ERROR_CHARS = 300
# The size limit of the render in progress (a context variable: renders in other threads have their own).
_OUTPUT_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("chat_template_size_limit", default=MAX_OUTPUT_CHARS)
_TRACE_CHECK_EVERY = 256  # trace events between two clock reads

# A width or precision in a %-format or {}-format spec that is long enough to be a runaway (7+ digits).
_HUGE_FORMAT_WIDTH = re.compile(r"\d{7,}")


class _LimitExceeded(BaseException):
    """A hostile or runaway template hit one of the renderer's limits.

    A BaseException, so that no `except Exception` on the way (in jinja2 or in a template helper) can
    swallow it: Python also switches the deadline tracer off once it has raised."""


class _RaisedByTemplate(Exception):
    """raise_exception(message) called by the template itself."""


# -- the sandbox ---------------------------------------------------------------------------------------
#
# Size limits work on estimates made *before* an operation: once Python has built a 10 GB string it is
# too late to refuse it. `_text_size` estimates how long a value's text is (a string's length; for
# containers their items plus punctuation); the operations that can multiply sizes (repetition, string
# formatting, join, replace, indent, wordwrap, expandtabs, tojson's indentation) are estimated from
# their inputs; everything else is checked on its result.


def _size_limit() -> int:
    """The character limit of the render in progress (MAX_OUTPUT_CHARS while compiling)."""
    return _OUTPUT_LIMIT.get()


def _text_size(value: Any, limit: int | None = None) -> tuple[int, int]:
    """(estimated length of str(value), nesting depth), counting only until the length passes `limit`.
    Iterative, and each container adds its item count before its items are visited, so the work is
    bounded by `limit` whatever the value."""
    limit = _size_limit() if limit is None else limit
    total, deepest = 0, 0
    stack = [(value, 0)]
    while stack and total <= limit:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, str):
            total += len(item) + (2 if depth else 0)  # quotes, inside a container's repr
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend((x, depth + 1) for x in item)
        elif isinstance(item, Mapping):
            total += 2 + 4 * len(item)
            stack.extend((x, depth + 1) for pair in item.items() for x in pair)
        else:
            total += 24  # numbers, None, booleans, undefined values, jinja2 helper objects
    return total, deepest


def _check_estimate(size: int, what: str) -> None:
    if size > _size_limit():
        raise _LimitExceeded(f"{what} would be about {size:,} characters long (the limit is {_size_limit():,})")


def _check_value(value: Any, what: str) -> Any:
    _check_estimate(_text_size(value)[0], what)
    return value


def _check_number_argument(value: Any, what: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > _size_limit():
        raise _LimitExceeded(f"{what} got the number {value:.6g}, larger than the limit {_size_limit():,}")


def _largest_text(values) -> int:
    return max((_text_size(v)[0] for v in values), default=0)


def _check_format(fmt: Any, arguments, marker: str, what: str) -> None:
    """`fmt % arguments` / `fmt.format(...)`: each marker may insert any argument (names and indices can
    repeat one), and a width of 7+ digits pads by itself."""
    if not isinstance(fmt, str):
        return
    if _HUGE_FORMAT_WIDTH.search(fmt):
        raise _LimitExceeded(f"{what}: a format width of 7 or more digits")
    _check_estimate(len(fmt) + fmt.count(marker) * _largest_text(arguments), what)


def _check_replace(text: Any, old: Any, new: Any, what: str) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        occurrences = len(text) + 1 if old == "" else text.count(old)
        _check_estimate(len(text) + occurrences * len(new), what)


def _is_unsized_iterable(value: Any) -> bool:
    return not isinstance(value, (str, list, tuple, Mapping)) and hasattr(value, "__iter__")


def _check_join(items: list, separator: Any, what: str) -> None:
    separator_size = len(separator) if isinstance(separator, str) else 24
    _check_estimate(_text_size(items)[0] + len(items) * separator_size, what)


def _checked_repeat(left: Any, right: Any) -> Any:
    """`*`: estimate a repetition before building it."""
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, (str, list, tuple)) and isinstance(count, int):
            _check_estimate(_text_size(sequence)[0] * max(count, 0), "a repetition")
    return left * right


def _checked_power(left: Any, right: Any) -> Any:
    """`**`: integer powers are exact and unbounded in Python, so bound the result's size up front."""
    integers = isinstance(left, int) and isinstance(right, int)
    if integers and right > 0 and abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
        raise _LimitExceeded(f"{left} ** {right} is too large")
    return left**right


def _checked_modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):
        arguments = right.values() if isinstance(right, Mapping) else right if isinstance(right, tuple) else (right,)
        _check_format(left, arguments, "%", "% formatting")
    return left % right


def _checked_add(left: Any, right: Any) -> Any:
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        _check_estimate(_text_size(left)[0] + _text_size(right)[0], "a concatenation")
    return left + right


def _check_filter_inputs(name: str, value: Any, options: tuple, kwargs: dict) -> None:
    """Estimates for the filters whose output can be much larger than their inputs."""
    def option(index: int, key: str, default=None):
        return options[index] if len(options) > index else kwargs.get(key, default)

    if name == "join" and isinstance(value, (list, tuple)):
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
    elif name == "tojson":
        size, depth = _text_size(value)
        indent = option(1, "indent")
        step = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        _check_estimate(size * (1 + depth * step), "filter 'tojson'")


def _check_str_method(method: Any, args: tuple) -> None:
    """Estimates for str methods whose output can be much larger than their inputs."""
    text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(text, str):
        return
    if name == "replace" and len(args) >= 2:
        _check_replace(text, args[0], args[1], "str.replace")
    elif name == "join" and args and isinstance(args[0], (list, tuple)):
        _check_join(args[0], text, "str.join")
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        _check_estimate(len(text) + text.count("\t") * size, "str.expandtabs")


class _SandboxCodeGenerator(jinja2.compiler.CodeGenerator):
    """Compiles `a ~ b` through the environment's size-checked join (jinja2 otherwise inlines a plain
    str join that no sandbox hook sees)."""

    def visit_Concat(self, node: jinja2.nodes.Concat, frame) -> None:
        self.write("environment.checked_concat((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")


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
        _check_estimate(sum(_text_size(p)[0] for p in parts), "a ~ concatenation")
        return "".join(map(str, parts))

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
        if getattr(obj, "__name__", "") == "join" and args and _is_unsized_iterable(args[0]):
            args = (list(args[0]), *args[1:])  # count a generator's items before str.join sees them
        _check_str_method(obj, args)
        return _check_value(super().call(context, obj, *args, **kwargs), "a call's result")


def _size_checked_filter(name: str, function: Callable) -> Callable:
    """Wrap a filter so that its numeric options, its estimated output and its result stay within the
    limit. Keeps jinja2's pass_context/pass_eval_ctx/pass_environment marker, which lives on the function."""

    # Positional arguments: [context/eval_ctx/environment when marked,] the filtered value, then options.
    value_index = 1 if hasattr(function, "jinja_pass_arg") else 0

    def checked(*args, **kwargs):
        value, options = (args[value_index], args[value_index + 1 :]) if len(args) > value_index else (None, ())
        if name == "join" and _is_unsized_iterable(value):
            value = list(value)  # a generator (e.g. from map) must be counted before it is joined
            args = (*args[:value_index], value, *options)
        for number in (*options, *kwargs.values()):
            _check_number_argument(number, f"filter '{name}'")
        _check_filter_inputs(name, value, options, kwargs)
        return _check_value(function(*args, **kwargs), f"filter '{name}'")

    checked.__name__ = getattr(function, "__name__", name)
    checked.__doc__ = function.__doc__
    if hasattr(function, "jinja_pass_arg"):
        checked.jinja_pass_arg = function.jinja_pass_arg  # type: ignore[attr-defined]
    return checked


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before str(): containers must not print to more than the limit."""
    if not isinstance(value, str):
        _check_value(value, "an output value")
    return value


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """HF transformers' tojson: plain json.dumps (jinja2's own escapes <, >, & and ' for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message) -> None:
    raise _RaisedByTemplate(str(message))


def _strftime_now(fmt) -> str:
    return datetime.now().strftime(str(fmt))


def _make_environment() -> _Sandbox:
    env = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _GenerationBlock],
        finalize=_finalize,
    )
    env.filters["tojson"] = _tojson
    env.filters = {name: _size_checked_filter(name, f) for name, f in env.filters.items()}
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
    limit_token = _OUTPUT_LIMIT.set(limit)
    previous_tracer = sys.gettrace()
    sys.settrace(_deadline_tracer(time.monotonic() + RENDER_SECONDS))
    try:
        for piece in template.generate(variables):
            total += len(piece)
            if total > limit:
                raise _LimitExceeded(f"the output exceeds {limit:,} characters")
            pieces.append(piece)
    finally:
        sys.settrace(previous_tracer)
        _OUTPUT_LIMIT.reset(limit_token)
    return "".join(pieces)


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
        raise TemplateError(f"chat template '{name}': {_describe(exc)}") from None
