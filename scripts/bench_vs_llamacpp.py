#!/usr/bin/env python3
"""localllm against llama.cpp on the same GGUF, the same threads, in one run, alternating.

    python scripts/bench_vs_llamacpp.py MODEL.gguf --llama-bench PATH [--llama-cli PATH] [-t 1,2] [--rounds 3]

Getting llama.cpp's tools (the `bench` extra, `pip install -e '.[bench]'`, installs llama-cpp-python,
whose sdist carries llama.cpp's sources; its wheel has no `llama-bench` binary, so build the tools from
the same sdist):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llsrc
    tar xzf /tmp/llsrc/llama_cpp_python-0.3.36.tar.gz -C /tmp/llsrc
    cd /tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    cmake --build build -j2 --target llama-bench llama-completion   # binaries in build/bin/

(`--llama-cli` takes llama-completion: in this llama.cpp revision llama-cli is chat-only, and the
one-shot `-p PROMPT -n 1 -no-cnv` tool is llama-completion.)

What it measures, per round and thread count, each engine in turn (so drift in machine load hits both):
- pp512 and tg128 tokens/s (`localllm bench --json` and `llama-bench -o json`, the same keys);
- peak RSS of each benchmark process (os.wait4's rusage of that child);
- time from process start to the first generated token: a one-token greedy generation (`localllm run
  -n 1`, `llama-cli -n 1`), warm (Numba's cache filled) and cold (NUMBA_CACHE_DIR emptied: every
  kernel compiles); llama.cpp has no JIT, so its cold and warm differ only by the page cache.
Prints medians with min-max, and localllm/llama.cpp ratios: of the medians, and per round (each round's
two runs back to back; their median and range); --json writes everything.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROMPT = "The capital of France is"


def peak_rss(cmd: list[str], env=None) -> tuple[str, float, int]:
    """Run cmd and return (stdout, wall seconds, its own peak RSS in bytes) via wait4."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err.read()[-2000:]}")
        return out.read(), wall, usage.ru_maxrss * 1024


def localllm_bench(model, threads, reps, n_prompt, n_gen, n_depth=0):
    cmd = [sys.executable, "-m", "localllm.cli.app", "bench", model, "-p", str(n_prompt), "-n", str(n_gen),
           "-d", str(n_depth), "-t", str(threads), "-r", str(reps), "--json"]
    out, _, rss = peak_rss(cmd)
    return json.loads(out), rss


def llamacpp_bench(binary, model, threads, reps, n_prompt, n_gen, n_depth=0, load_mode=None):
    """load_mode: llama-bench's -lm (mmap, none = its --no-mmap, ...); None: its default."""
    cmd = [binary, "-m", model, "-p", str(n_prompt), "-n", str(n_gen), "-d", str(n_depth), "-t", str(threads), "-r", str(reps),
           "-o", "json"] + (["-lm", load_mode] if load_mode else [])
    out, _, rss = peak_rss(cmd)
    return json.loads(out), rss


def first_token_seconds(cmd, env=None) -> float:
    _, wall, _ = peak_rss(cmd, env)
    return wall


def blas_kernels() -> str:
    """Which OpenBLAS kernels localllm's prefill gets. OPENBLAS_CORETYPE pins them (some machines of this
    project set it to Haswell: AVX2 kernels at about half the AVX-512 ones' speed on a Zen 5 core), so it
    is printed with every comparison."""
    code = "import threadpoolctl, numpy; print(threadpoolctl.threadpool_info()[0].get('architecture'))"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() or "?"
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return f"OpenBLAS {found} kernels" + (f" (OPENBLAS_CORETYPE={pinned} in the environment)" if pinned else "")


def test_name(row) -> str:
    """llama-bench's test label from a JSON row of either engine: pp512, tg128, tg128@d4096."""
    name = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
    return f"{name}@d{row['n_depth']}" if row.get("n_depth") else name


def paired_ratios(ours: list, theirs: list) -> list:
    """localllm / llama.cpp per round: the two runs of a round are adjacent in time, so a drift of the
    shared machine's speed that spans rounds cancels in each ratio (the median of these is the figure
    to quote when the machine is noisy; the ratio of medians mixes rounds run at different speeds)."""
    return [a / b for a, b in zip(ours, theirs)]


