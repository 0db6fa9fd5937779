"""The KV cache of one sequence (KVCache: float16 keys and values per layer, indexed by position, and
the recurrent layers' buffers), the per-layer shapes an architecture may give it (LayerKV), and the
memory check made before any of it is allocated (KVCacheTooLarge). The server's multi-sequence cache is
kv_paged.py's; both allocate through layer_caches."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..backends.base import Backend
from ..errors import LocalLLMError
from .hparams import HParams
from .recurrent import MAX_CHECKPOINTS, LayerState, RecurrentStates, state_bytes

GIB = 1024**3


class KVCacheTooLarge(LocalLLMError):
    """The KV cache for the context asked for would not fit in the memory available (checked before any of it
    is allocated)."""

    def __init__(self, n_ctx: int, needed_bytes: int, available_bytes: int, fitting_ctx: int):
        self.n_ctx, self.needed_bytes, self.available_bytes = n_ctx, needed_bytes, available_bytes
        hint = f"at most about {fitting_ctx} tokens fit" if fitting_ctx >= 16 else "not even a small context fits"
        super().__init__(
            f"a context of {n_ctx} tokens needs {needed_bytes / GIB:.1f} GiB of memory for its KV cache "
            f"but {available_bytes / GIB:.1f} GiB is available: choose a smaller context ({hint})"
        )


@dataclass(frozen=True)
class LayerKV:
    """One layer's KV cache shape, for an architecture whose layers differ (Decoder.kv_layout): its KV
    heads and head size, and the layer whose cache it reads (itself, or an earlier layer it shares)."""

    n_head_kv: int
    head_dim: int
    source: int


def layer_caches(ops: Backend, hp: HParams, lead: tuple, dtype, layout: Optional[list] = None):
    """Per-layer K and V buffers [*lead, n_head_kv, head_dim]: the same shape for every layer, or each
    layer's from `layout` (a layer that reads an earlier layer's cache gets that layer's buffers; a
    recurrent layer, a LayerState, gets None: its buffers are model/recurrent.py's)."""
    keys, values = [], []
    for il in range(hp.n_layer):
        spec = layout[il] if layout else LayerKV(hp.n_head_kv, hp.head_dim, il)
        if isinstance(spec, LayerState):
            keys.append(None)
            values.append(None)
            continue
        if spec.source != il:
            keys.append(keys[spec.source])
            values.append(values[spec.source])
            continue
        shape = (*lead, spec.n_head_kv, spec.head_dim)
        keys.append(ops.alloc(shape, dtype))
        values.append(ops.alloc(shape, dtype))
    return keys, values


def kv_bytes_per_position(hp: HParams, dtype, layout: Optional[list] = None) -> int:
    """K and V bytes of one position over all layers (a layer reading another's cache adds none)."""
    if not layout:
        return 2 * hp.n_layer * hp.n_head_kv * hp.head_dim * np.dtype(dtype).itemsize
    own = [spec for il, spec in enumerate(layout) if isinstance(spec, LayerKV) and spec.source == il]
    return 2 * sum(spec.n_head_kv * spec.head_dim for spec in own) * np.dtype(dtype).itemsize


class KVCache:
    """Per-layer K and V, float16 [n_ctx, n_head_kv, head_dim], indexed by absolute position; and the
    recurrent layers' buffers where the layout has LayerState entries (model/recurrent.py).

    Float16, as llama.cpp's default cache type: half the memory of float32, and measured closer to
    llama.cpp's logits on Gemma 3 270M (KL at the last prompt position 0.001-0.006 against 0.003-0.015
    with a float32 cache), since the values attention sees are rounded as llama.cpp rounds them."""

    DTYPE = np.float16

    def __init__(self, ops: Backend, hp: HParams, n_ctx: int, layout: Optional[list] = None):
        self.n_ctx = n_ctx
        self.k, self.v = layer_caches(ops, hp, (n_ctx,), self.DTYPE, layout)
        has_states = any(isinstance(spec, LayerState) for spec in layout or ())
        self.states = RecurrentStates(ops, layout) if has_states else None

    @staticmethod
    def bytes_needed(hp: HParams, n_ctx: int, layout: Optional[list] = None) -> int:
        """K and V at n_ctx positions, plus the recurrent buffers, their checkpoints and the copy a
        speculative step keeps (save_state)."""
        return n_ctx * kv_bytes_per_position(hp, KVCache.DTYPE, layout) + (2 + MAX_CHECKPOINTS) * state_bytes(layout)

    def resume_at(self, shared: int) -> int:
        """How many of the held tokens a session can keep when its next prompt shares the first `shared`:
        all of them for attention (positions past them are overwritten); for recurrent layers the
        latest checkpoint at or before (RecurrentStates.resume_at)."""
        return shared if self.states is None else self.states.resume_at(shared)

    def checkpoint(self) -> None:
        """Keep the recurrent layers' buffers as they are now (nothing to keep without them)."""
        if self.states is not None:
            self.states.checkpoint()

    def save_state(self) -> None:
        """Keep the recurrent layers' buffers as they are now, to come back to with restore_state (a
        speculative step whose draft is refused in part); K and V need nothing: they are indexed by
        position, and positions past what a sequence keeps are written over by its next step."""
        if self.states is not None:
            self.states.save()

    def restore_state(self) -> None:
        """The recurrent buffers as save_state kept them (nothing to do without them)."""
        if self.states is not None:
            self.states.restore()

    def running(self) -> None:
        """A forward pass starts updating the buffers (until `ran`, what they hold is unknown)."""
        if self.states is not None:
            self.states.position = None

    def ran(self, end: int) -> None:
        """A forward pass ran the tokens before position `end`."""
        if self.states is not None:
            self.states.position = end

    def recurrent(self, il: int) -> tuple:
        """Recurrent layer il's buffers, as its LayerState lists them."""
        return self.states.layers[il]

    def recurrent_segments(self, il: int, n_rows: int) -> list:
        """(first row, end row, buffers) of each sequence in a step's rows: here one sequence, all rows
        (PagedBatch answers for several)."""
        return [(0, n_rows, self.states.layers[il])]

    # The two things attention asks of a cache; PagedBatch (model/kv_paged.py) answers them for a
    # multi-sequence step, so architecture code never knows which cache it runs on.
    def store(self, ops: Backend, il: int, k, v, start: int) -> None:
        ops.kv_store(self.k[il], self.v[il], k, v, start)

    def attend(self, ops: Backend, il: int, q, start: int, scale: float, window: int, out, softcap: float = 0.0,
               sinks=None) -> None:
        ops.attention(q, self.k[il], self.v[il], start, scale, window, out, softcap, sinks)
