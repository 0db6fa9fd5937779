"""GBNF, llama.cpp's grammar format, parsed into rules over Unicode code points.

The format (llama.cpp's grammars/README.md):

    root   ::= "{" ws pair ("," ws pair)* "}"      # a rule; `root` is where output starts
    pair   ::= [a-z]+ ws ":" ws ("true" | "false")
    ws     ::= [ \\t\\n]{0,4}

- `"..."` literal text, `[...]` a character class (`[^...]` its complement), `.` any character;
  escapes `\\n \\r \\t \\\\ \\" \\[ \\] \\xHH \\uHHHH \\UHHHHHHHH`.
- `( ... )` a group, `|` alternatives, postfix `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (`{,n}`) repetition.
- `#` comments to the end of the line. A rule ends at the end of its line unless inside parentheses or
  after a `|`.

The result is a `Grammar`: rules numbered from 0, each a list of alternatives, each a tuple of elements,
`CharSet` (one code point from a set) or `Ref` (another rule). Groups and repetitions become rules of
their own, as in llama.cpp (x* -> R ::= x R | ; x{0,3} -> nested optionals, so that every string has one
parse). Token references (`<[id]>`, `<name>`) are not supported and refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..sampling_config import SamplingError

MAX_CODE_POINT = 0x10FFFF
# Repetition bound: x{m,n} makes n rules; a larger n is almost surely a mistake and would be slow.
MAX_REPEAT = 10_000


class GrammarError(SamplingError):
    """A grammar or JSON schema that cannot be used: the message says where and why."""


@dataclass(frozen=True)
class CharSet:
    """One code point in `ranges` (inclusive (low, high) pairs), or outside them when `negated`."""

    ranges: tuple
    negated: bool = False


@dataclass(frozen=True)
class Ref:
    rule: int


@dataclass
class Grammar:
    names: list = field(default_factory=list)  # rule id -> name (generated rules: parent_N)
    rules: list = field(default_factory=list)  # rule id -> [alternative: tuple of CharSet | Ref]
    root: int = 0

    def rule_id(self, name: str) -> int:
        return self.names.index(name)


_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_")
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "/": "/", "-": "-", "^": "^"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


@lru_cache(maxsize=64)
def parse_gbnf(text: str) -> Grammar:
    """The Grammar of a GBNF text (cached: the same text gives the same, unchanged object)."""
    if not isinstance(text, str):
        raise GrammarError(f"a grammar must be text (got {type(text).__name__})")
    return _Parser(text).parse()


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.grammar = Grammar()
        self.defined: set = set()
        self.referenced: dict = {}  # name -> position of a first use, for the error message

    # -- errors and positions ---------------------------------------------------------------------------
    def fail(self, message: str, pos: int | None = None):
        pos = self.pos if pos is None else pos
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        raise GrammarError(f"grammar, line {line} column {column}: {message}")

    def peek(self, offset: int = 0) -> str:
        i = self.pos + offset
        return self.text[i] if i < len(self.text) else ""

    def skip_space(self, newlines: bool) -> None:
        text, n = self.text, len(self.text)
        while self.pos < n:
            c = text[self.pos]
            if c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            elif c == "#":
                while self.pos < n and text[self.pos] not in "\r\n":
                    self.pos += 1
            else:
                return

    # -- rules --------------------------------------------------------------------------------------------
    def rule(self, name: str) -> int:
        """The id of rule `name`, made (empty, to be defined later) on first mention."""
        names = self.grammar.names
        if name in self._ids:
            return self._ids[name]
        self._ids[name] = len(names)
        names.append(name)
        self.grammar.rules.append(None)
        return self._ids[name]

    def new_rule(self, parent: str, alternatives: list) -> Ref:
        self._generated[parent] = self._generated.get(parent, 0) + 1
        rid = self.rule(f"{parent}_{self._generated[parent]}")
        self.grammar.rules[rid] = alternatives
        self.defined.add(rid)
        return Ref(rid)

    def parse(self) -> Grammar:
        self._ids: dict = {}
        self._generated: dict = {}
        self.skip_space(newlines=True)
        if self.pos >= len(self.text):
            self.fail("the grammar is empty")
        while self.pos < len(self.text):
            self.parse_rule()
            self.skip_space(newlines=True)
        for name, pos in self.referenced.items():
            if self._ids[name] not in self.defined:
                self.fail(f"rule {name!r} is used but never defined", pos)
        if "root" not in self._ids or self._ids["root"] not in self.defined:
            raise GrammarError("grammar: no `root` rule (the rule output starts from)")
        self.grammar.root = self._ids["root"]
        return self.grammar

    def parse_name(self) -> str:
        start = self.pos
        while self.peek() and self.peek() in _WORD:
            self.pos += 1
        if self.pos == start:
            self.fail(f"expected a rule name, found {self.peek()!r}" if self.peek() else "expected a rule name")
        return self.text[start : self.pos]

    def parse_rule(self) -> None:
        start = self.pos
        name = self.parse_name()
        self.skip_space(newlines=False)
        if not self.text.startswith("::=", self.pos):
            self.fail(f"expected '::=' after rule name {name!r}")
        self.pos += 3
        self.skip_space(newlines=True)
        rid = self.rule(name)
        if rid in self.defined:
            self.fail(f"rule {name!r} is defined twice", start)
        self.defined.add(rid)
        self.grammar.rules[rid] = self.parse_alternatives(name, nested=False)
        self.skip_space(newlines=False)
        if self.pos < len(self.text) and self.peek() not in "\r\n":
            self.fail(f"expected the end of the line after rule {name!r}, found {self.peek()!r}")

    def parse_alternatives(self, name: str, nested: bool) -> list:
        alternatives = [self.parse_sequence(name, nested)]
        while self.peek() == "|":
            self.pos += 1
            self.skip_space(newlines=True)
            alternatives.append(self.parse_sequence(name, nested))
        return alternatives

    def parse_sequence(self, name: str, nested: bool) -> tuple:
        items: list = []  # each item: a tuple of elements that a repetition operator applies to as a whole
        while True:
            c = self.peek()
            if c == '"':
                self.pos += 1
                items.append(self.parse_literal())
            elif c == "[":
                self.pos += 1
                items.append((self.parse_class(),))
            elif c == ".":
                self.pos += 1
                items.append((CharSet((), negated=True),))
            elif c and c in _WORD:
                at = self.pos
                ref = self.parse_name()
                self.referenced.setdefault(ref, at)
                items.append((Ref(self.rule(ref)),))
            elif c == "(":
                self.pos += 1
                self.skip_space(newlines=True)
                alternatives = self.parse_alternatives(name, nested=True)
                if self.peek() != ")":
                    self.fail("expected ')'")
                self.pos += 1
                items.append((self.new_rule(name, alternatives),))
            elif c == "<":
                self.fail("token references (<...>) are not supported")
            elif c in ("*", "+", "?", "{"):
                if not items:
                    self.fail(f"{c!r} has nothing before it to repeat")
                low, high = self.parse_repetition()
                items[-1] = self.repeat(name, items[-1], low, high)
            else:
                break
            self.skip_space(newlines=nested)
        return tuple(element for item in items for element in item)

    # -- repetition -----------------------------------------------------------------------------------------
    def parse_repetition(self) -> tuple:
        c = self.peek()
        self.pos += 1
        if c == "*":
            return 0, None
        if c == "+":
            return 1, None
        if c == "?":
            return 0, 1
        self.skip_space(newlines=False)
        low = self.parse_int(optional=True)
        self.skip_space(newlines=False)
        high = low
        if self.peek() == ",":
            self.pos += 1
            self.skip_space(newlines=False)
            high = self.parse_int(optional=True)
            self.skip_space(newlines=False)
        if self.peek() != "}":
            self.fail("expected '}' to close a repetition")
        self.pos += 1
        low = 0 if low is None else low
        if high is not None and high < low:
            self.fail(f"repetition {{{low},{high}}}: the maximum is below the minimum")
        if max(low, high or 0) > MAX_REPEAT:
            self.fail(f"repetition counts above {MAX_REPEAT} are not supported")
        return low, high

    def parse_int(self, optional: bool):
        start = self.pos
        while self.peek().isdigit():
            self.pos += 1
        if self.pos == start:
            if optional:
                return None
            self.fail("expected a number")
        return int(self.text[start : self.pos])

    def repeat(self, name: str, item: tuple, low: int, high) -> tuple:
        """`item` repeated low..high times (high None: no limit), as elements (new rules for the tail)."""
        out = item * low
        if high is None:
            star = self.new_rule(name, [])  # R ::= item R |
            self.grammar.rules[star.rule] = [item + (star,), ()]
            return out + (star,)
        tail: tuple = ()
        for _ in range(high - low):  # (item (item (item)?)?)?: nested, so each string has one parse
            tail = (self.new_rule(name, [item + tail, ()]),)
        return out + tail

    # -- characters -------------------------------------------------------------------------------------------
    def parse_char(self, closing: str) -> int:
        """One (possibly escaped) character of a literal or class; its code point."""
        c = self.peek()
        if not c:
            self.fail("unterminated literal" if closing == '"' else "unterminated character class")
        if c != "\\":
            self.pos += 1
            return ord(c)
        escape = self.peek(1)
        if escape in _SIMPLE_ESCAPES:
            self.pos += 2
            return ord(_SIMPLE_ESCAPES[escape])
        if escape in _HEX_ESCAPES:
            digits = self.text[self.pos + 2 : self.pos + 2 + _HEX_ESCAPES[escape]]
            if len(digits) != _HEX_ESCAPES[escape] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"\\{escape} needs {_HEX_ESCAPES[escape]} hexadecimal digits")
            value = int(digits, 16)
            if value > MAX_CODE_POINT:
                self.fail(f"\\{escape}{digits} is beyond the last code point U+10FFFF")
            self.pos += 2 + len(digits)
            return value
        self.fail(f"unknown escape \\{escape}" if escape else "unterminated escape")

    def parse_literal(self) -> tuple:
        chars = []
        while self.peek() != '"':
            if self.peek() in ("", "\n", "\r"):
                self.fail("unterminated literal (a literal ends on its line)")
            chars.append(self.parse_char('"'))
        self.pos += 1
        return tuple(CharSet(((c, c),)) for c in chars)

    def parse_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges = []
        while self.peek() != "]":
            if not self.peek():
                self.fail("unterminated character class")
            low = self.parse_char("]")
            high = low
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                high = self.parse_char("]")
                if high < low:
                    self.fail(f"character range {chr(low)!r}-{chr(high)!r} runs backwards")
            ranges.append((low, high))
        self.pos += 1
        return CharSet(tuple(ranges), negated)
