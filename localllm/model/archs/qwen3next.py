"""Qwen3-Next: `general.architecture = qwen3next` (Qwen3-Next-80B-A3B).

Qwen3.5's mixture of experts (archs/qwen35.py, archs/qwen35moe.py) in an earlier form, as llama.cpp's
src/models/qwen3next.cpp computes it:
- RoPE without sections (NeoX pairing on the first `rope.dimension_count` dims of each head).
- In a delta net, value head h reads key head h // (Hv / Hk) (each key head's value heads side by side;
  Qwen3.5 tiles them, h % Hk).
- The delta net's projections: either attn_qkv and attn_gate as Qwen3.5's, or (the files of llama.cpp's
  first converter) one `ssm_in` holding, for each key head in turn, its q rows (S), k rows (S), its value
  heads' v rows (S Hv / Hk) and z rows (S Hv / Hk); beta and alpha always come from one
  `ssm_ba`, for each key head its value heads' beta rows then their alpha rows. Both are read
  here as row groups of those tensors (TensorSpec.row_groups), into the projections Qwen3.5 runs.
- Every feed-forward is routed experts plus the sigmoid-gated shared expert, as Qwen3.5's MoE.
"""

from __future__ import annotations

from ..weights import TensorSpec
from .qwen35moe import Qwen35Moe


class Qwen3Next(Qwen35Moe):
    DELTA_NET_GROUPED = True

    def delta_net_projections(self, il: int) -> list[TensorSpec]:
        hp, dn, p = self.hp, self.dn, f"blk.{il}."
        e, s, r = hp.n_embd, dn.size, dn.n_v // dn.n_k  # r value heads per key head
        ba = dict(fused=p + "ssm_ba.weight", fused_shape=(e, 2 * dn.n_v), row_groups=(2 * r, r))
        gates = [TensorSpec(p + "ssm_beta.weight", (e, dn.n_v), first_row=0, **ba),
                 TensorSpec(p + "ssm_alpha.weight", (e, dn.n_v), first_row=r, **ba)]
        if p + "ssm_in.weight" not in self.file_tensors:
            return [spec for spec in super().delta_net_projections(il) if "ssm_" not in spec.name] + gates
        group = 2 * s + 2 * s * r  # one key head's rows of ssm_in: q, k, its value heads' v, then z
        fused = dict(fused=p + "ssm_in.weight", fused_shape=(e, dn.n_k * group))
        return [
            TensorSpec(p + "attn_qkv.q", (e, dn.key_dim), first_row=0, row_groups=(group, s), **fused),
            TensorSpec(p + "attn_qkv.k", (e, dn.key_dim), first_row=s, row_groups=(group, s), **fused),
            TensorSpec(p + "attn_qkv.v", (e, dn.value_dim), first_row=2 * s, row_groups=(group, s * r), **fused),
            TensorSpec(p + "attn_gate.weight", (e, dn.value_dim), first_row=2 * s + s * r, row_groups=(group, s * r), **fused),
        ] + gates
