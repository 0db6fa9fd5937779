"""GBNF parsing and the byte-level automaton (localllm/grammar/gbnf.py, utf8.py, automaton.py).

Oracles: Python's own UTF-8 encoder for the byte patterns; Python's `re` for which strings a grammar
accepts (each grammar below is regular and written beside the regular expression it must equal); the
`json` module's output for llama.cpp's json.gbnf; llama.cpp's example grammars for the parser."""

from __future__ import annotations

import json
import random
import re

import pytest

from localllm.grammar import GrammarError, parse_gbnf
from localllm.grammar.automaton import DEAD, Automaton
from localllm.grammar.utf8 import byte_sequences, normalized


def automaton(text: str) -> Automaton:
    return Automaton(parse_gbnf(text))


def matches_pattern(data: bytes, pattern) -> bool:
    return len(data) == len(pattern) and all(lo <= b <= hi for b, (lo, hi) in zip(data, pattern))


# -- UTF-8 patterns -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("low,high", [(0, 0x7F), (0x41, 0x5A), (0x7F, 0x80), (0x80, 0x7FF), (0x7FF, 0x800),
                                      (0x3A9, 0x20AC), (0xFFF, 0x1000), (0xE000, 0x10000), (0x1F600, 0x1F64F),
                                      (0xFFFF, 0x10FFFF), (0x10000, 0x10FFFF)])
def test_byte_patterns_match_exactly_the_encodings_of_the_range(low, high):
    patterns = byte_sequences(low, high)
    rng = random.Random(low ^ high)
    inside = {low, high, *(rng.randint(low, high) for _ in range(300))}
    outside = {c for c in (low - 1, high + 1, *(rng.randint(0, 0x10FFFF) for _ in range(300)))
               if 0 <= c <= 0x10FFFF and not low <= c <= high}
    for code_point in inside | outside:
        if 0xD800 <= code_point <= 0xDFFF:
            continue
        data = chr(code_point).encode("utf-8")
        hits = sum(matches_pattern(data, p) for p in patterns)
        assert hits == (1 if code_point in inside else 0), hex(code_point)


def test_negated_sets_are_the_complement_without_surrogates():
    ranges = normalized([(0x22, 0x22), (0x5C, 0x5C), (0x00, 0x1F)], negated=True)
    assert ranges[0] == (0x20, 0x21) and ranges[-1] == (0xE000, 0x10FFFF)
    assert (0xD800, 0xDFFF) not in ranges and all(not (lo <= 0xD900 <= hi) for lo, hi in ranges)


# -- grammars against regular expressions ---------------------------------------------------------------------

# (GBNF, the regular expression it equals)
REGULAR = [
    ('root ::= "ab"* "c"?', r"(ab)*c?"),
    ('root ::= [a-c]{2,4} ("x" | "yz")+', r"[a-c]{2,4}(x|yz)+"),
    ('root ::= [^a]{0,3} "a"', r"[^a]{0,3}a"),
    ('root ::= item ("," item)*\nitem ::= [0-9]+ | "-" [0-9]+', r"(-?[0-9]+)(,-?[0-9]+)*"),
    ('root ::= . "b" .?', r".b.?"),
    ('root ::= ("é" | [€-€] | "😀"){1,} [^é€]', r"(é|€|😀)+[^é€]"),
    ('root ::= x{3}\nx ::= "a" | "bc" # three of them', r"(a|bc){3}"),
    ('root ::= (\n  "a"\n  | "b" "c"?\n)? "d"{,2}', r"(a|bc?)?d{0,2}"),
    ('root ::= [\\x41-\\x43\\u00e9] "\\n" [\\]\\[]', "[A-C\u00e9]\n[\\]\\[]"),
]
OTHERS = ["q", "0", ",", "é", "😀", "\n", "]"]


@pytest.mark.parametrize("grammar,regex", REGULAR)
def test_a_regular_grammar_accepts_what_its_regex_matches(grammar, regex):
    fsm = automaton(grammar)
    expression = re.compile(regex, re.DOTALL)
    rng = random.Random(grammar)
    # pieces: the grammar's own characters and literals, and others
    literals = [t for t in re.findall(r'"([^"\\]+)"', grammar)]
    pieces = sorted(set(regex) - set("()[]{}*+?|\\.^") | set(OTHERS) | set(literals))
    texts = {"".join(rng.choice(pieces) for _ in range(rng.randint(0, 7))) for _ in range(3000)}
    for text in texts:
        assert fsm.accepts(text.encode("utf-8")) == (expression.fullmatch(text) is not None), (grammar, text)
    for _ in range(300):  # and what the automaton writes byte by byte is a sentence of the regex
        text = random_sentence(fsm, rng).decode("utf-8")
        assert expression.fullmatch(text), (grammar, text)


