"""How every localllm Numba kernel is compiled, and the scalar primitives the exact kernels share.

Numba ships LLVM's SLP vectorizer switched off (`NUMBA_SLP_VECTORIZE=0`). Our block dot products are short
fixed-length integer loops (32 int8 products summed, then scaled) that only the SLP vectorizer turns into
packed AVX2/AVX-512 instructions: measured on this machine kind, a Q8_0 matvec runs 5x faster with it on.
`configure_numba()` switches it on (and keys Numba's on-disk cache on it and on the kernel sources, below);
it is idempotent and runs when the first kernel is asked for (quant.get, the CPU backend's kernel table,
CPUBackend), never at import. It changes how Numba optimises code compiled from then on and nothing else.

Decorators (each kernel's on-disk cache is switched on by configure_numba: the cache locator it installs
must be in place when a kernel's cache is made, and a kernel decorated before that is registered here):
- `exact_kernel`: IEEE arithmetic as written (no fast-math), for dequantizers and quantizers that must
  equal llama.cpp's reference bit for bit (fast-math would contract a*b+c into an FMA and change roundings).
- `fast_kernel`: fast-math allowed, for dot products whose float reductions may be reordered.
- `cached_kernel(**options)`: numba.njit with the given options, cached the same way.
"""

from __future__ import annotations

import hashlib
import threading
from functools import lru_cache
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# ----- the kernel sources: one hash over every file a kernel can inline -----
#
# Numba keeps a cached kernel while *its own* file is unchanged, but our kernels inline intrinsics and
# helpers from other files (the CPU backend's vector code, quant's block helpers, this module): after an
# edit there, a type's cached vec_dot would stay the old code while freshly generated drivers (whose file
# names carry this hash) use the new one, so the two could disagree (seen during development, until the
# cache was emptied). So for the kernel files the cache's source stamp also carries a hash of all of them
# (and the SLP setting): any edit there recompiles every kernel once.

_PACKAGE = Path(__file__).resolve().parent
_KERNEL_DIRS = tuple(
    _PACKAGE / sub for sub in ("quant", "backends/cpu", "backends/cpu/quant_kernels", "backends/cpu/templates")
)
_KERNEL_FILES = (Path(__file__).resolve(),)


