"""Mistral 3 (Ministral 3, Mistral Small 3.x text models): `general.architecture = mistral3`.

The llama layout (RoPE normal pairing, SiLU gate, output.weight optional: tied when absent), usually
with YaRN RoPE scaling (`rope.scaling.type = yarn`, `rope.scaling.yarn_beta_fast/slow`,
`rope.scaling.yarn_log_multiplier`; model/rope.py), and Llama 4's attention temperature when
`mistral3.attention.temperature_scale` is set (llama.cpp, src/models/mistral3.cpp): the rotated queries
at position p are multiplied by 1 + scale * ln(floor(p / n) + 1), n the original context
(`rope.scaling.original_context_length`), so positions within it are unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from ..decoder import Buffers, Decoder


class Mistral3(Decoder):
    ROPE_NEOX = False
    ACTIVATION = "silu"

    def read_extra(self, reader) -> None:
        self.temperature_scale = reader.metadata.get_float(reader.arch_key("attention.temperature_scale"), 0.0)
        self.temperature_length = self.hp.rope_scaling.orig_ctx

    def query_scale(self, position: int) -> float:
        return 1.0 + self.temperature_scale * math.log(position // self.temperature_length + 1)

    def scale_queries(self, b: Buffers) -> None:
        if not self.temperature_scale:
            return
        n, span = b.n_tokens, self.temperature_length
        if n == 1 or int(b.positions[:n].min()) // span == int(b.positions[:n].max()) // span:
            self._scale_rows(b, 0, n, int(b.positions[0]))  # one scale for the step's rows
            return
        # rows in runs of the same scale (it changes once per temperature_length positions)
        buckets = b.positions[:n] // self.temperature_length
        cuts = [0, *(np.flatnonzero(np.diff(buckets)) + 1).tolist(), n]
        for start, end in zip(cuts[:-1], cuts[1:]):
            self._scale_rows(b, start, end, int(b.positions[start]))

    def _scale_rows(self, b: Buffers, start: int, end: int, position: int) -> None:
        factor = self.query_scale(position)
        if factor != 1.0:
            rows = b.q[start:end]
            self.ops.scale(rows, factor, rows)
