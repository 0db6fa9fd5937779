"""Token masks (localllm/grammar/trie.py, constraint.py) on the real Gemma 3 vocabulary (262,144 tokens),
and grammar-constrained generation through the sampler.

The oracle for a mask is the definition, token by token: a token is allowed when its bytes, fed one at a
time to the automaton, never reach a dead state (an end-of-generation token: when the grammar is
complete). The trie walk must give exactly that set."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import localllm
from localllm.grammar import GrammarError
from localllm.grammar.automaton import DEAD
from localllm.grammar.constraint import Constraint, compile_grammar
from localllm.sampling import Sampler, SamplingConfig, SamplingError

JSON_GRAMMAR = r'''
root   ::= "{" ws members? "}" ws
members ::= pair ("," ws pair)*
pair   ::= string ":" ws value
value  ::= string | number | "true" ws | "false" ws | "null" ws | "[" ws (value ("," ws value)*)? "]" ws
string ::= "\"" ([^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\"" ws
number ::= "-"? [0-9]+ ("." [0-9]+)? ws
ws     ::= | " " | "\n" [ \t]{0,8}
'''


@pytest.fixture(scope="module")
def model(gemma_path):
    return localllm.load(gemma_path, n_ctx=512, threads=2)


def brute_force_mask(grammar, state: int) -> np.ndarray:
    automaton, trie = grammar.automaton, grammar.trie
    mask = np.zeros(grammar.n_vocab, dtype=bool)
    for token, piece in enumerate(trie.pieces):
        s = state
        for byte in piece:
            s = automaton.step(s, byte)
            if s == DEAD:
                break
        mask[token] = bool(piece) and s != DEAD
    if automaton.accepting[state]:
        mask[trie.eog_ids] = True
    return mask


@pytest.mark.parametrize("prefix", ['', '{"na', '{"name": "a\\u00', '{"x": [1.5, -', '{"k": "v"}\n  ', '{"é": "😀'])
def test_the_mask_is_every_token_whose_bytes_fit(model, prefix):
    grammar = compile_grammar(JSON_GRAMMAR, model.tokenizer, model.decoder.hp.n_vocab)
    state = grammar.automaton.start
    for byte in prefix.encode("utf-8"):
        state = grammar.automaton.step(state, byte)
    assert state != DEAD
    expected = brute_force_mask(grammar, state)
    assert np.array_equal(grammar.mask(state), expected)
    assert expected.sum() > 0
    eog = sorted(model.tokenizer.eog_ids)
    assert expected[eog].all() == grammar.automaton.accepting[state]


SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "city": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "city", "age"]}}


@pytest.mark.parametrize("prefix", ['[{"name": "Al', '[{"name": "Al", "city": "Pa', '[{"name": "a", "city": "b", "age": 1',
                                    '[{"name": "a", "city": "b", "age": 12}, {"name": "x\\', '[{"name": "é'])
def test_masks_built_from_shared_inner_states_are_exact(model, prefix):
    """In a schema's grammar the stacks inside a string share their bottom part: the mask comes from the
    inner state (shared by both string fields) plus what leaves it; it must still be exactly the
    token-by-token definition."""
    from localllm.grammar import grammar_text

    grammar = compile_grammar(grammar_text(json_schema=SCHEMA), model.tokenizer, model.decoder.hp.n_vocab)
    state = grammar.automaton.start
    for byte in prefix.encode("utf-8"):
        state = grammar.automaton.step(state, byte)
    assert state != DEAD and grammar.automaton.split(state) is not None
    assert np.array_equal(grammar.mask(state), brute_force_mask(grammar, state))


def test_control_tokens_are_never_allowed(model):
    grammar = compile_grammar('root ::= [^x]*', model.tokenizer, model.decoder.hp.n_vocab)
    mask = grammar.mask(grammar.automaton.start)
    tok = model.tokenizer
    control = [i for i in range(tok.vocab_size) if tok.token_to_piece(i, special=False) == b"" and i not in tok.eog_ids]
    assert control and not mask[control].any()
    assert mask[sorted(tok.eog_ids)].all()  # the empty text is a sentence: the end may come at once


def test_greedy_generation_follows_the_grammar(model):
    grammar = 'root ::= ("yes" | "no") ", because " [a-z ]{1,30} "."'
    events = list(model.generate("Is the sky blue? Answer:", max_tokens=60, temperature=0, grammar=grammar,
                                 session=model.new_session()))
    text = "".join(e.text for e in events if e.kind == "token")
    assert re.fullmatch(r"(yes|no), because [a-z ]{1,30}\.", text), text
    assert events[-1].finish_reason == "stop"


def test_sampling_at_temperature_draws_only_allowed_tokens(model):
    """Sampled (not greedy) output, many seeds: always a sentence of the grammar."""
    grammar = 'root ::= "[" [0-9]{1,3} ("," " "? [0-9]{1,3}){0,4} "]"'
    for seed in range(8):
        events = list(model.generate("Some numbers:", max_tokens=40, temperature=1.0, seed=seed, grammar=grammar,
                                     session=model.new_session()))
        text = "".join(e.text for e in events if e.kind == "token")
        assert re.fullmatch(r"\[[0-9]{1,3}(, ?[0-9]{1,3}){0,4}\]", text), (seed, text)


def test_the_sampler_refuses_a_grammar_without_a_tokenizer():
    with pytest.raises(SamplingError, match="tokenizer"):
        Sampler(SamplingConfig(grammar='root ::= "a"'), 10)


def test_a_token_the_grammar_refuses_is_an_error(model):
    grammar = compile_grammar('root ::= "ab"', model.tokenizer, model.decoder.hp.n_vocab)
    constraint = Constraint(grammar)
    bad = model.tokenize("zebra", add_bos=False)[0]
    with pytest.raises(GrammarError, match="does not fit"):
        constraint.accept(bad)
    assert constraint.state == grammar.automaton.start  # unchanged


def test_bad_grammar_in_generate_is_refused_before_any_token(model):
    with pytest.raises(GrammarError, match="line 1"):
        next(model.generate("Hi", grammar='root ::= ("a"', max_tokens=3))
    with pytest.raises(GrammarError, match="not both"):
        next(model.generate("Hi", grammar='root ::= "a"', json_schema={"type": "string"}, max_tokens=3))


def test_a_chat_with_a_grammar_answers_every_turn_in_it(model, tmp_path):
    from localllm.chat.conversation import ChatSettings, Conversation

    grammar = 'root ::= ("Yes" | "No") "."'
    conversation = Conversation(model, settings=ChatSettings(temperature=0, grammar=grammar))
    for question in ("Is fire hot?", "Is ice hot?"):
        reply = "".join(e.text for e in conversation.send(question) if e.kind == "token")
        assert reply in ("Yes.", "No.")
    conversation.save(tmp_path / "chat.json")
    assert "grammar" not in json.loads((tmp_path / "chat.json").read_text())["settings"]
    conversation.load(tmp_path / "chat.json")  # the grammar stays the command line's
    assert conversation.settings.grammar == grammar


def test_the_mask_cache_drops_the_least_recently_used_past_its_budget():
    from localllm.grammar.constraint import _MaskCache

    cache = _MaskCache(budget=3 * 1000)
    for key in "abc":
        cache.put(key, key.upper(), 1000)
    assert cache.get("a") == "A"  # now the most recently used
    cache.put("d", "D", 1000)
    assert cache.get("b") is None and [cache.get(k) for k in "acd"] == ["A", "C", "D"]
    assert cache.bytes == 3000
