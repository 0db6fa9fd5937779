"""JSON Schema -> GBNF: a grammar whose every complete output is JSON that validates against the schema.

What is supported (as llama.cpp's converter, common/json-schema-to-grammar.cpp, supports it):
- type: object, array, string, number, integer, boolean, null, and lists of them; no type: any JSON value;
- object: properties (in order), required, additionalProperties (absent or false: only the declared
  properties, as llama.cpp; true or a schema: extra string keys after them); an object type with no
  properties is any object;
- array: items, prefixItems (and the old list form of items), minItems, maxItems;
- string: minLength, maxLength, format date, time, date-time and uuid (other formats: any string);
- integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (digit by digit, so every number in the
  range and none outside it can be written);
- enum, const, anyOf, oneOf (as anyOf), allOf (objects merged), local $ref (#/$defs/..., #/definitions/...,
  recursion included).

Keywords that constrain in ways the grammar cannot (pattern, not, multipleOf, uniqueItems, bounds on
non-integer numbers, ...) are refused with a GrammarError naming them, never ignored: output that does
not validate would be a silent failure. Annotations (title, description, default, examples, ...) are
ignored.

Whitespace between tokens is limited as llama.cpp limits it (a space, or one or two newlines and up to
20 spaces or tabs of indentation), so a model cannot loop on blank lines. Integers have at most 16
digits, fractions and exponents likewise, unless bounds say otherwise.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .gbnf import GrammarError
from .integers import MAX_DIGITS, integer_bounds, integer_range

SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'

PRIMITIVES = {
    "space": SPACE,
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "integral-part": "[0] | [1-9] [0-9]{0,%d}" % (MAX_DIGITS - 1),
    "decimal-part": "[0-9]{1,%d}" % MAX_DIGITS,
    "number": '"-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)? space',
    "integer": '"-"? integral-part space',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\"" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
    "array": '"[" space ( value ("," space value)* )? "]" space',
    "date": '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
    "time": '( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
            '( "Z" | [+-] ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    "date-string": '"\\"" date "\\"" space',
    "time-string": '"\\"" time "\\"" space',
    "date-time-string": '"\\"" date "T" time "\\"" space',
    "uuid": '"\\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\\"" space',
}
# the primitives each primitive uses
_USES = {
    "boolean": ["space"], "null": ["space"], "number": ["integral-part", "decimal-part", "space"],
    "integer": ["integral-part", "space"], "string": ["char", "space"],
    "value": ["object", "array", "string", "number", "boolean", "null"],
    "object": ["string", "value", "space"], "array": ["value", "space"],
    "date-string": ["date", "space"], "time-string": ["time", "space"],
    "date-time-string": ["date", "time", "space"], "uuid": ["space"],
}
# Gemma 4's tool-call arguments (chat/tools.py): JSON's shapes without its whitespace, strings between
# <|"|> marks (and holding no "<", which could begin one), keys bare and in sorted order, as its chat
# template writes them.
GEMMA4_QUOTE = '"<|\\"|>"'
GEMMA4_PRIMITIVES = {
    **{name: body.replace('"\\""', GEMMA4_QUOTE) for name, body in PRIMITIVES.items()},
    "space": '""',
    "char": "[^<]",
    "key": "[A-Za-z_] [A-Za-z0-9_]*",
    "object": '"{" ( key ":" value ("," key ":" value)* )? "}"',
}
_FORMATS = {"date": "date-string", "time": "time-string", "date-time": "date-time-string", "uuid": "uuid"}

# keywords that would constrain the output in ways a grammar here does not express
_REFUSED = ("pattern", "patternProperties", "not", "if", "then", "else", "multipleOf", "uniqueItems",
            "minProperties", "maxProperties", "contains", "minContains", "maxContains", "propertyNames",
            "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
            "unevaluatedItems", "$dynamicRef", "$recursiveRef")


class Dialect:
    """How values are written: JSON (the default), or Gemma 4's tool-call arguments."""

    def __init__(self, name: str):
        if name not in ("json", "gemma4"):
            raise ValueError(f"unknown dialect {name!r}")
        self.name = name
        self.primitives = PRIMITIVES if name == "json" else GEMMA4_PRIMITIVES
        self.quote = '"\\""' if name == "json" else GEMMA4_QUOTE
        self.sorted_keys = name == "gemma4"

    def literal(self, value: Any) -> str:
        return json_literal(value) if self.name == "json" else gbnf_literal(gemma4_text(value))

    def member(self, key: str, value_rule: str) -> str:
        """An object member: its key, the colon, its value."""
        if self.name == "json":
            return f'{json_literal(key)} space ":" space {value_rule}'
        return f'{gbnf_literal(key)} ":" {value_rule}'

    def any_member(self, value_rule: str) -> str:
        return f'string ":" space {value_rule}' if self.name == "json" else f'key ":" {value_rule}'


