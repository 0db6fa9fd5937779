"""Record llama.cpp's embeddings on tiny random embedding models: the oracle that
tests/model/test_embeddings.py holds `Model.embed` to.

tests/tiny_encoders.py (`embed_model`) writes each model of EMBED_MODELS (the encoders bert and nomic-bert
with a small WordPiece vocabulary, and decoders used as embedders: Qwen3 with last-token pooling, a llama
file without a pooling type) in each of EMBED_TYPES, and llama.cpp (`Llama(embedding=True)`) embeds each
text of EMBED_TEXTS alone, its own pooling as the file says, not normalised. One file,
tests/data/llamacpp_embeddings.npz:
- `tokens_<model>` int32 (all texts' ids, concatenated) and `lengths_<model>`: llama.cpp's tokenization
  (with its BOS / [CLS] ... [SEP]), which the test checks ours against;
- `embd_<model>_<type>` float32 [texts, n_embd]: the pooled embeddings; for the model without a pooling
  type llama.cpp gives every token's hidden state, kept as `embd_<model>_<type>` float32 [sum of lengths,
  n_embd];
- `sha256_<model>_<type>` (the model file's digest, so the test can tell it rebuilt the same file), `texts`,
  and `llama_cpp` (version and system line of the library that computed them).

llama.cpp comes from llama-cpp-python 0.3.36, as for scripts/llamacpp_arch_logits.py (see its docstring);
here, run from the repository root:

    PYTHONPATH=/tmp/llsrc/llama_cpp_python-0.3.36 \\
    LLAMA_CPP_LIB_PATH=/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp/build-noamx/bin \\
    python scripts/llamacpp_embeddings.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from tiny_encoders import EMBED_MODELS, EMBED_TEXTS, EMBED_TYPES, embed_model  # noqa: E402
from tiny_models import file_sha256  # noqa: E402

N_CTX = 128


def llama_cpp_embeddings(path: Path) -> tuple[list[list[int]], np.ndarray]:
    """llama.cpp's token ids of each text and its embeddings: [texts, n_embd] pooled, or every token's
    [sum of lengths, n_embd] when the model pools nothing."""
    import llama_cpp

    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2,
                          flash_attn=False, verbose=False)
    tokens, rows = [], []
    for text in EMBED_TEXTS:
        tokens.append(llm.tokenize(text.encode("utf-8")))
        out = llm.embed(text, normalize=False)  # one text per call: a batch of one sequence
        rows.append(np.array(out, dtype=np.float32).reshape(-1, llm.n_embd()))
    llm.close()
    return tokens, np.concatenate(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "llamacpp_embeddings.npz")
    args = parser.parse_args()
    import llama_cpp

    data = {
        "texts": np.array(EMBED_TEXTS),
        "llama_cpp": np.array(f"llama-cpp-python {llama_cpp.__version__}; "
                              f"{llama_cpp.llama_print_system_info().decode().strip()}"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in EMBED_MODELS:
            for qtype in EMBED_TYPES:
                path = embed_model(Path(tmp), name, qtype)
                tokens, embd = llama_cpp_embeddings(path)
                if qtype == EMBED_TYPES[0]:
                    data[f"tokens_{name}"] = np.array([t for ids in tokens for t in ids], dtype=np.int32)
                    data[f"lengths_{name}"] = np.array([len(ids) for ids in tokens], dtype=np.int32)
                data[f"embd_{name}_{qtype}"] = embd
                data[f"sha256_{name}_{qtype}"] = np.array(file_sha256(path))
                print(f"{name} {qtype}: {embd.shape}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **data)
    print(args.out)


if __name__ == "__main__":
    main()
