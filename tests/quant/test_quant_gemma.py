"""Every tensor of the real Gemma 3 270M file dequantizes exactly as llama.cpp's gguf package does.

Both the NumPy reference (`dequantize`) and the Numba kernel the engine uses (`dequantize_row`, checked
on a sample of rows per tensor, since the engine dequantizes row by row) must match bit for bit.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from localllm import quant
from localllm.gguf import GGUFReader

CHUNK_ROWS = 16384


@pytest.fixture(scope="module")
def reader(gemma_path):
    with GGUFReader(gemma_path) as r:
        yield r


def test_every_gemma_tensor_dequantizes_bit_exactly(reader):
    seen = set()
    rng = np.random.default_rng(0)
    for info in reader.tensors.values():
        qt = quant.get(info.ggml_type.name)
        gtype = gguf.GGMLQuantizationType[info.ggml_type.name]
        raw = reader.tensor_bytes(info.name)
        for start in range(0, raw.shape[0], CHUNK_ROWS):
            chunk = raw[start : start + CHUNK_ROWS]
            ours = qt.dequantize(chunk)
            theirs = gguf.quants.dequantize(chunk, gtype).reshape(ours.shape)
            assert ours.dtype == np.float32
            np.testing.assert_array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32), err_msg=info.name)
        out = np.empty(info.shape[0], dtype=np.float32)
        for row in rng.choice(raw.shape[0], size=min(8, raw.shape[0]), replace=False):
            qt.dequantize_row(raw[row], out)
            expected = qt.dequantize(raw[row : row + 1])[0]
            np.testing.assert_array_equal(out.view(np.uint32), expected.view(np.uint32), err_msg=f"{info.name} row {row}")
        seen.add(info.ggml_type.name)
    assert seen == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}
