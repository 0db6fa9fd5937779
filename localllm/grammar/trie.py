"""The vocabulary as a byte trie, and the walk that finds every token a grammar state allows.

Built once per tokenizer (`token_trie`). Nodes are in depth-first preorder, so a node's subtree is the
index range [node, subtree_end[node]): the walk is one forward scan that jumps over the subtree of a byte
the grammar refuses. A node's tokens are those whose bytes end there (tok_ids[tok_start[n]:tok_start[n+1]]).

Which tokens take part: every token with a non-empty text, as the detokenizer writes it (control tokens
write nothing and are never allowed, unless the output is written with them: `special`; end-of-generation
tokens are allowed by the constraint itself, when the grammar is complete).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..jit import cached_kernel, configure_numba
from .automaton import UNKNOWN


@dataclass
class TokenTrie:
    label: np.ndarray  # uint8[nodes]: the byte on the edge into the node (node 0, the root: unused)
    depth: np.ndarray  # int32[nodes]: bytes from the root
    subtree_end: np.ndarray  # int32[nodes]
    tok_start: np.ndarray  # int32[nodes + 1]
    tok_ids: np.ndarray  # int32[tokens in the trie]
    pieces: list  # token id -> its bytes (b"" for tokens not in the trie)
    n_vocab: int
    eog_ids: np.ndarray  # int64: end-of-generation tokens
    max_depth: int  # bytes in the longest token


_tries: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_tries_lock = threading.Lock()


def token_trie(tokenizer, special: bool = False) -> TokenTrie:
    """The trie of a tokenizer's vocabulary (built once, kept as long as the tokenizer lives). `special`:
    control tokens take part with their text, as output written with them (SamplingConfig.special_tokens)."""
    with _tries_lock:
        tries = _tries.setdefault(tokenizer, {})
        if special not in tries:
            tries[special] = build_trie(tokenizer, special)
        return tries[special]


def build_trie(tokenizer, special: bool = False) -> TokenTrie:
    n = tokenizer.vocab_size
    eog = set(tokenizer.eog_ids)
    pieces = [b"" if i in eog else tokenizer.token_to_piece(i, special=special) for i in range(n)]
    order = sorted((i for i in range(n) if pieces[i]), key=pieces.__getitem__)
    lengths = np.fromiter((len(pieces[i]) for i in order), dtype=np.int64, count=len(order))
    offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(pieces[i] for i in order), dtype=np.uint8)
    configure_numba()
    label, depth, token_node, n_nodes = _build_nodes(data, offsets)
    label, depth = label[:n_nodes], depth[:n_nodes]
    subtree_end = _subtree_ends(depth)
    ids = np.asarray(order, dtype=np.int32)
    by_node = np.argsort(token_node, kind="stable")
    tok_start = np.zeros(n_nodes + 1, dtype=np.int32)
    np.cumsum(np.bincount(token_node, minlength=n_nodes), out=tok_start[1:])
    return TokenTrie(label, depth, subtree_end, tok_start, ids[by_node], pieces, n,
                     np.asarray(sorted(eog), dtype=np.int64), int(depth.max()) if depth.size else 0)


@cached_kernel(nogil=True)
def _build_nodes(data, offsets):
    """Nodes of the trie of the sorted byte strings data[offsets[k]:offsets[k+1]], in preorder: sorted
    strings add their new nodes in preorder. Returns (label, depth, the node of each string, node count)."""
    n_strings = offsets.shape[0] - 1
    capacity = data.shape[0] + 1
    label = np.zeros(capacity, dtype=np.uint8)
    depth = np.zeros(capacity, dtype=np.int32)
    token_node = np.zeros(n_strings, dtype=np.int64)
    longest = 0
    for k in range(n_strings):
        longest = max(longest, offsets[k + 1] - offsets[k])
    path = np.zeros(longest + 1, dtype=np.int64)  # path[d]: the node at depth d on the current string
    n_nodes = 1
    for k in range(n_strings):
        start, end = offsets[k], offsets[k + 1]
        common = 0
        if k > 0:
            p_start, p_end = offsets[k - 1], offsets[k]
            while common < end - start and common < p_end - p_start and data[start + common] == data[p_start + common]:
                common += 1
        for d in range(common, end - start):
            label[n_nodes] = data[start + d]
            depth[n_nodes] = d + 1
            path[d + 1] = n_nodes
            n_nodes += 1
        token_node[k] = path[end - start]
    return label, depth, token_node, n_nodes


@cached_kernel(nogil=True)
def _subtree_ends(depth):
    """subtree_end[n]: the first node after n's subtree (the next node no deeper than n)."""
    n = depth.shape[0]
    ends = np.full(n, n, dtype=np.int32)
    open_nodes = np.zeros(n, dtype=np.int64)
    top = 0
    for i in range(n):
        while top > 0 and depth[open_nodes[top - 1]] >= depth[i]:
            top -= 1
            ends[open_nodes[top]] = i
        open_nodes[top] = i
        top += 1
    return ends


@cached_kernel(nogil=True)
def walk_trie(label, depth, subtree_end, tok_start, tok_ids, max_depth, table, accepting, roots, root_states, mask,
              skipped, skipped_states, exits):
    """Mark in mask (bool[n_vocab]) the tokens whose bytes take the automaton to a live state, walking
    from root_states[k] the subtree of node roots[k] (r >= 0), or the nodes below node -r-1 (r < 0;
    -1: the whole trie). A subtree entered from a state whose row is still UNKNOWN is not walked but
    recorded in skipped / skipped_states, to be walked again once the row is known. When `exits` is not
    empty, every node with children reached in an accepting state is recorded in it (constraint.py
    continues from there in an enclosing context). Arrays of n_nodes entries; returns the counts
    (skipped, exits): no skipped subtree means the mask is complete."""
    state_at = np.empty(max_depth + 1, dtype=np.int32)  # state_at[d]: the state after the node at depth d
    n_skipped = 0
    n_exits = 0
    record_exits = exits.shape[0] > 0
    for k in range(roots.shape[0]):
        root = roots[k]
        if root < 0:
            above = -root - 1
            state_at[depth[above]] = root_states[k]
            i, end = above + 1, subtree_end[above]
        else:
            state_at[depth[root] - 1] = root_states[k]
            i, end = root, subtree_end[root]
        while i < end:
            parent_state = state_at[depth[i] - 1]
            target = table[parent_state, label[i]]
            if target < 0:
                if target == UNKNOWN:
                    skipped[n_skipped] = i
                    skipped_states[n_skipped] = parent_state
                    n_skipped += 1
                i = subtree_end[i]
                continue
            state_at[depth[i]] = target
            for t in range(tok_start[i], tok_start[i + 1]):
                mask[tok_ids[t]] = True
            if record_exits and accepting[target] and i + 1 < subtree_end[i]:
                exits[n_exits] = i
                n_exits += 1
            i += 1
    return n_skipped, n_exits
