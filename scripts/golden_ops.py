#!/usr/bin/env python3
"""Write (or check) the bit-exact fingerprint of every CPU backend op on every quant type.

The restructure of the kernels (issue 27) promised the same bits. scripts/golden_logits.py checks that on
one model (Gemma, Q4_K_M); this checks every type in `quant.supported_names()` and every op, on small
inputs drawn from a fixed seed, through the public interface only (CPUBackend, Weight, quant.get), so the
same script runs against the code before and after the restructure:
- per type (N = 38 rows, so the 16-row tiles leave a tail; K = 512): matmul at T in MATMUL_ROWS, in the
  full tier and in the basic tier (`backend.basic_tier = True`: row by row, no re-laid matrices);
  matmul_rows at T in ROWS_ROWS; embed of 5 rows;
- once: rms_norm, rope (normal and NeoX), gated_act (silu, gelu_tanh), each small (the serial kernels) and
  large (the parallel ones); attention (decode at start > 0, small and large, prefill of 40 rows, sliding
  window for both paths) in both tiers; kv_store (numpy's rounding under 16 rows, the kernel from 16).
Each entry is the sha256 of the output's float32 (kv_store: float16) bits. Entries are grouped under the
host's vector target ("avx512_vnni", "avx2", "generic", as golden_logits.vector_isa() names it): the
fingerprint is only ever compared with one taken on the same kind of target.

Recorded from the code before the restructure (commit 02d0705, checked out at /tmp/before):

    cd /tmp/before && OPENBLAS_CORETYPE=Haswell LOCALLLM_COMPILE=foreground PYTHONPATH=/tmp/before \\
        python /work/main/scripts/golden_ops.py --write /work/main/tests/data/golden/ops.json
    # the AVX2 path (compiles everything: several minutes), with its own caches
    cd /tmp/before && NUMBA_CPU_NAME=haswell \\
        NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,+sse,+mmx,+cx16,+lzcnt,+movbe" \\
        NUMBA_CACHE_DIR=/tmp/numba-haswell-before LOCALLLM_KERNEL_DIR=/tmp/kd-haswell-before \\
        OPENBLAS_CORETYPE=Haswell LOCALLLM_COMPILE=foreground PYTHONPATH=/tmp/before \\
        python /work/main/scripts/golden_ops.py --write /work/main/tests/data/golden/ops.json

One deliberate change since: the Q8_K products. In the code before, on AVX-512 VNNI, the process that
compiled their kernels computed other bits (up to 17 ulp) than every later process, which loaded them from
Numba's cache (the cached driver fused vec_dot's `acc += total * scale` into an FMA, the fresh one did not).
Q8_K's vec_dot now writes the fma out (backends/cpu/quant_kernels/q8_k.py), so every process computes the
cached bits: the avx512_vnni entries are unchanged, and the 19 avx2 Q8_K entries (where the code before
never fused) were re-recorded from the code after, the haswell command above with PYTHONPATH=/work/main.

Two more since (2026-11-26), both target keys re-recorded from the working tree with the two commands
above (PYTHONPATH and the cache folders of the current code): IQ4_NL's products now keep Q8_0's eight
float lanes (its matmul and matmul_rows entries), and SiLU divides exactly (gated_act/silu): in fast-math
code LLVM had turned the division into vrcpps plus a Newton step, whose bits differ between Intel and AMD
CPUs, so the entries recorded on AMD failed on an Intel machine. (The softmax of prefill attention now sums
in a fixed order for the same reason; its entries came out unchanged.)

MXFP4's entries (a type added on 2026-11-27, its products then moved onto IQ4_NL's vector kernels the same
day) were recorded from the code that added them, with the two commands
above from /work/main (OPENBLAS_CORETYPE=Haswell for the avx512_vnni run too: prefill attention's BLAS products
depend on OpenBLAS's kernel); every other entry came out unchanged.

The avx512_amx entries (2026-11-27, BF16's products moved onto AMX's tiles where the CPU has them) were
recorded from the code that made the move, on an Intel Xeon with AMX, with the first command above from
/work/main; every entry but BF16's matmul and matmul_rows ones equals its avx512_vnni twin (checked when
recorded), those differ by design (amx.py's order).

The float types' products (2026-11-28, issue 28: F32, F16 and BF16 matrices moved onto float_panels.py,
16 rows as lanes, each output one chain of fused multiply-adds): their matmul and matmul_rows entries
were re-recorded from the code that made the move, avx512_vnni and avx2 with the two commands above from
/work/main (every other entry came out unchanged, and the new avx2 float entries equal the avx512_vnni
ones: the chains' order does not depend on the vector width); the avx512_amx F16 and F32 entries were
copied from the new avx512_vnni ones (no AMX machine was at hand; before the move every avx512_amx entry
but BF16's products equalled its avx512_vnni twin, and AMX's BF16 products did not change).

AVX2's tiles (2026-11-28, issue 28: Q4_0, Q5_0, Q4_1 and Q5_1 take legacy_tiles' kernels on AVX2 from 16
rows, where Q4_1 and Q5_1 had gone through BLAS from 32): the four avx2 entries matmul/Q4_1/T=33 and
matmul/Q5_1/T=33 (basic and full) re-recorded with the haswell command above from /work/main; they now
equal their avx512_vnni twins, and every other entry came out unchanged.

The K-quant and IQ4_XS tiles on AVX2 (2026-11-28, issue 28: each 512-bit product as two 256-bit halves,
IQ4_XS's values kept signed there; Q2_K, Q3_K and IQ4_XS had gone through BLAS from 32 rows): the six
avx2 entries matmul/{Q2_K,Q3_K,IQ4_XS}/T=33 (basic and full) re-recorded with the haswell command above
from /work/main; they now equal their avx512_vnni twins, and every other entry came out unchanged.

Q4_0's block sums (2026-11-29, issue 28: its products take one fused multiply-add per block, the order
of llama.cpp's re-laid AVX2 Q4_0 kernels, instead of Q8_0's eight float lanes): the 21 Q4_0 matmul and
matmul_rows entries re-recorded on an AVX2-only machine (AMD Zen 3) with the first command above from
/work/main, every other entry unchanged; the avx512_vnni and avx512_amx Q4_0 entries copied from them (no
AVX-512 machine was at hand; every one of the 21 had equalled its avx2 twin in all three keys, and the new
order is the same operations on every vector width: exact integers, then one fma per block and row).
IQ4_NL's block sums (the same day, the same reason: llama.cpp re-lays IQ4_NL on AVX2 too) were recorded
the same way: its 21 matmul and matmul_rows entries changed, every other entry came out unchanged, and
the avx512_vnni and avx512_amx IQ4_NL entries, each equal to its avx2 twin before, were copied.

Checked on the code after with `--check tests/data/golden/ops.json` (PYTHONPATH=/work/main, from
/work/main; the haswell run with /tmp/numba-haswell-after and /tmp/kd-haswell-after).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zlib
from pathlib import Path

import numpy as np

SEED = 27
N_ROWS, K = 38, 512  # 38 = 2 x 16 + 6: the 16-row tiles leave a tail
MATMUL_ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 33)
ROWS_ROWS = (2, 5, 17)
EMBED_IDS = np.array([0, 37, 5, 5, 20], dtype=np.int32)

def vector_isa() -> str:
    """The host's vector target, as scripts/golden_logits.py names it (the same keys in both files), and
    "avx512_amx" for an AVX-512 VNNI target whose process may use AMX's tiles: BF16's products run on them
    there (backends/cpu/quant_kernels/amx.py), other bits."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("golden_logits", Path(__file__).with_name("golden_logits.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    isa = module.vector_isa()
    try:
        from localllm.backends.cpu.quant_kernels import amx
    except ImportError:  # a tree from before BF16 moved onto AMX (the recording commands above)
        return isa
    return "avx512_amx" if isa == "avx512_vnni" and amx.available() else isa


