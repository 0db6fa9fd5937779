"""Regenerate iq4_reference.npz: IQ4_NL / IQ4_XS blocks from ggml's own C quantizers.

Usage: python gen_iq4_reference.py /path/to/libggml-base.so

Where the checked-in file came from: ggml's own C quantizers (ggml-org/ggml at commit d99724f2b141,
a portable build: no FMA contraction, the same arithmetic as llama.cpp's portable build), called on the
rows below. No ggml code or build recipe is part of this repository: the .npz is data, an oracle
independent of our implementation. The file holds float32 rows `x` and, per type, the bytes of
`quantize_iq4_nl` / `quantize_iq4_xs` (src, dst, nrows, n_per_row, imatrix=NULL): the functions
llama-quantize reaches through ggml_quantize_chunk.

Rows: the 18 rows of the K-quant reference (tests/data/reference/quant/Q4_K.npz, described in its
manifest), then 64 rows of Gemma 3 270M's blk.0.ffn_down dequantized (real weights), then edge cases.
"""

import ctypes
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def rows() -> np.ndarray:
    base = np.load(HERE.parent / "reference" / "quant" / "Q4_K.npz")["x"]  # [18, 1024]
    from localllm.gguf import GGUFReader
    from localllm.hub.default_model import default_model_path
    from localllm.quant import get

    with GGUFReader(default_model_path()) as reader:
        info = reader.tensors["blk.0.ffn_down.weight"]  # Q6_K, 2048 per row
        real = get(info.ggml_type.name).dequantize(reader.tensor_bytes(info.name)[:64])[:, :1024]
    rng = np.random.default_rng(7)
    edge = np.zeros((6, 1024), dtype=np.float32)
    edge[0, ::32] = 1e-16  # below GROUP_MAX_EPS: zero scales
    edge[1] = rng.normal(0, 1, 1024) * (np.arange(1024) % 64 < 32)  # alternate zero sub-blocks
    edge[2] = -np.abs(rng.normal(0, 1, 1024))  # all negative (max element negative)
    edge[3] = np.abs(rng.normal(0, 1, 1024))  # all positive
    edge[4] = rng.normal(0, 1, 1024) * np.repeat(np.logspace(-4, 2, 32), 32)  # sub-block scale sweep
    edge[5] = rng.standard_cauchy(1024) * 0.01  # heavy tails
    return np.ascontiguousarray(np.concatenate([base, real, edge]).astype(np.float32))


def main(lib_path: str) -> None:
    lib = ctypes.CDLL(lib_path)
    x = rows()
    out = {"x": x}
    for name, fn, row_bytes in (("IQ4_NL", lib.quantize_iq4_nl, 1024 // 32 * 18), ("IQ4_XS", lib.quantize_iq4_xs, 1024 // 256 * 136)):
        fn.restype = ctypes.c_size_t
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        dst = np.zeros((x.shape[0], row_bytes), dtype=np.uint8)
        size = fn(x.ctypes.data, dst.ctypes.data, x.shape[0], x.shape[1], None)
        assert size == dst.nbytes
        out[name] = dst
    np.savez_compressed(HERE / "iq4_reference.npz", **out)


if __name__ == "__main__":
    main(sys.argv[1])
