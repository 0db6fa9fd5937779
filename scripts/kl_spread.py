#!/usr/bin/env python3
"""How far localllm's logits are from llama.cpp's, next to how far llama.cpp's own paths are from each other.

    python scripts/kl_spread.py [MODEL.gguf] [--prompts 50] [--seed 7] [--threads 2] [--json OUT]

For each prompt (token ids from llama.cpp's own tokenizer: random spans of tests/data/ppl/botchan.txt of
4 to 500 tokens, and a few short fixed prompts), the logits at the last prompt position from:
- llama.cpp as the reference files were made (llama-cpp-python defaults: the prompt in one batch, weights
  repacked, no flash attention), the base of every comparison;
- llama.cpp token by token (n_batch 1), with flash attention, and without repacking (use_extra_bufts off):
  the same engine and file, other kernels: its own spread;
- localllm, the prompt in one batch (what tests/model/test_gemma_reference.py checks) and token by token.
Prints KL(base || each) over the prompts (median, mean, 90th percentile, max, the share above 0.01) and
how often the top token agrees. A per-prompt KL bound below the spread of llama.cpp's own paths is a
bound some prompts fail by rounding alone: the 8-bit activation quantization inside every matmul turns
an ulp anywhere into flipped int8 roundings downstream.

With --reference OUT.npz it also writes what tests/model/test_gemma_reference.py checks our engine against
(llama.cpp only: no localllm logits in it): the prompts' token ids, the base path's TOP_K most likely
tokens with their log-probabilities at the last position, and the per-prompt KL of llama.cpp's token-by-
token and flash-attention paths against the base, each computed as top_k_kl computes ours.

llama.cpp runs in a child process through llama-cpp-python (`pip install -e '.[bench]'`), or through the
Python package of its sdist and a library built from it (scripts/bench_vs_llamacpp.py says how to build):
    PYTHONPATH=<sdist dir> LLAMA_CPP_LIB_PATH=<sdist>/vendor/llama.cpp/build/bin python scripts/kl_spread.py
(the package imports diskcache, jinja2 and typing-extensions). Needs ~60 MB of memory per variant for
50 prompts (262,144 float32 logits each).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "data" / "ppl" / "botchan.txt"
FIXED = [
    "The capital of Japan is",
    "def quicksort(arr):",
    "1, 1, 2, 3, 5, 8,",
    "Translate to French: good morning",
    "<start_of_turn>user\nWhat is the boiling point of water?<end_of_turn>\n<start_of_turn>model\n",
]
LENGTHS = [4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 200, 256, 300, 384, 450, 500]
LLAMA_VARIANTS = {  # name -> (Llama keyword arguments, repack weights)
    "llama.cpp batched": ({}, True),
    "llama.cpp token by token": ({"n_batch": 1, "n_ubatch": 1}, True),
    "llama.cpp flash attention": ({"flash_attn": True}, True),
    "llama.cpp no repack": ({}, False),
}
BASE = "llama.cpp batched"
SPREAD_PATHS = ("llama.cpp token by token", "llama.cpp flash attention")  # the bar of --reference
TOP_K = 512  # tokens of the base distribution kept by --reference


def _llama(model: str, threads: int, kwargs: dict, repack: bool, vocab_only: bool = False):
    import llama_cpp
    import llama_cpp.llama as llama_module

    settings = {"n_ctx": 2048, "n_batch": 512, "n_threads": threads, "verbose": False, "vocab_only": vocab_only, **kwargs}
    if repack:
        return llama_cpp.Llama(model_path=model, **settings)
    # llama-cpp-python has no argument for repacking: Llama takes its model parameters from this call
    default = llama_module.llama_cpp.llama_model_default_params

    def no_repack():
        params = default()
        params.use_extra_bufts = False
        return params

    llama_module.llama_cpp.llama_model_default_params = no_repack
    try:
        return llama_cpp.Llama(model_path=model, **settings)
    finally:
        llama_module.llama_cpp.llama_model_default_params = default


def make_prompts(model: str, count: int, seed: int) -> dict[str, list[int]]:
    """Prompt name -> token ids, tokenized by llama.cpp (with BOS, special tokens not parsed)."""
    llm = _llama(model, 1, {}, True, vocab_only=True)
    rng = np.random.default_rng(seed)
    text = TEXT.read_text()
    prompts = {f"fixed{i}": llm.tokenize(p.encode(), add_bos=True, special=False) for i, p in enumerate(FIXED)}
    for i in range(max(0, count - len(FIXED))):
        n = LENGTHS[i % len(LENGTHS)]
        start = int(rng.integers(0, len(text) - 8 * n))
        ids = llm.tokenize(text[start : start + 8 * n].encode(), add_bos=True, special=False)[:n]
        prompts[f"span{i:02d}_{len(ids)}"] = ids
    return prompts


def llama_worker(model: str, count: int, seed: int, out_dir: str, threads: int) -> None:
    """Child process (llama.cpp's library stays out of the process that runs ours): prompts.json, then
    one .npy of last-position logits [n_prompts, vocab] per llama.cpp variant."""
    import llama_cpp

    prompts = make_prompts(model, count, seed)
    (Path(out_dir) / "prompts.json").write_text(json.dumps(prompts))
    for index, (name, (kwargs, repack)) in enumerate(LLAMA_VARIANTS.items()):
        llm = _llama(model, threads, kwargs, repack)
        rows = []
        for ids in prompts.values():
            llm.reset()
            llm.eval(ids)
            rows.append(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy())
        np.save(Path(out_dir) / f"llama{index}.npy", np.stack(rows))
        del llm


def localllm_logits(model: str, prompts: dict[str, list[int]], threads: int) -> dict[str, np.ndarray]:
    import localllm

    llm = localllm.load(model, n_ctx=1024, threads=threads)
    batched, stepwise = [], []
    for ids in prompts.values():
        batched.append(llm.logits(ids)[-1].copy())
        session = llm.new_session()
        for pos, token in enumerate(ids):
            last = llm.decoder.forward(np.array([token], dtype=np.int32), pos, session.cache)[0]
        stepwise.append(last.copy())
    return {"localllm batched": np.stack(batched), "localllm token by token": np.stack(stepwise)}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(base: np.ndarray, other: np.ndarray) -> dict:
    p, q = log_softmax(base), log_softmax(other)
    kl = np.sum(np.exp(p) * (p - q), axis=-1)
    return {
        "kl_median": float(np.median(kl)),
        "kl_mean": float(kl.mean()),
        "kl_p90": float(np.quantile(kl, 0.9)),
        "kl_max": float(kl.max()),
        "share_above_0.01": float((kl > 0.01).mean()),
        "top1_agreement": float((base.argmax(axis=-1) == other.argmax(axis=-1)).mean()),
        "kl": kl.tolist(),
    }


def top_k_kl(base_ids: np.ndarray, base_logp: np.ndarray, other_logits: np.ndarray) -> float:
    """KL(base || other) between the two distributions coarsened to the base's top tokens (base_ids,
    with their log-probabilities base_logp) plus one bucket for every other token: a lower bound of the
    full KL, equal to it up to the bucket's share (what a reference file of 512 tokens a prompt allows).
    other_logits: float[vocab]."""
    q = log_softmax(other_logits)
    p_rest = max(1.0 - float(np.exp(base_logp).sum()), 1e-300)
    q_rest = max(1.0 - float(np.exp(q[base_ids]).sum()), 1e-300)
    p = np.exp(base_logp)
    return float(np.sum(p * (base_logp - q[base_ids])) + p_rest * (np.log(p_rest) - np.log(q_rest)))


def write_reference(path: str, model: str, prompts: dict, logits: dict) -> None:
    """The compact reference (module docstring): token ids (concatenated, with offsets), the base's top
    TOP_K ids and log-probabilities per prompt, and the SPREAD_PATHS' top_k_kl per prompt."""
    base = log_softmax(logits[BASE])
    top_ids = np.argsort(-base, axis=1)[:, :TOP_K].astype(np.int32)
    top_logp = np.take_along_axis(base, top_ids, axis=1)
    spread = np.array([[top_k_kl(top_ids[i], top_logp[i], logits[name][i]) for i in range(len(prompts))] for name in SPREAD_PATHS])
    ids = list(prompts.values())
    np.savez_compressed(
        path, model=os.path.basename(model), names=np.array(list(prompts)), tokens=np.concatenate(ids).astype(np.int32),
        offsets=np.cumsum([0] + [len(x) for x in ids]).astype(np.int64), top_ids=top_ids,
        top_logp=top_logp.astype(np.float64), spread_paths=np.array(SPREAD_PATHS), spread_kl=spread,
    )
    print(f"wrote {path}: {len(ids)} prompts, top {TOP_K} tokens each; " + "; ".join(
        f"{name}: median {np.median(kl):.5f}, p90 {np.quantile(kl, 0.9):.5f}" for name, kl in zip(SPREAD_PATHS, spread)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="GGUF file (default: the built-in Gemma 3 270M)")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the figures (and every prompt's KL) here")
    parser.add_argument("--reference", metavar="OUT.npz", help="write the compact llama.cpp reference the tests check (module docstring)")
    parser.add_argument("--llama-worker", metavar="OUT_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_worker:
        llama_worker(args.model, args.prompts, args.seed, args.llama_worker, args.threads)
        return 0
    if args.prompts < 1:
        parser.error("--prompts must be at least 1")
    model = args.model
    if model is None:
        from localllm.hub.default_model import default_model_path

        model = str(default_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, model, "--prompts", str(args.prompts), "--seed", str(args.seed),
               "--threads", str(args.threads), "--llama-worker", tmp]
        if subprocess.run(cmd, env=os.environ.copy()).returncode != 0:
            print("kl_spread: the llama.cpp run failed (is llama-cpp-python importable? see the module docstring)", file=sys.stderr)
            return 2
        prompts = json.loads((Path(tmp) / "prompts.json").read_text())
        logits = {name: np.load(Path(tmp) / f"llama{i}.npy") for i, name in enumerate(LLAMA_VARIANTS)}
    if args.reference:
        write_reference(args.reference, model, prompts, logits)
    logits.update(localllm_logits(model, prompts, args.threads))
    lengths = [len(ids) for ids in prompts.values()]
    print(f"{len(prompts)} prompts of {min(lengths)}-{max(lengths)} tokens; KL({BASE} || each) at the last prompt position")
    print(f"{'':28s} {'median':>8s} {'mean':>8s} {'p90':>8s} {'max':>8s} {'>0.01':>7s} {'top-1':>7s}")
    results = {}
    for name, rows in logits.items():
        if name == BASE:
            continue
        r = results[name] = compare(logits[BASE], rows)
        print(f"{name:28s} {r['kl_median']:8.5f} {r['kl_mean']:8.5f} {r['kl_p90']:8.5f} {r['kl_max']:8.5f} "
              f"{100 * r['share_above_0.01']:6.0f}% {100 * r['top1_agreement']:6.0f}%")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "prompts": prompts, "base": BASE, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
