"""Prefill and decode speed of every architecture per weight byte, against llama's: the check that a new
architecture hides no slow path in a new op.

Each architecture gets a random model of the same shape (tests/tiny_models.py, `--embd` wide, `--layers`
layers, Q4_K matrices by default); all are loaded at once and timed in paired rounds (every round times
every architecture, so the machine's drift hits them alike). Per round, an architecture's throughput
times its weight bytes over llama's is its ratio; the table gives the median ratio and its spread.
Ratios near 1 mean the same speed per byte of weights read; an architecture's extra work (Gemma's
post-norms and soft-caps, OLMo 2's norms over whole rows) shows as a ratio below 1.

    python scripts/bench_archs.py [--archs llama gemma2 ...] [--type Q4_K] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tiny_models import TINY_ARCHS, Dims, write_tiny_model  # noqa: E402


# Tables a token only gathers rows from: not read whole per token, so not counted as weight bytes.
GATHERED = ("per_layer_token_embd.weight",)


def weight_bytes(model) -> int:
    return sum(info.nbytes for name, info in model.reader.tensors.items() if name not in GATHERED)


def main() -> None:
    import localllm
    from localllm.bench import time_generation, time_prompt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="*", default=sorted(TINY_ARCHS))
    parser.add_argument("--type", default="Q4_K")
    parser.add_argument("--embd", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    archs = ["llama"] + [a for a in args.archs if a != "llama"]
    head_dim = 128
    dims = Dims(n_embd=args.embd, n_head=args.embd // head_dim, n_kv=max(1, args.embd // head_dim // 2),
                head_dim=head_dim, n_ff=args.embd * 11 // 4 // 256 * 256, n_layer=args.layers)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        models = {}
        for arch in archs:
            path = write_tiny_model(Path(tmp) / f"{arch}.gguf", arch, args.type, seed=1, dims=dims)
            models[arch] = localllm.load(path, n_ctx=args.prompt + args.gen + 16, threads=args.threads)
            models[arch].backend.wait_for_kernels()
            time_prompt(models[arch], args.prompt, rng)  # warm-up
            time_generation(models[arch], 4, rng)
        ratios = {arch: {"pp": [], "tg": []} for arch in archs}
        speeds = {arch: {"pp": [], "tg": []} for arch in archs}
        for _ in range(args.rounds):
            per_byte = {}
            for arch, model in models.items():
                pp = args.prompt / (time_prompt(model, args.prompt, rng) * 1e-9)
                tg = args.gen / (time_generation(model, args.gen, rng) * 1e-9)
                speeds[arch]["pp"].append(pp)
                speeds[arch]["tg"].append(tg)
                per_byte[arch] = {"pp": pp * weight_bytes(model), "tg": tg * weight_bytes(model)}
            for arch in archs:
                for test in ("pp", "tg"):
                    ratios[arch][test].append(per_byte[arch][test] / per_byte["llama"][test])
        print(f"{args.type}, {args.embd} wide, {args.layers} layers, {args.threads} threads, {args.rounds} paired rounds")
        print(f"| arch | weight MB | pp{args.prompt} tok/s | tg{args.gen} tok/s | pp per byte vs llama | tg per byte vs llama |")
        print("|---|---|---|---|---|---|")
        for arch in archs:
            r = ratios[arch]
            spread = lambda xs: f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"  # noqa: E731
            print(f"| {arch} | {weight_bytes(models[arch]) / 1e6:.1f} | {statistics.median(speeds[arch]['pp']):.0f} | "
                  f"{statistics.median(speeds[arch]['tg']):.1f} | {spread(r['pp'])} | {spread(r['tg'])} |")


if __name__ == "__main__":
    main()
