"""Device memory planning: what a model takes on the GPU before any of it is uploaded.

The plan is per tensor (and so per layer), so that placing some layers on the device and the rest on the
host can later be decided from the same numbers; this round everything goes to the device or the load
fails with both sizes named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...errors import LocalLLMError
from .blocks import UNIT_DECODERS
from .matmul import SLAB_ELEMENTS

# Room kept free for the CUDA context, the compiled kernels and the allocator's slack.
RESERVE_BYTES = 256 * 1024 * 1024
# Vector tensors (norm weights, biases) are uploaded as float32 on first use.
_VECTOR_TYPES = ("F32", "F16", "BF16")


class DeviceOutOfMemory(LocalLLMError):
    """The model does not fit the device's free memory (no partial offload yet)."""


def uploaded_bytes(qtype: str, n_in: int, n_out: int, nbytes: int) -> int:
    """Bytes a matrix takes on the device: its file bytes when a kernel reads its type, else float16."""
    return nbytes if qtype in UNIT_DECODERS else 2 * n_in * n_out


@dataclass
class DevicePlan:
    tensors: dict[str, int] = field(default_factory=dict)  # name -> device bytes
    kv_bytes: int = 0
    scratch_bytes: int = 0  # activation buffers, logits, the GEMM slab, attention scores

    @property
    def weights_bytes(self) -> int:
        return sum(self.tensors.values())

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.scratch_bytes

    def layer_bytes(self, il: int) -> int:
        """Weights of block il (what a per-layer placement would move)."""
        prefix = f"blk.{il}."
        return sum(n for name, n in self.tensors.items() if name.startswith(prefix))


def plan(reader, kv_bytes: int, n_ctx: int, hp) -> DevicePlan:
    """Device bytes of every tensor of `reader`, the KV cache and the scratch a forward pass allocates."""
    result = DevicePlan(kv_bytes=kv_bytes)
    for name, info in reader.tensors.items():
        qtype = info.ggml_type.name
        n_in = int(info.shape[0])
        n_out = info.n_rows
        if len(info.shape) == 1 and qtype in _VECTOR_TYPES:
            result.tensors[name] = 4 * n_in
        else:
            result.tensors[name] = uploaded_bytes(qtype, n_in, n_out, int(info.nbytes))
    prefill = 512  # rows of the largest activation batch budgeted for (prompts are split into chunks anyway)
    per_row = 4 * (4 * hp.n_embd + 3 * hp.n_head * hp.head_dim + 2 * hp.n_ff + hp.n_vocab)
    scores = 4 * hp.n_head * min(n_ctx, 4096) * 64
    result.scratch_bytes = prefill * per_row + 4 * SLAB_ELEMENTS + scores
    return result


def check_fits(plan_: DevicePlan, free: int, total: int, device: str) -> None:
    need = plan_.total_bytes + RESERVE_BYTES
    if need > free:
        raise DeviceOutOfMemory(
            f"the model needs {_gib(need)} of device memory (weights {_gib(plan_.weights_bytes)}, KV cache "
            f"{_gib(plan_.kv_bytes)}, buffers {_gib(plan_.scratch_bytes + RESERVE_BYTES)}) but {device} has "
            f"{_gib(free)} free of {_gib(total)} (use a smaller --ctx or quant, or --backend cpu)"
        )


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"

