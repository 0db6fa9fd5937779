"""A grammar as a byte-level pushdown automaton, run on sets of stacks as llama.cpp runs GBNF.

The Grammar's rules are flattened into one list of positions: each alternative is its elements followed
by an END. An element is BYTES (one byte from a 256-bit set) or REF (another rule). Character sets become
bytes here (utf8.py): a set of ASCII characters is one BYTES element, a wider one a generated rule whose
alternatives are sequences of byte ranges.

A *stack* is a tuple of positions, innermost last: the top is the BYTES element that the next byte must
match, the ones below are where each enclosing rule continues after it returns. The empty stack means the
root rule is complete. A *state* is a set of stacks (the grammar may be ambiguous as far as it has been
read), interned to a small int. `row(state)` gives the state after each possible byte (DEAD: none fits),
computed once per state and kept in `table` (int32 [states, 256]), which the token walk (trie.py) reads.

Two rewrites keep the states few, so that masks repeat and can be cached:
- a rule reference that ends its alternative pushes no return position (tail calls): `R ::= x R |`
  reading x a hundred times stays one state;
- expansion goes through references and ENDs at once, so a stack's top is always a BYTES element.

Left recursion (a rule that can reach itself without reading a byte) would expand forever; it is refused
when the automaton is built, as llama.cpp refuses it.
"""

from __future__ import annotations

import threading

import numpy as np

from .gbnf import CharSet, Grammar, GrammarError, Ref
from .utf8 import code_point_patterns

END, BYTES, REF = 0, 1, 2
DEAD = -1  # no stack can read the byte
UNKNOWN = -2  # the state's row is not computed yet
ALL_BYTES = (1 << 256) - 1


