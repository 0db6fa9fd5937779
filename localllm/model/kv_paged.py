"""Paged KV cache with prefix sharing (the PagedAttention idea, sized for a laptop).

The cache is a pool of fixed-size blocks, each holding `block_size` consecutive positions of K and V for
every layer: float16 [n_blocks, block_size, n_head_kv, head_dim] per layer. A sequence owns a block
table (list of block ids); position p lives in block table[p // block_size] at offset p % block_size.

Prefix sharing: a block that is full of known tokens is registered under a key that names its whole
prefix (sha256 chained over the blocks: key_i = H(key_{i-1} || tokens of block i)), so two requests
whose prompts begin with the same tokens map those blocks to the same physical block. Blocks are
reference counted; when the last user lets go of a registered block it stays in an LRU of cached,
unreferenced blocks, so a later request with that prefix prefills only the rest. A request that needs a
block when none is free evicts the least recently released cached block.

The pool never over-commits: a sequence reserves at admission every block it can need (prompt + its
token budget), so a running sequence never waits for memory; a request that cannot reserve waits in
the queue.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np

from ..backends.base import Backend
from ..errors import LocalLLMError
from .hparams import HParams

DEFAULT_BLOCK_SIZE = 16
ROOT_KEY = b"localllm-prefix-root"


class CacheFull(LocalLLMError):
    """The block pool cannot provide the blocks a request needs right now."""


def block_key(parent: bytes, tokens) -> bytes:
    """Key of a full block: names the block's tokens and everything before them."""
    digest = hashlib.sha256(parent)
    digest.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return digest.digest()


def block_keys(tokens, block_size: int, end: int, first: int = 0,
               parent: bytes = ROOT_KEY) -> Iterator[tuple[int, bytes]]:
    """(i, key of block i) for the full blocks first..end-1 of `tokens`, chained from `parent` (the key of
    block first-1; ROOT_KEY for block 0). The prefix-key walk of every user: lazy, so a walk that stops at
    the first block not cached hashes no further."""
    for i in range(first, end):
        parent = block_key(parent, tokens[i * block_size : (i + 1) * block_size])
        yield i, parent


def prefix_keys(tokens, block_size: int, n_blocks: int) -> list[bytes]:
    """Keys of the first n_blocks full blocks of `tokens`."""
    return [key for _, key in block_keys(tokens, block_size, n_blocks)]


@dataclass
class PoolStats:
    hit_blocks: int = 0  # blocks found in the prefix cache
    miss_blocks: int = 0  # full prompt blocks looked up and not found
    evictions: int = 0


