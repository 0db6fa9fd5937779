"""Q8_K: 256 weights per 292-byte super-block, symmetric 8-bit with a float32 scale.

Block layout (ggml `block_q8_K`), little-endian:
  bytes   0..3     d          float32   scale; weight j = d * qs[j]
  bytes   4..259   qs[256]    int8      quants
  bytes 260..291   bsums[16]  int16     sum of qs[16g .. 16g+15] for each group g of 16

ggml uses Q8_K as the activation format (`vec_dot_type`) of every K-quant; as a weight type it pairs
with q8_k activations too (a dot product of two Q8_K rows). localllm keeps q8_k activations unpacked
(activation.py), so `quantize` here packs the same numbers into ggml's 292-byte blocks.

This module also holds what the super-block modules share: the block checks (`QK_K`, `as_blocks`,
`as_float_blocks`, `f16_field`) and the quantizers' rounding (`nearest_int`). The vector operations
their dot-product kernels are built from are in vector.py.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from ..errors import TensorError
from . import QuantType
from .activation import quantize_q8_k
from .jit import exact_kernel, fast_kernel, read_f32

QK_K = 256
BLOCK = QK_K
BLOCK_BYTES = 292
GROUPS = QK_K // 16  # bsums per block

_QS = 4
_BSUMS = 260


def as_blocks(raw: np.ndarray, block_bytes: int, type_name: str) -> np.ndarray:
    """View uint8[..., k*block_bytes] as uint8[blocks, block_bytes]; TensorError if the rows do not split."""
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise TensorError(f"{type_name} data must be uint8 bytes, got {raw.dtype}")
    if raw.ndim == 0 or raw.shape[-1] % block_bytes:
        raise TensorError(
            f"{type_name} row of {raw.shape[-1] if raw.ndim else 0} bytes is not a whole number of"
            f" {block_bytes}-byte blocks"
        )
    return np.ascontiguousarray(raw).reshape(-1, block_bytes)


def as_float_blocks(x: np.ndarray, block: int, type_name: str) -> np.ndarray:
    """float32 C-contiguous [blocks, block] view of x[..., n]; TensorError if n is not a multiple of block."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % block:
        raise TensorError(
            f"cannot quantize rows of {x.shape[-1] if x.ndim else 0} values to {type_name}:"
            f" the row length must be a multiple of {block}"
        )
    return x.reshape(-1, block)


def f16_field(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The float16 field at byte `offset` of every block, as float32 [blocks, 1] (exact conversion)."""
    return blocks[:, offset : offset + 2].copy().view(np.float16).astype(np.float32)


@intrinsic
def _f32_bits(typingctx, value):
    """The 32 bits of a float32, as int32 (no conversion)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@exact_kernel
def nearest_int(value):
    """ggml's nearest_int: adding 1.5*2**23 leaves round(value) in the low mantissa bits.

    That is round-half-to-even for |value| <= 4194303 (ggml asserts this range); emulated bit for bit,
    so that the rare out-of-range argument gives the same (clamped-away) garbage as llama.cpp.
    """
    shifted = np.float32(value) + np.float32(12582912.0)
    return np.int32((_f32_bits(shifted) & np.int32(0x007FFFFF)) - np.int32(0x00400000))


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*292] -> float32[..., nb*256]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "Q8_K")
    d = blocks[:, :_QS].copy().view(np.float32)
    qs = blocks[:, _QS:_BSUMS].view(np.int8).astype(np.float32)
    return (d * qs).reshape(*np.shape(raw)[:-1], -1)


def quantize(x: np.ndarray) -> np.ndarray:
    """float32[..., n] -> uint8[..., n/256*292], as llama.cpp's quantize_row_q8_K (via activation.py)."""
    blocks = as_float_blocks(x, BLOCK, "Q8_K")
    flat = blocks.reshape(-1)
    qs = np.empty(flat.shape[0], dtype=np.int8)
    d = np.empty(blocks.shape[0], dtype=np.float32)
    bsums = np.empty(blocks.shape[0] * GROUPS, dtype=np.int32)
    quantize_q8_k(flat, qs, d, bsums)
    out = np.empty((blocks.shape[0], BLOCK_BYTES), dtype=np.uint8)
    out[:, :_QS] = d.reshape(-1, 1).view(np.uint8)
    out[:, _QS:_BSUMS] = qs.reshape(-1, BLOCK).view(np.uint8)
    # |bsum| <= 16*128, so int16 holds it exactly, as in ggml.
    out[:, _BSUMS:] = bsums.astype("<i2").reshape(-1, GROUPS).view(np.uint8)
    return out.reshape(*np.shape(x)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*292] -> out: float32[nb*256]."""
    qs = src.view(np.int8)
    for b in range(out.shape[0] // BLOCK):
        d = read_f32(src, b * BLOCK_BYTES)
        base = b * BLOCK_BYTES + _QS
        for j in range(BLOCK):
            out[b * BLOCK + j] = d * np.float32(qs[base + j])


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*292] weight row; aqs int8[n], ad float32[n/256], asum int32[n/16]: q8_k activation."""
    wq = w.view(np.int8)
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        wbase = b * BLOCK_BYTES + _QS
        abase = b * BLOCK
        total = np.int32(0)
        for j in range(BLOCK):
            total += np.int32(wq[wbase + j]) * np.int32(aqs[abase + j])
        acc += np.float32(total) * (read_f32(w, b * BLOCK_BYTES) * ad[b])
    return acc


QUANT = QuantType(
    name="Q8_K",
    act="q8_k",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    vec_dot=vec_dot,
    quantize=quantize,
)
