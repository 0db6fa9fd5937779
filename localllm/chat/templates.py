"""Chat templates: a conversation (list of {"role", "content"} messages) -> the prompt text a model expects.

A GGUF file usually carries its model's template as `tokenizer.chat_template`, the Jinja text of the HF
tokenizer_config.json's `chat_template`. It is rendered the way HF transformers renders it, so the
prompt is the one the model was trained on:
- jinja2 `ImmutableSandboxedEnvironment` with `trim_blocks=True, lstrip_blocks=True` and the
  loop-controls extension (`{% break %}`, `{% continue %}`); `{% generation %}` blocks (HF's assistant
  mask markers) render their body;
- globals `raise_exception(message)` and `strftime_now(format)`; the `tojson` filter is HF's
  (`json.dumps` with ensure_ascii=False, optional indent / separators / sort_keys);
- variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and `tools` (None unless
  given), plus any extra keyword variables the caller passes (e.g. `enable_thinking`).

Files without a template get a built-in one (localllm/chat/builtin.py), chosen from the architecture
and from hints in the vocabulary (`<start_of_turn>`, `<|im_start|>`, `<|start_header_id|>`, `[INST]`...).

A template in a downloaded file is untrusted input. The sandbox already refuses private attributes,
unsafe callables, mutation of the data, and `range()` over more than 100,000 items; on top of that the
renderer bounds what a hostile template can cost:
- the output, and every value built on the way, at MAX_OUTPUT_CHARS characters plus twice the size of
  the messages and tools (so very long conversations still render): operations that can
  multiply sizes (`*` repetition, `%` and `str.format`, join, replace, indent, wordwrap, expandtabs,
  tojson's indentation) are estimated from their inputs *before* they run, the rest (`~`, `+`, filter
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
from .builtin import BUILTINS, BuiltinTemplate

MAX_OUTPUT_CHARS = 1 << 20  # beyond the conversation's own text; a template adds a few kB at most
MAX_SOURCE_CHARS = 1 << 20  # real templates are a few kB (the largest known are ~20 kB)
RENDER_SECONDS = 1.0  # normal renders take milliseconds
MAX_POWER_BITS = 4096  # `a ** b` may produce at most this many bits
_MAX_ERROR_CHARS = 300
# The size limit of the render in progress (a context variable: renders in other threads have their own).
_OUTPUT_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("chat_template_size_limit", default=MAX_OUTPUT_CHARS)
_TRACE_CHECK_EVERY = 256  # trace events between two clock reads

# A role is a plain word: it is pasted between special tokens, so it must not smuggle any in.
_ROLE_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}")
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


def _compile(source: Any, name: str) -> jinja2.Template:
    if not isinstance(source, str):
        raise TemplateError(f"chat template '{name}': expected a string, got {type(source).__name__}")
    if len(source) > MAX_SOURCE_CHARS:
        raise TemplateError(f"chat template '{name}': {len(source):,} characters is more than the {MAX_SOURCE_CHARS:,} allowed")
    try:
        return _ENVIRONMENT.from_string(source)
    except (Exception, _LimitExceeded) as exc:  # noqa: BLE001 - syntax errors, and anything a hostile source makes the compiler raise
        raise TemplateError(f"chat template '{name}': {_describe(exc)}") from None


# -- messages -----------------------------------------------------------------------------------------------


def _validated_messages(messages: Any) -> list[dict]:
    """Copies of the messages after checking each is {"role": word, "content": str, ...}."""
    if not isinstance(messages, (list, tuple)):
        raise TemplateError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise TemplateError("messages is empty: a conversation needs at least one message")
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TemplateError(f"message {index}: expected a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not _ROLE_PATTERN.fullmatch(role):
            raise TemplateError(f"message {index}: 'role' must be a word such as 'system', 'user' or 'assistant', got {role!r:.60}")
        if not isinstance(content, str):
            raise TemplateError(f"message {index}: 'content' must be a string, got {type(content).__name__}")
        checked.append(dict(message))
    return checked


# -- choosing a built-in -------------------------------------------------------------------------------------

_HINT_TOKENS = ("<start_of_turn>", "<|im_start|>", "<|start_header_id|>", "[INST]", "<|user|>", "<|end|>")


def _vocabulary_hints(meta: Mapping[str, Any]) -> set[str]:
    """Which of the telltale special tokens the file's vocabulary has (one pass over it)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if tokens is None or isinstance(tokens, (str, bytes)):
        return set()
    try:
        return set(_HINT_TOKENS).intersection(tokens)
    except TypeError:  # unhashable elements: not a token list
        return set()