class BlockPool:
    """Block ids, reference counts, the prefix map and the LRU of cached unreferenced blocks.

    A block is in exactly one state: free (in `_free`), referenced (refcount > 0, may be registered),
    or cached (refcount 0, registered, in `_lru`). `reserved` counts blocks promised to admitted
    sequences and not yet taken."""

    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise LocalLLMError(f"a block pool needs >= 1 block of >= 1 token (got {n_blocks} x {block_size})")
        self.n_blocks = n_blocks
        self.block_size = block_size
        self._free = list(range(n_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._refs = [0] * n_blocks
        self._key_of: dict[int, bytes] = {}
        self._block_of: dict[bytes, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.reserved = 0
        self.stats = PoolStats()

    # -- capacity -----------------------------------------------------------------------------------
    @property
    def available(self) -> int:
        """Blocks that can be handed out now without taking a promised one (free + evictable)."""
        return len(self._free) + len(self._lru) - self.reserved

    @property
    def n_cached(self) -> int:
        return len(self._lru)

    @property
    def n_used(self) -> int:
        return self.n_blocks - len(self._free) - len(self._lru)

    def reserve(self, n: int) -> None:
        if n > self.available:
            raise CacheFull(f"need {n} KV blocks, {self.available} available")
        self.reserved += n

    def unreserve(self, n: int) -> None:
        self.reserved -= n

    # -- blocks -------------------------------------------------------------------------------------
    def allocate(self, reserved: bool = True) -> int:
        """A fresh block with refcount 1 (taken from a reservation unless reserved=False)."""
        if not reserved and self.available < 1:
            raise CacheFull("no KV block available")
        if self._free:
            block = self._free.pop()
        elif self._lru:
            block, _ = self._lru.popitem(last=False)  # evict the least recently released
            del self._block_of[self._key_of.pop(block)]
            self.stats.evictions += 1
        else:  # reservations guarantee this cannot happen
            raise CacheFull("KV block pool exhausted")
        if reserved:
            self.reserved -= 1
        self._refs[block] = 1
        return block

    def lookup(self, key: bytes) -> int | None:
        """The cached block for a prefix key, with a new reference; None if not cached."""
        block = self._block_of.get(key)
        if block is None:
            self.stats.miss_blocks += 1
            return None
        if self._refs[block] == 0:
            del self._lru[block]
        self._refs[block] += 1
        self.stats.hit_blocks += 1
        return block

    def cached_prefix(self, tokens, limit: int) -> tuple[int, int]:
        """(blocks, unreferenced): how many leading full blocks of tokens[:limit] are cached, and how many
        of those sit in the LRU (a request that maps them takes them out of `available`). Looks only: no
        reference taken, no hit counted."""
        hits = unreferenced = 0
        for _, key in block_keys(tokens, self.block_size, limit // self.block_size):
            block = self._block_of.get(key)
            if block is None:
                break
            hits += 1
            unreferenced += self._refs[block] == 0
        return hits, unreferenced

    def register(self, block: int, key: bytes) -> None:
        """Publish a full block under its prefix key (a no-op if that prefix is already cached)."""
        if key in self._block_of or block in self._key_of:
            return
        self._block_of[key] = block
        self._key_of[block] = key

    def release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] > 0:
            return
        if block in self._key_of:
            self._lru[block] = None  # newest end
        else:
            self._free.append(block)

    def refcount(self, block: int) -> int:
        return self._refs[block]

    def is_cached(self, key: bytes) -> bool:
        return key in self._block_of


class PagedKVCache:
    """Per-layer K and V, float16 [n_blocks, block_size, n_head_kv, head_dim], and the block pool."""

    DTYPE = np.float16

    def __init__(self, ops: Backend, hp: HParams, n_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE, layout=None,
                 state_slots: int = 0):
        """state_slots: how many sequences' recurrent buffers to hold, for a layout with recurrent layers."""
        from .kv_cache import layer_caches
        from .recurrent import LayerState, RecurrentSlots

        self.block_size = block_size
        self.pool = BlockPool(n_blocks, block_size)
        self.k, self.v = layer_caches(ops, hp, (n_blocks, block_size), self.DTYPE, layout)  # see Decoder.kv_layout
        recurrent = any(isinstance(spec, LayerState) for spec in layout or ())
        self.states = RecurrentSlots(ops, layout, state_slots) if recurrent else None

    @staticmethod
    def bytes_per_block(hp: HParams, block_size: int = DEFAULT_BLOCK_SIZE, layout=None) -> int:
        from .kv_cache import kv_bytes_per_position

        return block_size * kv_bytes_per_position(hp, PagedKVCache.DTYPE, layout)

    @classmethod
    def blocks_for_bytes(cls, hp: HParams, n_bytes: int, block_size: int = DEFAULT_BLOCK_SIZE, layout=None) -> int:
        return int(n_bytes // cls.bytes_per_block(hp, block_size, layout))


@dataclass
class SequenceBlocks:
    """One sequence's view of the pool: its block table and the blocks it may still take."""

    table: list = field(default_factory=list)
    reserved: int = 0  # blocks reserved in the pool for this sequence and not yet allocated
    state_slot: int = -1  # its recurrent layers' slot in the cache (PagedKVCache.states), if any
    n_registered: int = 0  # leading blocks already published (or found) in the prefix map
    last_key: bytes = ROOT_KEY  # prefix key of block n_registered - 1

    def attach_prefix(self, pool: BlockPool, tokens, limit: int) -> int:
        """Map the longest cached prefix of tokens[:limit] (whole blocks); returns the tokens covered."""
        bs = pool.block_size
        for _, key in block_keys(tokens, bs, limit // bs):
            block = pool.lookup(key)
            if block is None:
                break
            self.table.append(block)
            self.last_key = key
        self.n_registered = len(self.table)
        return len(self.table) * bs

    def ensure(self, pool: BlockPool, n_positions: int) -> None:
        """Grow the table to hold positions 0..n_positions-1 (from this sequence's reservation)."""
        while len(self.table) * pool.block_size < n_positions:
            if self.reserved <= 0:
                raise CacheFull("a sequence outgrew its KV reservation")
            self.table.append(pool.allocate())
            self.reserved -= 1

    def publish(self, pool: BlockPool, tokens, n_filled: int) -> None:
        """Register every block now full of known tokens (tokens[:n_filled] have their K/V stored)."""
        bs = pool.block_size
        for i, key in block_keys(tokens, bs, n_filled // bs, first=self.n_registered, parent=self.last_key):
            self.last_key = key
            pool.register(self.table[i], key)
            self.n_registered = i + 1

    def free(self, pool: BlockPool) -> None:
        for block in self.table:
            pool.release(block)
        self.table = []
        pool.unreserve(self.reserved)
        self.reserved = 0


@dataclass
class BatchLayout:
    """Where each row of a multi-sequence step goes, as arrays a kernel can read.

    Rows are grouped by sequence: sequence s owns rows seq_first[s] .. seq_first[s] + seq_rows[s] - 1,
    at positions seq_start[s] .. onwards. slots[t] = block * block_size + offset of row t's K/V;
    tables[s] is sequence s's block table (padded with 0)."""

    tokens: np.ndarray  # int32[T]
    positions: np.ndarray  # int32[T]
    slots: np.ndarray  # int32[T]
    row_seq: np.ndarray  # int32[T]
    tables: np.ndarray  # int32[S, max_blocks]
    seq_first: np.ndarray  # int32[S]
    seq_rows: np.ndarray  # int32[S]
    seq_start: np.ndarray  # int32[S]
    block_size: int
    n_rowwise: int = 0  # leading rows computed one by one (decode rows), as a T=1 step computes them
    seq_state: Optional[np.ndarray] = None  # int32[S]: each sequence's recurrent slot (-1: none)


class PagedBatch:
    """The cache seen by one multi-sequence step: what Decoder.attention asks of a cache (store the
    step's K/V, attend), answered through the block tables of `layout`. The `start` the decoder passes
    is unused: positions come per row from the layout."""

    def __init__(self, cache: PagedKVCache, layout: BatchLayout):
        self.cache = cache
        self.layout = layout

    def store(self, ops: Backend, il: int, k, v, start: int) -> None:
        ops.kv_store_paged(self.cache.k[il], self.cache.v[il], k, v, self.layout.slots)

    def attend(self, ops: Backend, il: int, q, start: int, scale: float, window: int, out, softcap: float = 0.0,
               sinks=None) -> None:
        ops.attention_paged(q, self.cache.k[il], self.cache.v[il], self.layout, scale, window, out, softcap, sinks)

    def recurrent_segments(self, il: int, n_rows: int) -> list:
        """(first row, end row, buffers) of each sequence's rows, its recurrent layer il's slot."""
        lay, states = self.layout, self.cache.states
        return [(int(f), int(f + n), states.of(il, int(slot)))
                for f, n, slot in zip(lay.seq_first, lay.seq_rows, lay.seq_state) if n]


class LayoutBuilder:
    """Builds the BatchLayout of a step into arrays allocated once (grown if a step needs more)."""

    def __init__(self, block_size: int, max_rows: int = 64, max_seqs: int = 8, max_blocks: int = 64):
        self.block_size = block_size
        self._alloc(max_rows, max_seqs, max_blocks)

    def _alloc(self, rows: int, seqs: int, blocks: int) -> None:
        self.rows, self.seqs, self.blocks = rows, seqs, blocks
        self._row = np.zeros((5, rows), dtype=np.int32)  # tokens, positions, slots, row_seq, scratch
        self._seq = np.zeros((4, seqs), dtype=np.int32)  # first, rows, start, recurrent slot
        self._tables = np.zeros((seqs, blocks), dtype=np.int32)

    def build(self, entries, n_rowwise: int) -> BatchLayout:
        """entries: (SequenceBlocks, tokens to run, position of the first) per sequence, in row order."""
        n_rows = sum(len(tokens) for _, tokens, _ in entries)
        n_blocks = max(len(blocks.table) for blocks, _, _ in entries)
        if n_rows > self.rows or len(entries) > self.seqs or n_blocks > self.blocks:
            self._alloc(max(n_rows, self.rows), max(len(entries), self.seqs), max(n_blocks, 2 * self.blocks))
        tokens, positions, slots, row_seq = (a[:n_rows] for a in self._row[:4])
        first, rows, start, state = (a[: len(entries)] for a in self._seq)
        tables = self._tables[: len(entries), :n_blocks]
        bs, t = self.block_size, 0
        for s, (blocks, chunk, pos0) in enumerate(entries):
            n = len(chunk)
            first[s], rows[s], start[s], state[s] = t, n, pos0, blocks.state_slot
            tables[s, : len(blocks.table)] = blocks.table
            tokens[t : t + n] = chunk
            for i in range(n):
                p = pos0 + i
                positions[t + i] = p
                slots[t + i] = blocks.table[p // bs] * bs + p % bs
                row_seq[t + i] = s
            t += n
        return BatchLayout(tokens, positions, slots, row_seq, tables, first, rows, start, bs, n_rowwise, state)
