"""JSON Schema -> GBNF (localllm/grammar/json_schema.py). The oracle is the `jsonschema` package: what the
grammar accepts must validate, and 100 random schemas (made here) each constrain the real Gemma 3 270M to
output that parses and validates."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

import localllm
from localllm.grammar import GrammarError, grammar_text
from localllm.grammar.automaton import Automaton
from localllm.grammar.gbnf import parse_gbnf
from localllm.grammar.integers import integer_range
from localllm.grammar.json_schema import json_schema_to_gbnf


def accepts(schema, text: str) -> bool:
    return Automaton(parse_gbnf(json_schema_to_gbnf(schema))).accepts(text.encode("utf-8"))


@pytest.mark.parametrize("low,high", [(-13, 250), (0, 9), (5, 5), (None, 10), (17, None), (-100, -7), (0, 1000),
                                      (123, 45678), (-999, 999), (None, None)])
def test_integer_ranges_accept_exactly_their_integers(low, high):
    fsm = Automaton(parse_gbnf("root ::= " + integer_range(low, high)))
    for n in range(-1200, 50000):
        inside = (low is None or n >= low) and (high is None or n <= high)
        assert fsm.accepts(str(n).encode()) == inside, n
    for text in ("-0", "007", "1.0", "+5", ""):
        assert not fsm.accepts(text.encode()), text


def test_integer_bounds_from_every_keyword():
    schema = {"type": "integer", "exclusiveMinimum": 2, "maximum": 7.5}
    assert [n for n in range(-5, 15) if accepts(schema, str(n))] == [3, 4, 5, 6, 7]
    draft4 = {"type": "integer", "minimum": 2, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": True}
    assert [n for n in range(-5, 15) if accepts(draft4, str(n))] == [3, 4]


SCHEMA = {
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                        "required": ["x", "y"]}},
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "kind": {"enum": ["a", "b", 3, None]},
        "at": {"$ref": "#/$defs/point"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
        "when": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
        "either": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "boolean"}]},
        "fixed": {"const": {"v": [1, 2]}},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "null"}]},
    },
    "required": ["name", "kind"],
}


@pytest.mark.parametrize("text,valid", [
    ('{"name": "bob", "kind": "a"}', True),
    ('{"name":"bob","kind":3,"at":{"x":1.5,"y":-2e3}}', True),
    ('{"name": "bob", "kind": null, "tags": ["x", "yz"], "when": "2024-02-29"}', True),
    ('{"name": "b", "kind": "b", "id": "123e4567-e89b-12d3-a456-426614174000", "either": true}', True),
    ('{"name": "b", "kind": "b", "either": 12, "fixed": {"v": [1, 2]}, "pair": [5, null]}', True),
    ('{"name": "bob"}', False),  # kind is required
    ('{"kind": "a", "name": "bob"}', False),  # properties come in their order
    ('{"name": "", "kind": "a"}', False),  # minLength
    ('{"name": "abcdefghi", "kind": "a"}', False),  # maxLength
    ('{"name": "b", "kind": "c"}', False),  # not in the enum
    ('{"name": "b", "kind": "a", "tags": []}', False),  # minItems
    ('{"name": "b", "kind": "a", "tags": ["a", "b", "c"]}', False),  # maxItems
    ('{"name": "b", "kind": "a", "either": -1}', False),
    ('{"name": "b", "kind": "a", "at": {"x": 1}}', False),
    ('{"name": "b", "kind": "a", "extra": 1}', False),  # no additional properties unless the schema says so
    ('{"name": "b", "kind": "a", "when": "2024-13-01"}', False),
])
def test_the_grammar_accepts_valid_instances_in_order_and_refuses_invalid_ones(text, valid):
    assert accepts(SCHEMA, text) == valid
    if valid:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_additional_properties_and_recursive_refs():
    tree = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                               "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                               "required": ["v"]}},
            "$ref": "#/$defs/node"}
    assert accepts(tree, '{"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]}')
    extra = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert accepts(extra, '{"a": 1, "b": "x", "c": "y"}') and not accepts(extra, '{"a": 1, "b": 2}')
    assert accepts({"type": "object"}, '{"any": [1, {"x": null}]}')


@pytest.mark.parametrize("schema,message", [
    ({"type": "string", "pattern": "^a+$"}, "pattern"),
    ({"type": "number", "minimum": 0.5}, "integers only"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer"),
    ({"$ref": "https://example.com/schema.json"}, r"local \$ref"),
    ({"$ref": "#/$defs/missing"}, "points at nothing"),
    ({"type": "blob"}, "unknown type"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "not in properties"),
    (False, "allows no value"),
    ("{not json", "not valid JSON"),
])
def test_unsupported_or_impossible_schemas_are_refused(schema, message):
    with pytest.raises(GrammarError, match=message):
        grammar_text(json_schema=schema)


# -- the real model under 100 random schemas ------------------------------------------------------------------

WORDS = ["name", "age", "city", "tags", "score", "active", "id", "kind", "items", "note", "size", "color"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "null", "enum", "const", "format", "anyOf"]
    if depth < 2:
        kinds += ["object", "object", "array", "array"]
    kind = rng.choice(kinds)
    if kind == "string":
        schema = {"type": "string", "maxLength": rng.randint(1, 12)}
        if rng.random() < 0.4:
            schema["minLength"] = rng.randint(0, schema["maxLength"])
        return schema
    if kind == "integer":
        schema = {"type": "integer"}
        if rng.random() < 0.7:
            low = rng.randint(-500, 500)
            schema.update(minimum=low, maximum=low + rng.randint(0, 2000))
        elif rng.random() < 0.5:
            schema["exclusiveMinimum"] = rng.randint(-5, 5)
        return schema
    if kind == "number":
        return {"type": "number"}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        pool = ["red", "green", "blue", 1, 2.5, None, True, "a b", "é"]
        return {"enum": rng.sample(pool, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 42, [1, "x"], {"k": False}])}
    if kind == "format":
        return {"type": "string", "format": rng.choice(["date", "time", "date-time", "uuid"])}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(2, 3))]}
    if kind == "array":
        schema = {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
        if rng.random() < 0.5:
            schema["minItems"] = rng.randint(0, schema["maxItems"])
        return schema
    names = rng.sample(WORDS, rng.randint(1, 4))
    properties = {n: random_schema(rng, depth + 1) for n in names}
    return {"type": "object", "properties": properties, "required": [n for n in names if rng.random() < 0.6]}


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=1024, threads=2)


def test_100_random_schemas_each_give_valid_json_on_the_default_model(model):
    rng = random.Random(2024)
    lengths = []
    for i in range(100):
        schema = random_schema(rng)
        if i % 3 == 0 and schema.get("type") != "object":  # objects at the top, as apps mostly ask
            schema = {"type": "object", "properties": {"result": schema}, "required": ["result"]}
        prompt = f"Here is a JSON value for the schema {json.dumps(schema)}:\n"
        events = list(model.generate(prompt, max_tokens=400, temperature=0.8, seed=i, json_schema=schema,
                                     session=model.new_session()))
        text = "".join(e.text for e in events if e.kind == "token")
        assert events[-1].finish_reason == "stop", (i, schema, text)
        value = json.loads(text)
        jsonschema.validate(value, schema)
        lengths.append(len(events) - 1)
    assert sum(lengths) > 300  # (not all trivial: the values have some size)