def summarize(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--llama-bench", required=True)
    parser.add_argument("--llama-cli", default=None, help="llama-completion, for time-to-first-token (optional)")
    parser.add_argument("-t", "--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-r", "--repetitions", type=int, default=3)
    parser.add_argument("-p", "--n-prompt", type=int, default=512)
    parser.add_argument("-n", "--n-gen", type=int, default=128)
    parser.add_argument("-d", "--n-depth", type=int, default=0, help="tokens in the cache before each test (llama-bench -d)")
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    print(f"localllm's BLAS (prefill): {blas_kernels()}", flush=True)

    samples: dict = {}  # (engine, test, threads) -> list of tok/s samples
    round_means: dict = {}  # (engine, test, threads) -> the mean tok/s of each round, in round order
    rss: dict = {"localllm": [], "llama.cpp": []}
    for rnd in range(args.rounds):
        for t in threads:
            for engine in ("localllm", "llama.cpp") if rnd % 2 == 0 else ("llama.cpp", "localllm"):
                if engine == "localllm":
                    rows, peak = localllm_bench(args.model, t, args.repetitions, args.n_prompt, args.n_gen, args.n_depth)
                else:
                    rows, peak = llamacpp_bench(args.llama_bench, args.model, t, args.repetitions, args.n_prompt, args.n_gen,
                                                args.n_depth)
                rss[engine].append(peak)
                for row in rows:
                    samples.setdefault((engine, test_name(row), t), []).extend(row["samples_ts"])
                    round_means.setdefault((engine, test_name(row), t), []).append(row["avg_ts"])
                print(f"round {rnd + 1} {engine} t={t}: " + ", ".join(
                    f"{test_name(r)} {r['avg_ts']:.1f} t/s" for r in rows), flush=True)

    ttft = {}
    if args.llama_cli:
        for label in ("warm", "cold"):
            env = dict(os.environ)
            values_ours, values_theirs = [], []
            for _ in range(args.rounds):
                if label == "cold":
                    env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-")
                values_ours.append(first_token_seconds(
                    [sys.executable, "-m", "localllm.cli.app", "run", args.model, PROMPT, "-n", "1", "--temperature", "0", "--ctx", "1024"], env))
                values_theirs.append(first_token_seconds(
                    [args.llama_cli, "-m", args.model, "-p", PROMPT, "-n", "1", "--temp", "0", "-c", "1024", "-no-cnv"], env))
            ttft[label] = {"localllm": summarize(values_ours), "llama.cpp": summarize(values_theirs)}

    report = {"model": args.model, "threads": threads, "tests": {}, "peak_rss_bytes": {k: max(v) for k, v in rss.items() if v}, "first_token_seconds": ttft}
    print(f"\n{'test':>12} {'thr':>4} {'localllm t/s':>22} {'llama.cpp t/s':>22} {'ratio':>8} {'paired ratio':>22}")
    for (engine, test, t), values in sorted(samples.items()):
        if engine != "localllm":
            continue
        theirs = samples.get(("llama.cpp", test, t), [])
        ours_s, theirs_s = summarize(values), summarize(theirs) if theirs else None
        ratio = ours_s["median"] / theirs_s["median"] if theirs_s else float("nan")
        paired = paired_ratios(round_means.get((engine, test, t), []), round_means.get(("llama.cpp", test, t), []))
        report["tests"][f"{test}/t{t}"] = {"localllm": ours_s, "llama.cpp": theirs_s, "ratio": ratio,
                                           "paired_ratio": summarize(paired) if paired else None}
        fmt = lambda s: f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"  # noqa: E731
        paired_text = f"{statistics.median(paired):.2f}x [{min(paired):.2f}-{max(paired):.2f}]" if paired else "-"
        print(f"{test:>12} {t:>4} {fmt(ours_s):>22} {fmt(theirs_s) if theirs_s else '-':>22} {ratio:>7.2f}x {paired_text:>22}")
    for engine, peak in report["peak_rss_bytes"].items():
        print(f"peak RSS {engine}: {peak / 2**20:.0f} MiB")
    for label, both in ttft.items():
        print(f"start to first token ({label}): localllm {both['localllm']['median']:.2f} s, llama.cpp {both['llama.cpp']['median']:.2f} s")
    if args.json_path:
        with open(args.json_path, "w") as fh:
            json.dump(report, fh, indent=2)


if __name__ == "__main__":
    main()
