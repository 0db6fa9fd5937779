"""The GGUF format as tables: magic, versions, metadata value types, ggml tensor types.

Facts from the GGUF specification (ggml/docs/gguf.md) and ggml.h; the numbers are the file format.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
WRITE_VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS


class ValueType(enum.IntEnum):
    """Metadata value types (uint32 on disk)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size scalar value types -> numpy dtype string (little-endian).
SCALAR_DTYPES: dict[ValueType, str] = {
    ValueType.UINT8: "<u1",
    ValueType.INT8: "<i1",
    ValueType.UINT16: "<u2",
    ValueType.INT16: "<i2",
    ValueType.UINT32: "<u4",
    ValueType.INT32: "<i4",
    ValueType.FLOAT32: "<f4",
    ValueType.BOOL: "<u1",
    ValueType.UINT64: "<u8",
    ValueType.INT64: "<i8",
    ValueType.FLOAT64: "<f8",
}


@dataclass(frozen=True)
class GGMLTypeInfo:
    """One ggml tensor type: `block_size` elements are stored in `type_size` bytes."""

    name: str
    type_id: int
    block_size: int
    type_size: int

    def row_bytes(self, n_elements: int) -> int:
        """Bytes of a row of n_elements (n_elements must be a multiple of block_size)."""
        return n_elements // self.block_size * self.type_size


# Every type a GGUF file may name (ggml.h `enum ggml_type`); ids 4, 5 (Q4_2, Q4_3) were removed upstream.
GGML_TYPES: dict[int, GGMLTypeInfo] = {
    t.type_id: t
    for t in (
        GGMLTypeInfo("F32", 0, 1, 4),
        GGMLTypeInfo("F16", 1, 1, 2),
        GGMLTypeInfo("Q4_0", 2, 32, 18),
        GGMLTypeInfo("Q4_1", 3, 32, 20),
        GGMLTypeInfo("Q5_0", 6, 32, 22),
        GGMLTypeInfo("Q5_1", 7, 32, 24),
        GGMLTypeInfo("Q8_0", 8, 32, 34),
        GGMLTypeInfo("Q8_1", 9, 32, 36),
        GGMLTypeInfo("Q2_K", 10, 256, 84),
        GGMLTypeInfo("Q3_K", 11, 256, 110),
        GGMLTypeInfo("Q4_K", 12, 256, 144),
        GGMLTypeInfo("Q5_K", 13, 256, 176),
        GGMLTypeInfo("Q6_K", 14, 256, 210),
        GGMLTypeInfo("Q8_K", 15, 256, 292),
        GGMLTypeInfo("IQ2_XXS", 16, 256, 66),
        GGMLTypeInfo("IQ2_XS", 17, 256, 74),
        GGMLTypeInfo("IQ3_XXS", 18, 256, 98),
        GGMLTypeInfo("IQ1_S", 19, 256, 50),
        GGMLTypeInfo("IQ4_NL", 20, 32, 18),
        GGMLTypeInfo("IQ3_S", 21, 256, 110),
        GGMLTypeInfo("IQ2_S", 22, 256, 82),
        GGMLTypeInfo("IQ4_XS", 23, 256, 136),
        GGMLTypeInfo("I8", 24, 1, 1),
        GGMLTypeInfo("I16", 25, 1, 2),
        GGMLTypeInfo("I32", 26, 1, 4),
        GGMLTypeInfo("I64", 27, 1, 8),
        GGMLTypeInfo("F64", 28, 1, 8),
        GGMLTypeInfo("IQ1_M", 29, 256, 56),
        GGMLTypeInfo("BF16", 30, 1, 2),
        GGMLTypeInfo("TQ1_0", 34, 256, 54),
        GGMLTypeInfo("TQ2_0", 35, 256, 66),
        GGMLTypeInfo("MXFP4", 39, 32, 17),
    )
}
GGML_TYPES_BY_NAME: dict[str, GGMLTypeInfo] = {t.name: t for t in GGML_TYPES.values()}

# general.file_type (llama_ftype) -> the name llama.cpp prints for it.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE",
}
