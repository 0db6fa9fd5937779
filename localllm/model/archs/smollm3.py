"""SmolLM3: `general.architecture = smollm3`.

The llama layout (RoPE normal pairing, SiLU gate, output.weight optional: tied when absent) with one
difference: every fourth layer (il = 3, 7, 11, ...) attends without RoPE. The files do not state
which layers; llama.cpp (src/models/smollm3.cpp) fixes the interval at 4, as the published models use.
"""

from __future__ import annotations

from ..decoder import Decoder

NO_ROPE_EVERY = 4


class SmolLM3(Decoder):
    ROPE_NEOX = False
    ACTIVATION = "silu"

    def layer_has_rope(self, il: int) -> bool:
        return (il + 1) % NO_ROPE_EVERY != 0
