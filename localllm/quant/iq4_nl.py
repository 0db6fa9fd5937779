"""IQ4_NL: 32 weights per 18-byte block, 4-bit indices into a fixed non-linear table.

Block layout (ggml `block_iq4_nl`), little-endian:
  bytes 0..1    d        float16   scale
  bytes 2..17   qs[16]   4-bit indices: element l (l < 16) is the low nibble of qs[l], element l + 16
                         its high nibble
Weight = d * KVALUES[index], KVALUES = ggml's kvalues_iq4nl (16 int8 levels, denser near zero).

Pairs with q8_0 activations (llama.cpp's vec_dot_type Q8_0). IQ4_XS shares the table.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic

from . import QuantType
from .jit import exact_kernel, fast_kernel, read_f16
from .q8_k import VectorCode, as_blocks, f16_field

BLOCK = 32
BLOCK_BYTES = 18

# ggml-common.h kvalues_iq4nl
KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=np.int8)


def lookup_nibbles(qs: np.ndarray) -> np.ndarray:
    """uint8[nb, k, 16] packed index bytes -> int8[nb, k, 32] table values (low nibbles first)."""
    return KVALUES[np.concatenate([qs & 15, qs >> 4], axis=-1)]


def dequantize(raw: np.ndarray) -> np.ndarray:
    """uint8[..., nb*18] -> float32[..., nb*32]."""
    blocks = as_blocks(raw, BLOCK_BYTES, "IQ4_NL")
    values = lookup_nibbles(blocks[:, 2:].reshape(-1, 1, 16)).reshape(-1, BLOCK).astype(np.float32)
    return (f16_field(blocks, 0) * values).reshape(*np.shape(raw)[:-1], -1)


@exact_kernel
def dequantize_row(src, out):
    """src: uint8[nb*18] -> out: float32[nb*32]."""
    for b in range(out.shape[0] // BLOCK):
        d = read_f16(src, b * BLOCK_BYTES)
        base = b * BLOCK_BYTES + 2
        for l in range(16):
            q = src[base + l]
            out[b * BLOCK + l] = d * np.float32(KVALUES[q & 15])
            out[b * BLOCK + 16 + l] = d * np.float32(KVALUES[q >> 4])


@intrinsic
def block_dot(typingctx, w, qs, aqs, a):
    """<KVALUES[indices], aqs[a : a+32]> for the 16 index bytes at w[qs:], as int32."""
    sig = types.int32(w, qs, aqs, a)

    def codegen(context, builder, signature, args):
        w_, qs_, aqs_, a_ = args
        v = VectorCode(context, builder)
        packed = v.load(signature.args[0], w_, qs_, 16)
        values = v.lookup16(KVALUES, v.join(v.and_(packed, 15), v.shr(packed, 4)))
        acts = v.load(signature.args[2], aqs_, a_, BLOCK)
        return v.sum(v.scale_pairs(v.dot_pairs_signed(values, acts), v.constant(1, 16, 16)))

    return sig, codegen


@fast_kernel
def vec_dot(w, aqs, ad, asum):
    """w: uint8[nb*18] weight row; aqs int8[n], ad float32[n/32], asum int32[n/32]: q8_0 activation."""
    acc = np.float32(0.0)
    for b in range(aqs.shape[0] // BLOCK):
        total = block_dot(w, b * BLOCK_BYTES + 2, aqs, b * BLOCK)
        acc += np.float32(total) * (read_f16(w, b * BLOCK_BYTES) * ad[b])
    return acc


QUANT = QuantType(
    name="IQ4_NL",
    act="q8_0",
    dequantize=dequantize,
    dequantize_row=dequantize_row,
    vec_dot=vec_dot,
    quantize=None,
)
