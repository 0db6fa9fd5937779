"""Activation buffers of the forward passes: allocated once per shape with the backend's `alloc` (host
arrays on the CPU, device arrays on a GPU) and reused, so a decode step allocates nothing.

`Buffers` holds one step's activations for T rows; `BatchBuffers` the per-step arrays of the batched
forward over several sequences (Decoder.forward_batch), grown on demand.
"""

from __future__ import annotations

import numpy as np

from ..backends.base import Backend
from .hparams import HParams


class Buffers:
    """Activation buffers for a batch of T tokens, allocated once per T and reused."""

    # The per-row arrays (first axis T): what head() cuts.
    ROW_ARRAYS = ("x", "h", "q", "k", "v", "attn", "o", "gate", "up", "positions")

    def __init__(self, ops: Backend, hp: HParams, n_tokens: int):
        t, e, f, d = n_tokens, hp.n_embd, hp.n_ff, hp.head_dim
        self.n_tokens = t
        self.x = ops.alloc((t, e))  # residual stream
        self.h = ops.alloc((t, e))  # normed input of a sub-block
        self.q = ops.alloc((t, hp.n_head, d))
        self.k = ops.alloc((t, hp.n_head_kv, d))
        self.v = ops.alloc((t, hp.n_head_kv, d))
        self.attn = ops.alloc((t, hp.n_head, d))
        self.o = ops.alloc((t, e))  # output of a sub-block
        self.gate = ops.alloc((t, f))
        self.up = ops.alloc((t, f))
        self.positions = np.zeros(t, dtype=np.int32)  # on the host: the backend uploads what it needs
        # Leading rows computed one by one, each exactly as a T=1 step computes it (the decode rows of
        # a multi-sequence step); 0 for a single-sequence forward.
        self.n_rowwise = 0
        # Bounds of the rows after those, cut by sequence (the prompt chunks of a server step), each
        # chunk computed as it would be alone; None: one chunk.
        self.segments = None

    def head(self, n_tokens: int) -> "Buffers":
        """The same buffers limited to their first n_tokens rows (views, no new memory; host or device)."""
        view = object.__new__(Buffers)
        vars(view).update(vars(self))
        for name in self.ROW_ARRAYS:
            setattr(view, name, getattr(self, name)[:n_tokens])
        view.n_tokens = n_tokens
        return view


class BatchBuffers:
    """The per-step arrays of Decoder.forward_batch, grown when a step needs more and reused otherwise.

    rows(T): Buffers for a step of T rows, views of one allocation sized for the largest step so far
    (at least 16 rows). outputs(S): the arrays of the S logit rows (at least 8): last[S, E] (the rows
    gathered from the residual stream), normed[S, E] and logits[S, vocab]."""

    MIN_ROWS = 16
    MIN_OUTPUTS = 8

    def __init__(self, ops: Backend, hp: HParams):
        self.ops, self.hp = ops, hp
        self._full: Buffers | None = None
        self._views: dict[int, Buffers] = {}
        self._last = self._normed = self._logits = None

    def rows(self, n_tokens: int) -> Buffers:
        if self._full is None or self._full.n_tokens < n_tokens:
            self._full = Buffers(self.ops, self.hp, max(n_tokens, self.MIN_ROWS))
            self._views = {}
        view = self._views.get(n_tokens)
        if view is None:
            view = self._views[n_tokens] = self._full.head(n_tokens)
        return view

    def outputs(self, n_out: int) -> tuple:
        """(last, normed, logits), each cut to its first n_out rows."""
        if self._logits is None or self._logits.shape[0] < n_out:
            rows = max(n_out, self.MIN_OUTPUTS)
            self._last = self.ops.alloc((rows, self.hp.n_embd))
            self._normed = self.ops.alloc((rows, self.hp.n_embd))
            self._logits = self.ops.alloc((rows, self.hp.n_vocab))
        return self._last[:n_out], self._normed[:n_out], self._logits[:n_out]