def rng_for(*tags) -> np.random.Generator:
    """A generator fixed by SEED and the tags, so each entry's inputs do not depend on which ran before."""
    return np.random.default_rng([SEED, zlib.crc32(repr(tags).encode())])


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def weight_rows(name: str) -> np.ndarray:
    """uint8[N_ROWS, row bytes]: random normal rows, quantized (every type localllm supports has a quantizer)."""
    from localllm import quant

    rng = rng_for("weight", name)
    return np.ascontiguousarray(quant.get(name).quantize(rng.standard_normal((N_ROWS, K)).astype(np.float32)))


def make_backend(basic: bool):
    from localllm.backends.cpu import CPUBackend

    backend = CPUBackend(threads=2)
    backend.basic_tier = basic  # before: a plain attribute; after: a property with a setter
    return backend


def product_prints(backend, name: str, tier: str) -> dict:
    """{key: sha256} of matmul at every T (and, in the full tier, matmul_rows and embed) of one type."""
    from localllm.backends.base import Weight

    w = backend.upload(Weight(f"blk.0.golden_{name}.weight", name, (K, N_ROWS), weight_rows(name)))
    prints = {}
    for t in MATMUL_ROWS:
        x = rng_for("x", name, t).standard_normal((t, K)).astype(np.float32)
        out = np.zeros((t, N_ROWS), dtype=np.float32)
        backend.matmul(w, x, out)
        prints[f"matmul/{name}/T={t}/{tier}"] = digest(out)
    if tier == "basic":
        return prints
    for t in ROWS_ROWS:
        x = rng_for("rows", name, t).standard_normal((t, K)).astype(np.float32)
        out = np.zeros((t, N_ROWS), dtype=np.float32)
        backend.matmul_rows(w, x, out)
        prints[f"matmul_rows/{name}/T={t}"] = digest(out)
    out = np.zeros((EMBED_IDS.shape[0], K), dtype=np.float32)
    backend.embed(w, EMBED_IDS, out)
    prints[f"embed/{name}"] = digest(out)
    return prints


