"""Grammar-constrained sampling: which tokens may come next, and the state after each chosen token.

`CompiledGrammar` is a grammar's automaton bound to one vocabulary's trie, shared by every sequence that
uses the same grammar text with the same tokenizer (cached: a server sees the same schema many times).
The masks of the states it has seen (bool[n_vocab]) are kept, so a state met again, e.g. "inside a
string" after every string token, costs a dictionary lookup: in one cache for every grammar, bounded in
bytes (MASK_CACHE_BYTES), least recently used first out. `Constraint` is one sequence's position in
it: `allowed()` is the current mask, `accept(token)` moves on.

End-of-generation tokens are allowed exactly when the grammar is complete; once nothing but the end can
follow, they are the only tokens allowed.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict

import numpy as np

from .automaton import DEAD, UNKNOWN, Automaton
from .gbnf import GrammarError, parse_gbnf
from .trie import token_trie, walk_trie

# Bytes of masks kept, all grammars together: bool[n_vocab] each (262 KB at Gemma 3's vocabulary, so
# about 500 of them); an inner state's mask is kept packed, 8 tokens a byte.
MASK_CACHE_BYTES = 128 * 2**20
# Levels of rows computed beyond the states a walk stopped at (automaton.fill_rows): fewer walks of the
# trie for a new state's mask, for a few rows that may go unused.
FILL_AHEAD = 2


class _MaskCache:
    """Least recently used out, once the values' bytes pass the budget."""

    def __init__(self, budget: int):
        self.budget = budget
        self.items: OrderedDict = OrderedDict()  # key -> (value, bytes)
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, key):
        with self.lock:
            found = self.items.get(key)
            if found is None:
                return None
            self.items.move_to_end(key)
            return found[0]

    def put(self, key, value, size: int) -> None:
        with self.lock:
            if key in self.items:
                return
            self.items[key] = (value, size)
            self.bytes += size
            while self.bytes > self.budget and len(self.items) > 1:
                _, (_, dropped) = self.items.popitem(last=False)
                self.bytes -= dropped


_masks = _MaskCache(MASK_CACHE_BYTES)
_grammar_ids = itertools.count()