@lru_cache(maxsize=1)
def kernel_sources_hash() -> str:
    """16 hex digits over the names and bytes of every kernel source and template (the files of
    _KERNEL_DIRS and this module): the generated drivers' file names and the cache stamps carry it."""
    digest = hashlib.sha256()
    sources = [p for folder in _KERNEL_DIRS for pattern in ("*.py", "*.py.tmpl") for p in folder.glob(pattern)]
    paths = sorted(sources) + list(_KERNEL_FILES)  # (not "*.py*": an editor's swap or backup file is no source)
    for path in paths:
        digest.update(path.relative_to(_PACKAGE).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _is_kernel_file(py_file) -> bool:
    path = Path(py_file).resolve()
    return path.parent in _KERNEL_DIRS or path in _KERNEL_FILES


def _keyed_on_kernel_sources(base):
    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not _is_kernel_file(py_file):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return (super().get_source_stamp(), kernel_sources_hash(), numba.config.SLP_VECTORIZE)

    Locator.__name__ = f"KernelSources{base.__name__}"
    return Locator


def _install_cache_locators() -> None:
    """Put the locators keyed on the kernel sources first in Numba's list (not public API: if it moves,
    this does nothing and Numba's own locators key on each kernel's file alone, as before)."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None)
    locators = getattr(impl, "_locator_classes", None)
    names = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
    if not isinstance(locators, list) or not all(hasattr(caching, n) for n in names):
        return
    if any(getattr(c, "__name__", "").startswith("KernelSources") for c in locators):
        return
    locators[:0] = [_keyed_on_kernel_sources(getattr(caching, n)) for n in names]


_configured = False
_configure_lock = threading.Lock()  # two threads creating backends at once configure once
_uncached: list = []  # kernels decorated before configure_numba: their cache is switched on by it


def configure_numba() -> None:
    """Numba as every localllm kernel is compiled: the SLP vectorizer on, the on-disk cache keyed on the
    kernel sources and on that setting (so a kernel compiled without it is never served here), and the
    cache of every kernel decorated so far switched on. Idempotent; call it before compiling a kernel."""
    global _configured
    if _configured:
        return
    with _configure_lock:
        if _configured:
            return
        numba.config.SLP_VECTORIZE = 1
        _install_cache_locators()
        while _uncached:
            _uncached.pop().enable_caching()
        _configured = True


def cached_kernel(fn=None, **options):
    """numba.njit(**options) with Numba's on-disk cache, which configure_numba switches on (at once if it
    has run): the cache is made with the locator configure_numba installs."""

    def decorate(py_func):
        dispatcher = numba.njit(cache=False, **options)(py_func)
        with _configure_lock:  # a module imported on another thread while configure_numba runs
            if _configured:
                dispatcher.enable_caching()
            else:
                _uncached.append(dispatcher)
        return dispatcher

    return decorate(fn) if fn is not None else decorate


def exact_kernel(fn=None, *, parallel: bool = False):
    deco = cached_kernel(nogil=True, parallel=parallel, error_model="numpy")
    return deco(fn) if fn is not None else deco


def fast_kernel(fn=None, *, parallel: bool = False):
    deco = cached_kernel(nogil=True, parallel=parallel, fastmath=True, error_model="numpy")
    return deco(fn) if fn is not None else deco


@intrinsic
def f16_to_f32(typingctx, bits):
    """IEEE half given as its 16 bits (any integer type) -> float32, exactly (LLVM fpext: F16C on x86)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        (value,) = args
        as_i16 = builder.trunc(value, ir.IntType(16)) if value.type.width > 16 else builder.zext(value, ir.IntType(16)) if value.type.width < 16 else value
        return builder.fpext(builder.bitcast(as_i16, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma.f32), float32. A call, not a reassociable fadd: a loop
    `acc = fma_f32(x, y, acc)` sums in its written order in every kernel it is inlined into (a fast-math
    `acc += x * y` was reordered differently in different drivers, measured on IQ4_NL). In a fast-math
    kernel Numba flags the call too, as it does q4_k's and q6_k's accumulation steps, which rely on the
    same: LLVM keeps a flagged fma a single fma."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None
    sig = types.float32(a, b, c)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32] * 3), "llvm.fma.f32")
        return builder.call(fma, args)

    return sig, codegen


@intrinsic
def u32_as_f32(typingctx, bits):
    """Reinterpret the 32 bits of an unsigned integer as a float32 (no conversion)."""
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        (value,) = args
        as_i32 = builder.trunc(value, ir.IntType(32)) if value.type.width > 32 else value
        return builder.bitcast(as_i32, ir.FloatType())

    return sig, codegen


@intrinsic
def f32_bits(typingctx, value):
    """The 32 bits of a float32 as an int32 (no conversion): with the sign bit cleared, their order
    is the order of the magnitudes, for every value but NaN, which an integer max reduces in vector
    registers where a float compare-and-keep loop stays scalar (quant.activation)."""
    if not isinstance(value, types.Float) or value.bitwidth != 32:
        return None
    sig = types.int32(value)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@exact_kernel
def read_f16(buf, offset):
    """float32 value of the little-endian half stored at buf[offset:offset+2] (buf: uint8[:])."""
    return f16_to_f32(np.uint16(buf[offset]) | (np.uint16(buf[offset + 1]) << np.uint16(8)))


@exact_kernel
def read_f32(buf, offset):
    """float32 stored little-endian at buf[offset:offset+4] (buf: uint8[:])."""
    bits = (
        np.uint32(buf[offset])
        | (np.uint32(buf[offset + 1]) << np.uint32(8))
        | (np.uint32(buf[offset + 2]) << np.uint32(16))
        | (np.uint32(buf[offset + 3]) << np.uint32(24))
    )
    return u32_as_f32(bits)


@intrinsic
def f32_to_f16_bits(typingctx, value):
    """float32 -> the 16 bits of the nearest float16 (round to nearest even, as F16C and numpy do)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        (x,) = args
        return builder.bitcast(builder.fptrunc(x, ir.HalfType()), ir.IntType(16))

    return sig, codegen


@exact_kernel
def round_to_f16(value):
    """float32 value rounded to the nearest float16, returned as float32."""
    return f16_to_f32(f32_to_f16_bits(np.float32(value)))