def random_sentence(fsm: Automaton, rng: random.Random) -> bytes:
    """Bytes drawn one at a time among those the automaton takes, until a complete sentence stops."""
    state, out = fsm.start, bytearray()
    while True:
        if fsm.accepting[state] and (fsm.only_end[state] or rng.random() < 0.3 or len(out) > 40):
            return bytes(out)
        live = [b for b in range(256) if fsm.step(state, b) != DEAD]
        byte = rng.choice(live)
        out.append(byte)
        state = fsm.step(state, byte)


def test_every_prefix_of_a_sentence_stays_live_and_a_wrong_byte_is_dead():
    fsm = automaton('root ::= "{" [a-z]+ ":" ("é" | "x"){2} "}"')
    sentence = "{key:éx}".encode("utf-8")
    state = fsm.start
    for byte in sentence:
        state = fsm.step(state, byte)
        assert state != DEAD
    assert fsm.accepting[state] and fsm.only_end[state]
    assert fsm.step(fsm.start, ord("k")) == DEAD
    # "é" is two bytes: its first alone is live, a wrong continuation byte is not
    mid = fsm.start
    for byte in "{k:".encode() + b"\xc3":
        mid = fsm.step(mid, byte)
    assert mid != DEAD and fsm.step(mid, 0xA8) == DEAD and fsm.step(mid, 0xA9) != DEAD


def test_long_repetition_keeps_a_constant_number_of_states():
    """`x*` is a tail call: reading it many times adds no stack depth, so the states repeat (and the
    masks of grammar/constraint.py can be cached)."""
    fsm = automaton('root ::= "[" [a-z]* "]"')
    state = fsm.start
    for byte in b"[" + b"abcxyz" * 100:
        state = fsm.step(state, byte)
    assert len(fsm.states) <= 4 and fsm.step(state, ord("]")) != DEAD


# -- llama.cpp's grammars ---------------------------------------------------------------------------------------


def test_llama_cpp_example_grammars_parse(llama_cpp_grammars_dir):
    files = sorted(llama_cpp_grammars_dir.glob("*.gbnf"))
    assert len(files) >= 8
    for path in files:
        fsm = automaton(path.read_text(encoding="utf-8"))
        assert fsm.states[fsm.start] and not fsm.only_end[fsm.start], path.name


def random_json(rng: random.Random, depth: int = 0):
    kind = rng.choice(["int", "float", "str", "bool", "null"] + (["list", "dict"] * 2 if depth < 3 else []))
    if kind == "int":
        return rng.randint(-10**6, 10**6)
    if kind == "float":
        return round(rng.uniform(-1000, 1000), rng.randint(0, 6))
    if kind == "str":
        return "".join(rng.choice('ab é"\\\n\t€😀/') for _ in range(rng.randint(0, 6)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{rng.randint(0, 99)}": random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_llama_cpp_json_grammar_accepts_json_objects_and_refuses_broken_ones(llama_cpp_grammars_dir):
    fsm = automaton((llama_cpp_grammars_dir / "json.gbnf").read_text(encoding="utf-8"))
    rng = random.Random(7)
    for _ in range(300):
        value = {f"k{i}": random_json(rng) for i in range(rng.randint(0, 4))}
        for text in (json.dumps(value), json.dumps(value, ensure_ascii=False), json.dumps(value, indent=2)):
            assert fsm.accepts(text.encode("utf-8")), text
    for broken in ('{"a": 1,}', '{"a" 1}', "{'a': 1}", '{"a": tru}', '{"a": "\x01"}', '{"a": 01x}', '{"a": 1'):
        with pytest.raises(json.JSONDecodeError):
            json.loads(broken)
        assert not fsm.accepts(broken.encode("utf-8")), broken
    assert not fsm.accepts(b"[1, 2]")  # JSON, but its root rule is an object


# -- refused grammars ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,message", [
    ("", "empty"),
    ('item ::= "a"', "no `root`"),
    ("root ::= item", "never defined"),
    ('root ::= "a" | root "b"', "left-recursive"),
    ('root ::= x "a"\nx ::= "" | root', "left-recursive"),
    ('root ::= ("a"?)*', "left-recursive"),
    ('root ::= "abc', "unterminated literal"),
    ("root ::= [a-", "unterminated character class"),
    ('root ::= "a" "\\q"', "unknown escape"),
    ("root ::= [z-a]", "backwards"),
    ('root ::= "a"{3,2}', "below the minimum"),
    ('root ::= <[1000]>', "token references"),
    ('root ::= "a"\nroot ::= "b"', "defined twice"),
    ('root ::= "a" )', "end of the line"),
    ('root := "a"', "'::='"),
])
def test_bad_grammars_are_refused_with_the_reason(text, message):
    with pytest.raises(GrammarError) as caught:
        automaton(text)
    assert message in str(caught.value)


def test_errors_name_the_line_and_column():
    with pytest.raises(GrammarError, match=r"line 2 column 11"):
        parse_gbnf('root ::= a\na ::= "x" @ "y"')
