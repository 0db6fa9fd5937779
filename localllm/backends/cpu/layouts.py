"""What the CPU backend's matrix products read for each weight, kept per weight for the backend's life.

Two caches, keyed by id(weight), each entry holding the weight itself so that its id cannot be reused by
another weight while the entry lives:
- the layout: the weight's re-laid rows (matmul.PackedWeights or TiledWeights, made at its first product
  when the backend repacks and the type and target gain from it), else its mapped bytes;
- the one-row plan: what a one-row product looks up per call (type, kernel, activation buffers, thread
  rule), made once: a decode step of Gemma 3 270M makes ~130 one-row products, and the lookups were
  ~4 us of each (~5% of the step).
"""

from __future__ import annotations

from ... import quant
from ..base import Weight
from .matmul import RELAID, MatmulScratch, MatrixRow, matrix_kernel, matvec_kernel, relaid_layout
from .threads import SMALL_MATVEC_BYTES


class WeightLayouts:
    def __init__(self, repack: bool, scratch: MatmulScratch):
        self.repack = repack
        self.scratch = scratch
        self.arena = None  # weight_memory.HugePageArena where the backend copies its matrices: the re-laid copies go there too
        self._layouts: dict[int, tuple] = {}  # id(weight) -> (weight, its re-laid layout or its data)
        self.plans: dict[int, tuple] = {}  # id(weight) -> (weight, kernel, activation, small, packed)

    def layout_of(self, w: Weight, basic_tier: bool = False):
        """What the matrix products read for w: its re-laid rows, else the mapped bytes. In the basic tier
        (tiers.py) the mapped bytes, not recorded: the full tier may re-lay it."""
        entry = self._layouts.get(id(w))
        if entry is None:
            if basic_tier:
                return w.data
            data = w.data
            layout = relaid_layout(quant.get(w.qtype), data) if self.repack and quant.is_supported(w.qtype) else None
            if layout is not None:
                data = layout(quant.get(w.qtype), data, self.arena)
            entry = self._layouts[id(w)] = (w, data)
        return entry[1]

    def recorded(self) -> list:
        """The layouts made so far (re-laid layouts or mapped bytes), in the order they were made."""
        return [entry[1] for entry in self._layouts.values()]

    def plan_matvec(self, w: Weight, n_in: int, basic_tier: bool = False) -> tuple:
        """Make (and keep in `plans`) w's one-row plan: (w, kernel over the mapped rows, the activation
        buffers of an n_in-long row, whether w is under SMALL_MATVEC_BYTES, its re-laid layout or None)."""
        qt = quant.get(w.qtype)
        small = w.data.nbytes < SMALL_MATVEC_BYTES
        layout = self.layout_of(w, basic_tier)
        packed = layout if isinstance(layout, RELAID) else None
        matrix = matrix_kernel(qt, layout)
        kernel = MatrixRow(matrix) if matrix is not None else matvec_kernel(qt)
        plan = self.plans[id(w)] = (w, kernel, self.scratch.activation(qt.act, n_in), small, packed)
        return plan

    def forget_plans(self) -> None:
        """Drop the one-row plans (made on the file's layout in the basic tier; the full tier re-lays)."""
        self.plans.clear()