class CompiledGrammar:
    def __init__(self, text: str, trie, n_vocab: int):
        self.automaton = Automaton(parse_gbnf(text))
        self.trie = trie
        self.n_vocab = n_vocab
        self.uid = next(_grammar_ids)  # its masks' key in the shared cache

    def mask(self, state: int) -> np.ndarray:
        """bool[n_vocab]: the tokens allowed in `state` (do not write it: it is cached)."""
        mask = _masks.get((self.uid, state))
        if mask is None:
            mask = self._compute_mask(state)
            if not mask.any():  # (checked once: a cached mask is never empty)
                raise GrammarError("the grammar allows no token here (no token of this vocabulary can continue it)")
            _masks.put((self.uid, state), mask, mask.nbytes)
        return mask

    def _compute_mask(self, state: int) -> np.ndarray:
        """The tokens whose bytes fit. When the state's stacks share a bottom part, the mask is the inner
        state's (cached: the same inside every string of a schema, say) plus the tokens that leave the
        inner stacks and go on in the shared part, walked from where they leave (_inner)."""
        automaton = self.automaton
        split = automaton.split(state)
        if split is None:
            mask = np.zeros(self.n_vocab, dtype=np.bool_)
            self._walk(mask, np.full(1, -1, dtype=np.int64), state)
        else:
            base, inner = split
            mask, exits = self._inner(inner)  # (a new array, ours to add to)
            if exits.size:
                self._walk(mask, -exits - 1, automaton.resumed(base))
        if automaton.accepting[state]:
            mask[self.trie.eog_ids[self.trie.eog_ids < self.n_vocab]] = True
        return mask

    def _inner(self, inner: int) -> tuple:
        """(mask, exit nodes) of an inner state: the tokens it allows on its own (a new array each call),
        and the nodes (with children) where its stacks have all returned, from which a token may go on
        outside them."""
        key = (self.uid, "inner", inner)
        cached = _masks.get(key)
        if cached is not None:
            packed, exits = cached
            return np.unpackbits(packed, count=self.n_vocab).view(np.bool_), exits
        mask = np.zeros(self.n_vocab, dtype=np.bool_)
        exits = self._walk(mask, np.full(1, -1, dtype=np.int64), inner, record_exits=True)
        packed = np.packbits(mask)
        _masks.put(key, (packed, exits), packed.nbytes + exits.nbytes)
        return mask, exits

    def _walk(self, mask: np.ndarray, roots: np.ndarray, state: int, record_exits: bool = False) -> np.ndarray:
        """Mark in `mask` the tokens walked from `state` at `roots` (walk_trie's encoding), computing the
        rows of states first met on the way; returns the exit nodes when recording them."""
        automaton, trie = self.automaton, self.trie
        if automaton.table[state, 0] == UNKNOWN:
            automaton.fill_rows([state])
        n_nodes = trie.label.shape[0]
        skipped, skipped_states = np.empty(n_nodes, dtype=np.int64), np.empty(n_nodes, dtype=np.int32)
        exits = np.empty(n_nodes if record_exits else 0, dtype=np.int64)
        found = []
        root_states = np.full(roots.shape[0], state, dtype=np.int32)
        while True:  # each pass walks the subtrees the one before reached through states without rows
            n, n_exits = walk_trie(trie.label, trie.depth, trie.subtree_end, trie.tok_start, trie.tok_ids,
                                   trie.max_depth, automaton.table, automaton.accept_flags, roots, root_states, mask,
                                   skipped, skipped_states, exits)
            if n_exits:
                found.append(exits[:n_exits].copy())
            if n == 0:
                break
            roots, root_states = skipped[:n].copy(), skipped_states[:n].copy()
            automaton.fill_rows(np.unique(root_states).tolist(), ahead=FILL_AHEAD)
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

    def advance(self, state: int, token: int) -> int:
        """The state after `token`'s bytes (DEAD if the grammar refuses them)."""
        for byte in self.trie.pieces[token] if token < len(self.trie.pieces) else b"":
            state = self.automaton.step(state, byte)
            if state == DEAD:
                return DEAD
        return state


_compiled: "OrderedDict" = OrderedDict()
_compiled_lock = threading.Lock()
COMPILED_KEPT = 16


def compile_grammar(text: str, tokenizer, n_vocab: int, special: bool = False) -> CompiledGrammar:
    """The CompiledGrammar of a GBNF text for a tokenizer (cached, the most recent COMPILED_KEPT);
    `special`: control tokens match by their text (trie.token_trie)."""
    key = (text, id(tokenizer), n_vocab, special)
    trie = token_trie(tokenizer, special)
    with _compiled_lock:
        found = _compiled.get(key)
        if found is not None and found.trie is trie:
            _compiled.move_to_end(key)
            return found
    compiled = CompiledGrammar(text, trie, n_vocab)
    with _compiled_lock:
        _compiled[key] = compiled
        while len(_compiled) > COMPILED_KEPT:
            _compiled.popitem(last=False)
    return compiled


class Constraint:
    """One sequence's place in a grammar."""

    def __init__(self, grammar: CompiledGrammar):
        self.grammar = grammar
        self.state = grammar.automaton.start

    @property
    def complete(self) -> bool:
        """The grammar accepts the text so far."""
        return self.grammar.automaton.accepting[self.state]

    def allowed(self) -> np.ndarray:
        """bool[n_vocab]: the tokens allowed next (GrammarError when there are none)."""
        return self.grammar.mask(self.state)

    def apply(self, scores: np.ndarray) -> np.ndarray:
        """A copy of float32 `scores` with the tokens the grammar refuses set to -inf."""
        out = np.full(scores.shape, -np.inf, dtype=np.float32)
        np.copyto(out, scores, where=self.allowed())
        return out

    def accept(self, token: int) -> None:
        if int(token) in self.grammar.trie.eog_ids:
            return  # the end: allowed only when complete, and nothing comes after it
        state = self.grammar.advance(self.state, int(token))
        if state == DEAD:
            raise GrammarError(f"token {token} does not fit the grammar here")
        self.state = state