def small_op_prints(backend, tier: str) -> dict:
    """rms_norm, rope and gated_act: small (serial kernels) and large (parallel) inputs."""
    prints = {}
    for size, (rows, d) in {"small": (2, 64), "large": (64, 1024)}.items():
        rng = rng_for("rms_norm", size)
        x, weight = rng.standard_normal((rows, d)).astype(np.float32), rng.standard_normal(d).astype(np.float32)
        out = np.zeros_like(x)
        backend.rms_norm(x, weight, 1e-6, out)
        prints[f"rms_norm/{size}/{tier}"] = digest(out)
        gate, up = rng.standard_normal((rows, d)).astype(np.float32) * 4, rng.standard_normal((rows, d)).astype(np.float32)
        for kind in ("silu", "gelu_tanh"):
            out = np.zeros_like(gate)
            backend.gated_act(gate, up, out, kind)
            prints[f"gated_act/{kind}/{size}/{tier}"] = digest(out)
    for size, (rows, heads, d, n_rot) in {"small": (2, 2, 64, 64), "large": (40, 8, 256, 128)}.items():
        rng = rng_for("rope", size)
        base_x = rng.standard_normal((rows, heads, d)).astype(np.float32)
        positions = (np.arange(rows) + 7).astype(np.int32)
        for neox in (False, True):
            x = base_x.copy()
            backend.rope(x, positions, n_rot, 10000.0, neox)
            prints[f"rope/{'neox' if neox else 'normal'}/{size}/{tier}"] = digest(x)
    return prints


# name: (query rows T, start, query heads, key heads, head dim, window)
ATTENTION_CASES = {
    "decode_small": (1, 5, 4, 1, 64, 0),
    "decode_large": (1, 300, 8, 2, 128, 0),  # enough work for the parallel kernel
    "rows_3": (3, 60, 4, 2, 64, 0),
    "prefill_40": (40, 0, 4, 2, 64, 0),  # BLAS attention from 32 rows
    "window_rows_3": (3, 60, 4, 2, 64, 16),
    "window_prefill_40": (40, 20, 4, 2, 64, 16),
}


def attention_prints(backend, tier: str) -> dict:
    prints = {}
    for case, (t, start, hq, hkv, d, window) in ATTENTION_CASES.items():
        rng = rng_for("attention", case)
        n_ctx = start + t + 3
        q = rng.standard_normal((t, hq, d)).astype(np.float32)
        cache_k = rng.standard_normal((n_ctx, hkv, d)).astype(np.float16)
        cache_v = rng.standard_normal((n_ctx, hkv, d)).astype(np.float16)
        out = np.zeros_like(q)
        backend.attention(q, cache_k, cache_v, start, 1.0 / np.sqrt(d), window, out)
        prints[f"attention/{case}/{tier}"] = digest(out)
    return prints


def kv_store_prints(backend) -> dict:
    prints = {}
    for rows in (3, 40):  # numpy's float16 rounding below 16 rows, the store kernel from 16
        rng = rng_for("kv_store", rows)
        k, v = (rng.standard_normal((rows, 2, 64)).astype(np.float32) * 100 for _ in range(2))
        cache_k, cache_v = np.zeros((rows + 9, 2, 64), np.float16), np.zeros((rows + 9, 2, 64), np.float16)
        backend.kv_store(cache_k, cache_v, k, v, 5)
        prints[f"kv_store/T={rows}"] = digest(np.stack([cache_k, cache_v]))
    return prints


def fingerprint() -> dict:
    """{entry key: sha256} of every op on this host's target, both tiers (each on its own backend)."""
    from localllm import quant

    prints = {}
    for tier in ("full", "basic"):
        backend = make_backend(basic=tier == "basic")
        for name in quant.supported_names():
            prints.update(product_prints(backend, name, tier))
        prints.update(small_op_prints(backend, tier))
        prints.update(attention_prints(backend, tier))
        if tier == "full":
            prints.update(kv_store_prints(backend))
    return prints


def compare(expected: dict, now: dict) -> list[str]:
    """What differs: changed entries, and entries only one side has."""
    return ([f"changed: {key}" for key in sorted(expected) if key in now and now[key] != expected[key]]
            + [f"missing now: {key}" for key in sorted(set(expected) - set(now))]
            + [f"not recorded: {key}" for key in sorted(set(now) - set(expected))])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path)
    group.add_argument("--check", type=Path)
    args = parser.parse_args()
    isa = vector_isa()
    now = fingerprint()
    if args.write:
        data = json.loads(args.write.read_text()) if args.write.exists() else {}
        data[isa] = now
        args.write.parent.mkdir(parents=True, exist_ok=True)
        args.write.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(now)} {isa} entries to {args.write}")
        return 0
    recorded = json.loads(args.check.read_text())
    if isa not in recorded:
        print(f"no {isa} fingerprint in {args.check}")
        return 1
    differences = compare(recorded[isa], now)
    print(f"{isa}: {len(now)} entries identical" if not differences else "\n".join(differences))
    return 0 if not differences else 1


if __name__ == "__main__":
    sys.exit(main())
