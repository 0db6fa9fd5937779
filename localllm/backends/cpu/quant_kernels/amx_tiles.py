"""AMX's tile unit as Numba intrinsics: whether this process may use it, and its instructions (tile
configuration, loads, stores, zeroing, `tdpbf16ps`), with a cache-line prefetch, for the kernels of
amx.py.

The OS hands out the tile registers per process on request (Linux 5.16+: arch_prctl
ARCH_REQ_XCOMP_PERM); `available()` asks once. Without that grant the first tile instruction kills the
process (SIGILL), so no kernel may run one before it. Tile numbers are immediates of the instructions:
each factory below makes one intrinsic per tile (or per three tiles, for a product).
"""

from __future__ import annotations

import ctypes
import platform
import sys
from functools import lru_cache

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ....jit import exact_kernel
from . import vector
from .vector import PREFETCH_LOCALITY, _target_features

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def target_has_amx() -> bool:
    """Whether Numba's compile target has the tile unit with bfloat16 products (AMX-TILE, AMX-BF16)."""
    from numba.core.registry import cpu_target

    # vector.VECTOR_ISA read when asked: the per-path tests set it for the kernels they compile.
    return vector.VECTOR_ISA == "auto" and {"+amx-tile", "+amx-bf16"} <= _target_features(cpu_target.target_context)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether this process may run the tile kernels: the target has AMX and the OS granted the tile
    registers (asked once; a refusal leaves float_panels' kernels)."""
    if sys.platform != "linux" or platform.machine() != "x86_64" or not target_has_amx():
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_BYTES = _I8.as_pointer()


def _declare(builder, name: str, args: list):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), args), name)


def _byte_pointer(context, builder, array_type, array, offset):
    """i8* to byte `offset` of an array's data."""
    data = builder.bitcast(context.make_array(array_type)(context, builder, array).data, _BYTES)
    return builder.gep(data, [offset if offset.type.width == 64 else builder.sext(offset, _I64)])


@intrinsic
def tile_configure(typingctx, config):
    """ldtilecfg from a uint8[64] array (palette 1, then each tile's bytes per row and rows)."""
    def codegen(context, builder, signature, args):
        pointer = _byte_pointer(context, builder, signature.args[0], args[0], _I64(0))
        builder.call(_declare(builder, "llvm.x86.ldtilecfg", [_BYTES]), [pointer])
        return context.get_dummy_value()

    return types.void(config), codegen


@intrinsic
def tile_release(typingctx):
    """tilerelease: the tile state back to its initial (cheap to save on a context switch) state."""
    def codegen(context, builder, signature, args):
        builder.call(_declare(builder, "llvm.x86.tilerelease", []), [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def prefetch_line(typingctx, array, offset):
    """Ask for the cache line at byte `offset` of an array (into the level PREFETCH_LOCALITY says)."""
    def codegen(context, builder, signature, args):
        pointer = _byte_pointer(context, builder, signature.args[0], args[0], args[1])
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_BYTES, _I32, _I32, _I32]), "llvm.prefetch.p0i8")
        builder.call(prefetch, [pointer, _I32(0), _I32(PREFETCH_LOCALITY), _I32(1)])
        return context.get_dummy_value()

    return types.void(array, offset), codegen


def tile_zero(tile: int):
    @intrinsic
    def zero(typingctx):
        def codegen(context, builder, signature, args):
            builder.call(_declare(builder, "llvm.x86.tilezero", [_I8]), [_I8(tile)])
            return context.get_dummy_value()

        return types.void(), codegen

    return zero


def tile_move(tile: int, name: str):
    """tileloadd / tilestored of tile `tile` at byte `offset` of an array, rows `stride` bytes apart."""
    @intrinsic
    def move(typingctx, array, offset, stride):
        def codegen(context, builder, signature, args):
            array_, offset_, stride_ = args
            pointer = _byte_pointer(context, builder, signature.args[0], array_, offset_)
            stride_ = builder.sext(stride_, _I64) if stride_.type.width < 64 else stride_
            builder.call(_declare(builder, name, [_I8, _BYTES, _I64]), [_I8(tile), pointer, stride_])
            return context.get_dummy_value()

        return types.void(array, offset, stride), codegen

    return move


def tile_dot(sums: int, a: int, b: int):
    """tdpbf16ps: tile `sums` += tile a (bfloat16 rows) x tile b (bfloat16 pairs)."""
    @intrinsic
    def dot(typingctx):
        def codegen(context, builder, signature, args):
            builder.call(_declare(builder, "llvm.x86.tdpbf16ps", [_I8, _I8, _I8]), [_I8(sums), _I8(a), _I8(b)])
            return context.get_dummy_value()

        return types.void(), codegen

    return dot


@exact_kernel
def set_tile(config, tile, rows, row_bytes):
    """Tile `tile`'s rows and bytes per row in a uint8[64] configuration (palette 1's layout)."""
    config[16 + 2 * tile] = row_bytes
    config[48 + tile] = rows