def choose_builtin(meta: Mapping[str, Any]) -> str:
    """The built-in template for a file without its own: by architecture, then vocabulary hints.

    gemma/gemma2/gemma3 -> gemma; qwen2/qwen3 -> chatml; phi3 -> phi3; llama -> llama3 when the vocabulary
    has <|start_header_id|>, chatml when it has <|im_start|>, mistral when it has [INST], zephyr for a
    model named so, else llama2. Unknown architectures go by the same token hints; chatml is the last resort
    (as in llama.cpp)."""
    arch = str(meta.get("general.architecture") or "").lower()
    model_name = str(meta.get("general.name") or "").lower()
    pre = str(meta.get("tokenizer.ggml.pre") or "").lower()
    hints = _vocabulary_hints(meta)
    if arch.startswith("gemma"):
        return "gemma"
    if arch.startswith("qwen"):
        return "chatml"
    if arch.startswith("phi3"):
        return "phi3"
    if "<start_of_turn>" in hints:
        return "gemma"
    if "<|start_header_id|>" in hints or pre in ("llama-bpe", "llama3"):
        return "llama3"
    if "<|im_start|>" in hints or pre.startswith("qwen"):
        return "chatml"
    if {"<|user|>", "<|end|>"} <= hints:
        return "phi3"
    if "[INST]" in hints or arch == "mistral":
        return "mistral"
    if "zephyr" in model_name:
        return "zephyr"
    if arch == "llama":
        return "llama2"
    return "chatml"


def _token_text(meta: Mapping[str, Any], which: str) -> str:
    """The text of the file's BOS or EOS token ('' when the metadata does not say)."""
    token_id = meta.get(f"tokenizer.ggml.{which}_token_id")
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(token_id, int) and not isinstance(token_id, bool) and tokens is not None:
        try:
            text = tokens[token_id] if 0 <= token_id < len(tokens) else None
        except (TypeError, IndexError):
            text = None
        if isinstance(text, str):
            return text
    return ""


# -- the template --------------------------------------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template. `name` is "gguf" for the file's own template, else the built-in's name;
    `source` is the Jinja text."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = ""):
        self.name = name
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _compile(source, name)

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """The file's `tokenizer.chat_template` when it has one, else a built-in (see choose_builtin).

        Empty `bos_token` / `eos_token` mean "not given": they are then read from the file's vocabulary
        (tokenizer.ggml.bos_token_id / eos_token_id), and for a built-in fall back to its family's usual
        token text."""
        bos_token = bos_token or _token_text(meta, "bos")
        eos_token = eos_token or _token_text(meta, "eos")
        source = meta.get("tokenizer.chat_template")
        if source is not None:
            return cls(source, "gguf", bos_token, eos_token)
        return cls.builtin(choose_builtin(meta), bos_token, eos_token)

    @classmethod
    def builtin(cls, name: str, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
        """A built-in template by name: one of BUILTINS (gemma, chatml, llama3, llama2, mistral, phi3, zephyr)."""
        spec: BuiltinTemplate | None = BUILTINS.get(name)
        if spec is None:
            raise TemplateError(f"no built-in chat template '{name}' (known: {', '.join(sorted(BUILTINS))})")
        return cls(spec.source, spec.name, bos_token or spec.default_bos, eos_token or spec.default_eos)

    def apply(self, messages: list[dict], add_generation_prompt: bool = True, *, tools: list | None = None, **variables) -> str:
        """Render the conversation. Extra keyword `variables` are passed to the template as they are."""
        context = {
            **variables,
            "messages": _validated_messages(messages),
            "add_generation_prompt": bool(add_generation_prompt),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "tools": tools,
        }
        # Room for the conversation itself (a template may repeat it, e.g. once per turn in a summary),
        # on top of the fixed allowance for what the template adds.
        limit = MAX_OUTPUT_CHARS + 2 * (_text_size(context["messages"], limit=1 << 62)[0] + _text_size(tools, limit=1 << 62)[0])
        try:
            return _render_bounded(self._template, context, limit)
        except (Exception, _LimitExceeded) as exc:  # noqa: BLE001 - any failure inside a template is the template's
            raise TemplateError(f"chat template '{self.name}': {_describe(exc)}") from None

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r}, {len(self.source)} chars)"
