"""Record llama.cpp's logits on tiny random models of each architecture: the oracle that
tests/model/test_llamacpp_archs.py holds our engine to.

For each architecture, tests/tiny_models.py (`oracle_model`) writes a small random model with our GGUF
writer in each type of `oracle_types` (Q4_K_M and, for mixtures of experts, MXFP4_MOE: our `quantize` of
the F32 file, byte-identical to llama-quantize's), and llama.cpp evaluates each prompt of ORACLE_PROMPTS from position 0 with logits at every position. One file per
architecture, `<arch>.npz`: `logits_<type>` float16 [sum of prompt lengths, vocab], `sha256_<type>` (the
model file's digest, so the test can tell that it rebuilt the same file), `prompts`, and `llama_cpp`
(version and system line of the library that computed them).

llama.cpp comes from llama-cpp-python 0.3.36: `CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF" pip install
llama-cpp-python==0.3.36`, or its sdist's python package on PYTHONPATH with LLAMA_CPP_LIB_PATH naming a
CMake build of its vendor/llama.cpp (on AMX machines configure that build with -mno-amx-tile
-mno-amx-int8 -mno-amx-bf16: llama.cpp's AMX path crashes there). Run from the repository root:

    python scripts/llamacpp_arch_logits.py [--archs olmo2 granite] [--out tests/data/llamacpp_archs]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tiny_models import ORACLE_PROMPTS as PROMPTS, TINY_ARCHS, file_sha256, oracle_model, oracle_types  # noqa: E402

N_CTX = 64


def llama_cpp_logits(path: Path) -> np.ndarray:
    """llama.cpp's logits float32 [sum of prompt lengths, vocab], each prompt from position 0."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2,
                          logits_all=True, flash_attn=False, verbose=False)
    rows = []
    for prompt in PROMPTS:
        llm.reset()
        llm.eval(prompt)
        rows.append(np.array(llm.scores[: len(prompt)], dtype=np.float32))
    llm.close()
    return np.concatenate(rows)


def record(arch: str, out: Path) -> None:
    import llama_cpp

    data = {
        "prompts": np.array([t for p in PROMPTS for t in p], dtype=np.int32),
        "prompt_lengths": np.array([len(p) for p in PROMPTS], dtype=np.int32),
        "llama_cpp": np.array(f"llama-cpp-python {llama_cpp.__version__}; "
                              f"{llama_cpp.llama_print_system_info().decode().strip()}"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for qtype in oracle_types(arch):
            path = oracle_model(Path(tmp), arch, qtype)
            data[f"logits_{qtype}"] = llama_cpp_logits(path).astype(np.float16)  # half the bytes; 5e-4 relative
            data[f"sha256_{qtype}"] = np.array(file_sha256(path))
    np.savez_compressed(out / f"{arch}.npz", **data)
    print(f"{arch}: {out / f'{arch}.npz'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="*", default=sorted(TINY_ARCHS))
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "llamacpp_archs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for arch in args.archs:
        record(arch, args.out)


if __name__ == "__main__":
    main()