class Automaton:
    """The positions of a Grammar at byte level, its states, and their transition table."""

    def __init__(self, grammar: Grammar):
        self.kind: list = []  # position -> END, BYTES or REF
        self.arg: list = []  # position -> byte set index (BYTES) or rule id (REF)
        self.byte_sets: list = []  # index -> 256-bit int, bit b set when byte b is in the set
        self.rule_starts: list = []  # rule id -> first position of each alternative
        self._lock = threading.Lock()
        self._flatten(grammar)
        _refuse_left_recursion(self, grammar)
        self._byte_classes()
        self.states: list = []  # state id -> frozenset of stacks
        self.accepting: list = []  # state id -> the empty stack is in the set (the root rule is complete)
        self.only_end: list = []  # state id -> nothing but the empty stack (no byte can follow)
        self._ids: dict = {}
        self.table = np.full((64, 256), UNKNOWN, dtype=np.int32)
        self.accept_flags = np.zeros(64, dtype=np.uint8)  # state id -> accepting, for the trie walk
        self.start = self._intern(self._expand_all(self._root_stacks(grammar)))

    # -- building ---------------------------------------------------------------------------------------
    def _flatten(self, grammar: Grammar) -> None:
        n_rules = len(grammar.rules)
        self.rule_starts = [None] * n_rules
        class_rules: dict = {}  # (ranges, negated) -> rule id of a generated multi-byte rule
        set_index: dict = {}

        def byte_set(mask: int) -> int:
            if mask not in set_index:
                set_index[mask] = len(self.byte_sets)
                self.byte_sets.append(mask)
            return set_index[mask]

        pending = [(rid, [list(alt) for alt in alts]) for rid, alts in enumerate(grammar.rules)]
        while pending:
            rid, alternatives = pending.pop()
            starts = []
            for alternative in alternatives:
                starts.append(len(self.kind))
                for element in alternative:
                    if isinstance(element, Ref):
                        self.kind.append(REF)
                        self.arg.append(element.rule)
                    elif isinstance(element, CharSet):
                        patterns = code_point_patterns(element.ranges, element.negated)
                        if not patterns:
                            raise GrammarError("grammar: a character class matches no character")
                        if all(len(p) == 1 for p in patterns):  # ASCII only: one byte set
                            mask = 0
                            for ((low, high),) in patterns:
                                mask |= ((1 << (high - low + 1)) - 1) << low
                            self.kind.append(BYTES)
                            self.arg.append(byte_set(mask))
                        else:
                            key = (element.ranges, element.negated)
                            if key not in class_rules:
                                class_rules[key] = n_rules + len(class_rules)
                                self.rule_starts.append(None)
                                pending.append((class_rules[key], _pattern_alternatives(patterns)))
                            self.kind.append(REF)
                            self.arg.append(class_rules[key])
                    else:  # a byte-range tuple from _pattern_alternatives
                        low, high = element
                        self.kind.append(BYTES)
                        self.arg.append(byte_set(((1 << (high - low + 1)) - 1) << low))
                self.kind.append(END)
                self.arg.append(-1)
            self.rule_starts[rid] = starts

    def _root_stacks(self, grammar: Grammar) -> list:
        return [(start,) for start in self.rule_starts[grammar.root]]

    def _byte_classes(self) -> None:
        """Bytes that every byte set treats alike share a class: a row is computed once per class."""
        signatures: dict = {}
        self.byte_class = np.zeros(256, dtype=np.int32)
        for b in range(256):
            signature = tuple((mask >> b) & 1 for mask in self.byte_sets)
            self.byte_class[b] = signatures.setdefault(signature, len(signatures))
        self.class_bytes = [np.flatnonzero(self.byte_class == c) for c in range(len(signatures))]
        # byte set index -> the classes whose bytes it holds, so that a row visits only live classes
        self.set_classes = [[c for c, members in enumerate(self.class_bytes) if (mask >> int(members[0])) & 1]
                            for mask in self.byte_sets]

    # -- stacks -------------------------------------------------------------------------------------------
    def _expand(self, stack: tuple, out: set) -> None:
        """Add to `out` the stacks `stack` stands for, each with a BYTES element (or nothing) on top."""
        kind, arg = self.kind, self.arg
        while stack:
            pos = stack[-1]
            k = kind[pos]
            if k == BYTES:
                break
            if k == END:
                stack = stack[:-1]
                continue
            after = pos + 1
            base = stack[:-1] if kind[after] == END else stack[:-1] + (after,)  # tail call: no return position
            for start in self.rule_starts[arg[pos]]:
                self._expand(base + (start,), out)
            return
        out.add(stack)

    def _expand_all(self, stacks) -> frozenset:
        out: set = set()
        for stack in stacks:
            self._expand(stack, out)
        return frozenset(out)

    def _intern(self, stacks: frozenset) -> int:
        sid = self._ids.get(stacks)
        if sid is None:
            sid = len(self.states)
            self._ids[stacks] = sid
            self.states.append(stacks)
            self.accepting.append(() in stacks)
            self.only_end.append(stacks == frozenset([()]))
            if sid >= self.table.shape[0]:
                grown = np.full((2 * self.table.shape[0], 256), UNKNOWN, dtype=np.int32)
                grown[: self.table.shape[0]] = self.table
                flags = np.zeros(2 * self.table.shape[0], dtype=np.uint8)
                flags[: self.table.shape[0]] = self.accept_flags
                self.table, self.accept_flags = grown, flags
            self.accept_flags[sid] = () in stacks
        return sid

    def state_of(self, stacks) -> int:
        """The state of a set of expanded stacks (interned)."""
        return self._intern(frozenset(stacks))

    def split(self, state: int):
        """(the longest bottom part all of the state's stacks share, the state of the stacks above it),
        or None when they share nothing (or the state is accepting). A stack of the inner state that
        empties has returned into the shared part: the inner state's mask does not depend on it, and is
        the same wherever the same inner stacks sit (e.g. inside a string, in any field of a schema)."""
        stacks = self.states[state]
        if () in stacks:
            return None
        shortest = min(len(s) for s in stacks)
        first = next(iter(stacks))
        shared = 0
        while shared < shortest - 1 and all(s[shared] == first[shared] for s in stacks):
            shared += 1
        if shared == 0:
            return None
        with self._lock:
            return first[:shared], self.state_of(s[shared:] for s in stacks)

    def resumed(self, base: tuple) -> int:
        """The state of a shared bottom part once the stacks above it have returned into it."""
        with self._lock:
            return self._intern(self._expand_all([base]))

    def step(self, state: int, byte: int) -> int:
        """The state after `byte` (DEAD when no stack can read it), computing the state's row if needed."""
        target = int(self.table[state, byte])
        if target == UNKNOWN:
            self.fill_rows([state])
            target = int(self.table[state, byte])
        return target

    def accepts(self, data: bytes) -> bool:
        """Whether `data` is a complete sentence of the grammar."""
        state = self.start
        for byte in data:
            state = self.step(state, byte)
            if state == DEAD:
                return False
        return self.accepting[state]

    def fill_rows(self, states, ahead: int = 0, most: int = 256) -> None:
        """Compute the transition rows of `states` (each for every byte class), then, `ahead` times, those
        of the states they lead to whose rows are still unknown (at most `most` a level): a token walk
        that reaches them next needs no pass of its own."""
        for _ in range(ahead + 1):
            states = self._fill(states)
            states = [s for s in states if self.table[s, 0] == UNKNOWN][:most]
            if not states:
                return

    def _fill(self, states) -> list:
        """Rows of `states`; returns the states those rows lead to."""
        reached = set()
        with self._lock:
            for state in states:
                if self.table[state, 0] != UNKNOWN:
                    continue  # (another thread did it)
                row = np.full(256, DEAD, dtype=np.int32)
                moved: dict = {}  # class -> the stacks that read its bytes, each moved past its top element
                for s in self.states[state]:
                    if s:
                        advanced = s[:-1] + (s[-1] + 1,)
                        for cls in self.set_classes[self.arg[s[-1]]]:
                            moved.setdefault(cls, []).append(advanced)
                for cls, stacks in moved.items():
                    target = self._intern(self._expand_all(stacks))
                    row[self.class_bytes[cls]] = target
                    reached.add(target)
                self.table[state] = row  # (after _intern: the table may have grown)
        return list(reached)