def gemma4_text(value: Any) -> str:
    """A value as Gemma 4's template writes tool-call arguments (its format_argument, keys bare)."""
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{gemma4_text(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(gemma4_text(v) for v in value) + "]"
    return "null" if value is None else json.dumps(value)


def json_schema_to_gbnf(schema: Any) -> str:
    """The GBNF text of a JSON schema (a dict, a bool, or its JSON text)."""
    builder = GrammarBuilder()
    return builder.text(builder.schema(schema, "root-value"))


def gbnf_literal(text: str) -> str:
    """A GBNF literal matching exactly `text`."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append("\\x%02X" % ord(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def json_literal(value: Any) -> str:
    """A GBNF literal of a JSON value as JSON writes it (compact)."""
    return gbnf_literal(json.dumps(value, ensure_ascii=False))


class GrammarBuilder:
    """Rules built from schemas, to be composed: `schema()` returns the name of a rule for a schema
    (trailing whitespace included), `rule()` adds one of the caller's, `text(root_body)` writes them all
    with `root ::= root_body`."""

    def __init__(self, dialect: str = "json"):
        self.dialect = Dialect(dialect)
        self.rules: dict = {}
        self._bodies: dict = {}  # body -> the name it was first written under
        self._refs: dict = {}  # "$ref" -> rule name
        self._documents: list = []  # root schemas, for resolving "#/..." refs

    # -- rules -----------------------------------------------------------------------------------------
    def rule(self, name: str, body: str) -> str:
        """Add `name ::= body` (a new name if taken by another body); returns the name used. A body
        already written under another name is that rule: equal schemas share their rules, so that their
        states (and the masks cached for them, grammar/constraint.py) are shared too."""
        same = self._bodies.get(body)
        if same is not None and self.rules.get(same) == body:
            return same
        name = re.sub(r"[^A-Za-z0-9-]+", "-", name).strip("-") or "rule"
        candidate, n = name, 1
        while candidate in self.rules and self.rules[candidate] != body:
            n += 1
            candidate = f"{name}{n}"
        self.rules[candidate] = body
        self._bodies[body] = candidate
        return candidate

    def primitive(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = self.dialect.primitives[name]
            for used in list(_USES.get(name, ())) + (["key"] if name == "object" and self.dialect.name == "gemma4" else []):
                self.primitive(used)
        return name

    def text(self, root_body: str) -> str:
        lines = [f"root ::= {root_body}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items() if name != "root"]
        return "\n".join(lines) + "\n"

    # -- schemas ------------------------------------------------------------------------------------------
    def schema(self, schema: Any, name: str) -> str:
        """The name of a rule matching JSON values valid under `schema` (then whitespace)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        self._documents.append(schema)
        try:
            return self._visit(schema, name)
        finally:
            self._documents.pop()

    def _visit(self, schema: Any, name: str) -> str:
        if schema is True or schema == {}:
            return self.primitive("value")
        if schema is False:
            raise GrammarError(f"JSON schema at {name!r}: the schema `false` allows no value")
        if not isinstance(schema, dict):
            raise GrammarError(f"JSON schema at {name!r}: a schema must be an object or a boolean (got {type(schema).__name__})")
        refused = [k for k in _REFUSED if k in schema]
        if refused:
            raise GrammarError(f"JSON schema at {name!r}: {', '.join(refused)} is not supported")
        if "$ref" in schema:
            return self._ref(schema, name)
        if "allOf" in schema:
            return self._visit(self._merged(schema), name)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                options = schema[key]
                if not isinstance(options, list) or not options:
                    raise GrammarError(f"JSON schema at {name!r}: {key} must be a non-empty list")
                siblings = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                names = [self._visit({**siblings, **_as_dict(o)} if siblings else o, f"{name}-{i}")
                         for i, o in enumerate(options)]
                return self.rule(name, " | ".join(names))
        if "const" in schema:
            self.primitive("space")
            return self.rule(name, f"{self.dialect.literal(schema['const'])} space")
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise GrammarError(f"JSON schema at {name!r}: enum must be a non-empty list")
            self.primitive("space")
            return self.rule(name, "(" + " | ".join(self.dialect.literal(v) for v in values) + ") space")
        kind = schema.get("type")
        if isinstance(kind, list):
            if not kind:
                raise GrammarError(f"JSON schema at {name!r}: type must not be an empty list")
            names = [self._visit({**schema, "type": k}, f"{name}-{k}") for k in kind]
            return self.rule(name, " | ".join(names))
        if kind is None:
            if "properties" in schema or "additionalProperties" in schema:
                kind = "object"
            elif "items" in schema or "prefixItems" in schema:
                kind = "array"
            else:
                return self.primitive("value")
        build = {"object": self._object, "array": self._array, "string": self._string,
                 "integer": self._integer, "number": self._number}.get(kind)
        if build is not None:
            return build(schema, name)
        if kind in ("boolean", "null"):
            return self.primitive(kind)
        raise GrammarError(f"JSON schema at {name!r}: unknown type {kind!r}")

    def _ref(self, schema: dict, name: str) -> str:
        ref = schema["$ref"]
        if ref in self._refs:
            return self._refs[ref]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"JSON schema at {name!r}: only local $ref (#/...) are supported (got {ref!r})")
        target = self._documents[-1] if self._documents else {}
        for part in [p for p in ref[1:].split("/") if p]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise GrammarError(f"JSON schema: $ref {ref!r} points at nothing")
        rule_name = self.rule("ref-" + ref.rsplit("/", 1)[-1], f"(pending {ref})")  # reserved: the target may recurse
        self._refs[ref] = rule_name
        body_rule = self._visit(target, rule_name + "-body")
        self.rules[rule_name] = body_rule
        return rule_name

    def _merged(self, schema: dict) -> dict:
        """allOf's schemas as one (objects: properties and required merged; other keys: the later wins)."""
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            part = _as_dict(part)
            while "$ref" in part:
                part = self._resolve(part["$ref"])
            if "allOf" in part:
                part = self._merged(part)
            for key, value in part.items():
                if key == "properties":
                    merged["properties"] = {**merged.get("properties", {}), **value}
                elif key == "required":
                    merged["required"] = list(dict.fromkeys(list(merged.get("required", [])) + list(value)))
                else:
                    merged[key] = value
        return merged

    def _resolve(self, ref: str) -> dict:
        target = self._documents[-1] if self._documents else {}
        for part in [p for p in ref[1:].split("/") if p]:
            if not isinstance(target, dict) or part not in target:
                raise GrammarError(f"JSON schema: $ref {ref!r} points at nothing")
            target = target[part]
        return _as_dict(target)

    # -- types ------------------------------------------------------------------------------------------
    def _object(self, schema: dict, name: str) -> str:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if properties is None and extra in (None, True, {}):
            return self.primitive("object")
        properties = properties or {}
        if not isinstance(properties, dict):
            raise GrammarError(f"JSON schema at {name!r}: properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list):
            raise GrammarError(f"JSON schema at {name!r}: required must be a list")
        missing = [r for r in required if r not in properties]
        if missing and extra in (None, False):
            raise GrammarError(f"JSON schema at {name!r}: required properties {missing} are not in properties")
        self.primitive("space")
        pairs = {}
        keys = sorted(properties) if self.dialect.sorted_keys else list(properties)
        for key in keys:
            value = self._visit(properties[key], f"{name}-{key}")
            pairs[key] = self.rule(f"{name}-{key}-kv", self.dialect.member(key, value))
        mandatory = [pairs[k] for k in keys if k in required]
        optional = [pairs[k] for k in keys if k not in required]
        if extra not in (None, False):
            value = self._visit(extra, f"{name}-additional-value")
            self.primitive("string" if self.dialect.name == "json" else "key")
            member = self.dialect.any_member(value)
            optional.append(self.rule(f"{name}-additional-kvs", f'{member} ("," space {member})*'))
        body = ' "," space '.join(mandatory)
        if optional:
            rest = self._optional_members(optional, name, leading_comma=bool(mandatory))
            body = f"{body} {rest}" if body else rest
        return self.rule(name, f'"{{" space {body} "}}" space' if body else '"{" space "}" space')

    def _optional_members(self, members: list, name: str, leading_comma: bool) -> str:
        """Any ordered subset of `members`, comma-separated (after a comma when something came before),
        each subset written one way only."""
        # tail_i: ("," member_i)? tail_{i+1}: the members after one that is present
        tails = [""] * (len(members) + 1)
        for i in range(len(members) - 1, -1, -1):
            body = f'("," space {members[i]})?' + (f" {tails[i + 1]}" if tails[i + 1] else "")
            tails[i] = self.rule(f"{name}-tail{i}", body)
        if leading_comma:
            return tails[0]
        firsts = [members[i] + (f" {tails[i + 1]}" if tails[i + 1] else "") for i in range(len(members))]
        return "(" + " | ".join(firsts) + ")?"

    def _array(self, schema: dict, name: str) -> str:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(items, list):  # the old tuple form of prefixItems
            prefix, items = items, None
        low = _count(schema, "minItems", name, 0)
        high = _count(schema, "maxItems", name, None)
        if high is not None and high < low:
            raise GrammarError(f"JSON schema at {name!r}: maxItems is below minItems")
        self.primitive("space")
        if prefix is not None:
            # exactly the prefix items: valid whatever further items the schema would allow
            if not isinstance(prefix, list) or not prefix:
                raise GrammarError(f"JSON schema at {name!r}: prefixItems must be a non-empty list")
            if low > len(prefix) or (high is not None and high < len(prefix)):
                raise GrammarError(f"JSON schema at {name!r}: prefixItems with minItems/maxItems beyond them is not supported")
            names = [self._visit(s, f"{name}-{i}") for i, s in enumerate(prefix)]
            return self.rule(name, '"[" space ' + ' "," space '.join(names) + ' "]" space')
        item = self._visit(items if items is not None else True, f"{name}-item")
        if low == 0:
            if high == 0:
                return self.rule(name, '"[" space "]" space')
            more = _repeat(f'"," space {item}', 0, None if high is None else high - 1)
            return self.rule(name, f'"[" space ( {item} {more} )? "]" space')
        more = _repeat(f'"," space {item}', low - 1, None if high is None else high - 1)
        return self.rule(name, f'"[" space {item} {more} "]" space')

    def _string(self, schema: dict, name: str) -> str:
        fmt = schema.get("format")
        if fmt in _FORMATS and "minLength" not in schema and "maxLength" not in schema:
            return self.primitive(_FORMATS[fmt])
        low = _count(schema, "minLength", name, 0)
        high = _count(schema, "maxLength", name, None)
        if low == 0 and high is None:
            return self.primitive("string")
        if high is not None and high < low:
            raise GrammarError(f"JSON schema at {name!r}: maxLength is below minLength")
        self.primitive("char")
        self.primitive("space")
        quote = self.dialect.quote
        return self.rule(name, f'{quote} {_repeat("char", low, high)} {quote} space')

    def _integer(self, schema: dict, name: str) -> str:
        low, high = integer_bounds(schema, name)
        if low is None and high is None:
            return self.primitive("integer")
        self.primitive("space")
        return self.rule(name, f"( {integer_range(low, high)} ) space")

    def _number(self, schema: dict, name: str) -> str:
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if key in schema:
                raise GrammarError(f"JSON schema at {name!r}: {key} is supported on integers only")
        return self.primitive("number")


def _as_dict(schema: Any) -> dict:
    if schema is True:
        return {}
    if not isinstance(schema, dict):
        raise GrammarError(f"JSON schema: expected a schema object, got {schema!r}")
    return schema


def _count(schema: dict, key: str, name: str, default):
    value = schema.get(key, default)
    if value is default:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GrammarError(f"JSON schema at {name!r}: {key} must be an integer >= 0 (got {value!r})")
    if value > 10_000:
        raise GrammarError(f"JSON schema at {name!r}: {key} above 10000 is not supported")
    return value


def _repeat(item: str, low: int, high) -> str:
    if high is None:
        return f"({item}){{{low},}}" if low else f"({item})*"
    if high == 0:
        return ""
    return f"({item}){{{low},{high}}}"
