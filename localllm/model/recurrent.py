"""The fixed-size memory of recurrent layers, beside the KV cache of attention layers.

A hybrid architecture (Qwen3.5: gated delta nets between attention layers) declares in its
`Decoder.kv_layout` which layers are recurrent, each with a `LayerState`: the shapes of the float32
buffers that carry it from one token to the next (a convolution's window of past inputs, the delta
rule's state matrices). `KVCache` holds them beside the attention layers' K and V and hands them out
through `recurrent(il)`; the architecture's code updates them in place.

Unlike K and V, which are indexed by position, a recurrent state holds all the tokens before it at once:
it cannot be cut back to an earlier position. So a session whose next prompt shares only part of what
the cache holds (a chat whose template re-renders the last reply, an edited message) continues from a
**checkpoint**: a copy of every recurrent buffer taken after a known number of tokens. The policy
(llama.cpp's server keeps such "context checkpoints" for the same reason, a few per conversation):
- a checkpoint is taken one token before the end of every prompt the session prefills, the point a
  next turn that repeats this prompt resumes from (the last prompt token is always run again, for its
  logits);
- at most MAX_CHECKPOINTS are kept, the oldest dropped first; those past the point a session resumes
  from are dropped, since the tokens after it are about to change;
- with no checkpoint at or before the shared prefix, the state restarts from zero and the whole prompt
  is run again: slower, never wrong;
- a forward pass that stops part way (an error, Ctrl-C) leaves the buffers marked unknown, so that the
  next prompt resumes from a checkpoint too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends.base import Backend

MAX_CHECKPOINTS = 4


@dataclass(frozen=True)
class LayerState:
    """A recurrent layer's entry in Decoder.kv_layout: the shapes of its float32 buffers, in the order
    the architecture reads them from KVCache.recurrent (each zero at a sequence's start)."""

    shapes: tuple

    @property
    def nbytes(self) -> int:
        return sum(int(np.prod(shape, dtype=np.int64)) * 4 for shape in self.shapes)


def state_bytes(layout) -> int:
    """Bytes of every recurrent layer's buffers (0 where the layout has none)."""
    return sum(spec.nbytes for spec in layout or () if isinstance(spec, LayerState))


class RecurrentSlots:
    """The recurrent layers' buffers of up to n_slots sequences of the batching engine (its paged cache):
    slot s of every buffer belongs to one running sequence, taken zeroed when it is admitted and given
    back when it ends. (No checkpoints here: the engine runs each request's prompt from its start.)"""

    def __init__(self, ops: Backend, layout, n_slots: int):
        self.ops = ops
        self.layers = {il: tuple(ops.alloc((n_slots, *shape)) for shape in spec.shapes)
                       for il, spec in enumerate(layout) if isinstance(spec, LayerState)}
        self.free = list(range(n_slots))
        self.saved: dict | None = None  # save(): a copy of every buffer, per slot (made at the first save)

    def take(self) -> int:
        """A free slot, its buffers zeroed (a sequence's start)."""
        slot = self.free.pop(0)
        for buffers in self.layers.values():
            for buffer in buffers:
                self.ops.scale(buffer[slot], 0.0, buffer[slot])
        return slot

    def give(self, slot: int) -> None:
        self.free.append(slot)

    def of(self, il: int, slot: int) -> tuple:
        """Layer il's buffers of the sequence in `slot`."""
        return tuple(buffer[slot] for buffer in self.layers[il])

    def save(self, slot: int) -> None:
        """Copy slot's buffers aside, to come back to with restore(slot): a speculative step (the engine's)
        whose draft may be refused in part. The copies double the slots' memory; they are made at the
        first save, so a server that does not speculate never holds them."""
        if self.saved is None:
            self.saved = {il: tuple(self.ops.alloc(b.shape) for b in buffers) for il, buffers in self.layers.items()}
        for il, buffers in self.layers.items():
            for a, b in zip(buffers, self.saved[il]):
                self.ops.scale(a[slot], 1.0, b[slot])  # an exact copy on every backend (x * 1.0 == x)

    def restore(self, slot: int) -> None:
        """slot's buffers as the last save(slot) left them."""
        for il, buffers in self.layers.items():
            for a, b in zip(self.saved[il], buffers):
                self.ops.scale(a[slot], 1.0, b[slot])


class RecurrentStates:
    """The recurrent layers' buffers of one sequence and their checkpoints (module docstring)."""

    def __init__(self, ops: Backend, layout):
        self.ops = ops
        self.layers = {il: tuple(ops.alloc(shape) for shape in spec.shapes)
                       for il, spec in enumerate(layout) if isinstance(spec, LayerState)}
        self.position: int | None = 0  # how many tokens the buffers hold; None while a forward pass updates them
        self.checkpoints: list[tuple[int, dict]] = []  # (position, layer -> copies), oldest first
        self._saved: tuple[int | None, dict] | None = None  # save(): (position, layer -> copies), made once

    def resume_at(self, shared: int) -> int:
        """Make the buffers hold at most the first `shared` tokens of what they hold now; returns how many
        they hold: `shared` when nothing before it changes, else the latest checkpoint's position at or
        before it (restored), else 0 (the buffers zeroed)."""
        if self.position is not None and shared >= self.position:
            return self.position
        self.checkpoints = [c for c in self.checkpoints if c[0] <= shared]
        if self.checkpoints:
            position, copies = self.checkpoints[-1]
            self._copy(copies, self.layers)
        else:
            position = 0
            for buffers in self.layers.values():
                for buffer in buffers:
                    self.ops.scale(buffer, 0.0, buffer)
        self.position = position
        return position

    def checkpoint(self) -> None:
        """Keep a copy of every buffer at the current position (MAX_CHECKPOINTS kept, oldest dropped)."""
        if self.checkpoints and self.checkpoints[-1][0] == self.position:
            return
        copies = {il: tuple(self.ops.alloc(b.shape) for b in buffers) for il, buffers in self.layers.items()}
        self._copy(self.layers, copies)
        self.checkpoints.append((self.position, copies))
        del self.checkpoints[:-MAX_CHECKPOINTS]

    def save(self) -> None:
        """Copy every buffer aside (one copy, reused), to come back to with restore()."""
        if self._saved is None:
            self._saved = (None, {il: tuple(self.ops.alloc(b.shape) for b in buffers) for il, buffers in self.layers.items()})
        self._copy(self.layers, self._saved[1])
        self._saved = (self.position, self._saved[1])

    def restore(self) -> None:
        """The buffers and position as the last save() left them."""
        position, copies = self._saved
        self._copy(copies, self.layers)
        self.position = position

    def _copy(self, src: dict, dst: dict) -> None:
        for il, buffers in src.items():
            for a, b in zip(buffers, dst[il]):
                self.ops.scale(a, 1.0, b)  # an exact copy on every backend (x * 1.0 == x)