def _pattern_alternatives(patterns) -> list:
    """A generated rule's alternatives for UTF-8 byte patterns: one alternative per pattern."""
    return [list(pattern) for pattern in patterns]


def _refuse_left_recursion(automaton: Automaton, grammar: Grammar) -> None:
    """Raise GrammarError when some rule can reach itself before reading a byte."""
    kind, arg, starts = automaton.kind, automaton.arg, automaton.rule_starts
    n = len(starts)
    nullable = [False] * n
    changed = True
    while changed:  # a rule is nullable when one alternative is all nullable references
        changed = False
        for rid in range(n):
            if nullable[rid]:
                continue
            for pos in starts[rid]:
                while kind[pos] == REF and nullable[arg[pos]]:
                    pos += 1
                if kind[pos] == END:
                    nullable[rid] = changed = True
                    break
    leading = [set() for _ in range(n)]  # rules reachable at the start of each rule, before any byte
    for rid in range(n):
        for pos in starts[rid]:
            while kind[pos] == REF:
                leading[rid].add(arg[pos])
                if not nullable[arg[pos]]:
                    break
                pos += 1
    for rid in range(n):
        seen, frontier = set(), list(leading[rid])
        while frontier:
            r = frontier.pop()
            if r == rid:
                name = grammar.names[rid] if rid < len(grammar.names) else f"#{rid}"
                raise GrammarError(f"grammar: rule {name!r} is left-recursive (it can reach itself before reading anything)")
            if r not in seen:
                seen.add(r)
                frontier.extend(leading[r])
